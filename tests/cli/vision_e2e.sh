#!/usr/bin/env bash
# Images through the `openai` npm client (tests/server/vision.e2e.mjs) against
# `deepinfer serve` on the tiny vision model: chat with a base64 data URL,
# streaming and not, gives generate's text for the same input; bad images are
# 400s; text-only requests are bit-identical with and without an image request
# in the batch. Usage: vision_e2e.sh <path-to-deepinfer> <source-dir>
# Uses $DEEPINFER_TINY_VISION_DIR (else $DEEPINFER_TINY_DIR-vision, ctest's fixture) when it holds the
# checkpoint, else makes one.
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
# The reference answer: `deepinfer generate` on the same chat line.
B64=$(base64 -w0 "$SRC/tests/data/vision/image0.png")
printf '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%s"}}, {"type": "text", "text": "Describe this image."}]}], "max_tokens": 8, "temperature": 0}\n' "$B64" >"$WORK/p.jsonl"
# The same image as a local file path (generate only).
printf '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "%s"}}, {"type": "text", "text": "Describe this image."}]}], "max_tokens": 8, "temperature": 0}\n' "$SRC/tests/data/vision/image0.png" >>"$WORK/p.jsonl"
"$BIN" generate --model "$MODEL" --prompts "$WORK/p.jsonl" --output "$WORK/out.jsonl" --threads 1 2>/dev/null
read -r TEXT PT FILE_TEXT < <(python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert all("error" not in x for x in r), r
print(json.dumps(r[0]["text"]).replace(" ", "\\u0020"), r[0]["prompt_tokens"], json.dumps(r[1]["text"]).replace(" ", "\\u0020"))
' "$WORK/out.jsonl")
[ "$TEXT" = "$FILE_TEXT" ] || { echo "vision_e2e: a file path and a data URL of the same image gave different text"; exit 1; }
export VISION_EXPECTED_TEXT="$TEXT" VISION_PROMPT_TOKENS="$PT" VISION_DATA="$SRC/tests/data/vision"
DEEPINFER_TINY_DIR="$MODEL" exec bash "$SRC/tests/cli/server_e2e.sh" "$BIN" "$SRC" "$SRC/tests/server/vision.e2e.mjs" \
  --max-model-len 512 --max-num-seqs 16 --max-num-batched-tokens 256 --max-request-bytes 4000000 --threads 1
