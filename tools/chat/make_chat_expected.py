#!/usr/bin/env python3
"""Regenerates tests/data/chat/expected.json: the prompts DeepSeek's official
encoders render for the conversations in tools/chat/chat_cases.json. The C++
test (tests/unit/chat_format_test.cc) renders the same conversations and must
produce identical strings.

The official encoders are Python files released with the models (no Jinja
chat template exists for V4/V4.1). They are not committed here; pass their
paths:

  python3 tools/chat/make_chat_expected.py --v4 /path/to/encoding_dsv4.py \
      --v41 /path/to/encoding_dsv41.py

  * V4:   encoding/encoding_dsv4.py of deepseek-ai/DeepSeek-V4-Flash (HF).
  * V4.1: encoding/encoding.py of deepseek-ai/DeepSeek-V4.1-Flash (HF).
Only the standard library is needed. Each case is rendered for every listed
encoding and thinking mode with encode_messages(messages, thinking_mode=...,
drop_thinking=..., reasoning_effort=...) and default BOS.
"""
import argparse
import copy
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--v4", required=True, help="official encoding_dsv4.py")
    ap.add_argument("--v41", required=True, help="official V4.1 encoding.py")
    ap.add_argument("--cases", default=os.path.join(HERE, "chat_cases.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "chat", "expected.json"))
    a = ap.parse_args()
    enc = {"v4": load(a.v4, "encoding_dsv4"), "v41": load(a.v41, "encoding_dsv41")}
    cases = json.load(open(a.cases, encoding="utf-8"))
    out = []
    for c in cases:
        for e in c["encodings"]:
            for mode in c["modes"]:
                kw = dict(thinking_mode=mode, drop_thinking=c.get("drop_thinking", True),
                          reasoning_effort=c.get("reasoning_effort"))
                prompt = enc[e].encode_messages(copy.deepcopy(c["messages"]), **kw)
                out.append({"name": c["name"], "encoding": e, "thinking_mode": mode,
                            "drop_thinking": kw["drop_thinking"], "reasoning_effort": kw["reasoning_effort"],
                            "messages": c["messages"], "expected": prompt})
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {a.out}: {len(out)} rendered prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
