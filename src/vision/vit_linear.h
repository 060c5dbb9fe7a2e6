// deepinfer/vision/vit_linear.h — the dot products of the ViT's and the
// aligner's BF16 linears in the order of the reference's CPU kernel: torch's
// BF16 GEMM fallback (ATen cpublas gemm_transa_ → dot_with_fp32_arith, AVX2
// dispatch: Vectorized<float> of 8 lanes), which is what produced the golden
// vectors (docs/vision.md, "Bit-identical ViT").
//
// For one output, with p_k = x_k·w_k (exact in FP32: BF16 × BF16):
//   main loop over blocks of 64: 8 registers × 8 lanes, partial sum a[t] for
//     t = k mod 64 accumulates p_k in increasing k (from 0);
//   register tree: for off = 4, 2, 1: a[8i + l] += a[8(i + off) + l] (i < off);
//   lane tree (AVX2 reduce_all): s = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7));
//   16-wide tail (k from ⌊K/64⌋·64 to ⌊K/16⌋·16, chunks of 16): 8-lane sum
//     t[l] = (t[l] + p_{j+l}) + p_{j+8+l}, reduced by the same lane tree, added to s;
//   scalar tail: s += p_k for the last K mod 16 values, in increasing k.
// Every output is formed by the same FP32 operations in the same order on every
// Highway target (one SIMD lane per output column n, -ffp-contract=off), so
// VitLinearRows is bit-identical to VitDotTorchOrder.
#pragma once

#include <cstdint>

namespace deepinfer::vision {

// The scalar oracle: Σ_k x[k]·w[k·w_stride] in the order above. x: [K] FP32
// (BF16 values); w: the weight column, element k at w[k·w_stride]. K >= 0.
float VitDotTorchOrder(const float* x, const float* w, int64_t K, int64_t w_stride);

// y[m·N + n] = VitDotTorchOrder(x + m·K, wT + n, K, N) for m < M, n < N.
// x: [M, K] FP32 row-major; wT: the weight transposed, [K, N] FP32 row-major;
// y: [M, N] FP32 (unrounded, no bias). M, N >= 1, K >= 0.
void VitLinearRows(const float* x, int64_t M, int64_t K, const float* wT, int64_t N, float* y);

// The same product for a linear whose input the reference passes as a
// transposed (strided) view, where torch's GEMM takes gemm_transab_ with
// ATen's sum(): four partial sums s_q over k ≡ q (mod 4) in increasing k, the
// K mod 4 remainder added to s_0, then ((s_0 + s_1) + s_2) + s_3. Scalar loops
// with one independent accumulator per output (vectorisable across n, same
// value on every target). Shapes as VitLinearRows.
void VitLinearRowsSum4(const float* x, int64_t M, int64_t K, const float* wT, int64_t N, float* y);

}  // namespace deepinfer::vision
