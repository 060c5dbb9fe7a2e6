// Lightning-indexer scores of one query row (cpu_ops.h IndexerScores),
// bit-identical to the scalar score loop of the V4.1 forward pass
// (model-spec indexer: score_j = bf16(Σ_h bf16(w_h·max(bf16(q_h·k_j), 0)))):
//   * each lane owns one key j and sums its q_h·k_j products in increasing c
//     with a separate multiply and add (no FMA: an FP4 q times a BF16 k is
//     exact unless it underflows), then runs the head sum in increasing h
//     with the same rounding, ReLU, multiply, rounding and add as the scalar
//     loop;
//   * keys come from the blocked layout (kIndexKeyBlock keys' element c
//     adjacent), so one load feeds kLanes keys; 4 vectors of keys × 2 heads
//     are in flight so the adds are not latency bound.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/indexer.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

static_assert(kIndexKeyBlock % kLanes == 0, "a vector of keys must lie inside one key block");

// acc + bf16(max(bf16(dot), 0)·w) with std::max's semantics (dot NaN or
// -0.0 kept as it is).
HWY_INLINE VF IndexerHeadStep(VF acc, VF dot, VF w) {
  const DF df;
  const VF zero = hn::Zero(df);
  const VF r = RoundBf16V(dot);
  const VF rl = hn::IfThenElse(hn::Lt(r, zero), zero, r);
  return hn::Add(acc, RoundBf16V(hn::Mul(rl, w)));
}

// Scores of the U·kLanes keys from j0 (the last vector may run past n into
// the zero padding of its block; only keys < n are stored).
template <int U>
HWY_INLINE void IndexerGroup(const float* HWY_RESTRICT q, const float* HWY_RESTRICT w, int64_t nh, int64_t ID,
                             const float* HWY_RESTRICT kt, int64_t j0, int64_t n, float* HWY_RESTRICT score) {
  const DF df;
  const float* kb[U];
  HWY_UNROLL(4)
  for (int u = 0; u < U; ++u) {
    const int64_t j = j0 + u * static_cast<int64_t>(kLanes);
    kb[u] = kt + (j / kIndexKeyBlock) * kIndexKeyBlock * ID + j % kIndexKeyBlock;
  }
  VF acc[U];
  HWY_UNROLL(4)
  for (int u = 0; u < U; ++u) acc[u] = hn::Zero(df);
  int64_t h = 0;
  for (; h + 2 <= nh; h += 2) {
    const float* q0 = q + h * ID;
    const float* q1 = q0 + ID;
    VF d0[U], d1[U];
    HWY_UNROLL(4)
    for (int u = 0; u < U; ++u) d0[u] = d1[u] = hn::Zero(df);
    for (int64_t c = 0; c < ID; ++c) {
      const VF a = hn::Set(df, q0[c]);
      const VF b = hn::Set(df, q1[c]);
      HWY_UNROLL(4)
      for (int u = 0; u < U; ++u) {
        const VF k = hn::LoadU(df, kb[u] + c * kIndexKeyBlock);
        d0[u] = hn::Add(d0[u], hn::Mul(a, k));
        d1[u] = hn::Add(d1[u], hn::Mul(b, k));
      }
    }
    const VF w0 = hn::Set(df, w[h]), w1 = hn::Set(df, w[h + 1]);
    HWY_UNROLL(4)
    for (int u = 0; u < U; ++u) acc[u] = IndexerHeadStep(IndexerHeadStep(acc[u], d0[u], w0), d1[u], w1);
  }
  if (h < nh) {
    const float* q0 = q + h * ID;
    VF d0[U];
    HWY_UNROLL(4)
    for (int u = 0; u < U; ++u) d0[u] = hn::Zero(df);
    for (int64_t c = 0; c < ID; ++c) {
      const VF a = hn::Set(df, q0[c]);
      HWY_UNROLL(4)
      for (int u = 0; u < U; ++u) d0[u] = hn::Add(d0[u], hn::Mul(a, hn::LoadU(df, kb[u] + c * kIndexKeyBlock)));
    }
    const VF w0 = hn::Set(df, w[h]);
    HWY_UNROLL(4)
    for (int u = 0; u < U; ++u) acc[u] = IndexerHeadStep(acc[u], d0[u], w0);
  }
  HWY_UNROLL(4)
  for (int u = 0; u < U; ++u) {
    const int64_t j = j0 + u * static_cast<int64_t>(kLanes);
    StorePartial(RoundBf16V(acc[u]), static_cast<size_t>(std::min<int64_t>(kLanes, n - j)), score + j);
  }
}

