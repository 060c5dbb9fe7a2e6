#!/usr/bin/env bash
# The openai-client e2e suite (tests/cli/server_e2e.sh) against a server with
# speculative decoding on (n-gram drafts, docs/speculative.md): the answers the
# suite checks are unchanged, and /metrics has the spec_decode families (promtool
# clean) with drafts verified and accepted (DEEPINFER_EXPECT_SPEC=1).
# By default a short variant (completions, chat, streaming, logprobs, stop strings,
# seeds, metrics) keeps CI time small; DEEPINFER_SPEC_E2E_FULL=1 runs the whole suite, and then the
# whole suite again with V4.1's DSpark drafter (k = 2; drafts verified, acceptance not required: the
# tiny drafter's weights are random).
# Usage: server_spec.sh <path-to-deepinfer> <source-dir>
set -euo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
PATTERN='^(completion|chat|streaming|logprobs and top_logprobs|stop strings|seed reproducibility|/metrics)'
[ "${DEEPINFER_SPEC_E2E_FULL:-0}" = 1 ] && PATTERN=''
DEEPINFER_EXPECT_SPEC=1 DEEPINFER_E2E_TEST_PATTERN="$PATTERN" \
  DEEPINFER_SERVE_ARGS='--speculative-config {"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":3}' \
  bash "$SRC/tests/cli/server_e2e.sh" "$BIN" "$SRC"
if [ "${DEEPINFER_SPEC_E2E_FULL:-0}" = 1 ]; then
  DEEPINFER_EXPECT_SPEC=drafts DEEPINFER_E2E_TEST_PATTERN='' \
    DEEPINFER_SERVE_ARGS='--speculative-config {"method":"dspark","num_speculative_tokens":2}' \
    bash "$SRC/tests/cli/server_e2e.sh" "$BIN" "$SRC"
fi
echo "server_spec: OK"
