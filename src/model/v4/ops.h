// deepinfer/model/v4/ops.h — the operators of the DeepSeek-V4 (`deepseek_v4`)
// forward pass that differ from V4.1's (kernels/ref/ref_ops.h): scalar
// reference forms (ops.cc, the *Ref functions and the others) and the
// Highway forms bit-identical to them (ops_hwy.cc).
//
// The V4 golden vectors (shared golden README_V4.md) come from DeepSeek's V4
// model.py with a CPU port of its tilelang kernels; the kernels' semantics are
// (model-spec §3.1, README_V4 "The CPU kernel port"):
//   * FP8 / FP4 GEMM: one K block (128 for FP8, 32-wide weight groups for FP4)
//     at a time; the block's partial product is the correctly rounded FP32 of
//     the exact sum (formed here in double, where it is exact), then
//     acc = acc + partial·(s_a·s_w) in FP32 in K order; BF16 out.
//   * sparse attention: the candidate list in chunks of 64 (−1 = absent);
//     per chunk the q·k dots, the probability sum and P·V are exact sums
//     rounded once to FP32; exp correctly rounded (double exp → FP32); running
//     max from −∞; probabilities rounded to BF16 for P·V; sink added at the end.
//   * hc_split_sinkhorn: FP32 operations in the kernel's order, 4-term sums left
//     to right, sigmoid(x) = 1/(1+exp(−x)) with the correctly rounded exp.
//   * Hadamard: natural-order butterfly in FP32 (strides 1, 2, …, n/2), ×scale, BF16.
// Torch-level operations of model.py (norms, RoPE, BF16/FP32 linears, the
// collapse/expand of mHC, softplus, silu) are the V4.1 operators, which
// reproduce the same torch build (ref_ops.h / ref_math.h).
//
// Conventions as ref_ops.h: float arrays holding BF16-exact values where the
// reference stores BF16; rows independent; no throwing (shapes are the
// model's contract, checked at load). Scratch is per thread (thread_local,
// only growing), so the operators of the forward pass make no heap allocation
// at shapes already seen (model/v4/workspace.h); the *Ref oracles of the
// linears allocate per call.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace deepinfer::v4 {

// FP8 E4M3 weight [out, in] with UE8M0 scales [ceil(out/128), in/128].
struct Fp8Weight {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0;
};
// FP4 E2M1 packed weight [out, in/2] with UE8M0 scales [out, in/32].
struct Fp4Weight {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0;
};

// y [M, out] = BF16(fp8_gemm(act_quant(x, 128), W)). x [M, in] BF16 values, in % 128 == 0.
void LinearFp8(const float* x, int64_t M, const Fp8Weight& w, float* y);
// y [M, out] = BF16(fp4_gemm(act_quant(x, 128), W)): K in 32-wide groups, the
// activation scale of the enclosing 128 block. in % 128 == 0.
void LinearFp4(const float* x, int64_t M, const Fp4Weight& w, float* y);
// The scalar oracles of the two (one double accumulator in increasing k);
// LinearFp8/LinearFp4 are bit-identical to them (exact block sums in any order,
// 8 accumulators, byte tables, rows × outputs in parallel).
void LinearFp8Ref(const float* x, int64_t M, const Fp8Weight& w, float* y);
void LinearFp4Ref(const float* x, int64_t M, const Fp4Weight& w, float* y);

// An FP8 weight with its load-time repacked copy (kernels/cpu PackFp8 layout,
// 128-wide blocks) for the Highway linear (ops_hwy.cc). `fast` is false when
// in % 128 != 0 or a weight code is NaN; then the calls take LinearFp8(src).
struct PackedFp8Weight {
  Fp8Weight src;
  cpu::PackedFp8 packed;
  bool fast = false;
};
PackedFp8Weight PackFp8Weight(const Fp8Weight& w);
// As LinearFp8(x, M, w.src, y), bit-identical (v4_ops_test): one double lane
// per output row, exact block partials, the reference's FP32 block steps;
// output tiles in parallel (OpenMP) when M·out·in >= 2^20.
void LinearFp8(const float* x, int64_t M, const PackedFp8Weight& w, float* y);
// The same for FP4 (kernels/cpu PackFp4 layout): `fast` is false when
// in % 128 != 0 or a scale byte is 0x00 / 0xFF; LinearFp4 on it is
// bit-identical to LinearFp4(x, M, w.src, y).
struct PackedFp4Weight {
  Fp4Weight src;
  cpu::PackedFp4 packed;
  bool fast = false;
};
PackedFp4Weight PackFp4Weight(const Fp4Weight& w);
void LinearFp4(const float* x, int64_t M, const PackedFp4Weight& w, float* y);

