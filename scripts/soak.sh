#!/usr/bin/env bash
# Soak test of `deepinfer serve` on the tiny model (not part of CI): N mixed
# requests (completions and chat, streaming and not, n = 1/2, logprobs,
# echo scoring), C at a time, a share of them cancelled by the client
# (streams closed after a few events, plain requests closed after 0.1-0.6 s),
# some sent by slow clients (the request dribbled out in small pieces), plus
# a few stalled connections that never finish their request line. Checks: no
# request lost, no error status, KV blocks back to 0, nothing running, and the
# server's RSS after the run within 1% of its RSS after a warm-up.
#
# Usage: scripts/soak.sh [--requests N] [--concurrency C] [--cancel-share F] [--binary PATH]
#   defaults: 2000, 16, 0.2, build/deepinfer. Prints the figures; exit 1 on a failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=2000 CONC=16 CANCEL=0.2 BIN=build/deepinfer
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) REQUESTS=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    --cancel-share) CANCEL=$2; shift 2 ;;
    --binary) BIN=$2; shift 2 ;;
    *) echo "soak: unknown argument $1"; exit 2 ;;
  esac
done
WORK=$(mktemp -d)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"$BIN" make-tiny --arch deepseek_v41 "$WORK/tiny" >/dev/null
"$BIN" serve --model "$WORK/tiny" --port 0 --served-model-name tiny --max-model-len 512 --max-num-seqs 16 \
  --max-num-batched-tokens 512 >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
PORT=""
for _ in $(seq 1 300); do
  PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$WORK/server.log" | head -1 | sed 's/.*://' || true)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || { echo "soak: the server did not start"; cat "$WORK/server.log"; exit 1; }

python3 - "$PORT" "$SERVER_PID" "$REQUESTS" "$CONC" "$CANCEL" <<'PY'
import json, random, re, socket, sys, threading, time
from concurrent.futures import ThreadPoolExecutor

port, pid, total, conc, cancel_share = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

def rss_kb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def http(method, path, body=None, timeout=120):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = json.dumps(body).encode() if body is not None else b""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
              f"Connection: close\r\n\r\n".encode() + data)
    out = b""
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
    s.close()
    head, _, rest = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest

def metrics():
    _, body = http("GET", "/metrics")
    m = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m

L = '{model_name="tiny"}'
for _ in range(600):
    try:
        if http("GET", "/health", timeout=5)[0] == 200: break
    except OSError: pass
    time.sleep(0.1)

def body_for(rng):
    kind = rng.choice(["comp", "comp", "chat", "chat", "score"])
    if kind == "score":
        return "/v1/completions", {"prompt": f"Score this sentence number {rng.randrange(1000)}", "echo": True,
                                    "logprobs": 1, "max_tokens": 0, "temperature": 0}
    b = {"max_tokens": rng.randint(4, 24), "temperature": rng.choice([0, 0.8]), "seed": rng.randrange(100)}
    if rng.random() < 0.3: b["n"] = 2
    if rng.random() < 0.3: b["logprobs"] = True if kind == "chat" else 2
    if kind == "chat" and b.get("logprobs"): b["top_logprobs"] = 2
    if rng.random() < 0.5: b["stream"] = True
    if kind == "comp":
        b["prompt"] = f"Request {rng.randrange(10**6)}: once upon a time"
        return "/v1/completions", b
    b["messages"] = [{"role": "user", "content": f"Hello number {rng.randrange(10**6)}"}]
    return "/v1/chat/completions", b

stats = {"ok": 0, "cancelled": 0, "errors": 0, "lost": 0, "slow": 0}
lock = threading.Lock()
errors = []

