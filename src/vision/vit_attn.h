// deepinfer/vision/vit_attn.h — the two dot-product loops of the ViT's
// attention (vit.cc), Highway-vectorised with one SIMD lane per output value so
// that every value is formed by the same FP32 operations in the same order as
// the scalar loop (products rounded to FP32, then added in increasing index;
// -ffp-contract=off, no FMA): the result is bit-identical to the scalar form on
// every target (avx512, avx2, the baseline fallback).
#pragma once

#include <cstdint>

namespace deepinfer::vision {

// scores[j] = Σ_{e=0..hd−1} q[e]·kT[e·n + j] for j in [0, n), summed in
// increasing e starting from 0. q: [hd] FP32; kT: the head's keys transposed,
// [hd, n] FP32 row-major; scores: [n] FP32. n, hd >= 1.
void VitScoresRow(const float* q, const float* kT, int64_t n, int64_t hd, float* scores);

// out[e] = Σ_{j=0..n−1} p[j]·v[j·ldv + e] for e in [0, hd), summed in
// increasing j starting from 0. p: [n] FP32 (the flash kernel's BF16-rounded
// unnormalised exps); v: the head's values, row j at v + j·ldv (ldv >= hd);
// out: [hd] FP32 (unrounded).
void VitPvRow(const float* p, const float* v, int64_t n, int64_t hd, int64_t ldv, float* out);

}  // namespace deepinfer::vision
