// deepinfer/kernels/ref/ref_ops.h — scalar reference operators of the
// DeepSeek-V4.1 forward pass (model-spec §3.1, §3.3, §4).
//
// Each operator reproduces the reference's arithmetic: the same operations in
// the same order with the same rounding points, so results are bit-identical
// wherever the reference's own kernels are deterministic. A faster kernel
// (Highway) may replace any of them behind the same signature as long as the
// results stay bit-identical.
//
// Conventions shared by all operators:
//   * Activations are float arrays whose values are exactly representable in
//     the dtype the reference stores them in (BF16 unless stated): a "BF16
//     tensor" here is a float array of BF16-exact values, and every operator
//     whose reference output is BF16 rounds its outputs with RoundBf16.
//   * Matrices are row-major; a linear's weight is [out, in] (DeepSeek layout)
//     and y[m, n] = Σ_k x[m, k]·W[n, k].
//   * Rows are independent: every output element is computed by one thread in
//     a fixed order, so results never depend on the thread count or on which
//     other rows are in the call (README "Threads").
//   * Shapes are the caller's contract (checked by the model at load time);
//     these functions do not throw.
#pragma once

#include <cstdint>
#include <vector>

#include "format/numerics.h"

namespace deepinfer::ref {

// ------------------------------------------------------------------ weights
// FP8 linear weight: E4M3 codes [out, in] and UE8M0 block scales
// [ceil(out/block), ceil(in/block)] (block 32 for V4.1).
struct Fp8Weight {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0;
  int block = 32;
};
// FP4 routed-expert weight: packed E2M1 [out, in/2] (low nibble = even
// element) and UE8M0 scales [out, in/32].
struct Fp4Weight {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0;
};
// BF16 weight [out, in] as raw BF16 bits.
struct Bf16Weight {
  const uint16_t* w = nullptr;
  int64_t out = 0, in = 0;
};

// ------------------------------------------------------------------ linears
// Quantised linear, model-spec §3.1(b) (reference `linear` → act_quant +
// fp8_gemm): each row of x [M, in] (BF16 values) is quantised per
// `act_block` (32) to E4M3 with a power-of-two scale; for every output n the
// block partial sums Σ_{k∈kb} q·w are formed in FP32 in increasing k, scaled
// ((partial·s_act)·s_w) and added to an FP32 accumulator in increasing kb.
// y [M, out] = BF16 of the accumulator.
// act_format = kE4M3Ieee: the activations are quantised to a maximum of 224
// (QuantizeActE4M3's e4m3-ieee rule); the weight is used as given (the
// model transforms e4m3-ieee weights at load: codes halved, scales + 1).
// Raises Error(kInvalidArgument) when act_block <= 0 or does not divide `in`,
// or the weight block is not positive.
void LinearFp8(const float* x, int64_t M, const Fp8Weight& w, int act_block, float* y,
               Fp8Format act_format = Fp8Format::kE4M3FN);

// FP4 routed-expert linear (fp4_gemm): as LinearFp8 with E2M1 weights and
// per-(row, 32-group) UE8M0 weight scales; the activation scale of the
// act_block containing each 32-group is used. y [M, out] BF16. act_format as
// for LinearFp8 (the FP4 weights are never transformed). Raises
// Error(kInvalidArgument) unless act_block > 0 and both act_block and 32
// divide `in`.
void LinearFp4(const float* x, int64_t M, const Fp4Weight& w, int act_block, float* y,
               Fp8Format act_format = Fp8Format::kE4M3FN);

// BF16 linear (F.linear on BF16 tensors): FP32 accumulation of exact
// BF16×BF16 products in increasing k, output rounded to BF16.
void LinearBf16(const float* x, int64_t M, const Bf16Weight& w, float* y);

// FP32 linear with a BF16 weight upcast to FP32 (the reference keeps the head,
// the router weight and the ratio-2 compressor weights in FP32): x [M, in]
// FP32, y [M, out] FP32, products and sums in FP32 in increasing k.
void LinearF32Bf16W(const float* x, int64_t M, const Bf16Weight& w, float* y);
// Same with an FP32 weight [out, in] (the mHC `hc_*_fn`).
void LinearF32(const float* x, int64_t M, const float* w, int64_t out, int64_t in, float* y);

// Grouped BF16 output projection `wo_a` (model-spec §3.2.3 step 7): o [M, G·Kg]
// (BF16), Wa [G·R, Kg] (BF16, dequantised at load); z[m, g·R + r] =
// BF16(Σ_k o[m, g·Kg + k]·Wa[g·R + r, k]). z [M, G·R].
void GroupedLinearBf16(const float* o, int64_t M, int groups, const Bf16Weight& wa, float* z);

// ------------------------------------------------------------------ norms
// RMSNorm, model-spec §3.1(a): for each row of x [M, n] (values exact in the
// input dtype), y = BF16(w · (x · rsqrt(mean(x²) + eps))) with torch's sum order
// for mean and w the BF16 weight in FP32. In-place allowed (y == x).
void RmsNorm(const float* x, int64_t M, int64_t n, const uint16_t* w_bf16, float eps, float* y);

// ------------------------------------------------------------------ RoPE
// Rotary tables of model-spec §3.1(c): θ_k = 1 / pow(base, 2k/R) (SLEEF powf),
// optionally YaRN-corrected; angle(p, k) = fp32(p) · θ'_k; cos/sin by glibc.
class RopeTable {
 public:
  RopeTable() = default;
  // rope_dim R (even); yarn_original_len <= 0 disables YaRN.
  RopeTable(int64_t rope_dim, double base, int64_t yarn_original_len, double factor,
            double beta_fast, double beta_slow);
  int64_t rope_dim() const { return rope_dim_; }
  const std::vector<float>& theta() const { return theta_; }
  // cos/sin of position p for the R/2 pairs (written to cs[0..R/2) and sn[0..R/2)).
  void CosSin(int64_t pos, float* cs, float* sn) const;
  // Rotates x[0..R) (interleaved pairs) in place by position p (inverse: −φ),
  // in FP32, rounding the results to BF16 (the reference's in-place copy_).
  void Apply(float* x, int64_t pos, bool inverse) const;
  // Apply on `heads` vectors x + h·stride (h < heads) at the same position:
  // the same operations per element as one Apply call per head, with the
  // cos/sin of the position computed once.
  void ApplyHeads(float* x, int64_t heads, int64_t stride, int64_t pos, bool inverse) const;

