#!/usr/bin/env python3
"""Throwaway-grade numpy emulation of the V4.1 ViT tower in BF16, for testing rounding hypotheses
against the golden ViT output without torch (see docs/vision.md, "Why the ViT is not bit-identical").

Every op follows the reference's op sequence (model spec 3.3.7, TINY_V41_VISION_SPEC.md section 4);
each BF16 rounding point is a named site so that it can be switched off (--off SITE), and the SDPA
form is selectable (--sdpa):
  math32  torch's math SDPA with the FP32 up-cast: q·s, k·s (s = hd^-1/4), FP32 scores, FP32
          softmax, FP32 P@V, one rounding of the output (what vit.cc implements);
  mathbf16  the math SDPA without up-cast: q·s, k·s, scores, probabilities and output each rounded;
  flash   torch's CPU flash kernel: FP32 q·k × hd^-1/2, exp(x − max) rounded to BF16 unnormalised,
          FP32 sum of the unrounded exps, FP32 P@V, × (1/sum), one rounding.
--noise SITE:ULPS adds uniform ±ULPS FP32-ulp noise before that site's rounding (a sensitivity
probe: how many golden-output values a small FP32-level difference at that site can move).

Usage: vit_emulate.py CKPT_DIR GOLDEN_DIR [--sdpa flash] [--off res1,act] [--noise o:16]
CKPT_DIR is `deepinfer make-tiny --arch deepseek_v41 --vision` output; GOLDEN_DIR holds golden.json
and caseK_patches.f32 / caseK_vit_out.f32 (tests/data/vision has the ViT files of both cases).
"""
import argparse
import json
import math
import os
import struct

import numpy as np

f32 = np.float32
f64 = np.float64


def read_bf16_tensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    hdr = json.loads(blob[8:8 + n])
    out = {}
    for k, e in hdr.items():
        if k == "__metadata__" or e["dtype"] != "BF16":
            continue
        b, end = e["data_offsets"]
        u = np.frombuffer(blob[8 + n + b:8 + n + end], dtype="<u2").astype(np.uint32) << 16
        out[k] = u.view(f32).reshape(e["shape"])
    return out


