#!/usr/bin/env bash
# End-to-end test of `deepinfer serve`: starts the server on the tiny V4.1
# checkpoint on a free loopback port and drives it with the official `openai`
# npm client (node's test runner). Runs tests/server/*.test.mjs by default, or
# the file given as the third argument with the serve flags after it in
# place of the defaults (structured_e2e.sh).
# Usage: server_e2e.sh <path-to-deepinfer> <source-dir> [test-file [serve flags...]]
# Uses $DEEPINFER_TINY_DIR when it holds a checkpoint, else makes one with make-tiny.
# DEEPINFER_SERVE_LAUNCH (e.g. "mpirun --oversubscribe -np 2") and DEEPINFER_SERVE_ARGS
# (e.g. "--ep 2") run the same suite against a parallel job (tests/cli/server_mpi.sh).
# DEEPINFER_E2E_TEST_PATTERN runs only the tests whose names match (node --test-name-pattern).
set -euo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
NPM_DIR="$SRC/tools/npm"
TESTS=("$SRC"/tests/server/*.test.mjs)
FLAGS=(--max-model-len 256 --max-num-seqs 16 --max-num-batched-tokens 512 --max-request-bytes 1000000)
if [ $# -ge 3 ]; then TESTS=("$3"); FLAGS=("${@:4}"); fi

command -v node >/dev/null || { echo "server_e2e: node is not installed (scripts/setup.sh installs it)"; exit 1; }
[ -d "$NPM_DIR/node_modules/openai" ] || { echo "server_e2e: $NPM_DIR/node_modules/openai is missing: run scripts/setup.sh"; exit 1; }

WORK=$(mktemp -d)
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

MODEL="${DEEPINFER_TINY_DIR:-}"
if [ -z "$MODEL" ] || [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
  MODEL="$WORK/tiny"
  "$BIN" make-tiny --arch deepseek_v41 "$MODEL" >/dev/null
fi

API_KEY="e2e-$RANDOM$RANDOM"
# --port 0: the kernel picks a free port; the log line names it.
# shellcheck disable=SC2086
${DEEPINFER_SERVE_LAUNCH:-} "$BIN" serve "$MODEL" ${DEEPINFER_SERVE_ARGS:-} --host 127.0.0.1 --port 0 --served-model-name tiny --api-key "$API_KEY" \
  "${FLAGS[@]}" \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!

PORT=""
for _ in $(seq 1 300); do
  PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$WORK/server.log" | head -1 | sed 's/.*://' || true)
  [ -n "$PORT" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "server_e2e: server exited:"; cat "$WORK/server.log"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "server_e2e: no port in the log"; cat "$WORK/server.log"; exit 1; }

set +e
DEEPINFER_URL="http://127.0.0.1:$PORT" DEEPINFER_API_KEY="$API_KEY" DEEPINFER_NPM_DIR="$NPM_DIR" \
  timeout 800 node --test --test-reporter=spec ${DEEPINFER_E2E_TEST_PATTERN:+"--test-name-pattern=$DEEPINFER_E2E_TEST_PATTERN"} "${TESTS[@]}"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "server_e2e: node tests failed (rc=$rc); server log:"
  tail -n 50 "$WORK/server.log"
  exit 1
fi

# Graceful shutdown on SIGTERM (of a parallel job: to its leader, rank 0; docs/parallel.md).
STOP_PID="$SERVER_PID"
if [ -n "${DEEPINFER_SERVE_LAUNCH:-}" ]; then
  STOP_PID=$(grep -o 'rank 0/[0-9]* (pid [0-9]*' "$WORK/server.log" | head -1 | grep -o '[0-9]*$')
fi
kill -TERM "$STOP_PID"
for _ in $(seq 1 200); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$SERVER_PID" 2>/dev/null; then echo "server_e2e: server did not stop on SIGTERM"; exit 1; fi
wait "$SERVER_PID" || { echo "server_e2e: server exited with an error on SIGTERM"; tail -n 20 "$WORK/server.log"; exit 1; }
SERVER_PID=""
echo "server_e2e: ok"
