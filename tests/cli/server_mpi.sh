#!/usr/bin/env bash
# `deepinfer serve` as a parallel job (docs/parallel.md), on the tiny V4.1 checkpoint:
#  1. under `mpirun -np 2 ... --ep 2` the openai-client e2e suite passes unchanged
#     (tests/cli/server_e2e.sh with a launcher);
#  2. with --ep 2 --dp 2 a request that arrives while the other rank is in a long
#     decode is served at once (it finishes first);
#  3. after a follower is killed (mpirun --enable-recovery keeps the leader alive)
#     new requests get 503 within 10 s, and the leader still stops cleanly.
# Usage: server_mpi.sh <path-to-deepinfer> <source-dir>
set -euo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
TINY="${DEEPINFER_TINY_DIR:?DEEPINFER_TINY_DIR not set}"
command -v mpirun >/dev/null || { echo "server_mpi: mpirun is not installed (scripts/setup.sh installs openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
fail() { echo "FAIL: $*"; exit 1; }

# ---- 1. the e2e suite against an expert-parallel server
DEEPINFER_SERVE_LAUNCH="mpirun --oversubscribe --bind-to none -np 2" DEEPINFER_SERVE_ARGS="--ep 2 --threads 1" \
  bash "$SRC/tests/cli/server_e2e.sh" "$BIN" "$SRC" || fail "e2e suite under mpirun -np 2 --ep 2"

# ---- 2 and 3: data-parallel server
T="$(mktemp -d)"
MP=""
cleanup() {
  [ -n "$MP" ] && kill -KILL "$MP" 2>/dev/null || true
  pkill -KILL -f "$T/marker" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
mpirun --oversubscribe --bind-to none --enable-recovery -np 2 "$BIN" serve "$TINY" --ep 2 --dp 2 --threads 1 \
  --host 127.0.0.1 --port 0 --max-model-len 1024 --served-model-name "$T/marker" \
  >"$T/server.log" 2>&1 &
MP=$!
PORT=""
for _ in $(seq 1 300); do
  PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$T/server.log" | head -1 | sed 's/.*://' || true)
  [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$MP" 2>/dev/null || fail "server exited: $(cat "$T/server.log")"
  sleep 0.2
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || fail "server not healthy: $(tail "$T/server.log")"
python3 - "$PORT" "$T/marker" <<'PY'
import json, sys, threading, time, urllib.request
port, model = sys.argv[1], sys.argv[2]
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())
done = {}
def run(name, body):
    out = post(body)
    done[name] = (time.time(), out)
long = threading.Thread(target=run, args=("long", {"model": model, "prompt": "Once upon a time", "max_tokens": 1000,
                                                   "ignore_eos": True, "temperature": 0}))
long.start()
# The long request is decoding on rank 0 after a few ms; the tiny model decodes 1000 tokens in
# about 2 s on an idle machine (400 took 0.7 s: the late request came after it had finished).
time.sleep(0.3)
t0 = time.time()
run("short", {"model": model, "prompt": "A late request", "max_tokens": 4, "temperature": 0})
long.join()
assert done["short"][1]["usage"]["completion_tokens"] == 4, done["short"]
assert done["long"][1]["usage"]["completion_tokens"] == 1000, done["long"][1]["usage"]
assert done["short"][0] < done["long"][0], "the late request waited for the long decode"
print(f"late request served in {done['short'][0] - t0:.2f} s while the long one decoded "
      f"(it finished {done['long'][0] - done['short'][0]:.2f} s later)")
# Prefix caching through the API: the same 40-token prompt twice; the second reports cached tokens.
prompt = list(range(1000, 1040))
u1 = post({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0})
u2 = post({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0})
assert u1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, u1["usage"]
assert u2["usage"]["prompt_tokens_details"]["cached_tokens"] == 32, u2["usage"]  # 2 full blocks of 16
assert u1["choices"][0]["text"] == u2["choices"][0]["text"]
print("usage.prompt_tokens_details.cached_tokens: 0 cold, 32 on the repeat")
PY

# 3. lose the follower
FPID=$(grep -o 'rank 1/2 (pid [0-9]*' "$T/server.log" | grep -o '[0-9]*$') || fail "no follower pid"
LPID=$(grep -o 'rank 0/2 (pid [0-9]*' "$T/server.log" | grep -o '[0-9]*$') || fail "no leader pid"
kill -KILL "$FPID"
code=""
for _ in $(seq 1 100); do
  code=$(curl -s -o "$T/resp.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" \
    -H 'Content-Type: application/json' -d "{\"model\": \"$T/marker\", \"prompt\": \"hi\", \"max_tokens\": 2}" || true)
  [ "$code" = "503" ] && break
  sleep 0.1
done
[ "$code" = "503" ] || fail "no 503 within 10 s of losing a rank (last $code: $(cat "$T/resp.json"))"
grep -q "rank 1" "$T/resp.json" || fail "the 503 should name the lost rank: $(cat "$T/resp.json")"
hc=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" || true)
[ "$hc" = "503" ] || fail "/health answers $hc after a rank was lost"
echo "lost rank: 503 with $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['error']['message'][:90])" "$T/resp.json")"
kill -TERM "$LPID"
for _ in $(seq 1 100); do kill -0 "$MP" 2>/dev/null || break; sleep 0.1; done
kill -0 "$MP" 2>/dev/null && fail "the job did not stop on SIGTERM to its leader"
MP=""
sleep 0.3
if pgrep -f "$T/marker" >/dev/null; then fail "processes left: $(pgrep -af "$T/marker")"; fi
echo "server_mpi: ok"