// Makes the calling thread's activation scratch of the packed linears above
// hold M rows of K (it only grows): a parallel region whose threads take
// differently sized tasks calls it on every thread first, so no thread
// allocates in a later step (model/v4/workspace.h).
void ReserveLinearScratch(int64_t M, int64_t K);

// Correctly rounded FP32 exp (double exp, one rounding).
float Exp32(float x);

// Sparse attention with sink for one query row: q [H, D] BF16 values; the list
// has `list_len` entries, entry i is kv row `rows[i]` or absent when rows[i] is
// null; chunks of 64 in list order. sink [H] FP32. out [H, D] BF16.
void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* rows, int64_t list_len,
                     const float* sink, float softmax_scale, float* out);
// The scalar oracle of SparseAttention; SparseAttention (ops_hwy.cc) is
// bit-identical to it: each chunk's rows decoded once for all heads, the q·k
// dots one double lane per candidate (increasing c), P·V one lane per column
// c (candidates in list order), the softmax steps as here.
void SparseAttentionRef(const float* q, int H, int64_t D, const uint16_t* const* rows, int64_t list_len,
                        const float* sink, float softmax_scale, float* out);

// mHC mixes of one site for M rows (model.py hc_pre + hc_split_sinkhorn):
// X [M, hc, d] BF16 values; ρ = 1/sqrt(mean(f²) + norm_eps) over the hc·d values
// (torch sum order); m = (F·f)·ρ with F [mix, hc·d] FP32 (sequential FP32 sums);
// then the kernel: pre = σ(m·a₀ + b) + ε, post = 2σ(m·a₁ + b), comb = Sinkhorn.
// pre [M, hc], post [M, hc], comb [M, hc, hc] (comb[j][k]: source j, target k).
void HcMixes(const float* X, int64_t M, int hc, int64_t d, const float* fn, const float* base, const float* scale,
             float norm_eps, int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb);
// The same with F repacked (cpu::PackF32(fn, (2+hc)·hc, hc·d)): the M·mix dot
// products by cpu::LinearF32 (the same sequential FP32 sums, vectorised across
// outputs), the rest as above; bit-identical to it.
void HcMixes(const float* X, int64_t M, int hc, int64_t d, const cpu::PackedF32& fn, const float* base,
             const float* scale, float norm_eps, int sinkhorn_iters, float hc_eps, float* pre, float* post,
             float* comb);

// fast_hadamard_transform of one BF16 row of n (power of two) values, ×scale, BF16, in place.
// HadamardRef is the scalar oracle; Hadamard the Highway form (ops_hwy.cc),
// bit-identical to it (the scalar one when n is not a multiple of the vector width).
void Hadamard(float* x, int64_t n, float scale);
void HadamardRef(float* x, int64_t n, float scale);

// C4 indexer scores of one query row (model.py Indexer.forward with the
// golden port's order): q [nh, D] and keys [n, D] FP32 (BF16 values), w [nh];
// score[j] = bf16(Σ_h bf16(max(bf16(Σ_c q[h,c]·keys[j,c]), 0)·w[h])) for
// j < n, every sum sequential in FP32 from +0 in increasing c resp. h.
// IndexerScoresRef is the scalar oracle; IndexerScores the Highway form
// (one lane per key), bit-identical to it; called outside a parallel region
// with n·nh·D >= 2^19 it splits the keys over the OpenMP team in chunks of 64
// (the same bits for every thread count).
void IndexerScores(const float* q, const float* w, int nh, int64_t D, const float* keys, int64_t n, float* score);
void IndexerScoresRef(const float* q, const float* w, int nh, int64_t D, const float* keys, int64_t n,
                      float* score);

// Sum of n floats in torch's order for a reduction over a non-innermost
// dimension (vectorized_outer_sum → multi_row_sum: a cascade of sequential
// sums whose level step is 2^max(4, ceil(log2 n)/4)).
float OuterSum(const float* v, int64_t n);

// Indices of the k largest of v[0..n) in descending value order, equal values
// by ascending index (the golden run's stable top-k rule). idx [k]. Without a
// NaN in v: a partial sort under that total order (no buffer); with one: the
// stable sort by value, as the rule was first written.
void StableTopK(const float* v, int64_t n, int64_t k, int64_t* idx);

}  // namespace deepinfer::v4
