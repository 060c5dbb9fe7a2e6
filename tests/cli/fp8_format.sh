#!/usr/bin/env bash
# --fp8-format on generate, serve and bench e2e: the e4m3-ieee mode runs on the
# tiny checkpoint (DEEPINFER_TINY_DIR, made by the ctest fixture), and bad
# combinations are start-up errors (exit 2, one line naming the flag): an
# unknown format name, and e4m3-ieee on a checkpoint without FP8 weights; and
# the mode under mpirun --ep 2 --dp 2 equals one process.
set -euo pipefail
BIN="$1"
SRC="${2:-.}"
TINY="${DEEPINFER_TINY_DIR:?DEEPINFER_TINY_DIR not set}"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect_err PATTERN CMD...: exit status 2, exactly one stderr line "error: ..." matching PATTERN.
expect_err() {
  local pat=$1; shift
  local rc=0
  timeout 120 "$@" >"$T/out" 2>"$T/err" </dev/null || rc=$?
  [ "$rc" -eq 2 ] || fail "$* exited $rc (want 2): $(cat "$T/err")"
  local errs
  errs=$(grep -c '^error: ' "$T/err" || true)
  [ "$errs" -eq 1 ] || fail "$*: want one error line: $(cat "$T/err")"
  grep -q "^error: .*$pat" "$T/err" || fail "$*: error lacks '$pat': $(cat "$T/err")"
}

# The flag is listed by all three commands.
for c in "generate" "serve" "bench e2e"; do
  # shellcheck disable=SC2086
  "$BIN" $c --help > "$T/help" || fail "$c --help exited $?"   # (no pipe: grep -q would SIGPIPE it)
  grep -q -- '--fp8-format' "$T/help" || fail "$c --help lacks --fp8-format"
done

# (The first prompt is one on which the two modes' first-token logprobs differ, docs/kernels.md.)
echo '{"prompt": "The Fulton County Grand Jury said Friday an investigation of Atlanta'"'"'s recent primary election produced \" no evidence \" that any irregularities took place.", "max_tokens": 6, "logprobs": 3}' > "$T/in.jsonl"
echo '{"prompt": "Once upon a time", "max_tokens": 6}' >> "$T/in.jsonl"

# Unknown format names.
expect_err "--fp8-format: unknown format 'e5m2'" \
  "$BIN" generate --model "$TINY" --prompts "$T/in.jsonl" --output "$T/o.jsonl" --fp8-format e5m2
expect_err "--fp8-format: unknown format 'E4M3FN'" "$BIN" serve "$TINY" --port 0 --fp8-format E4M3FN
expect_err "--fp8-format: unknown format 'ieee'" \
  "$BIN" bench e2e --model "$TINY" --json "$T/b.json" --fp8-format ieee

# A checkpoint without FP8 weights (the tiny config and tokenizer, one BF16 tensor).
mkdir "$T/nofp8"
cp "$TINY/config.json" "$TINY/tokenizer.json" "$T/nofp8/"
[ -f "$TINY/tokenizer_config.json" ] && cp "$TINY/tokenizer_config.json" "$T/nofp8/"
python3 - "$T/nofp8/model.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"embed.weight": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(16))
PY
expect_err "--fp8-format e4m3-ieee: .*nofp8 has no FP8 weights" \
  "$BIN" generate --model "$T/nofp8" --prompts "$T/in.jsonl" --output "$T/o.jsonl" --fp8-format e4m3-ieee
expect_err "--fp8-format e4m3-ieee: .*has no FP8 weights" "$BIN" serve "$T/nofp8" --port 0 --fp8-format e4m3-ieee
expect_err "--fp8-format e4m3-ieee: .*has no FP8 weights" \
  "$BIN" bench e2e --model "$T/nofp8" --json "$T/b.json" --batches 1 --prompt-len 2 --decode-steps 1 \
  --fp8-format e4m3-ieee

# The mode runs: same requests in both modes, valid outputs; the load logs the transform.
for f in e4m3fn e4m3-ieee; do
  "$BIN" generate --model "$TINY" --prompts "$T/in.jsonl" --output "$T/$f.jsonl" --temperature 0 --threads 1 \
    --max-model-len 256 --fp8-format "$f" 2> "$T/$f.err" || fail "generate --fp8-format $f: $(cat "$T/$f.err")"
done
grep -q "e4m3-ieee: .* FP8 tensors transformed at load" "$T/e4m3-ieee.err" || fail "no transform log: $(cat "$T/e4m3-ieee.err")"
grep -q "transformed at load" "$T/e4m3fn.err" && fail "default mode logged a transform"
python3 - "$T/e4m3fn.jsonl" "$T/e4m3-ieee.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 2, (a, b)
for x, y in zip(a, b):
    assert "error" not in x and "error" not in y, (x, y)
    assert len(x["token_ids"]) == len(y["token_ids"]) == 6, (x, y)
# The first token's top-3 logprobs exist in both and are not bit-identical (the mode changes numerics).
la = a[0]["logprobs"][0]["top_logprobs"]
lb = b[0]["logprobs"][0]["top_logprobs"]
assert len(la) == len(lb) == 3, (la, lb)
assert [t["logprob"] for t in la] != [t["logprob"] for t in lb], (la, lb)
PY

"$BIN" bench e2e --model "$TINY" --json "$T/e.json" --batches 1 --prompt-len 3 --decode-steps 2 \
  --fp8-format e4m3-ieee > "$T/e.out" 2>&1 || fail "bench e2e e4m3-ieee: $(cat "$T/e.out")"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['fp8_format']=='e4m3-ieee', j" "$T/e.json" \
  || fail "bench e2e JSON lacks fp8_format"
# Scale-out in the IEEE mode (docs/parallel.md): --ep 2 --dp 2 under mpirun gives the one-process
# tokens and logprobs on the 64 English prompts.
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  G=(generate --model "$TINY" --prompts "$SRC/tests/data/engine/english_prompts.jsonl" --threads 1 --temperature 0
     --logprobs 3 --no-progress --fp8-format e4m3-ieee)
  "$BIN" "${G[@]}" --output "$T/one.jsonl" 2>"$T/one.err" || fail "one process: $(cat "$T/one.err")"
  timeout 300 mpirun --oversubscribe --bind-to none -np 2 "$BIN" "${G[@]}" --ep 2 --dp 2 --output "$T/two.jsonl" \
    2>"$T/two.err" || fail "mpirun -np 2 --ep 2 --dp 2: $(tail -5 "$T/two.err")"
  python3 - "$T/one.jsonl" "$T/two.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 64, (len(a), len(b))
for x, y in zip(a, b):
    assert "error" not in x and "error" not in y, (x.get("error"), y.get("error"))
    assert x["token_ids"] == y["token_ids"] and x["logprobs"] == y["logprobs"], x["index"]
PY
else
  echo "fp8_format.sh: mpirun not installed, scale-out check skipped"
fi
echo "fp8_format.sh: OK"
