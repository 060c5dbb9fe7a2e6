#!/usr/bin/env bash
# CLI smoke test of `deepinfer bench kernels` and `deepinfer bench e2e`: they
# run, write JSON with the documented keys (same-run triad_gbps at the top,
# fraction_of_triad / fraction_of_sgemm per measurement) and fail cleanly on
# bad input. Not a measurement: tiny sizes, one rep.
# Usage: tests/cli/bench.sh BUILD/deepinfer [SOURCE_DIR]   (DEEPINFER_TINY_DIR: the tiny model)
set -euo pipefail
BIN=${1:?usage: bench.sh path/to/deepinfer [source_dir]}
TMP=$(mktemp -d /tmp/bench_sh.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The output folder need not exist (README: --json out/kernels.json in a fresh clone).
"$BIN" bench kernels --quick --reps 1 --gemm-m 64 --json "$TMP/out/k.json" --png "$TMP/k.png" >"$TMP/k.out" \
  || fail "bench kernels failed: $(cat "$TMP/k.out")"
python3 - "$TMP/out/k.json" <<'PY' || fail "bench kernels JSON"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["triad_gbps"] > 0, "triad_gbps"
assert j["gemv"] and all(g["fraction_of_triad"] > 0 and g["gbps"] > 0 for g in j["gemv"]), "gemv"
assert {g["format"] for g in j["gemv"]} >= {"fp8", "fp4", "bf16"}, "gemv formats"
assert j["gemm"] and all(g["fraction_of_sgemm"] > 0 and g["M"] == 64 for g in j["gemm"]), "gemm"
# --reps 1: one sgemm / kernel pair per case, and the fraction is that pair's ratio.
assert all(len(g["pair_fractions"]) == 1 and g["fraction_of_sgemm"] == g["pair_fractions"][0]
           for g in j["gemm"]), "gemm pair fractions"
assert j["machine"]["dispatch_target"], "target"
PY
if command -v gnuplot >/dev/null; then [ -s "$TMP/k.png" ] || fail "no PNG"; fi

if [ -n "${DEEPINFER_TINY_DIR:-}" ]; then
  "$BIN" bench e2e --model "$DEEPINFER_TINY_DIR" --json "$TMP/e.json" --batches 1 2 --prompt-len 3 \
    --decode-steps 2 >"$TMP/e.out" || fail "bench e2e failed: $(cat "$TMP/e.out")"
  python3 - "$TMP/e.json" <<'PY' || fail "bench e2e JSON"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["triad_gbps"] > 0
assert j["active_weights"]["bytes_per_token"] > 0
runs = j["runs"]
assert [r["batch"] for r in runs] == [1, 2]
for r in runs:
    assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["fraction_of_triad"] > 0
PY
fi

# Errors: one line, exit 2.
rc=0
"$BIN" bench e2e --model "$TMP/missing" --json "$TMP/x.json" >/dev/null 2>"$TMP/err" || rc=$?
[ "$rc" -eq 2 ] || fail "missing model exited $rc"
[ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q '^error: ' "$TMP/err" || fail "stderr: $(cat "$TMP/err")"
# Bad arguments fail before anything is measured (well under the STREAM pass),
# with one error line naming the flag.
expect_err() {  # expect_err PATTERN ARGS...
  local pat=$1; shift
  local rc=0
  timeout 20 "$BIN" "$@" >/dev/null 2>"$TMP/err" || rc=$?
  [ "$rc" -eq 2 ] || fail "$* exited $rc: $(cat "$TMP/err")"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "^error: .*$pat" "$TMP/err" || fail "$*: $(cat "$TMP/err")"
}
expect_err -- '--gemm-m' bench kernels --quick --json "$TMP/bad.json" --gemm-m 0
expect_err -- '--gemm-m' bench kernels --quick --json "$TMP/bad.json" --gemm-m -5
expect_err -- '--reps' bench kernels --quick --json "$TMP/bad.json" --reps 0
expect_err -- '--json' bench kernels --quick --json /proc/deepinfer-bench/x.json
expect_err -- '--json' bench kernels --quick --json "$TMP"
expect_err -- '--json' bench e2e --model "$TMP/missing" --json /proc/deepinfer-bench/e.json
expect_err -- '--prompt-len' bench e2e --model "$TMP/missing" --json "$TMP/bad.json" --prompt-len 100000000
expect_err -- '--decode-steps' bench e2e --model "$TMP/missing" --json "$TMP/bad.json" --decode-steps 0
expect_err -- '--batches' bench e2e --model "$TMP/missing" --json "$TMP/bad.json" --batches 100000000
expect_err -- 'config.json' bench e2e --model "$TMP" --json "$TMP/bad.json"
[ ! -e "$TMP/bad.json" ] || fail "a failed check left an output file"
echo "bench.sh: ok"