 private:
  int64_t rope_dim_ = 0;
  std::vector<float> theta_;
};

// ------------------------------------------------------------------ attention
// Sparse attention with sink for one query row (model-spec §3.1(d); kernel
// `sparse_attn`): q [H, D] (BF16 values), candidate K=V rows kv[i] (BF16 bits,
// D each) at list slots slot[i] (ascending; slots without an entry are
// "absent" and skipped). The list is processed in chunks of 64 slots with an
// FP32 online softmax whose running max starts at −1e30; probabilities are
// rounded to BF16 relative to the running max of their chunk before P·V;
// sink[h] joins the denominator unscaled. `chunk_slots(c)` = number of slots in
// chunk c (64 except possibly the last; sums over a chunk follow torch's order
// over that many slots). out [H, D] BF16.
void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* kv,
                     const int32_t* slot, int n, int32_t list_len, const float* sink,
                     float softmax_scale, float* out);

// ------------------------------------------------------------------ mHC
// Mixes of one mHC site (model-spec §3.2.2 with V4.1's ε): for each row of
// X [M, hc, d] (BF16 values): ρ = rsqrt(mean(f²) + norm_eps) over the
// flattened hc·d values (torch sum order); m = (F·f)·ρ (F [mix, hc·d] FP32);
// pre_j = σ(m_j·a₀ + b_j) + ε_hc, post_j = 2σ(m_{hc+j}·a₁ + b_{hc+j}),
// comb = Sinkhorn(softmax_k(m_{2hc+4j+k}·a₂ + b) + ε_hc) (kernel
// hc_split_sinkhorn). pre [M, hc], post [M, hc], comb [M, hc, hc]
// (comb[j][k]: row j = source stream, column k = target stream).
// sig_vec[m] = how many leading elements of row m's pre (and post) sigmoid
// take torch's vectorised path (SLEEF exp) rather than its scalar tail
// (glibc exp); see VectorPathCount.
void HcMixes(const float* X, int64_t M, int hc, int64_t d, const float* fn, const float* base,
             const float* scale, float norm_eps, int sinkhorn_iters, float hc_eps,
             const int32_t* sig_vec, float* pre, float* post, float* comb);
// HcMixes of one row from its mixes m [(2+hc)·hc] (already (F·f)·ρ): pre [hc],
// post [hc], comb [hc, hc] as above; sig_vec is the row's count; rs and cs are
// scratch of hc floats each. Shared by HcMixes and cpu::HcMixes (which forms
// m with its fast kernel), so both run this arithmetic from one source.
void HcMixesTail(const float* mixes, int hc, const float* base, const float* scale, int sinkhorn_iters, float hc_eps,
                 int32_t sig_vec, float* rs, float* cs, float* pre, float* post, float* comb);

// Collapse x[m] = BF16(Σ_j pre[m, j]·X[m, j]) in FP32, j ascending. x [M, d].
void HcCollapse(const float* X, const float* pre, int64_t M, int hc, int64_t d, float* x);

// Expand X'[m, k] = BF16(post[m, k]·v[m] + Σ_j comb[m, j, k]·X[m, j]) (FP32, j
// ascending). v [M, d] BF16, X, Xout [M, hc, d]; Xout must not alias X.
void HcExpand(const float* v, const float* X, const float* post, const float* comb, int64_t M,
              int hc, int64_t d, float* Xout);

// ------------------------------------------------------------------ MoE router
// V4.1 gate (model-spec §3.3.5) for rows x [M, dim] (BF16 values): logits =
// x·Wgᵀ in FP32 (weight upcast), ÷ gate_temp; s = sqrt(softplus(logits));
// experts = torch top-k (sorted) of s + bias; weights = s[experts], divided by
// (Σ + 1e-20) when norm_topk_prob and topk > 1, × route_scale. bias[m] points
// at the selection bias of row m (`bias` or `bias_vl`). softplus_vec[m] = how
// many leading logits of row m take torch's vectorised softplus (SLEEF).
// indices [M, topk] and FP32 weights [M, topk] in torch's order.
void Router(const float* x, int64_t M, const Bf16Weight& gate, const float* const* bias, int topk,
            float gate_temp, bool norm_topk_prob, float route_scale, const int32_t* softplus_vec,
            int32_t* indices, float* weights);

// How many of `per_row` consecutive elements of row r (of a [rows, per_row]
// contiguous tensor, one sequence's call of `rows` rows) torch processes on
// the vectorised path of an elementwise kernel: cpu_kernel_vec's
// vectorized_loop handles floor(n / 2·lanes)·2·lanes elements with vectors of
// `lanes` floats (16 for kernels torch dispatches with AVX-512, such as
// sigmoid; 8 for AVX2-only ones) and the tail with scalar code.
int32_t VectorPathCount(int64_t r, int64_t rows, int64_t per_row, int lanes);

}  // namespace deepinfer::ref
