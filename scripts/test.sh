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
