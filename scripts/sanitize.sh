#!/usr/bin/env bash
# Sanitizer runs (part of scripts/test.sh, so of CI):
#   asan: an AddressSanitizer + UndefinedBehaviorSanitizer build of the unit
#         tests (build-asan/; UBSan without its vptr check, see CMakeLists.txt),
#         every gtest binary run by ctest, less the heavy runs listed below;
#   tsan: a ThreadSanitizer build of the engine-loop and server tests
#         (build-tsan/: server_test, server_http_test, engine_test).
# Any report fails the run. Usage: scripts/sanitize.sh [asan|tsan|all] (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
jobs="$(nproc)"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

# The tiny checkpoints the tests run on are made by the normal build's binary (the same bytes
# whichever build writes them), so these trees build neither the CLI nor its shell tests (those
# run in the normal build). The kernels are compiled for AVX-512 and AVX2 only (ASan) or AVX2 only
# (TSan: it checks the threads, not the SIMD code), not for the portable fallback that no machine
# running this script uses: see DEEPINFER_SIMD in CMakeLists.txt.
fixture_bin="$PWD/build/deepinfer"
if [ ! -f build/build.ninja ]; then
  echo "sanitize: build/ is not configured: run ./scripts/setup.sh first" >&2
  exit 2
fi
cmake --build build --target deepinfer >/dev/null  # current with the sources (make-tiny writes the fixtures)
configure() {  # dir sanitizers simd
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_SANITIZE="$2" -DDEEPINFER_SIMD="$3" \
    -DDEEPINFER_FIXTURE_BINARY="$fixture_bin" -DDEEPINFER_BUILD_BENCH=OFF >/dev/null
}

if [ "$what" = all ] || [ "$what" = asan ]; then
  t0=$(date +%s)
  configure build-asan "address,undefined" avx2-up
  cmake --build build-asan -j"$jobs"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # The unit tests (gtest binaries). The
  # acceptance-sized invariance runs below (64 prompts, 400 seeds, every target) take 25-470 s
  # each under ASan and add no code path that their smaller siblings (V41Golden.BatchEqualsAlone,
  # SpeculativeTiny.Sampled*, PrefixCacheTiny.PromptLogprobs*, V4EngineTiny.Chunked*, ...) do not
  # run here; they run in the normal build (scripts/test.sh).
  heavy='^(SpeculativeTiny\.(NgramGreedy|FirstThreeSampled)|Fp8Formats/EngineTiny\.SixtyFour|PrefixCacheTiny\.(EnglishPrompts|SharedPrefix|ConcurrentCommon)'
  heavy+='|V4EngineTiny\.EnglishPrompts|V41Golden\.(ChunkedPrefill|SameBitsOnEveryTarget)|PromptLogprobsTiny\.SameEntries|V4SpeculativeTiny\.(Mtp|Ngram)'
  # 92 s under ASan: the DSpark drafter and its engine path (drafts, verification, batched, alone) run
  # here in DsparkSpeculativeTiny.SeededSampled* and V41DsparkGolden.*; its budget-16 and
  # preemption runs only in the normal build.
  heavy+='|DsparkSpeculativeTiny\.GreedyIsBitIdentical'
  # 22-27 s each under ASan: the allocation counts of the steady-state step plans over 100 steps
  # (a malloc hook; counted in the normal build). The planned decode steps run here in the other
  # V41StepPlan.* / V4StepPlan.* tests (plan == eager, 1/2/3 threads, the V4.1 decode count), the
  # DSpark draft step in DsparkSpeculativeTiny.SeededSampled* and V41DsparkGolden.*.
  heavy+='|V41StepPlan\.SteadyStateDsparkDraftStepMakesNoHeapAllocation|V4StepPlan\.SteadyStateDecodeMakesNoHeapAllocation)'
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -E "$heavy"
  echo "sanitize: asan+ubsan unit tests passed in $(( $(date +%s) - t0 )) s"
fi

if [ "$what" = all ] || [ "$what" = tsan ]; then
  t0=$(date +%s)
  configure build-tsan "thread" avx2
  cmake --build build-tsan -j"$jobs" --target server_test server_http_test engine_test
  # libgomp is not built with TSan: its own synchronisation is invisible to it.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp"
  export OMP_NUM_THREADS=1
  ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R '^(HttpServer|HttpHardening|OpenAi|Engine|fixture_)'
  echo "sanitize: tsan engine-loop and server tests passed in $(( $(date +%s) - t0 )) s"
fi
