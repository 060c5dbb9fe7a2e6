#!/usr/bin/env bash
# Fuzzes the safetensors header parser (fuzz/safetensors_header_fuzz.cc) with
# libFuzzer + AddressSanitizer for a bounded time. Not part of CI.
#
# Usage: ./scripts/fuzz.sh [SECONDS]        (default 120)
#
# Builds a separate clang tree in build-fuzz/ (the modules the target uses —
# base, format, model config — are compiled again with
# -fsanitize=fuzzer-no-link,address so the parser is coverage-instrumented;
# see the DEEPINFER_BUILD_FUZZ block of CMakeLists.txt), writes a small seed corpus to
# build-fuzz/corpus/seeds/, keeps the growing corpus in
# build-fuzz/corpus/safetensors_header/ and any crash reproducer in
# build-fuzz/artifacts/. Exit status: 0 if no crash was found, else libFuzzer's.
# Reproduce a crash: build-fuzz/safetensors_header_fuzz build-fuzz/artifacts/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-120}
BUILD=build-fuzz

CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDEEPINFER_BUILD_FUZZ=ON -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target safetensors_header_fuzz

SEEDS="$BUILD/corpus/seeds"
CORPUS="$BUILD/corpus/safetensors_header"
mkdir -p "$SEEDS" "$CORPUS" "$BUILD/artifacts"
python3 - "$SEEDS" <<'EOF'
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

set +e
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$BUILD/safetensors_header_fuzz" \
  -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -dict=fuzz/safetensors_header.dict -artifact_prefix="$BUILD/artifacts/" \
  "$CORPUS" "$SEEDS" 2>&1 | tee "$BUILD/fuzz.log" | grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|ERROR|crash-|stat::" 
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "fuzz: libFuzzer exited with status $rc; see $BUILD/fuzz.log and $BUILD/artifacts/"
  exit "$rc"
fi
echo "fuzz: no crash in ${SECS}s (log: $BUILD/fuzz.log)"
