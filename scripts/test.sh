#!/usr/bin/env bash
# Runs the whole test suite (ctest over the build from scripts/setup.sh).
# Usage: ./scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
