// deepinfer/kernels/ref/ref_math.h — scalar elementwise maths and reductions
// with the exact rounding behaviour of the reference run (model-spec §4.2).
//
// The V4.1 golden vectors come from DeepSeek's reference executed with torch on
// an AVX-512 CPU (shared golden README, "Numeric settings"). Where torch's
// result depends on its implementation rather than on IEEE arithmetic, the
// functions here reproduce that implementation bit for bit:
//
//   * SleefExpf / SleefLog1pf / SleefPowf: torch's vectorised exp, log1p and
//     pow on AVX-512 call SLEEF's 1.0-ULP functions (Sleef_expf16_u10 etc.,
//     FMA variant). These are scalar transcriptions of those algorithms using
//     std::fma, so they give the same bits on any x86-64 CPU. They are not
//     correctly rounded; glibc's expf differs from them in the last bit for
//     some inputs.
//   * TorchSum: torch's CPU sum of a contiguous float row (cascade_sum /
//     vectorized_inner_sum with 4-way ILP). torch dispatches most elementwise
//     and reduction kernels only up to AVX2 (REGISTER_DISPATCH leaves the
//     AVX-512 slot empty), so the vectors have 8 float lanes even on AVX-512
//     CPUs; verified against the golden dumps (16 lanes breaks bit-exactness).
//   * TorchTopK: torch's CPU topk index selection (topk_impl_loop: libstdc++
//     nth_element / partial_sort on (value, index) pairs), including its
//     tie-breaking, which the V4.1 indexer hits often (bf16 scores, ReLU zeros).
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>

namespace deepinfer::ref {

// SLEEF's expf_u10 (AVX-512 FMA build). Returns +inf above 100 and 0 below -104.
float SleefExpf(float x);
// SLEEF's log1pf_u10 (AVX-512 FMA build).
float SleefLog1pf(float x);
// SLEEF's powf_u10 (AVX-512 FMA build), for finite positive x (the RoPE table).
float SleefPowf(float x, float y);

// Sum of n contiguous floats in the order of torch's CPU float sum over the
// innermost dimension (AVX2 kernel: 8 lanes, 4 independent vector
// accumulators, multi-level cascade every 16 steps, scalar tail added before
// the lanes; rows shorter than 8 use the scalar 4-way row_sum).
float TorchSum(const float* x, int64_t n);

// Indices of the k largest values of v[0..n) chosen exactly as torch's CPU
// topk does (largest=true): std::partial_sort when k*64 <= n, else
// std::nth_element (then std::sort of the first k-1 when `sorted`), on
// (value, index) pairs with comparator "a > b" (NaN counted as largest).
// Writes k indices to idx in torch's output order. Requires 1 <= k <= n.
void TorchTopK(const float* v, int64_t n, int64_t k, bool sorted, int64_t* idx);

// Torch's sigmoid: 1 / (1 + exp(-x)). `vector_path` selects the exp of torch's
// vectorised loop (SLEEF) rather than of its scalar tail (glibc std::exp).
float TorchSigmoid(float x, bool vector_path);
// Torch's silu on the vectorised path: x / (1 + exp(-x)) with SLEEF exp.
float TorchSilu(float x);
// Torch's softplus (beta 1, threshold 20) on the vectorised path.
float TorchSoftplus(float x);

// The Sinkhorn normalisation of hc_split_sinkhorn (model-spec §3.3.3) on the
// mHC combination matrix c [hc, hc] (row-major, after its row softmax):
// c = c / row_sum + eps, then c = c / (col_sum + eps), then sinkhorn_iters − 1
// rounds of c = c / (row_sum + eps), c = c / (col_sum + eps). The references
// add the sums in different orders (V4.1: torch.sum; V4: the kernel's loop),
// so the caller passes them: row_sums() fills rs [hc] and col_sums() fills
// cs [hc] from the current c. Pure FP32 division and addition, in this order.
template <typename RowSums, typename ColSums>
void SinkhornNormalize(float* c, int hc, int sinkhorn_iters, float eps, const float* rs, const float* cs,
                       RowSums&& row_sums, ColSums&& col_sums) {
  row_sums();
  for (int j = 0; j < hc; ++j)
    for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / rs[j] + eps;
  col_sums();
  for (int j = 0; j < hc; ++j)
    for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / (cs[k] + eps);
  for (int it = 0; it < sinkhorn_iters - 1; ++it) {
    row_sums();
    for (int j = 0; j < hc; ++j)
      for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / (rs[j] + eps);
    col_sums();
    for (int j = 0; j < hc; ++j)
      for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / (cs[k] + eps);
  }
}

}  // namespace deepinfer::ref
