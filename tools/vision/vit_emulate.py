#!/usr/bin/env python3
"""numpy emulation of the V4.1 ViT tower in BF16 with every FP32 operation of the reference's CPU
kernels (torch 2.14, AVX2 dispatch), for testing rounding hypotheses against the golden ViT output
without torch (docs/vision.md, "Bit-identical ViT"). The defaults reproduce the golden output of both
cases bit for bit (0 differing values), as vit.cc does.

Switches (each a hypothesis that was measured; docs/vision.md lists the counts):
  --sdpa   flash-fexp  torch's CPU flash kernel for BF16 as in torch 2.14 (default): scores q.k of
                       the BF16 q, k in FP32, x fl32(1/sqrt(hd)), exp(s - max) with ATen's
                       fexp_u20 over the first n - n%8 keys (std::exp on the tail), FP32 sum of the
                       unrounded exps in the kernel's lane order (16-wide loop of two 8-lane halves,
                       one 8-lane step, AVX2 reduce_all, scalar tail), P = BF16(exp), P.V in FP32,
                       x (1/sum), one rounding;
           flash-expu20 the older flash kernel: exp_u20 (8-lane loop), 8-lane sum;
           flash-exact  the flash form with a correctly rounded exp;
           math32      torch's math SDPA with the FP32 up-cast (q.s, k.s, s = fl32(hd^-1/4), FP32
                       softmax with the 8-lane sum, FP32 P.V, one rounding);
           mathbf16    the math SDPA without up-cast (every intermediate rounded to BF16);
           a comma list gives one form per layer.
  --lin    aten        ATen's dot_with_fp32_arith (8 registers x 8 lanes per 64-block, register
                       tree, AVX2 lane tree, 16-wide tail, scalar tail) (default);
           f64         correctly rounded FP32 dot; seq: sequential FP32 in increasing k;
           dp-intel / dp-even / dp-pair  vdpbf16ps-style pairs ((acc+p1)+p0, (acc+p0)+p1,
                       acc+(p0+p1)); lanesLxI: L lanes x I accumulators, lane tree, scalar tail.
  --kblk N  sums of K-blocks of N added afterwards (with seq / dp-*).
  --off SITES        skip the BF16 rounding at these sites (pe, n1, qkv, rotq, rotk, e, o, wo, res1, n2,
                     w1, silu, act, w2, res2, nf);
  --noise SITE:ULPS  uniform +-ULPS FP32-ulp noise before that site's rounding;
  --flip-search WIN  for each case, flip every single rounding whose FP32 value lies within WIN
                     FP32 ulps of a BF16 midpoint and print the flips that leave fewest differences
                     (how the one patch-embedding rounding that exposed the linears' order was found).

Usage: vit_emulate.py CKPT_DIR GOLDEN_DIR [switches]
CKPT_DIR is `deepinfer make-tiny --arch deepseek_v41 --vision` output; GOLDEN_DIR holds golden.json
and caseK_patches.f32 / caseK_vit_out.f32 (the shared tiny-v41-vision vectors).
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
        if k == "__metadata__" or e["dtype"] != "BF16" or not k.startswith("vision."):
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


def bf16_other(x):
    """The BF16 neighbour of x that round-to-nearest-even did not choose (x itself if exact)."""
    r = bf16(x)
    u = r.view(np.uint32).astype(np.int64)
    nxt = np.where((x > r) ^ (r < 0), u + 0x10000, u - 0x10000).astype(np.uint32).view(f32)
    return np.where(x == r, r, nxt)


def fma(a, b, c):  # single rounding (exact in FP64 for the operands met here)
    return (np.asarray(a, f32).astype(f64) * np.asarray(b, f32).astype(f64) + np.asarray(c, f32).astype(f64)).astype(f32)


def bits(h):
    return np.array([h], dtype=np.uint32).view(f32)[0]


LOG2E, LN2, LN_MIN, LN_MAX = bits(0x3FB8AA3B), bits(0x3F317218), bits(0xC2AEAC50), bits(0x42B17218)


def exp_u20(x):
    """ATen Vectorized<float>::exp_u20 (AVX2): 2^n * quintic(r), r = x - n ln2 (one FMA)."""
    x = np.asarray(x, f32)
    src = np.maximum(np.minimum(x, LN_MAX), LN_MIN)
    fx = np.floor(fma(src, LOG2E, f32(0.5)))
    r = (src.astype(f64) - fx.astype(f64) * f64(LN2)).astype(f32)
    res = fma(r, f32(0.00828929059), f32(0.0418978221))
    for c in (f32(0.166676521), f32(0.499991506), f32(0.999999701), f32(1)):
        res = fma(r, res, c)
    tp = (((fx - f32(1)).astype(np.int64) + 127) << 23).astype(np.uint32).view(f32)
    tp = np.where(x < LN_MIN, f32(0), tp)
    return ((res * tp).astype(f32) * f32(2)).astype(f32)


def fexp_u20(x):
    """ATen Vectorized<float>::fexp_u20 (AVX2): 2^(x log2 e) with a cubic correction of the
    fraction, the exponent bits from fma(2^23, ., 127 2^23) truncated (relative error ~1e-4)."""
    x = np.asarray(x, f32)
    src = (x * LOG2E).astype(f32)
    fr = (src - np.floor(src)).astype(f32)
    res = fma(fr, f32(-0.079204240219773236), f32(-0.22433836478672356))
    res = fma(fr, res, f32(0.30354260500649682))
    res = fma(fr, res, f32(0.00010703434948458272))
    src = (src - res).astype(f32)
    t = fma(f32(2.0 ** 23), src, f32(2.0 ** 23 * 127.0))
    r = np.trunc(t.astype(f64)).astype(np.int64).astype(np.uint32).view(f32).copy()
    r[x < LN_MIN] = 0
    r[x > LN_MAX] = np.inf
    return r


def red8(v):  # AVX2 vec_reduce_all(+) over the last axis of 8
    b = v[..., 0:4] + v[..., 4:8]
    return (b[..., 0] + b[..., 2]) + (b[..., 1] + b[..., 3])


# ---------------------------------------------------------------- dot products x [M,K] . w [N,K]
def dot(x, w, mode, kblk=0):
    M, K = x.shape
    if mode == "f64":
        return (x.astype(f64) @ w.T.astype(f64)).astype(f32)
    P = (x[:, None, :] * w[None, :, :]).astype(f32)  # exact BF16 x BF16 products [M, N, K]
    if mode == "aten":
        la, lv = K & ~63, K & ~15
        regs = [np.zeros(P.shape[:2] + (8,), f32) for _ in range(8)]
        for j in range(0, la, 64):
            for r in range(8):
                regs[r] = regs[r] + P[:, :, j + 8 * r:j + 8 * r + 8]
        for off in (4, 2, 1):
            for i in range(off):
                regs[i] = regs[i] + regs[off + i]
        tot = red8(regs[0])
        ts = np.zeros_like(regs[0])
        for j in range(la, lv, 16):
            ts = (ts + P[:, :, j:j + 8]) + P[:, :, j + 8:j + 16]
        tot = tot + red8(ts)
        for k in range(lv, K):
            tot = tot + P[:, :, k]
        return tot
    if mode.startswith("lanes"):
        L, ilp = (int(t) for t in mode[5:].split("x"))
        acc = np.zeros((ilp, L) + P.shape[:2], f32)
        kk = 0
        while kk + L * ilp <= K:
            for a in range(ilp):
                for l in range(L):
                    acc[a, l] = acc[a, l] + P[:, :, kk + a * L + l]
            kk += L * ilp
        t = acc[0]
        for a in range(1, ilp):
            t = t + acc[a]
        v = [t[l] for l in range(L)]
        while len(v) > 1:
            v = [v[i] + v[i + len(v) // 2] for i in range(len(v) // 2)]
        r = v[0]
        for k in range(kk, K):
            r = r + P[:, :, k]
        return r

    def part(s, e):
        acc = np.zeros(P.shape[:2], f32)
        if mode == "seq":
            for k in range(s, e):
                acc = acc + P[:, :, k]
            return acc
        for k in range(s, e, 2):
            p0, p1 = P[:, :, k], (P[:, :, k + 1] if k + 1 < e else np.zeros_like(acc))
            acc = {"dp-intel": lambda: (acc + p1) + p0, "dp-even": lambda: (acc + p0) + p1,
                   "dp-pair": lambda: acc + (p0 + p1)}[mode]()
        return acc

    if kblk and K > kblk:
        tot = None
        for s in range(0, K, kblk):
            p = part(s, min(K, s + kblk))
            tot = p if tot is None else tot + p
        return tot
    return part(0, K)


class Emu:
    def __init__(self, W, cfg, a, flips=None, record=False, seed=0):
        self.W, self.cfg, self.a = W, cfg, a
        self.flips, self.record, self.rec = flips or {}, record, {}
        self.rng = np.random.default_rng(seed)

    def r(self, site, x):
        """The BF16 rounding at a site (site = name + layer, e.g. qkv0; the switches use the name)."""
        x = np.asarray(x, dtype=f32)
        name = site.rstrip("0123456789")
        if name in self.a.noise:
            m = self.a.noise[name]
            x = (x.view(np.int32) + self.rng.integers(-m, m + 1, size=x.shape).astype(np.int32)).view(f32)
        if name in self.a.off:
            return x
        if self.record:
            self.rec[site] = np.abs((x.view(np.uint32).astype(np.int64) & 0xFFFF) - 0x8000)
        y = bf16(x)
        if site in self.flips:
            flat, idx = y.reshape(-1), self.flips[site]
            flat[idx] = bf16_other(x.reshape(-1)[idx])
        return y

    def linear(self, site, x, w, b=None):
        y = dot(x, w, self.a.lin, self.a.kblk)
        if b is not None:
            y = (y + b).astype(f32)
        return self.r(site, y)

    def rms(self, site, x, w, eps=1e-6):
        # torch: sum of x^2 (8-lane inner sum; FP32-level only) / D, + eps, 1/sqrt, x*r, w*(x*r)
        ms = ((x * x).astype(f64).sum(-1, keepdims=True).astype(f32) / f32(x.shape[1])).astype(f32)
        rs = (f32(1) / np.sqrt((ms + f32(eps)).astype(f32))).astype(f32)
        return self.r(site, (w * (x * rs).astype(f32)).astype(f32))

    def attention(self, L, q, k, v, form):  # [H, n, hd] BF16 values
        hd, n = q.shape[-1], q.shape[-2]
        bmm = lambda a, b: np.einsum("hmk,hkn->hmn", a.astype(f64), b.astype(f64)).astype(f32)
        if form.startswith("math"):
            s = f32(math.sqrt(1 / math.sqrt(hd)))
            rq = bf16 if form == "mathbf16" else (lambda t: np.asarray(t, f32))
            sc = rq(bmm(rq((q * s).astype(f32)), rq((k * s).astype(f32)).transpose(0, 2, 1)))
            e = np.exp((sc - sc.max(-1, keepdims=True)).astype(f64)).astype(f32)
            acc = e[..., 0:8].copy()
            d = 8
            while d < n - n % 8:
                acc, d = acc + e[..., d:d + 8], d + 8
            acc[..., :n - d] = acc[..., :n - d] + e[..., d:n]
            p = rq((e * (f32(1) / red8(acc))[..., None]).astype(f32))
            return self.r(f"o{L}", bmm(p, v))
        sc = (bmm(q, k.transpose(0, 2, 1)) * f32(1 / math.sqrt(hd))).astype(f32)
        z = (sc - sc.max(-1, keepdims=True)).astype(f32)
        e = np.exp(z.astype(f64)).astype(f32)
        n8, n16 = n - n % 8, n - n % 16
        if form == "flash-fexp":
            e[..., :n8] = fexp_u20(z[..., :n8])
            v0, v1, vt = (np.zeros(e.shape[:-1] + (8,), f32) for _ in range(3))
            for d in range(0, n16, 16):
                v0, v1 = v0 + e[..., d:d + 8], v1 + e[..., d + 8:d + 16]
            for d in range(n16, n8, 8):
                vt = vt + e[..., d:d + 8]
            tot = red8((v0 + vt) + v1)
        else:
            if form == "flash-expu20":
                e[..., :n8] = exp_u20(z[..., :n8])
            acc = np.zeros(e.shape[:-1] + (8,), f32)
            for d in range(0, n8, 8):
                acc = acc + e[..., d:d + 8]
            tot = red8(acc)
        for d in range(n8, n):
            tot = tot + e[..., d]
        dst = bmm(self.r(f"e{L}", e), v)
        return self.r(f"o{L}", (dst * (f32(1) / tot[..., None]).astype(f32)).astype(f32))

    def vit(self, patches, nh, nw):
        W, c = self.W, self.cfg
        D, H = c["vision_dim"], c["vision_n_heads"]
        hd = D // H
        R = hd // 2
        inv = (f32(1) / np.power(f64(c["vision_rope_theta"]), (np.arange(0, R, 2, dtype=f32) / f32(R)).astype(f64)).astype(f32))
        hp, wp = np.meshgrid(np.arange(nh), np.arange(nw), indexing="ij")
        ang = np.concatenate([hp.reshape(-1, 1).astype(f32) * inv, wp.reshape(-1, 1).astype(f32) * inv], 1)
        cos = np.cos(ang.astype(f64)).astype(f32)[:, None, :]
        sin = np.sin(ang.astype(f64)).astype(f32)[:, None, :]

        def rot(site, t):
            x1, x2 = t[..., :R], t[..., R:]
            a = (x1 * cos).astype(f32) - (x2 * sin).astype(f32)
            b = (x2 * cos).astype(f32) + (x1 * sin).astype(f32)
            return self.r(site, np.concatenate([a, b], -1))

        x = self.linear("pe", patches, W["vision.patch_embed.proj.weight"], W["vision.patch_embed.proj.bias"])
        n = x.shape[0]
        forms = self.a.sdpa.split(",")
        for L in range(c["vision_n_layers"]):
            p = f"vision.blocks.{L}."
            h = self.rms(f"n1{L}", x, W[p + "norm1.weight"])
            qkv = self.linear(f"qkv{L}", h, W[p + "attn.wqkv.weight"], W[p + "attn.wqkv.bias"])
            q, k, v = (t.reshape(n, H, hd) for t in np.split(qkv, 3, -1))
            o = self.attention(L, rot(f"rotq{L}", q).transpose(1, 0, 2), rot(f"rotk{L}", k).transpose(1, 0, 2),
                               v.transpose(1, 0, 2), forms[min(L, len(forms) - 1)])
            o = o.transpose(1, 0, 2).reshape(n, D)
            x = self.r(f"res1{L}", x + self.linear(f"wo{L}", o, W[p + "attn.wo.weight"], W[p + "attn.wo.bias"]))
            h = self.rms(f"n2{L}", x, W[p + "norm2.weight"])
            g, u = np.split(self.linear(f"w1{L}", h, W[p + "mlp.w1.weight"]), 2, -1)
            silu = (g.astype(f64) / (1 + np.exp(-g.astype(f64)))).astype(f32)
            a = self.r(f"act{L}", self.r(f"silu{L}", silu) * u)
            x = self.r(f"res2{L}", x + self.linear(f"w2{L}", a, W[p + "mlp.w2.weight"]))
        return self.rms("nf", x, W["vision.norm.weight"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("golden")
    ap.add_argument("--sdpa", default="flash-fexp")
    ap.add_argument("--lin", default="aten")
    ap.add_argument("--kblk", type=int, default=0)
    ap.add_argument("--off", default="", help="comma-separated rounding sites to skip")
    ap.add_argument("--noise", default="", help="SITE:ULPS[,SITE:ULPS]")
    ap.add_argument("--flip-search", type=int, default=-1, metavar="WIN")
    a = ap.parse_args()
    a.off = set(s for s in a.off.split(",") if s)
    a.noise = {s.split(":")[0]: int(s.split(":")[1]) for s in a.noise.split(",") if s}
    W = read_bf16_tensors(os.path.join(a.ckpt, "model.safetensors"))
    cfg = json.load(open(os.path.join(a.ckpt, "inference", "config.json")))
    g = json.load(open(os.path.join(a.golden, "golden.json")))
    for c in g["cases"]:
        k, nh, nw = c["case"], c["plan"]["n_vit_h"], c["plan"]["n_vit_w"]
        pt = np.fromfile(os.path.join(a.golden, f"case{k}_patches.f32"), dtype="<f4").reshape(nh * nw, -1)
        ref = np.fromfile(os.path.join(a.golden, f"case{k}_vit_out.f32"), dtype="<f4").reshape(nh * nw, -1)
        base = Emu(W, cfg, a, record=a.flip_search >= 0)
        o = base.vit(pt, nh, nw)
        print(f"case {k}: {int((o != ref).sum())} / {ref.size} values differ, max |d| {float(np.abs(o - ref).max()):.4g}, "
              f"mean |d| {float(np.abs(o - ref).mean()):.4g}")
        if a.flip_search >= 0:
            res = []
            for site, d in base.rec.items():
                for i in np.nonzero(d.reshape(-1) <= a.flip_search)[0]:
                    of = Emu(W, cfg, a, flips={site: np.array([i])}).vit(pt, nh, nw)
                    res.append((int((of != ref).sum()), site, int(i), int(d.reshape(-1)[i])))
            for r in sorted(res)[:10]:
                print(f"  flip {r[1]}[{r[2]}] ({r[3]} FP32 ulps from the midpoint): {r[0]} values differ")


if __name__ == "__main__":
    main()
