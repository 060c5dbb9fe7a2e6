// deepinfer/model/v41/kernels.h — the V4.1 forward pass's operator dispatch
// (model.cc, block.cc, attention.cc, moe.cc, dspark.cc): the fast CPU kernel
// when the weight was repacked at load (kernels/cpu/cpu_ops.h, bit-identical),
// else the scalar reference operator (kernels/ref/ref_ops.h, where shapes,
// dtypes and the arithmetic of each are documented: model-spec §3.1, §4).
// No errors (shapes are the caller's contract).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_ops.h"
#include "model/v41/weights.h"

namespace deepinfer::v41 {

// Linears and the vectorised non-GEMM ops: the fast CPU kernel when the weight
// was repacked at load (bit-identical, kernels/cpu/cpu_ops.h), else the
// scalar reference operator.
inline void Linear(const float* x, int64_t M, const Fp8Linear& w, int ab, float* y) {
  if (w.packed) cpu::LinearFp8(x, M, *w.packed, ab, y, w.act_format);
  else ref::LinearFp8(x, M, w.w, ab, y, w.act_format);
}
inline void Linear(const float* x, int64_t M, const Fp4Linear& w, int ab, float* y) {
  if (w.packed) cpu::LinearFp4(x, M, *w.packed, ab, y, w.act_format);
  else ref::LinearFp4(x, M, w.w, ab, y, w.act_format);
}
inline void LinearBf16(const float* x, int64_t M, const Bf16Tensor& w, float* y) {
  if (w.packed) cpu::LinearBf16(x, M, *w.packed, y);
  else ref::LinearBf16(x, M, w.weight(), y);
}
inline void LinearF32Bf16W(const float* x, int64_t M, const Bf16Tensor& w, float* y) {
  if (w.packed) cpu::LinearF32Bf16W(x, M, *w.packed, y);
  else ref::LinearF32Bf16W(x, M, w.weight(), y);
}
inline void GroupedLinearBf16(const float* o, int64_t M, int groups, const Bf16Tensor& wa, float* z) {
  if (wa.packed) cpu::GroupedLinearBf16(o, M, groups, *wa.packed, z);
  else ref::GroupedLinearBf16(o, M, groups, wa.weight(), z);
}
inline void HcMixes(const float* X, int64_t M, int hc, int64_t d, const F32Tensor& fn, const float* base,
             const float* scale, float norm_eps, int sinkhorn_iters, float hc_eps, const int32_t* sig_vec,
             float* pre, float* post, float* comb) {
  if (fn.packed)
    cpu::HcMixes(X, M, hc, d, *fn.packed, base, scale, norm_eps, sinkhorn_iters, hc_eps, sig_vec, pre, post, comb);
  else
    ref::HcMixes(X, M, hc, d, fn.data(), base, scale, norm_eps, sinkhorn_iters, hc_eps, sig_vec, pre, post, comb);
}
inline void Router(const float* x, int64_t M, const Bf16Tensor& gate, const float* const* bias, int topk, float gate_temp,
            bool norm_topk_prob, float route_scale, const int32_t* softplus_vec, int32_t* indices, float* weights) {
  if (gate.packed)
    cpu::Router(x, M, *gate.packed, bias, topk, gate_temp, norm_topk_prob, route_scale, softplus_vec, indices,
                weights);
  else
    ref::Router(x, M, gate.weight(), bias, topk, gate_temp, norm_topk_prob, route_scale, softplus_vec, indices,
                weights);
}

// The QDQ of the window K (FP8, §3.1(g)) and of the indexer's queries and
// keys (FP4 with UE8M0 scales, §3.1(h)) on one row of K floats in place:
// the vectorised forms when the forward pass runs on the fast kernels
// (cpu_ops.h, bit-identical), else format/numerics.h.
inline void Fp8Qdq(bool fast, float* x, int64_t K, int B, Fp8Format fmt) {
  if (fast) cpu::Fp8QdqRows(x, 1, K, B, fmt);
  else Fp8QdqInPlace(x, K, B, fmt);
}
inline void Fp4QdqUe8m0(bool fast, float* x, int64_t K, int B) {
  if (fast) cpu::Fp4QdqUe8m0Rows(x, 1, K, B);
  else Fp4QdqUe8m0InPlace(x, K, B);
}

// mHC collapse / expand (model-spec §3.3.3): the Highway forms when the
// forward pass runs on the fast kernels (bit-identical), else the reference.
inline void HcCollapse(bool fast, const float* X, const float* pre, int64_t M, int hc, int64_t d, float* x) {
  if (fast) cpu::HcCollapse(X, pre, M, hc, d, x);
  else ref::HcCollapse(X, pre, M, hc, d, x);
}
inline void HcExpand(bool fast, const float* v, const float* X, const float* post, const float* comb, int64_t M,
                     int hc, int64_t d, float* Xout) {
  if (fast) cpu::HcExpand(v, X, post, comb, M, hc, d, Xout);
  else ref::HcExpand(v, X, post, comb, M, hc, d, Xout);
}

// The experts' SwiGLU with the limit (Expert.forward, model-spec §3.3.5), in
// place on the [m, I] gate/up projections: u = clamp(up, -lim, lim),
// g = min(gate, lim) (lim <= 0: no clamp; std::min/max keep a NaN operand),
// a = silu(g)·u with silu(g) = g / (1 + SLEEF exp(-g)) (ref::TorchSilu),
// a = rw[row]·a when route weights are given, gate[i] = BF16(a). Vectorised,
// bit-identical: the clamps and the products by cpu::SwiGluClamp /
// SwiGluAct (2.1 -> 0.4 us per 512-wide expert row on AVX-512, 0.5 on AVX2),
// the exps of the whole block by cpu::SleefExpfRow.
// `scratch` is resized to m·I (the caller's thread_local: no allocation once
// grown).
inline void SwiGlu(float* gate, float* up, int64_t m, int64_t I, float lim, const float* rw,
                   std::vector<float>& scratch) {
  if (scratch.size() < static_cast<size_t>(m * I)) scratch.resize(static_cast<size_t>(m * I));
  float* neg = scratch.data();
  cpu::SwiGluClamp(gate, up, neg, m * I, lim);
  cpu::SleefExpfRow(neg, m * I, neg);
  for (int64_t r = 0; r < m; ++r) cpu::SwiGluAct(gate + r * I, up + r * I, neg + r * I, I, rw ? rw + r : nullptr);
}

// SwiGlu on the merged gate/up call's rows g13 [m, 2I] (row r: gate
// g13[r·2I ..], up g13[r·2I + I ..]), the results into out [m, I] (out may
// be g13 itself when m = 1): the same operations on every element, so the
// same bits as SwiGlu on the split rows, without copying them apart first.
inline void SwiGluMerged(float* g13, int64_t m, int64_t I, float lim, const float* rw, std::vector<float>& scratch,
                         float* out) {
  if (scratch.size() < static_cast<size_t>(m * I)) scratch.resize(static_cast<size_t>(m * I));
  float* neg = scratch.data();
  for (int64_t r = 0; r < m; ++r) cpu::SwiGluClamp(g13 + r * 2 * I, g13 + r * 2 * I + I, neg + r * I, I, lim);
  cpu::SleefExpfRow(neg, m * I, neg);
  for (int64_t r = 0; r < m; ++r)
    cpu::SwiGluAct(g13 + r * 2 * I, g13 + r * 2 * I + I, neg + r * I, I, rw ? rw + r : nullptr, out + r * I);
}

// Each thread's buffers for ExpertSwiGlu (the routed experts run in parallel,
// one per thread: RoutedExperts): gate/up projections [m, I] and the exps.
// One set per thread, shared by the main model's MoE and the DSpark
// drafter's (never in use at once on a thread). moe.cc.
struct ExpertScratch {
  std::vector<float> gt, up, neg;
  std::vector<float> g13;  // [m, 2I]: the merged gate/up call's output (ExpertWeights::w13)
};
ExpertScratch& ThreadExpertScratch();

// The decode step plan's reservation for the MoE: every thread of the team
// holds ExpertScratch, RoutedExperts' scratch and the linears' scratch for
// `rows` rows per expert (dim d, intermediate I). Done when rows exceed
// *reserved_rows or the team has more threads than *reserved_threads (a new
// thread holds nothing), which it then updates; otherwise nothing. Call
// outside a parallel region. moe.cc.
void ReserveExpertScratch(int64_t rows, int64_t d, int64_t I, int64_t* reserved_rows, int* reserved_threads);

// A packed weight's linear (the merged gate/up weights, which have no
// checkpoint view): as Linear with the packed form.
inline void LinearPacked(const float* x, int64_t M, const cpu::PackedFp8& w, int ab, float* y, Fp8Format f) {
  cpu::LinearFp8(x, M, w, ab, y, f);
}
inline void LinearPacked(const float* x, int64_t M, const cpu::PackedFp4& w, int ab, float* y, Fp8Format f) {
  cpu::LinearFp4(x, M, w, ab, y, f);
}

// Expert.forward on m rows x [m, d] → out [m, d]: w2(SwiGlu(w1·x, w3·x))
// with the limit and, for a routed expert, the route weights rw (null: the
// shared expert); W is Fp4Linear (routed) or Fp8Linear (shared), activation
// blocks of ab. w13, when not null, is the packed [w1; w3]
// (cpu::ConcatPackedRows, weights.h ExpertWeights::w13): one call gives
// both projections, each row the bits of its own call (the activations are
// quantised once instead of twice). Uses the calling thread's ExpertScratch.
template <class W, class P>
void ExpertSwiGlu(const float* x, int64_t m, const W& w1, const W& w3, const P* w13, const W& w2, int64_t I, int ab,
                  float lim, const float* rw, float* out) {
  ExpertScratch& es = ThreadExpertScratch();
  // Every output element of a linear is written (y = x·Wᵀ, as ref::Linear*):
  // the buffers are sized, not zero-filled first.
  if (w13) {
    es.g13.resize(static_cast<size_t>(m * 2 * I));
    LinearPacked(x, m, *w13, ab, es.g13.data(), w1.act_format);
    float* act = es.g13.data();  // one row: its [gate | up] in place
    if (m > 1) {
      es.gt.resize(static_cast<size_t>(m * I));
      act = es.gt.data();
    }
    SwiGluMerged(es.g13.data(), m, I, lim, rw, es.neg, act);
    Linear(act, m, w2, ab, out);
    return;
  }
  es.gt.resize(static_cast<size_t>(m * I));
  es.up.resize(static_cast<size_t>(m * I));
  Linear(x, m, w1, ab, es.gt.data());
  Linear(x, m, w3, ab, es.up.data());
  SwiGlu(es.gt.data(), es.up.data(), m, I, lim, rw, es.neg);
  Linear(es.gt.data(), m, w2, ab, out);
}

}  // namespace deepinfer::v41
