#!/usr/bin/env bash
# --speculative-config on the CLI (docs/speculative.md), tiny checkpoint (DEEPINFER_TINY_DIR):
# generate with n-gram drafts gives the same tokens and logprobs as without and prints the
# speculative-decoding summary line; the DSpark drafter ("dspark", k = 1 and 2) gives the same output as
# without; bad configs (dspark with k = 3 > dspark_block_size - 1) exit 2 naming the flag; bench e2e
# refuses a bad config before measuring. On the tiny V4 checkpoint (DEEPINFER_TINY_V4_DIR):
# the MTP drafter ("mtp") gives the same output as without; "mtp" on V4.1 or with k > 1 exits 2.
set -euo pipefail
BIN="$1"
TINY="${DEEPINFER_TINY_DIR:?DEEPINFER_TINY_DIR not set}"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$T/in.jsonl" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    # logit_bias confines the tiny (random-weight) model's output to a few ids: repetitive, draftable.
    b = ', "logit_bias": {"1000": 100, "5000": 100, "20000": 100}'
    f.write('{"prompt": "one two three four, one two three four", "max_tokens": 24%s}\n' % b)
    f.write('{"prompt": "The quick brown fox jumps over the lazy dog.", "max_tokens": 20, "logprobs": 3%s}\n' % b)
    f.write('{"prompt": "Seeded", "temperature": 1.0, "seed": 11, "max_tokens": 16%s}\n' % b)
    f.write('{"prompt": "Stop here", "max_tokens": 24, "stop_token_ids": [5000]%s}\n' % b)
PY
COMMON=(--model "$TINY" --prompts "$T/in.jsonl" --max-model-len 256 --max-num-seqs 4 --temperature 0 --threads 1)
"$BIN" generate "${COMMON[@]}" --output "$T/off.jsonl" 2> "$T/off.err" || fail "generate (off): $(cat "$T/off.err")"
"$BIN" generate "${COMMON[@]}" --output "$T/on.jsonl" \
  --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}' \
  2> "$T/on.err" || fail "generate (ngram): $(cat "$T/on.err")"
grep -q "^generate: speculative decoding: [1-9][0-9]* drafts, [0-9]* draft tokens, [1-9][0-9]* accepted" "$T/on.err" \
  || fail "no speculative summary with accepted drafts: $(cat "$T/on.err")"
grep -q "speculative decoding" "$T/off.err" && fail "speculative summary without the flag"
python3 - "$T/off.jsonl" "$T/on.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4
for x, y in zip(a, b):
    assert "error" not in x and "error" not in y, (x, y)
    for k in ("token_ids", "text", "finish_reason", "logprobs"):
        assert x.get(k) == y.get(k), (k, x.get(k), y.get(k))
PY

# V4.1's DSpark drafter: same tokens, text and logprobs as without, drafts verified.
for K in 1 2; do
  "$BIN" generate "${COMMON[@]}" --output "$T/ds$K.jsonl" \
    --speculative-config "{\"method\": \"dspark\", \"num_speculative_tokens\": $K}" 2> "$T/ds$K.err" \
    || fail "generate (dspark k=$K): $(cat "$T/ds$K.err")"
  grep -q "^generate: speculative decoding: [1-9][0-9]* drafts" "$T/ds$K.err" \
    || fail "no speculative summary with drafts (dspark k=$K): $(cat "$T/ds$K.err")"
  python3 - "$T/off.jsonl" "$T/ds$K.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4
for x, y in zip(a, b):
    assert "error" not in x and "error" not in y, (x, y)
    for k in ("token_ids", "text", "finish_reason", "logprobs"):
        assert x.get(k) == y.get(k), (k, x.get(k), y.get(k))
PY
done

expect_error() {  # expect_error <config> <pattern>
  set +e
  "$BIN" generate "${COMMON[@]}" --output "$T/x.jsonl" --speculative-config "$1" 2> "$T/e"
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "config $1: exit $rc, expected 2: $(cat "$T/e")"
  grep -q -- "--speculative-config" "$T/e" || fail "config $1: error does not name the flag: $(cat "$T/e")"
  grep -q -- "$2" "$T/e" || fail "config $1: error lacks '$2': $(cat "$T/e")"
}
expect_error '{"method": "ngram"' "not valid JSON"
expect_error '{"method": "medusa", "num_speculative_tokens": 2}' "unknown method"
expect_error '{"method": "ngram", "num_speculative_tokens": 0}' "num_speculative_tokens"
expect_error '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}' "prompt_lookup_max"
expect_error '{"method": "ngram", "num_speculative_tokens": 20}' "sliding_window"
expect_error '{"method": "dspark", "num_speculative_tokens": 3}' "dspark_block_size"
expect_error '{"method": "mtp", "num_speculative_tokens": 1}' "needs a deepseek_v4 model"
set +e
"$BIN" bench e2e --model "$TINY" --json "$T/b.json" --speculative-config '{"method": 1}' > "$T/b.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--speculative-config" "$T/b.out" || fail "bench e2e bad config: exit $rc: $(cat "$T/b.out")"

# V4's MTP drafter: same tokens, text and logprobs as without, every decode step verifies a draft.
TINY4="${DEEPINFER_TINY_V4_DIR:?DEEPINFER_TINY_V4_DIR not set}"
V4=(--model "$TINY4" --prompts "$T/in.jsonl" --max-model-len 256 --max-num-seqs 4 --temperature 0 --threads 1)
"$BIN" generate "${V4[@]}" --output "$T/v4off.jsonl" 2> "$T/v4off.err" || fail "generate V4 (off): $(cat "$T/v4off.err")"
"$BIN" generate "${V4[@]}" --output "$T/v4on.jsonl" --speculative-config '{"method": "mtp", "num_speculative_tokens": 1}' \
  2> "$T/v4on.err" || fail "generate V4 (mtp): $(cat "$T/v4on.err")"
grep -q "^generate: speculative decoding: [1-9][0-9]* drafts" "$T/v4on.err" \
  || fail "no speculative summary with drafts (mtp): $(cat "$T/v4on.err")"
python3 - "$T/v4off.jsonl" "$T/v4on.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4
for x, y in zip(a, b):
    assert "error" not in x and "error" not in y, (x, y)
    for k in ("token_ids", "text", "finish_reason", "logprobs"):
        assert x.get(k) == y.get(k), (k, x.get(k), y.get(k))
PY
set +e
"$BIN" generate "${V4[@]}" --output "$T/x.jsonl" --speculative-config '{"method": "mtp", "num_speculative_tokens": 2}' 2> "$T/e"
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--speculative-config" "$T/e" && grep -q "num_speculative_tokens must be 1" "$T/e" \
  || fail "mtp k=2: exit $rc: $(cat "$T/e")"
echo "speculative: OK"
