#!/usr/bin/env bash
# Structured output on the tiny model (random weights: the constraint does all
# the work): 100 generations at temperature 1 with different seeds for each of
# 10 JSON schemas, 5 regexes and 3 GBNF grammars (tests/data/structured/
# acceptance.json) through `deepinfer generate`; every output must end with
# finish_reason "stop" and be valid per an independent checker
# (structured_check.mjs: ajv for the schemas). Then batch invariance: a subset
# generated alone (--max-num-seqs 1) gives the same tokens as in the batch.
# Usage: structured_tiny.sh <path-to-deepinfer> <source-dir>
set -euo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
NPM_DIR="$SRC/tools/npm"
[ -d "$NPM_DIR/node_modules/ajv" ] || { echo "structured_tiny: $NPM_DIR/node_modules/ajv is missing: run scripts/setup.sh"; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
MODEL="${DEEPINFER_TINY_DIR:-}"
if [ -z "$MODEL" ] || [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
  MODEL="$WORK/tiny"
  "$BIN" make-tiny --arch deepseek_v41 "$MODEL" >/dev/null
fi
N=${STRUCTURED_N:-100}
export DEEPINFER_NPM_DIR="$NPM_DIR"
node "$SRC/tests/cli/structured_check.mjs" make "$SRC/tests/data/structured/acceptance.json" "$N" "$WORK/in.jsonl"
"$BIN" generate --model "$MODEL" --prompts "$WORK/in.jsonl" --output "$WORK/out.jsonl" --max-num-seqs 32 \
  --max-model-len 512 --max-num-batched-tokens 512 --threads 1 --no-progress
node "$SRC/tests/cli/structured_check.mjs" check "$SRC/tests/data/structured/acceptance.json" "$N" "$WORK/out.jsonl"

# Batch invariance: every 50th line alone gives the tokens it got in the batch of 32.
awk 'NR % 50 == 1' "$WORK/in.jsonl" > "$WORK/solo_in.jsonl"
"$BIN" generate --model "$MODEL" --prompts "$WORK/solo_in.jsonl" --output "$WORK/solo_out.jsonl" --max-num-seqs 1 \
  --max-model-len 512 --threads 1 --no-progress
# ... and the same subset all at once in a KV cache too small for it (recompute preemption).
"$BIN" generate --model "$MODEL" --prompts "$WORK/solo_in.jsonl" --output "$WORK/pre_out.jsonl" --max-num-seqs 36 \
  --max-model-len 512 --block-size 2 --num-kv-blocks 203 --threads 1 --no-progress 2> "$WORK/pre.log"
cat "$WORK/pre.log"
grep -q "preemptions [1-9]" "$WORK/pre.log" || { echo "structured_tiny: expected preemptions"; exit 1; }
python3 - "$WORK/out.jsonl" "$WORK/solo_out.jsonl" "$WORK/pre_out.jsonl" <<'PY'
import json, sys
batch = [json.loads(l) for l in open(sys.argv[1])]
solo = [json.loads(l) for l in open(sys.argv[2])]
pre = [json.loads(l) for l in open(sys.argv[3])]
picked = [batch[i] for i in range(0, len(batch), 50)]
assert len(picked) == len(solo) == len(pre), (len(picked), len(solo), len(pre))
for b, s, p in zip(picked, solo, pre):
    assert b["token_ids"] == s["token_ids"], ("batched != alone", b["text"], s["text"])
    assert b["token_ids"] == p["token_ids"], ("batched != preempted", b["text"], p["text"])
print(f"structured_tiny: {len(solo)} constrained requests alone == batched == preempted")
PY
echo "structured_tiny: ok"
