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
echo '{"prompt": "typo", "max_token": 3}' >> "$T/in.jsonl"        # unknown field: an error naming it
echo '{"messages": []}' >> "$T/in.jsonl"                            # empty conversation
"$BIN" generate --model "$TINY" --prompts "$T/in.jsonl" --output "$T/out.jsonl" --max-model-len 512 \
  --max-num-seqs 4 --temperature 0 --threads 1 2> "$T/err" || fail "generate exited $?: $(cat "$T/err")"
grep -q "^generate: 13 requests (9 errors)" "$T/err" || fail "summary line: $(cat "$T/err")"
python3 - "$T/out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["index"] for r in rows] == list(range(13)), rows
ok = {0, 3, 5, 9}
for r in rows:
    if r["index"] in ok:
        assert "error" not in r, r
        assert r["finish_reason"] in ("length", "stop"), r
        assert len(r["token_ids"]) == r["completion_tokens"] >= 1, r
        assert isinstance(r["text"], str), r
        # --temperature 0: a line without a seed reports none (null); a seeded sampled line its seed.
        assert r["seed"] is None if r["index"] != 9 else isinstance(r["seed"], int), r
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
assert 'unknown field "max_token"' in rows[11]["error"], rows[11]
assert "messages must not be empty" in rows[12]["error"], rows[12]
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

# prompt_logprobs: a per-line field and the --prompt-logprobs default. Entry p (p >= 1) is the logprob of
# prompt token p under the logits at position p-1, i.e. the first-token logprobs of the prompt cut before p.
cat > "$T/plp.jsonl" <<'JSONL'
{"prompt_token_ids": [0, 400, 500, 600, 700], "max_tokens": 1, "prompt_logprobs": 2}
{"prompt_token_ids": [0, 400, 500, 600], "max_tokens": 1, "logprobs": 2}
{"prompt_token_ids": [0, 400, 500, 600, 700], "max_tokens": 2, "temperature": 0.9, "seed": 1}
{"prompt": "x", "prompt_logprobs": 50}
{"prompt": "x", "prompt_logprobs": -2}
{"prompt": "x", "prompt_logprobs": "x"}
{"prompt": "x", "max_tokens": 0, "prompt_logprobs": 1}
JSONL
"$BIN" generate --model "$TINY" --prompts "$T/plp.jsonl" --output "$T/plp_out.jsonl" --max-model-len 512 \
  --max-num-seqs 4 --max-num-batched-tokens 3 --temperature 0 --prompt-logprobs 1 --threads 1 2> "$T/plp_err" \
  || fail "generate --prompt-logprobs exited $?: $(cat "$T/plp_err")"
grep -q "^generate: 7 requests (4 errors)" "$T/plp_err" || fail "prompt_logprobs summary: $(cat "$T/plp_err")"
python3 - "$T/plp_out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ids = [0, 400, 500, 600, 700]
a = rows[0]["prompt_logprobs"]
assert len(a) == 5 and a[0] is None, a
for p in range(1, 5):
    e = a[p]
    assert e["token_id"] == ids[p], e
    assert isinstance(e["token"], str) and e["logprob"] <= 0 and e["rank"] >= 1, e
    top = e["top_logprobs"]
    assert len(top) == 2 and top[0]["rank"] == 1 and top[0]["logprob"] >= top[1]["logprob"], e
    assert all(set(t) == {"token_id", "token", "logprob", "rank"} for t in top), e
# The last entry = the logprobs of the first token generated after [0, 400, 500, 600] (raw, bit for bit in JSON).
b = rows[1]["logprobs"][0]
assert a[4]["top_logprobs"] == b["top_logprobs"], (a[4], b)
assert rows[1]["token_ids"][0] == b["top_logprobs"][0]["token_id"]  # greedy
# rows[1] got the command-line default (1) too: its own prompt positions, same values as rows[0].
assert [x["logprob"] for x in rows[1]["prompt_logprobs"][1:]] == [x["logprob"] for x in a[1:4]], rows[1]
# The default (1 top entry) under other sampling settings: same values as rows[0], top cut to 1.
c = rows[2]["prompt_logprobs"]
assert len(c) == 5 and c[0] is None
for p in range(1, 5):
    assert (c[p]["logprob"], c[p]["rank"]) == (a[p]["logprob"], a[p]["rank"]), (c[p], a[p])
    assert c[p]["top_logprobs"] == a[p]["top_logprobs"][:1], (c[p], a[p])
for i in (3, 4, 5):
    assert "prompt_logprobs" in rows[i]["error"], rows[i]
assert "max_tokens" in rows[6]["error"], rows[6]
print("prompt_logprobs ok")
PY
# --logit-bias as a command-line default: +100 on one token makes greedy decoding pick it every
# time; a per-line logit_bias replaces the default; a malformed value is a usage error (exit 2).
printf '{"prompt": "Hello", "max_tokens": 4}\n{"prompt": "Hello", "max_tokens": 4, "logit_bias": {"777": 100}}\n' > "$T/lb.jsonl"
"$BIN" generate --model "$TINY" --prompts "$T/lb.jsonl" --output "$T/lb_out.jsonl" --threads 1 --temperature 0 \
  --logit-bias '{"555": 100}' 2>/dev/null || fail "generate --logit-bias failed"
python3 - "$T/lb_out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows[0]["token_ids"] == [555] * 4, rows[0]
assert rows[1]["token_ids"] == [777] * 4, rows[1]
PY
rc=0
"$BIN" generate --model "$TINY" --prompts "$T/lb.jsonl" --output "$T/lb_bad.jsonl" --logit-bias 'nope' 2>"$T/lb_err" || rc=$?
[ "$rc" = 2 ] && [ "$(wc -l < "$T/lb_err")" = 1 ] && grep -q "^error: --logit-bias" "$T/lb_err" || fail "--logit-bias nope: exit $rc $(cat "$T/lb_err")"
echo "1 passed, 0 failed"
