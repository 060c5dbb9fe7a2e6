#!/usr/bin/env bash
# Scale-out over MPI (docs/parallel.md) on the tiny V4.1 checkpoint, with
# `mpirun --oversubscribe` on this machine:
#  * --ep 2/4 and --dp 2/4 --ep 2/4: the 64 English prompts give tokens and
#    logprobs bit-identical to one process, greedy, and seeded-sampled under
#    --max-num-batched-tokens 16 with a pool small enough to preempt;
#  * the static decode path and the general path (--dp-moe-exchange general)
#    give identical results on the same steps;
#  * DP spreads requests over the ranks and idle ranks run dummy steps;
#  * unsupported combinations are start-up errors naming the flags;
#  * killing a follower: the leader reports an error naming the rank within
#    10 s and exits non-zero; no process is left.
# Usage: parallel_mpi.sh <path-to-deepinfer> <source-dir>   (DEEPINFER_MPI_FULL=1: every configuration)
set -euo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
TINY="${DEEPINFER_TINY_DIR:?DEEPINFER_TINY_DIR not set}"
command -v mpirun >/dev/null || { echo "parallel_mpi: mpirun is not installed (scripts/setup.sh installs openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
MPIRUN=(mpirun --oversubscribe --bind-to none)
T="$(mktemp -d)"
trap 'pkill -KILL -f "$T/" 2>/dev/null || true; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PROMPTS="$SRC/tests/data/engine/english_prompts.jsonl"

compare() {  # compare REF OUT LABEL: token ids and logprobs equal for every line
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
label = sys.argv[3]
assert len(a) == len(b) == 64, (label, len(a), len(b))
for x, y in zip(a, b):
    assert "error" not in x and "error" not in y, (label, x.get("error"), y.get("error"))
    assert x["token_ids"] == y["token_ids"], (label, x["index"], x["token_ids"], y["token_ids"])
    assert x["logprobs"] == y["logprobs"], (label, x["index"], "logprobs differ")
    assert x["text"] == y["text"] and x["finish_reason"] == y["finish_reason"], (label, x["index"])
print(f"{label}: 64 prompts bit-identical to one process")
PY
}

# ---- greedy, logprobs
G=(generate --model "$TINY" --prompts "$PROMPTS" --threads 1 --temperature 0 --logprobs 3 --no-progress)
"$BIN" "${G[@]}" --output "$T/ref.jsonl" 2>"$T/ref.err" || fail "one process: $(cat "$T/ref.err")"
# CI runs the configurations that cover each code path once (--ep 4 alone runs the 4-way expert
# split that --ep 4 --dp 4 also runs, the sampled --ep 2 the path of the greedy one);
# DEEPINFER_MPI_FULL=1 runs every configuration.
FULL="${DEEPINFER_MPI_FULL:-0}"
GREEDY=("2 --ep 2" "2 --ep 2 --dp 2" "4 --ep 4 --dp 4")
SAMPLED=("2 --ep 2 --dp 2" "2 --ep 2 --dp 2 --dp-moe-exchange general" "4 --ep 4 --dp 4")
if [ "$FULL" = 1 ]; then
  GREEDY+=("4 --ep 4")
  SAMPLED+=("2 --ep 2")
fi
for cfg in "${GREEDY[@]}"; do
  read -r np flags <<<"$cfg"
  # shellcheck disable=SC2086
  "${MPIRUN[@]}" -np "$np" "$BIN" "${G[@]}" $flags --output "$T/out.jsonl" 2>"$T/err" ||
    fail "np $np $flags: $(tail -5 "$T/err")"
  compare "$T/ref.jsonl" "$T/out.jsonl" "greedy np $np $flags"
  grep -q "rank $((np - 1))/$np (pid" "$T/err" || fail "np $np: no per-rank weight report: $(cat "$T/err")"
  if [[ "$flags" == *--dp* ]]; then
    line=$(grep "generate: data parallel:" "$T/err") || fail "np $np $flags: no data-parallel summary"
    echo "  $line"
    python3 - "$line" "$np" <<'PY'
import re, sys
line, np = sys.argv[1], int(sys.argv[2])
counts = [int(x) for x in re.findall(r"rank \d+: (\d+) requests", line)]
dummy = [int(x) for x in re.findall(r"(\d+) dummy steps", line)]
assert len(counts) == np and sum(counts) == 64 and min(counts) >= 64 // np - 1, counts  # least-loaded spread
assert sum(dummy) > 0, ("idle ranks should run dummy steps", dummy)
PY
  fi
done

# ---- decode-shaped steps with multi-token chunks (short prompts as decodes) take the general exchange
printf '{"prompt":"a b c","max_tokens":4}\n{"prompt":"hello there friend","max_tokens":5}\n{"prompt":"The quick brown fox jumps over the lazy dog","max_tokens":5}\n' >"$T/short.jsonl"
SH=(generate --model "$TINY" --prompts "$T/short.jsonl" --threads 1 --temperature 0 --logprobs 2 --prompt-as-decode-max-tokens 8 --no-progress)
"$BIN" "${SH[@]}" --output "$T/shref.jsonl" 2>"$T/err" || fail "short prompts, one process: $(cat "$T/err")"
timeout 300 "${MPIRUN[@]}" -np 2 "$BIN" "${SH[@]}" --ep 2 --dp 2 --output "$T/sh.jsonl" 2>"$T/err" ||
  fail "short prompts as decodes, --dp 2: $(tail -5 "$T/err")"
python3 -c "
import json, sys
a, b = ([(j['token_ids'], j['logprobs']) for j in map(json.loads, open(f))] for f in sys.argv[1:])
assert a == b, 'short prompts as decodes differ'
print('prompt-as-decode chunks with --dp 2: bit-identical to one process')" "$T/shref.jsonl" "$T/sh.jsonl"

# ---- prompt_logprobs: every prompt row's logits gathered from the DP ranks
PL=(generate --model "$TINY" --prompts "$PROMPTS" --num-prompts 6 --threads 1 --temperature 0 --prompt-logprobs 2
    --max-num-batched-tokens 48 --no-progress)
"$BIN" "${PL[@]}" --output "$T/plref.jsonl" 2>"$T/err" || fail "prompt_logprobs, one process: $(cat "$T/err")"
"${MPIRUN[@]}" -np 2 "$BIN" "${PL[@]}" --ep 2 --dp 2 --output "$T/pl.jsonl" 2>"$T/err" ||
  fail "prompt_logprobs, np 2 --dp 2: $(tail -5 "$T/err")"
python3 - "$T/plref.jsonl" "$T/pl.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 6
for x, y in zip(a, b):
    assert x["prompt_logprobs"] and x["prompt_logprobs"][0] is None, x.get("error")
    assert len(x["prompt_logprobs"]) == x["prompt_tokens"]
    assert x["prompt_logprobs"] == y["prompt_logprobs"] and x["token_ids"] == y["token_ids"], x["index"]
print("prompt_logprobs np 2 --ep 2 --dp 2: bit-identical to one process")
PY

# ---- prefix caching on the DP ranks: every prompt twice; the hits equal a run without the cache
cat "$PROMPTS" "$PROMPTS" >"$T/dup.jsonl"
D=(generate --model "$TINY" --prompts "$T/dup.jsonl" --threads 1 --temperature 0 --logprobs 2 --max-num-seqs 4 --no-progress)
"$BIN" "${D[@]}" --no-enable-prefix-caching --output "$T/dref.jsonl" 2>"$T/err" || fail "no cache: $(cat "$T/err")"
"${MPIRUN[@]}" -np 2 "$BIN" "${D[@]}" --ep 2 --dp 2 --output "$T/d.jsonl" 2>"$T/err" || fail "cache, dp 2: $(tail -5 "$T/err")"
grep -q "generate: prefix cache: [1-9][0-9]* of" "$T/err" || fail "no prefix-cache hits with --dp 2: $(tail -3 "$T/err")"
python3 - "$T/dref.jsonl" "$T/d.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 128
assert all(x["token_ids"] == y["token_ids"] and x["logprobs"] == y["logprobs"] for x, y in zip(a, b))
hits = sum(y["cached_tokens"] for y in b)
assert hits > 0 and all(x["cached_tokens"] == 0 for x in a), hits
print(f"prefix caching with --ep 2 --dp 2: {hits} cached prompt tokens, bit-identical to no cache")
PY

# ---- seeded sampling, small token budget, a pool small enough to preempt
S=(generate --model "$TINY" --prompts "$PROMPTS" --threads 1 --temperature 0.9 --top-p 0.95 --seed 7 --logprobs 2
   --max-num-batched-tokens 16 --num-kv-blocks 16 --max-model-len 256 --no-progress)
"$BIN" "${S[@]}" --output "$T/sref.jsonl" 2>"$T/sref.err" || fail "one process (sampled): $(cat "$T/sref.err")"
grep -Eq "preemptions [1-9]" "$T/sref.err" || fail "the small pool did not force preemption: $(tail -1 "$T/sref.err")"
for cfg in "${SAMPLED[@]}"; do
  read -r np flags <<<"$cfg"
  # shellcheck disable=SC2086
  "${MPIRUN[@]}" -np "$np" "$BIN" "${S[@]}" $flags --output "$T/out.jsonl" 2>"$T/err" ||
    fail "np $np $flags: $(tail -5 "$T/err")"
  grep -Eq "preemptions [1-9]" "$T/err" || fail "np $np $flags: no preemption: $(tail -1 "$T/err")"
  compare "$T/sref.jsonl" "$T/out.jsonl" "sampled, budget 16, preempting, np $np $flags"
done

# ---- start-up errors name the flags
expect_error() {  # expect_error PATTERN CMD...
  local pat="$1"; shift
  if "$@" >"$T/e.out" 2>&1; then fail "expected an error ($pat): $*"; fi
  grep -q -- "$pat" "$T/e.out" || fail "error should mention '$pat': $(cat "$T/e.out")"
}
expect_error "mpirun -np 2" "$BIN" "${G[@]}" --ep 2 --output "$T/x.jsonl"
expect_error "--ep 1 must equal the number of ranks" timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${G[@]}" --output "$T/x.jsonl"
expect_error "--ep 3 does not divide" timeout 60 "${MPIRUN[@]}" -np 3 "$BIN" "${G[@]}" --ep 3 --output "$T/x.jsonl"
expect_error "--dp 2 is not supported with --ep 4" timeout 60 "${MPIRUN[@]}" -np 4 "$BIN" "${G[@]}" --ep 4 --dp 2 --output "$T/x.jsonl"
expect_error "--dp-moe-exchange" timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${G[@]}" --ep 2 --dp 2 --dp-moe-exchange fast --output "$T/x.jsonl"
echo "start-up errors: ok"

# ---- a follower killed mid-run
for i in $(seq 1 8); do echo "{\"prompt\": \"Long story number $i\", \"max_tokens\": 1800, \"ignore_eos\": true}"; done >"$T/long.jsonl"
"${MPIRUN[@]}" -np 2 "$BIN" generate --model "$TINY" --prompts "$T/long.jsonl" --output "$T/long.out" --threads 1 \
  --ep 2 --max-model-len 2048 --no-progress >"$T/kill.log" 2>&1 &
MP=$!
for _ in $(seq 1 300); do grep -q "rank 1/2 (pid" "$T/kill.log" && break; sleep 0.1; done
FPID=$(grep -o 'rank 1/2 (pid [0-9]*' "$T/kill.log" | grep -o '[0-9]*$') || fail "no follower pid: $(cat "$T/kill.log")"
sleep 1.5
kill -0 "$MP" 2>/dev/null || fail "the run ended before the follower was killed: $(tail -3 "$T/kill.log")"
kill -KILL "$FPID"
t0=$(date +%s.%N)
rc=0
for _ in $(seq 1 150); do kill -0 "$MP" 2>/dev/null || break; sleep 0.1; done
kill -0 "$MP" 2>/dev/null && fail "the job still runs 15 s after its follower was killed"
wait "$MP" || rc=$?
dt=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
[ "$rc" -ne 0 ] || fail "the job exited 0 after losing a rank"
grep -q "error: rank 1 (pid $FPID on .*) is gone" "$T/kill.log" || fail "the leader did not name the lost rank: $(tail -8 "$T/kill.log")"
python3 -c "import sys; sys.exit(0 if $dt < 10 else 1)" || fail "took ${dt} s to stop"
sleep 0.5
if pgrep -f "$T/long.jsonl" >/dev/null; then fail "processes left: $(pgrep -af "$T/long.jsonl")"; fi
echo "killed follower: leader named rank 1 and exited $rc within ${dt} s; no process left"
echo "parallel_mpi: ok"
