#!/usr/bin/env python3
"""Standard (--fp8-format e4m3fn) vs Neuron IEEE (--fp8-format e4m3-ieee) numerics on a prompt file.

Runs `deepinfer generate` twice on the same requests (greedy, top-20 logprobs of every generated
token) and prints a Markdown table: greedy agreement (requests whose whole continuation is identical,
and generated tokens that agree up to each request's first divergence), the top-20 overlap of the
first generated token, and the largest |Δlogprob| of the first token over the ids both top-20 lists
share. A figure, not a target. Standard library only.

--baseline adds a sensitivity reference: the standard mode against itself on a copy of the model
where one weight code (of layers.0.attn.wq_a) moved one E4M3 step.

Usage: scripts/fp8_format_compare.py BIN MODEL_DIR PROMPTS_JSONL [--threads N] [--json OUT] [--baseline]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile


def run(binary, model, prompts, fmt, threads, out_dir):
    out = os.path.join(out_dir, fmt + ".jsonl")
    cmd = [binary, "generate", "--model", model, "--prompts", prompts, "--output", out,
           "--temperature", "0", "--logprobs", "20", "--threads", str(threads), "--fp8-format", fmt]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(out)]
    for r in rows:
        if "error" in r:
            sys.exit(f"{fmt}: request {r['index']}: {r['error']}")
    return rows


def perturbed_copy(model, out_dir, tensor="layers.0.attn.wq_a.weight"):
    """A copy of MODEL where one E4M3 code of TENSOR moves up one step: the first code with exponent
    field 7 (a value of 1..2 times its block scale) and mantissa below 7. The sensitivity baseline."""
    dst = os.path.join(out_dir, "perturbed")
    os.makedirs(dst)
    done = None
    for f in os.listdir(model):
        src = os.path.join(model, f)
        if not f.endswith(".safetensors"):
            os.symlink(os.path.abspath(src), os.path.join(dst, f))
            continue
        data = bytearray(open(src, "rb").read())
        hl = struct.unpack("<Q", bytes(data[:8]))[0]
        header = json.loads(bytes(data[8:8 + hl]))
        if tensor in header:
            b0, b1 = header[tensor]["data_offsets"]
            for i in range(8 + hl + b0, 8 + hl + b1):
                if (data[i] >> 3) & 15 == 7 and data[i] & 7 < 7:
                    done = (i - 8 - hl - b0, data[i])
                    data[i] += 1
                    break
        open(os.path.join(dst, f), "wb").write(data)
    if done is None:
        sys.exit(f"{model}: no code to perturb in {tensor}")
    return dst, f"{tensor}[{done[0]}] 0x{done[1]:02x} -> 0x{done[1] + 1:02x}"


def compare(std, other):
    n = len(std)
    same_seq = first_same = tok_total = tok_agree = 0
    overlaps = []
    max_dlp = max_dlp_chosen = 0.0
    for s, e in zip(std, other):
        ts, te = s["token_ids"], e["token_ids"]
        same_seq += ts == te
        first_same += ts[:1] == te[:1]
        tok_total += len(ts)
        k = 0
        while k < min(len(ts), len(te)) and ts[k] == te[k]:
            k += 1
        tok_agree += k
        top_s = {t["token_id"]: t["logprob"] for t in s["logprobs"][0]["top_logprobs"]}
        top_e = {t["token_id"]: t["logprob"] for t in e["logprobs"][0]["top_logprobs"]}
        common = set(top_s) & set(top_e)
        overlaps.append(len(common) / max(len(top_s), 1))
        for t in common:
            max_dlp = max(max_dlp, abs(top_s[t] - top_e[t]))
        if ts[:1] == te[:1]:
            max_dlp_chosen = max(max_dlp_chosen, abs(s["logprobs"][0]["logprob"] - e["logprobs"][0]["logprob"]))
    return {
        "requests": n,
        "greedy_identical_requests": same_seq,
        "greedy_first_token_agreement": first_same,
        "generated_tokens": tok_total,
        "tokens_agreeing_before_first_divergence": tok_agree,
        "first_token_top20_overlap_mean": sum(overlaps) / n,
        "first_token_top20_overlap_min": min(overlaps),
        "first_token_max_abs_dlogprob_top20": max_dlp,
        "first_token_max_abs_dlogprob_chosen": max_dlp_chosen,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--baseline", action="store_true",
                    help="also compare e4m3fn with e4m3fn on a copy where one weight code moved one step")
    a = ap.parse_args()
    cols = {}
    with tempfile.TemporaryDirectory() as d:
        std = run(a.binary, a.model, a.prompts, "e4m3fn", a.threads, d)
        cols["e4m3fn vs e4m3-ieee"] = compare(std, run(a.binary, a.model, a.prompts, "e4m3-ieee", a.threads, d))
        if a.baseline:
            pdir, what = perturbed_copy(a.model, d)
            os.makedirs(os.path.join(d, "p"))
            cols[f"e4m3fn vs e4m3fn with {what}"] = compare(
                std, run(a.binary, pdir, a.prompts, "e4m3fn", a.threads, os.path.join(d, "p")))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(cols, f, indent=1)
    rows = [
        ("requests with an identical greedy continuation",
         lambda r: f"{r['greedy_identical_requests']} / {r['requests']}"),
        ("requests with the same first greedy token",
         lambda r: f"{r['greedy_first_token_agreement']} / {r['requests']}"),
        ("generated tokens agreeing before the first divergence",
         lambda r: f"{r['tokens_agreeing_before_first_divergence']} / {r['generated_tokens']}"),
        ("first-token top-20 overlap, mean (min)",
         lambda r: f"{r['first_token_top20_overlap_mean']:.3f} ({r['first_token_top20_overlap_min']:.2f})"),
        ("first-token max \\|Δlogprob\\| over the shared top-20 ids",
         lambda r: f"{r['first_token_max_abs_dlogprob_top20']:.3g}"),
        ("first-token \\|Δlogprob\\| of the greedy token, max (same token)",
         lambda r: f"{r['first_token_max_abs_dlogprob_chosen']:.3g}"),
    ]
    print("| measure | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, fmt in rows:
        print(f"| {name} | " + " | ".join(fmt(r) for r in cols.values()) + " |")


if __name__ == "__main__":
    main()
