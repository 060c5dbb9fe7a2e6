#!/usr/bin/env bash
# Structured outputs and tool calling through the `openai` npm client
# (tests/server/structured.e2e.mjs) against `deepinfer serve` on the tiny
# model, with a context long enough for the tools prompt.
# Usage: structured_e2e.sh <path-to-deepinfer> <source-dir>
set -euo pipefail
SRC=$(realpath "$2")
exec bash "$SRC/tests/cli/server_e2e.sh" "$1" "$2" "$SRC/tests/server/structured.e2e.mjs" \
  --max-model-len 2048 --max-num-seqs 16 --max-num-batched-tokens 512 --max-request-bytes 4000000 --threads 1
