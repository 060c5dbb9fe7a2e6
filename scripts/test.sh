#!/usr/bin/env bash
# Runs the whole test suite (ctest over the build from scripts/setup.sh).
# Usage: ./scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j"$(nproc)"
# ctest runs tests in parallel; OpenMP workers that sleep instead of spinning keep
# oversubscribed cores from slowing every test down (results never depend on threads).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"

# Opt-in heavier runs (each builds its own tree; see the scripts):
#   DEEPINFER_SANITIZERS=1    ASan+UBSan unit tests and TSan server/engine-loop tests (scripts/sanitize.sh)
#   DEEPINFER_FUZZ_RUNS=N     N libFuzzer executions of every fuzz target (scripts/fuzz.sh --runs N),
#                             from seed DEEPINFER_FUZZ_SEED (default 1: the same run every time)
if [ "${DEEPINFER_SANITIZERS:-0}" = 1 ]; then ./scripts/sanitize.sh all; fi
if [ -n "${DEEPINFER_FUZZ_RUNS:-}" ]; then ./scripts/fuzz.sh --runs "$DEEPINFER_FUZZ_RUNS" --seed "${DEEPINFER_FUZZ_SEED:-1}"; fi
