#!/usr/bin/env python3
"""Standard (--fp8-format e4m3fn) vs Neuron IEEE (--fp8-format e4m3-ieee) numerics on a prompt file.

Runs `deepinfer generate` twice on the same requests (greedy, top-20 logprobs of every generated
token) and prints a Markdown table: greedy agreement (requests whose whole continuation is identical,
and generated tokens that agree up to each request's first divergence), the top-20 overlap of the
first generated token, and the largest |Δlogprob| of the first token over the ids both top-20 lists
share. A figure, not a target. Standard library only.

Usage: scripts/fp8_format_compare.py BIN MODEL_DIR PROMPTS_JSONL [--threads N] [--json OUT]
"""
import argparse
import json
import os
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        std = run(a.binary, a.model, a.prompts, "e4m3fn", a.threads, d)
        ieee = run(a.binary, a.model, a.prompts, "e4m3-ieee", a.threads, d)
    n = len(std)
    same_seq = 0
    tok_total = tok_agree = 0
    first_same = 0
    overlaps = []
    max_dlp = 0.0
    max_dlp_chosen = 0.0
    for s, e in zip(std, ieee):
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
    res = {
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
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print("| measure | e4m3fn vs e4m3-ieee |")
    print("|---|---|")
    print(f"| requests with an identical greedy continuation | {same_seq} / {n} |")
    print(f"| requests with the same first greedy token | {first_same} / {n} |")
    print(f"| generated tokens agreeing before the first divergence | {tok_agree} / {tok_total} |")
    print(f"| first-token top-20 overlap, mean (min) | {res['first_token_top20_overlap_mean']:.4f} "
          f"({res['first_token_top20_overlap_min']:.2f}) |")
    print(f"| first-token max \\|Δlogprob\\| over the shared top-20 ids | {max_dlp:.3g} |")
    print(f"| first-token \\|Δlogprob\\| of the greedy token, max | {max_dlp_chosen:.3g} |")


if __name__ == "__main__":
    main()
