#!/usr/bin/env bash
# Encode throughput on the Brown corpus (one encode per corpus file): C++
# (bench/tokenizer_bench, one thread) vs the JavaScript implementation, same
# documents, same run; prints the ratio. A benchmark, not a test. Usage: tools/tokenizer/bench.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
js=$(cd tools/npm && node ../tokenizer/bench_js.js --docs-out "$T/brown.json")
echo "$js"
DEEPINFER_BENCH_DOCS="$T/brown.json" OMP_NUM_THREADS=1 "$BUILD/bench/tokenizer_bench" \
  --benchmark_filter='BM_Encode|BM_EngramTokenMap' --benchmark_format=json > "$T/cpp.json"
python3 - "$T/cpp.json" "$js" <<'PY'
import json, sys
cpp = json.load(open(sys.argv[1]))
js = json.loads(sys.argv[2])
enc = next(b for b in cpp["benchmarks"] if b["name"].startswith("BM_Encode"))
eng = next(b for b in cpp["benchmarks"] if b["name"].startswith("BM_EngramTokenMap"))
cpp_mb = enc["bytes_per_second"] / 1e6
print(f"Brown corpus: {js['bytes']/1e6:.2f} MB, {js['ids']} ids")
print(f"C++ encode: {cpp_mb:.2f} MB/s   JS encode: {js['mb_per_s']:.2f} MB/s   ratio: {cpp_mb/js['mb_per_s']:.1f}x")
print(f"Engram compressed vocabulary (npm DeepSeek-V3 tokenizer): {int(eng['compressed_vocab'])}, "
      f"built in {eng['real_time']:.0f} ms")
PY
