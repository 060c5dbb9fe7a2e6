#!/usr/bin/env bash
# The openai-client e2e suite (tests/cli/server_e2e.sh) against a server with
# speculative decoding on (n-gram drafts, docs/speculative.md): every answer
# the suite checks is unchanged, and /metrics has the spec_decode families
# with drafts verified and accepted (DEEPINFER_EXPECT_SPEC=1).
# Usage: server_spec.sh <path-to-deepinfer> <source-dir>
set -euo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
DEEPINFER_EXPECT_SPEC=1 \
  DEEPINFER_SERVE_ARGS='--speculative-config {"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":3}' \
  bash "$SRC/tests/cli/server_e2e.sh" "$BIN" "$SRC"
echo "server_spec: OK"
