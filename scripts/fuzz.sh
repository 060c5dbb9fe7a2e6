#!/usr/bin/env bash
# Fuzzes the checkpoint loader's parsers with libFuzzer + AddressSanitizer for
# a bounded time. Not part of CI.
#
# Usage: ./scripts/fuzz.sh [SECONDS] [TARGET...]
#   SECONDS  time per target (default 120)
#   TARGET   safetensors_header (SafetensorsFile::Parse on file images) and/or
#            config_json (ModelConfig::FromJsonText + ExpectedTensors);
#            default: both
#
# Builds a separate clang tree in build-fuzz/ (the modules the targets use —
# base, format, model config — are compiled again with
# -fsanitize=fuzzer-no-link,address so the parsers are coverage-instrumented;
# see the DEEPINFER_BUILD_FUZZ block of CMakeLists.txt), writes a small seed
# corpus per target to build-fuzz/corpus/<target>-seeds/, keeps the growing
# corpus in build-fuzz/corpus/<target>/ and any crash reproducer in
# build-fuzz/artifacts/. Exit status: 0 if no crash was found, else libFuzzer's.
# Reproduce a crash: build-fuzz/<target>_fuzz build-fuzz/artifacts/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-120}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(safetensors_header config_json)
BUILD=build-fuzz

CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDEEPINFER_BUILD_FUZZ=ON -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_BUILD_BENCH=OFF >/dev/null
for t in "${TARGETS[@]}"; do
  cmake --build "$BUILD" -j"$(nproc)" --target "${t}_fuzz"
done
mkdir -p "$BUILD/artifacts"

seed_safetensors_header() {
  python3 - "$1" <<'EOF'
import struct, sys, os
out = sys.argv[1]
def st(header: bytes, data: bytes = b"", pad=True):
    if pad:
        header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data
seeds = {
    "valid": st(b'{"__metadata__":{"format":"pt"},"a.weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},'
                b'"a.scale":{"dtype":"F8_E8M0","shape":[1,1],"data_offsets":[8,9]},'
                b'"e.weight":{"dtype":"I8","shape":[2,2],"data_offsets":[9,13]},'
                b'"f":{"dtype":"F32","shape":[],"data_offsets":[13,17]}}', bytes(range(17))),
    "empty": st(b"{}"),
    "zero_len": st(b'{"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}}'),
    "overlap": st(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12)),
    "bad_dtype": st(b'{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}', b"x"),
    "past_eof": struct.pack("<Q", 1000) + b'{"a":1}',
    "short": b"\x01\x02\x03",
    "metadata_only": st(b'{"__metadata__":{"a":"b","c":"d"}}'),
    "i64": st(b'{"t":{"dtype":"I64","shape":[2,3],"data_offsets":[0,48]}}', bytes(48)),
}
for k, v in seeds.items():
    open(os.path.join(out, k), "wb").write(v)
EOF
}

seed_config_json() {
  cp tests/data/tiny_v41_config.json tests/data/tiny_v4_config.json \
     tests/data/v41_flash_config.json tests/data/v4_flash_config.json "$1/"
}

status=0
for t in "${TARGETS[@]}"; do
  seeds="$BUILD/corpus/$t-seeds"
  corpus="$BUILD/corpus/$t"
  mkdir -p "$seeds" "$corpus"
  "seed_$t" "$seeds"
  echo "== fuzzing $t for ${SECS}s"
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$BUILD/${t}_fuzz" \
    -max_total_time="$SECS" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="fuzz/$t.dict" -artifact_prefix="$BUILD/artifacts/$t-" \
    "$corpus" "$seeds" >"$BUILD/$t.log" 2>&1
  rc=$?
  set -e
  grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|ERROR|crash-|stat::(number_of_executed_units|peak_rss)" \
    "$BUILD/$t.log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t: libFuzzer exited with status $rc; see $BUILD/$t.log and $BUILD/artifacts/"
    status=$rc
  else
    echo "fuzz: $t: no crash in ${SECS}s (log: $BUILD/$t.log)"
  fi
done
exit "$status"