def bf16(x):
    """FP32 -> BF16 (round to nearest even), returned as FP32 values."""
    b = np.ascontiguousarray(x, dtype=f32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(f32)


class Emu:
    def __init__(self, W, cfg, sdpa, off, noise, seed=0):
        self.W, self.cfg, self.sdpa, self.off, self.noise = W, cfg, sdpa, off, noise
        self.rng = np.random.default_rng(seed)

    def r(self, site, x):
        x = np.asarray(x, dtype=f32)
        if site in self.noise:
            m = self.noise[site]
            x = (x.view(np.int32) + self.rng.integers(-m, m + 1, size=x.shape).astype(np.int32)).view(f32)
        return x if site in self.off else bf16(x)

    def linear(self, site, x, w, b=None):
        y = (x.astype(f64) @ w.T.astype(f64)).astype(f32)  # FP32 accumulation (order-insensitive here)
        if b is not None:
            y = (y + b).astype(f32)
        return self.r(site, y)

    def rms(self, site, x, w, eps=1e-6):
        ms = (x.astype(f64) ** 2).mean(-1, keepdims=True).astype(f32)
        rs = (f32(1) / np.sqrt((ms + f32(eps)).astype(f32))).astype(f32)
        return self.r(site, (w * (x * rs).astype(f32)).astype(f32))

    def attention(self, q, k, v):  # [H, n, hd] BF16 values
        hd = q.shape[-1]
        if self.sdpa in ("math32", "mathbf16"):
            s = f32(math.sqrt(1 / math.sqrt(hd)))
            rq = bf16 if self.sdpa == "mathbf16" else (lambda t: np.asarray(t, f32))
            qs, ks = rq((q * s).astype(f32)), rq((k * s).astype(f32))
            sc = rq(np.einsum("hqd,hkd->hqk", qs.astype(f64), ks.astype(f64)).astype(f32))
            e = np.exp((sc - sc.max(-1, keepdims=True)).astype(f64)).astype(f32)
            p = rq((e * (f32(1) / e.sum(-1, keepdims=True, dtype=f64).astype(f32))).astype(f32))
            o = np.einsum("hqk,hkd->hqd", p.astype(f64), v.astype(f64)).astype(f32)
            return self.r("o", o)
        sc = (np.einsum("hqd,hkd->hqk", q.astype(f64), k.astype(f64)).astype(f32) * f32(1 / math.sqrt(hd))).astype(f32)
        e = np.exp((sc - sc.max(-1, keepdims=True)).astype(f64)).astype(f32)
        ssum = e.sum(-1, keepdims=True, dtype=f64).astype(f32)
        dst = np.einsum("hqk,hkd->hqd", self.r("e", e).astype(f64), v.astype(f64)).astype(f32)
        return self.r("o", (dst * (f32(1) / ssum)).astype(f32))

    def vit(self, patches, nh, nw):
        W, c = self.W, self.cfg
        D, H = c["vision_dim"], c["vision_n_heads"]
        hd = D // H
        R = hd // 2
        inv = (f32(1) / (f32(c["vision_rope_theta"]) ** (np.arange(0, R, 2, dtype=f32) / f32(R))).astype(f32))
        hp, wp = np.meshgrid(np.arange(nh), np.arange(nw), indexing="ij")
        ang = np.concatenate([hp.reshape(-1, 1).astype(f32) * inv, wp.reshape(-1, 1).astype(f32) * inv], 1)
        cos = np.cos(ang.astype(f64)).astype(f32)[:, None, :]
        sin = np.sin(ang.astype(f64)).astype(f32)[:, None, :]

        def rot(t):
            x1, x2 = t[..., :R], t[..., R:]
            a = (x1 * cos).astype(f32) - (x2 * sin).astype(f32)
            b = (x2 * cos).astype(f32) + (x1 * sin).astype(f32)
            return self.r("rot", np.concatenate([a, b], -1))

        x = self.linear("pe", patches, W["vision.patch_embed.proj.weight"], W["vision.patch_embed.proj.bias"])
        n = x.shape[0]
        for blk in range(c["vision_n_layers"]):
            p = f"vision.blocks.{blk}."
            h = self.rms("n1", x, W[p + "norm1.weight"])
            qkv = self.linear("qkv", h, W[p + "attn.wqkv.weight"], W[p + "attn.wqkv.bias"])
            q, k, v = (t.reshape(n, H, hd) for t in np.split(qkv, 3, -1))
            o = self.attention(rot(q).transpose(1, 0, 2), rot(k).transpose(1, 0, 2), v.transpose(1, 0, 2))
            o = o.transpose(1, 0, 2).reshape(n, D)
            x = self.r("res1", x + self.linear("wo", o, W[p + "attn.wo.weight"], W[p + "attn.wo.bias"]))
            h = self.rms("n2", x, W[p + "norm2.weight"])
            g, u = np.split(self.linear("w1", h, W[p + "mlp.w1.weight"]), 2, -1)
            silu = (g.astype(f64) / (1 + np.exp(-g.astype(f64)))).astype(f32)
            a = self.r("act", self.r("silu", silu) * u)
            x = self.r("res2", x + self.linear("w2", a, W[p + "mlp.w2.weight"]))
        return self.rms("nf", x, W["vision.norm.weight"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("golden")
    ap.add_argument("--sdpa", default="math32", choices=["math32", "mathbf16", "flash"])
    ap.add_argument("--off", default="", help="comma-separated rounding sites to skip")
    ap.add_argument("--noise", default="", help="SITE:ULPS[,SITE:ULPS]")
    a = ap.parse_args()
    W = read_bf16_tensors(os.path.join(a.ckpt, "model.safetensors"))
    cfg = json.load(open(os.path.join(a.ckpt, "inference", "config.json")))
    off = set(s for s in a.off.split(",") if s)
    noise = {s.split(":")[0]: int(s.split(":")[1]) for s in a.noise.split(",") if s}
    g = json.load(open(os.path.join(a.golden, "golden.json")))
    for c in g["cases"]:
        k, nh, nw = c["case"], c["plan"]["n_vit_h"], c["plan"]["n_vit_w"]
        pt = np.fromfile(os.path.join(a.golden, f"case{k}_patches.f32"), dtype="<f4").reshape(nh * nw, -1)
        ref = np.fromfile(os.path.join(a.golden, f"case{k}_vit_out.f32"), dtype="<f4").reshape(nh * nw, -1)
        o = Emu(W, cfg, a.sdpa, off, noise).vit(pt, nh, nw)
        print(f"case {k}: {int((o != ref).sum())} / {ref.size} values differ, max |d| {float(np.abs(o - ref).max()):.4g}, "
              f"mean |d| {float(np.abs(o - ref).mean()):.4g}")


if __name__ == "__main__":
    main()
