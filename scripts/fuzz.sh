#!/usr/bin/env bash
# Fuzzes the parsers with libFuzzer + AddressSanitizer + UBSan.
#
# Usage: ./scripts/fuzz.sh [--runs N | --seconds S] [--seed S] [TARGET...]
#   --runs N     executions per target (default 1000000)
#   --seconds S  time per target instead
#   --seed S     libFuzzer's random seed (default 0: a new one each run; CI uses a
#                fixed one so that its short run is the same every time)
#   TARGET       http_request (whole raw requests: the transport's parser, then the
#                completions/chat schemas), request_schema (completions, chat and
#                tokenize bodies + responses), chat_render (the V4/V4.1 renderer +
#                EncodeChat), tokenizer (Encode/Decode round trips), safetensors_header
#                (SafetensorsFile::Parse), config_json (ModelConfig + ExpectedTensors);
#                default: all
#
# Builds a separate clang tree in build-fuzz/ (only the modules the targets use,
# compiled again with -fsanitize=fuzzer-no-link,address,undefined; see the
# DEEPINFER_BUILD_FUZZ block of CMakeLists.txt). Each target starts from the
# committed corpus fuzz/corpus/<target>/ (seeds and every crashing input found so
# far: tests/unit/fuzz_regression_test.cc runs them all in the normal build) plus
# generated seeds, keeps the growing corpus in build-fuzz/corpus/<target>/ and a
# crash reproducer in build-fuzz/artifacts/ (copy it into fuzz/corpus/<target>/
# once fixed). Prints the executions done per target. Exit status: 0 if no crash
# was found, else libFuzzer's. scripts/test.sh runs a short --runs pass of each.
# Reproduce a crash: build-fuzz/<target>_fuzz build-fuzz/artifacts/<target>-crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=(-runs=1000000)
SEED=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) LIMIT=(-runs="$2"); shift 2 ;;
    --seconds) LIMIT=(-max_total_time="$2"); shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    [0-9]*) LIMIT=(-max_total_time="$1"); shift ;;  # old form: SECONDS
    *) break ;;
  esac
done
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(http_request request_schema chat_render tokenizer safetensors_header config_json)
BUILD=build-fuzz

CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDEEPINFER_BUILD_FUZZ=ON -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_BUILD_BENCH=OFF >/dev/null
targets=()
for t in "${TARGETS[@]}"; do targets+=("${t}_fuzz"); done
cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}"
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

seed_http_request() { :; }
seed_request_schema() { :; }
seed_chat_render() { :; }
seed_tokenizer() { :; }

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
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "== fuzzing $t (${LIMIT[*]})"
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$BUILD/${t}_fuzz" "${LIMIT[@]}" -seed="$SEED" -max_len=8192 -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    "${dict[@]}" -artifact_prefix="$BUILD/artifacts/$t-" \
    "$corpus" "$seeds" "fuzz/corpus/$t" >"$BUILD/$t.log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$BUILD/$t.log" | grep -o "[0-9]*$" || echo "?")
  grep -E "ERROR|crash-" "$BUILD/$t.log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t: libFuzzer exited with status $rc after $execs executions; see $BUILD/$t.log and $BUILD/artifacts/"
    status=$rc
  else
    echo "fuzz: $t: $execs executions, no crash (log: $BUILD/$t.log)"
  fi
done
exit "$status"
