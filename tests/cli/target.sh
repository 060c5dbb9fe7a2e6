#!/usr/bin/env bash
# --target on generate, serve and bench: every SIMD target the CPU runs gives
# the same tokens and logprobs on the tiny checkpoint (DEEPINFER_TINY_DIR,
# made by the ctest fixture), DEEPINFER_TARGET does the same, and an unknown or
# unsupported target is a start-up error (exit 2, one line naming it).
set -euo pipefail
BIN="$1"
TINY="${DEEPINFER_TINY_DIR:?DEEPINFER_TINY_DIR not set}"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for c in "generate" "serve" "bench kernels" "bench e2e"; do
  # shellcheck disable=SC2086
  "$BIN" $c --help > "$T/help" || fail "$c --help exited $?"
  grep -q -- '--target' "$T/help" || fail "$c --help lacks --target"
done

printf '%s\n' '{"prompt": "Once upon a time", "max_tokens": 5, "logprobs": 2}' \
  '{"prompt": "The quick brown fox jumps over the lazy dog and then", "max_tokens": 4}' > "$T/in.jsonl"
run() {  # run NAME ARGS...: token ids and logprobs of every line into $T/NAME
  local name=$1; shift
  "$@" --model "$TINY" --prompts "$T/in.jsonl" --output "$T/$name.jsonl" --temperature 0 --threads 2 2>"$T/err" \
    || fail "$* exited $?: $(cat "$T/err")"
  python3 -c 'import json,sys; [print(json.dumps([d["token_ids"], d.get("logprobs")])) for d in map(json.loads, open(sys.argv[1]))]' \
    "$T/$name.jsonl" > "$T/$name.ids"
}
run auto "$BIN" generate --target auto
n=0
for t in avx512 avx2 scalar emu128; do
  # A target this CPU/binary lacks must be refused with the list of the available ones.
  rc=0
  "$BIN" generate --target "$t" --model "$TINY" --prompts "$T/in.jsonl" --output "$T/$t.jsonl" --temperature 0 \
    >/dev/null 2>"$T/err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 2 ] || fail "--target $t exited $rc: $(cat "$T/err")"
    grep -q "^error: --target $t: .*available: auto" "$T/err" || fail "--target $t: $(cat "$T/err")"
    continue
  fi
  run "$t" "$BIN" generate --target "$t"
  cmp -s "$T/auto.ids" "$T/$t.ids" || fail "--target $t differs from auto: $(diff "$T/auto.ids" "$T/$t.ids" | head -5)"
  if [ "$t" = avx2 ]; then  # the environment variable, once
    DEEPINFER_TARGET=$t run "env-$t" "$BIN" generate
    cmp -s "$T/auto.ids" "$T/env-$t.ids" || fail "DEEPINFER_TARGET=$t differs from auto"
  fi
  n=$((n + 1))
done
[ "$n" -ge 2 ] || fail "only $n targets ran (want a SIMD target and the fallback)"
[ "$(wc -l < "$T/auto.ids")" -eq 2 ] || fail "want 2 result lines"

rc=0
"$BIN" generate --target avx9 --model "$TINY" --prompts "$T/in.jsonl" --output "$T/x.jsonl" 2>"$T/err" >/dev/null || rc=$?
[ "$rc" -eq 2 ] || fail "--target avx9 exited $rc"
[ "$(grep -c '^error: --target avx9: not a target' "$T/err")" -eq 1 ] || fail "--target avx9: $(cat "$T/err")"
rc=0
DEEPINFER_TARGET=avx9 "$BIN" generate --model "$TINY" --prompts "$T/in.jsonl" --output "$T/x.jsonl" 2>"$T/err" >/dev/null || rc=$?
[ "$rc" -eq 2 ] || fail "DEEPINFER_TARGET=avx9 exited $rc"
grep -q '^error: DEEPINFER_TARGET: --target avx9: not a target' "$T/err" || fail "DEEPINFER_TARGET=avx9: $(cat "$T/err")"
echo "target.sh: $n targets, same tokens and logprobs"
