#!/usr/bin/env bash
# The image prompts of the golden set through `deepinfer generate` (docs/vision.md): the golden
# unexpanded ids (BOS <｜User｜> IMAGE "\nDescribe this image." <｜Assistant｜> </think>) with the PNG
# as "images", greedy, 9 tokens, logprobs 20, on the tiny vision checkpoint. For both cases (case 1
# goes through the bicubic upscale and padding): the 9 tokens equal the reference's token-wise
# greedy continuation, the first position's top-20 ids equal the golden last-position logits' top 20,
# and their logprobs equal the golden log-softmax within 1e-6.
# Usage: vision_golden.sh <path-to-deepinfer> <source-dir>
set -euo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
MODEL="${DEEPINFER_TINY_VISION_DIR:-${DEEPINFER_TINY_DIR:+${DEEPINFER_TINY_DIR}-vision}}"
if [ -z "$MODEL" ] || [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
  MODEL="$WORK/tiny-vision"
  "$BIN" make-tiny --arch deepseek_v41 --vision "$MODEL" >/dev/null
fi
DATA="$SRC/tests/data/vision"
python3 - "$DATA" "$WORK/p.jsonl" <<'PY'
import json, sys
data, out = sys.argv[1], sys.argv[2]
g = json.load(open(f"{data}/tokenwise_golden.json"))
with open(out, "w") as f:
    for p in g["prompts"]:
        f.write(json.dumps({"prompt_token_ids": p["prompt_unexpanded"], "images": [f"{data}/image{p['case']}.png"],
                            "max_tokens": len(p["generated"]), "temperature": 0, "logprobs": 20,
                            "ignore_eos": True}) + "\n")
PY
"$BIN" generate --model "$MODEL" --prompts "$WORK/p.jsonl" --output "$WORK/out.jsonl" --threads 1 2>"$WORK/err" \
  || { echo "vision_golden: generate failed: $(cat "$WORK/err")"; exit 1; }
python3 - "$DATA" "$WORK/out.jsonl" <<'PY'
import json, math, struct, sys
data, out = sys.argv[1], sys.argv[2]
g = json.load(open(f"{data}/tokenwise_golden.json"))
rows = [json.loads(l) for l in open(out)]
assert len(rows) == len(g["prompts"]), rows
for p, r in zip(g["prompts"], rows):
    k = p["case"]
    assert "error" not in r, r
    assert r["prompt_tokens"] == len(p["prompt"]), (k, r["prompt_tokens"], len(p["prompt"]))
    assert r["token_ids"] == p["generated"], (k, r["token_ids"], p["generated"])
    raw = open(f"{data}/tokenwise_case{k}_last.f32", "rb").read()
    lg = struct.unpack(f"<{len(raw) // 4}f", raw)
    m = max(lg)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in lg))
    want = sorted(range(len(lg)), key=lambda i: (-lg[i], i))[:20]
    top = r["logprobs"][0]["top_logprobs"]
    assert [t["token_id"] for t in top] == want, (k, [t["token_id"] for t in top], want)
    d = max(abs(t["logprob"] - (lg[t["token_id"]] - lse)) for t in top)
    assert d < 1e-6, (k, d)
    print(f"case {k}: 9 greedy tokens equal, top-20 ids equal, max |d logprob| {d:.2e}")
PY
# An image path that is not a regular file (or is too large) fails its line only, without reading it.
printf '{"prompt_token_ids": [0, 129264, 6], "images": ["/dev/zero"], "max_tokens": 2}\n{"prompt": "hi", "max_tokens": 2}\n' \
  >"$WORK/z.jsonl"
"$BIN" generate --model "$MODEL" --prompts "$WORK/z.jsonl" --output "$WORK/z_out.jsonl" --threads 1 2>/dev/null \
  || { echo "vision_golden: generate with /dev/zero as an image exited $?"; exit 1; }
python3 - "$WORK/z_out.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 2 and "not a regular file" in r[0].get("error", "") and "error" not in r[1], r
PY
# A model without a vision tower refuses image blocks (as the server's 400), never renders them as text.
if [ -n "${DEEPINFER_TINY_DIR:-}" ] && [ -f "$DEEPINFER_TINY_DIR/config.json" ]; then
  printf '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "%s"}}]}], "max_tokens": 2}\n' \
    "$DATA/image0.png" >"$WORK/t.jsonl"
  "$BIN" generate --model "$DEEPINFER_TINY_DIR" --prompts "$WORK/t.jsonl" --output "$WORK/t_out.jsonl" --threads 1 2>/dev/null
  grep -q '"error":"messages\[0\].content\[0\]: this model has no vision tower' "$WORK/t_out.jsonl" \
    || { echo "vision_golden: an image on a text-only model was not refused: $(cat "$WORK/t_out.jsonl")"; exit 1; }
fi
echo "vision_golden: OK"
