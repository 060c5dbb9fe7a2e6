#!/usr/bin/env bash
# CLI test of `deepinfer make-tiny --arch deepseek_v41 --vision`: byte-identical to
# the golden tiny-V4.1 vision checkpoint (sha256 values of TINY_V41_VISION_SPEC.md),
# and --list equal to TINY_V41_VISION_TENSORS.tsv (tests/data/vision/).
# Usage: tests/cli/make_tiny_vision.sh BUILD/deepinfer SOURCE_DIR
set -euo pipefail
BIN=${1:?usage: make_tiny_vision.sh path/to/deepinfer source_dir}
SRC=${2:?source dir}
TMP=$(mktemp -d /tmp/make_tiny_vision_sh.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

OMP_NUM_THREADS=1 "$BIN" make-tiny --arch deepseek_v41 --vision --no-tokenizer "$TMP/v" >/dev/null
(cd "$TMP/v" && sha256sum -c --strict --quiet) <<'SUMS' || fail "sha256 mismatch"
058fc351f7efc4a6010829e966a7f77db0bd6e1398086d9a87ee757bc484ac4c  model.safetensors
298fc1478d20b2c3c30f3ea8bf647080e8f4f8eb243b78366c31d72ce4bb8579  model.safetensors.index.json
a148e0dd1539e84143d85a76bf17abebe159ba28b832b58193ffc3e02cfcb25b  config.json
e81dea0b3f8bf39ea29c21cb5b88350650989f6a0c83493a67880c59c6ca74f6  inference/config.json
SUMS
[ "$(stat -c %s "$TMP/v/model.safetensors")" -eq 44115424 ] || fail "model.safetensors size"
"$BIN" make-tiny --arch deepseek_v41 --vision --list >"$TMP/list.tsv"
cmp -s "$TMP/list.tsv" "$SRC/tests/data/vision/TINY_V41_VISION_TENSORS.tsv" || fail "--vision --list differs from the golden TSV"
# Without --vision nothing changes (the text checkpoint keeps its golden config).
"$BIN" make-tiny --arch deepseek_v41 --dry-run | grep -q '"vision_n_layers": 0' || fail "text config lost vision_n_layers 0"
echo "make_tiny_vision: OK"
