#!/usr/bin/env bash
# deepinfer generate on the tiny checkpoint (DEEPINFER_TINY_DIR, made by the ctest fixture):
# the main job end to end, output in input order, bad lines give an error record for that line only,
# CLI errors exit 2 with one line.
set -euo pipefail
BIN="$1"
SRC="$2"
TINY="${DEEPINFER_TINY_DIR:?DEEPINFER_TINY_DIR not set}"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat > "$T/in.jsonl" <<'JSONL'
{"prompt": "The quick brown fox", "max_tokens": 5}
{"prompt": "not closed
{"prompt": ""}
{"prompt_token_ids": [5, 6, 7], "max_tokens": 3, "logprobs": 2}
{"prompt": "Once upon a time", "max_tokens": 700}
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}], "max_tokens": 4}
{"prompt": "x", "temperature": -1}
[1, 2]
{"prompt_token_ids": [5, 999999]}
{"prompt": "Seeded", "temperature": 0.8, "seed": 7, "max_tokens": 4}
JSONL
printf '{"prompt": "bad byte \xff here"}\n' >> "$T/in.jsonl"   # invalid UTF-8: an error record, not a dead run
"$BIN" generate --model "$TINY" --prompts "$T/in.jsonl" --output "$T/out.jsonl" --max-model-len 512 \
  --max-num-seqs 4 --temperature 0 --threads 1 2> "$T/err" || fail "generate exited $?: $(cat "$T/err")"
grep -q "^generate: 11 requests (7 errors)" "$T/err" || fail "summary line: $(cat "$T/err")"
python3 - "$T/out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["index"] for r in rows] == list(range(11)), rows
ok = {0, 3, 5, 9}
for r in rows:
    if r["index"] in ok:
        assert "error" not in r, r
        assert r["finish_reason"] in ("length", "stop"), r
        assert len(r["token_ids"]) == r["completion_tokens"] >= 1, r
        assert isinstance(r["text"], str) and isinstance(r["seed"], int), r
        assert r["time_to_first_token_s"] <= r["total_time_s"], r
    else:
        assert "error" in r and r["error"], r
assert rows[0]["completion_tokens"] == 5 and rows[0]["finish_reason"] == "length"
assert len(rows[3]["logprobs"]) == 3 and len(rows[3]["logprobs"][0]["top_logprobs"]) == 2
assert "invalid JSON" in rows[1]["error"], rows[1]
assert "empty" in rows[2]["error"], rows[2]
assert "max_model_len 512" in rows[4]["error"] and "700" in rows[4]["error"], rows[4]
assert "temperature" in rows[6]["error"], rows[6]
assert "999999" in rows[8]["error"], rows[8]
assert rows[9]["seed"] == 7
assert "invalid JSON" in rows[10]["error"], rows[10]
print("generate output ok")
PY
# The seeded request reproduces.
"$BIN" generate --model "$TINY" --prompts <(sed -n 10p "$T/in.jsonl") --output "$T/one.jsonl" --threads 1 2>/dev/null
python3 - "$T/out.jsonl" "$T/one.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])][9]
b = json.loads(open(sys.argv[2]).readline())
assert a["token_ids"] == b["token_ids"], (a, b)
PY
# CLI errors: exit status 2, one line, no crash.
set +e
"$BIN" generate --model "$T/nope" --prompts "$T/in.jsonl" --output "$T/x.jsonl" 2> "$T/err1"; rc=$?
set -e
[ "$rc" = 2 ] || fail "missing model dir: exit $rc"
[ "$(wc -l < "$T/err1")" = 1 ] && grep -q "^error: .*nope" "$T/err1" || fail "missing model dir message: $(cat "$T/err1")"
set +e
"$BIN" generate --model "$TINY" --prompts "$T/missing.jsonl" --output "$T/x.jsonl" 2> "$T/err2"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "^error: --prompts" "$T/err2" || fail "missing prompts: exit $rc $(cat "$T/err2")"
# Usage errors (CLI11 parse failures) follow the same rule.
set +e
"$BIN" generate --model "$TINY" --prompts "$T/in.jsonl" --output "$T/x.jsonl" --seed abc 2> "$T/err3"; rc=$?
"$BIN" generate --model "$TINY" --prompts "$T/in.jsonl" --output "$T/x.jsonl" --num-kv-blocks -1 2> "$T/err4"; rc4=$?
"$BIN" generate --model "$TINY" --prompts "$T" --output "$T/x.jsonl" 2> "$T/err5"; rc5=$?
set -e
[ "$rc" = 2 ] && [ "$(wc -l < "$T/err3")" = 1 ] && grep -q "^error: .*--seed" "$T/err3" || fail "--seed abc: exit $rc $(cat "$T/err3")"
[ "$rc4" = 2 ] && grep -q "^error: --num-kv-blocks" "$T/err4" || fail "--num-kv-blocks -1: exit $rc4 $(cat "$T/err4")"
[ "$rc5" = 2 ] && grep -q "is a directory" "$T/err5" || fail "--prompts DIR: exit $rc5 $(cat "$T/err5")"
echo "1 passed, 0 failed"
