#!/usr/bin/env bash
# CLI test of `deepinfer make-tiny --arch deepseek_v4`: the default model must be
# byte-identical to the golden tiny-V4 checkpoint (sha256 values of
# shared/golden/TINY_V4_SPEC.md), with any thread count; --list is the golden
# tensor list (TINY_V4_TENSORS.tsv, tests/data/tiny_v4_tensors.tsv); errors exit 2.
# Usage: tests/cli/make_tiny_v4.sh BUILD/deepinfer [SOURCE_DIR]
set -euo pipefail
BIN=${1:?usage: make_tiny_v4.sh path/to/deepinfer [source_dir]}
SRC=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
TMP=$(mktemp -d /tmp/make_tiny_v4_sh.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

check_golden() {
  local dir=$1
  (cd "$dir" && sha256sum -c --strict --quiet) <<'EOF2' || fail "sha256 mismatch in $dir"
e1691e695b17bce27d5b4eedc26046f6ca542bc10b013f3820b9e8c63f38b22d  model.safetensors
f73fce717ccc8f913d335e06bd8036c13000844e63cf7fcb26d44ede85034496  model.safetensors.index.json
789f38098d1bf057470a069593e017b1d190b950fa104b7403b9c01d46b269b3  config.json
241918d0c8ef615d245f2159386565644273a83a0715a7b99d5b8d32a17e698c  inference/config.json
EOF2
}

"$BIN" make-tiny --arch deepseek_v4 --no-tokenizer "$TMP/a" >/dev/null
check_golden "$TMP/a"
[ "$(stat -c %s "$TMP/a/model.safetensors")" -eq 73517591 ] || fail "model.safetensors size"
OMP_NUM_THREADS=1 "$BIN" make-tiny --arch deepseek_v4 --preset tiny --no-tokenizer "$TMP/one" >/dev/null
check_golden "$TMP/one"
ls "$TMP/one"/*.tmp 2>/dev/null && fail "temporary files left behind"

"$BIN" make-tiny --arch deepseek_v4 --list >"$TMP/list.tsv"
cmp -s "$TMP/list.tsv" "$SRC/tests/data/tiny_v4_tensors.tsv" || fail "--list differs from tests/data/tiny_v4_tensors.tsv"
"$BIN" make-tiny --arch deepseek_v4 --preset large --dry-run "$TMP/dry" | sed -n 1p | grep -q "preset large: " ||
  fail "--dry-run --preset large"
[ ! -e "$TMP/dry" ] || fail "--dry-run wrote files"

rc=0
"$BIN" make-tiny --arch deepseek_v4 --preset small "$TMP/x" >/dev/null 2>"$TMP/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "^error: .*tiny or large" "$TMP/err" || fail "--preset small: rc $rc, $(cat "$TMP/err")"
rc=0
"$BIN" make-tiny --arch deepseek_v4 --dim 256 "$TMP/x" >/dev/null 2>"$TMP/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "^error: .*overrides" "$TMP/err" || fail "--dim: rc $rc, $(cat "$TMP/err")"
[ ! -e "$TMP/x" ] || fail "a refused run created its OUT_DIR"
echo "make_tiny_v4.sh: all checks passed"