void IndexerScoresRow(const float* q, const float* w, int64_t nh, int64_t ID, const float* kt, int64_t n,
                      float* score) {
  constexpr int64_t kGroup = 4 * static_cast<int64_t>(kLanes);
  int64_t j = 0;
  for (; j + kGroup <= n; j += kGroup) IndexerGroup<4>(q, w, nh, ID, kt, j, n, score);
  const int64_t vt = (n - j + static_cast<int64_t>(kLanes) - 1) / static_cast<int64_t>(kLanes);
  if (vt == 4) IndexerGroup<4>(q, w, nh, ID, kt, j, n, score);
  if (vt == 3) IndexerGroup<3>(q, w, nh, ID, kt, j, n, score);
  if (vt == 2) IndexerGroup<2>(q, w, nh, ID, kt, j, n, score);
  if (vt == 1) IndexerGroup<1>(q, w, nh, ID, kt, j, n, score);
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(IndexerScoresRow);

void PackIndexKey(const uint16_t* k, int64_t j, int64_t ID, float* kt) {
  float* dst = kt + (j / kIndexKeyBlock) * kIndexKeyBlock * ID + j % kIndexKeyBlock;
  for (int64_t c = 0; c < ID; ++c) {
    uint16_t b;
    std::memcpy(&b, k + c, 2);
    dst[c * kIndexKeyBlock] = Bf16ToFloat(b);
  }
}

void IndexerScores(const float* q, const float* w, int64_t nh, int64_t ID, const float* kt, int64_t n,
                   float* score) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(IndexerScoresRow)(q, w, nh, ID, kt, n, score);
}

void PackAndScoreIndexKeys(const float* q, const float* w, int64_t nh, int64_t ID, const uint16_t* const* rows,
                           int64_t n, float* kt, float* score) {
  if (n <= 0) return;
  const int64_t chunks = (n + kIndexKeyChunk - 1) / kIndexKeyChunk;
  const auto chunk = [&](int64_t t) {
    // Packing a block writes its padding keys' elements too: they are read by
    // the last vector of the block (never stored), so they must be initialised.
    const int64_t j0 = t * kIndexKeyChunk, j1 = std::min(n, j0 + kIndexKeyChunk);
    for (int64_t j = j0; j < j1; ++j) PackIndexKey(rows[j], j, ID, kt);
    const int64_t jp = std::min((j1 + kIndexKeyBlock - 1) / kIndexKeyBlock * kIndexKeyBlock, j0 + kIndexKeyChunk);
    for (int64_t j = j1; j < jp; ++j) {
      float* dst = kt + (j / kIndexKeyBlock) * kIndexKeyBlock * ID + j % kIndexKeyBlock;
      for (int64_t c = 0; c < ID; ++c) dst[c * kIndexKeyBlock] = 0.0f;
    }
    HWY_DYNAMIC_DISPATCH(IndexerScoresRow)(q, w, nh, ID, kt + j0 * ID, j1 - j0, score + j0);
  };
  // A team only where there is work for it (each chunk ~nh·ID·64 multiply-adds).
  if (chunks >= 2 && n * nh * ID >= (int64_t{1} << 19)) {
    ParallelForStealing(chunks, chunk);
  } else {
    for (int64_t t = 0; t < chunks; ++t) chunk(t);
  }
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