def one(i):
    rng = random.Random(i)
    path, b = body_for(rng)
    cancel = rng.random() < cancel_share
    slow = rng.random() < 0.05
    data = json.dumps(b).encode()
    req = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
           f"Connection: close\r\n\r\n").encode() + data
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=300)
        if slow:  # a slow client: the request in 8 pieces, 100 ms apart
            step = max(1, len(req) // 8)
            for k in range(0, len(req), step):
                s.sendall(req[k:k + step]); time.sleep(0.1)
        else:
            s.sendall(req)
        if cancel:
            if b.get("stream"):
                got = b""
                while got.count(b"data: ") < 2:
                    x = s.recv(4096)
                    if not x: break
                    got += x
            else:
                time.sleep(rng.uniform(0.1, 0.6))
            s.close()
            with lock: stats["cancelled"] += 1
            return
        out = b""
        while True:
            x = s.recv(65536)
            if not x: break
            out += x
        s.close()
        head, _, rest = out.partition(b"\r\n\r\n")
        status = int(head.split()[1]) if head else 0
        complete = (b"data: [DONE]" in rest) if b.get("stream") else rest.strip().endswith(b"}")
        with lock:
            if status != 200:
                stats["errors"] += 1; errors.append((status, rest[:200]))
            elif b"\"error\"" in rest and b.get("stream"):
                stats["errors"] += 1; errors.append((status, rest[-300:]))
            elif not complete:
                stats["lost"] += 1
            else:
                stats["ok"] += 1
            if slow: stats["slow"] += 1
    except Exception as e:
        with lock:
            stats["lost"] += 1; errors.append(("exception", repr(e)))

# Warm-up (allocator, caches, OpenMP pools), then the baseline RSS.
with ThreadPoolExecutor(conc) as ex: list(ex.map(one, range(10**6, 10**6 + 200)))
time.sleep(1)
for k in stats: stats[k] = 0
errors.clear()
rss0 = rss_kb()
print(f"soak: warm-up done, RSS {rss0} kB", flush=True)
# A few stalled connections that never finish their request line.
stalled = []
for _ in range(50):
    c = socket.create_connection(("127.0.0.1", port)); c.sendall(b"POST /v1/comp"); stalled.append(c)
t0 = time.time()
rss_trace = []  # (requests done, RSS kB): a leak grows with the count, warm-up levels off
done = [0]
def one_traced(i):
    one(i)
    with lock:
        done[0] += 1
        if done[0] % max(1, total // 10) == 0:
            rss_trace.append((done[0], rss_kb()))
            print(f"soak: {done[0]} done, RSS {rss_trace[-1][1]} kB", flush=True)
with ThreadPoolExecutor(conc) as ex: list(ex.map(one_traced, range(total)))
elapsed = time.time() - t0
for c in stalled: c.close()
# Everything back?
deadline = time.time() + 30
while True:
    m = metrics()
    used, running = m[f"deepinfer_kv_cache_blocks_used{L}"], m[f"deepinfer_num_requests_running{L}"]
    if (used == 0 and running == 0) or time.time() > deadline: break
    time.sleep(0.2)
time.sleep(1)
rss1 = rss_kb()
growth = (rss1 - rss0) / rss0 * 100
aborts = m['deepinfer_request_success_total{model_name="tiny",finished_reason="abort"}']

print(f"soak: {total} requests in {elapsed:.1f} s, {conc} concurrent: ok {stats['ok']}, cancelled {stats['cancelled']} "
      f"(engine aborts so far {aborts:.0f}), slow clients {stats['slow']}, errors {stats['errors']}, lost {stats['lost']}")
print(f"soak: KV blocks used after {used:.0f}, running {running:.0f}; RSS {rss0} kB after warm-up -> {rss1} kB "
      f"({growth:+.2f}%)")
print("soak: RSS trace (requests: kB): " + ", ".join(f"{n}: {r}" for n, r in rss_trace))
for e in errors[:5]: print("soak: error:", e)
ok = stats["errors"] == 0 and stats["lost"] == 0 and used == 0 and running == 0 and growth < 1.0 \
     and stats["ok"] + stats["cancelled"] == total
print("soak: PASS" if ok else "soak: FAIL")
sys.exit(0 if ok else 1)
PY
