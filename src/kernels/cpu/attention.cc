// Sparse attention with sink for one query row (cpu_ops.h), bit-identical to
// ref::SparseAttention: the same chunked online softmax, with
//   * the q·k dot products computed 16 (AVX-512) heads per vector: q is
//     transposed once per row to qt[d][h], each candidate's k[d] is broadcast,
//     and every lane sums its head's products in increasing d, as the
//     reference's scalar loop does;
//   * the P·V accumulation, the running rescale and the final division run
//     along d (elementwise, same operations per element);
//   * heads split over the OpenMP team in the P·V phase, candidates in the
//     score phase.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "kernels/ref/ref_math.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

// kvf[i][0..D) = BF16 row kv[i] widened.
void WidenRows(const uint16_t* const* kv, int n, int64_t D, float* kvf) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  for (int i = 0; i < n; ++i) {
    int64_t d = 0;
    for (; d + static_cast<int64_t>(kLanes) <= D; d += kLanes)
      hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, kv[i] + d)))), df,
                 kvf + i * D + d);
    for (; d < D; ++d) kvf[i * D + d] = Bf16ToFloat(kv[i][d]);
  }
}

// dots[i·Hp + h] = Σ_d q[h][d]·k_i[d] (increasing d) for candidates [i0, i1),
// with qt[d·Hp + h] the transposed query (Hp = H rounded up to kLanes).
void Scores(const float* qt, int64_t Hp, int64_t D, const float* kvf, int i0, int i1, float* dots) {
  const DF df;
  const int64_t hv = Hp / static_cast<int64_t>(kLanes);
  int i = i0;
  for (; i + 4 <= i1; i += 4) {
    for (int64_t v = 0; v < hv; ++v) {
      VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      const float* k0 = kvf + (i + 0) * D;
      const float* k1 = kvf + (i + 1) * D;
      const float* k2 = kvf + (i + 2) * D;
      const float* k3 = kvf + (i + 3) * D;
      for (int64_t d = 0; d < D; ++d) {
        const VF qv = hn::LoadU(df, qt + d * Hp + v * kLanes);
        a0 = hn::Add(a0, hn::Mul(qv, hn::Set(df, k0[d])));
        a1 = hn::Add(a1, hn::Mul(qv, hn::Set(df, k1[d])));
        a2 = hn::Add(a2, hn::Mul(qv, hn::Set(df, k2[d])));
        a3 = hn::Add(a3, hn::Mul(qv, hn::Set(df, k3[d])));
      }
      hn::StoreU(a0, df, dots + (i + 0) * Hp + v * kLanes);
      hn::StoreU(a1, df, dots + (i + 1) * Hp + v * kLanes);
      hn::StoreU(a2, df, dots + (i + 2) * Hp + v * kLanes);
      hn::StoreU(a3, df, dots + (i + 3) * Hp + v * kLanes);
    }
  }
  for (; i < i1; ++i) {
    for (int64_t v = 0; v < hv; ++v) {
      VF a0 = hn::Zero(df);
      const float* k0 = kvf + i * D;
      for (int64_t d = 0; d < D; ++d) a0 = hn::Add(a0, hn::Mul(hn::LoadU(df, qt + d * Hp + v * kLanes), hn::Set(df, k0[d])));
      hn::StoreU(a0, df, dots + i * Hp + v * kLanes);
    }
  }
}

// part[d] = part[d] + pb·kr[d]
void AddScaled(float* part, float pb, const float* kr, int64_t D) {
  const DF df;
  const VF p = hn::Set(df, pb);
  int64_t d = 0;
  for (; d + static_cast<int64_t>(kLanes) <= D; d += kLanes)
    hn::StoreU(hn::Add(hn::LoadU(df, part + d), hn::Mul(p, hn::LoadU(df, kr + d))), df, part + d);
  for (; d < D; ++d) part[d] += pb * kr[d];
}

// acc[d] = acc[d]·rescale + part[d]
void Rescale(float* acc, float rescale, const float* part, int64_t D) {
  const DF df;
  const VF r = hn::Set(df, rescale);
  int64_t d = 0;
  for (; d + static_cast<int64_t>(kLanes) <= D; d += kLanes)
    hn::StoreU(hn::Add(hn::Mul(hn::LoadU(df, acc + d), r), hn::LoadU(df, part + d)), df, acc + d);
  for (; d < D; ++d) acc[d] = acc[d] * rescale + part[d];
}

// out[d] = bf16(acc[d] / sum)
void Finish(const float* acc, float sum, float* out, int64_t D) {
  const DF df;
  const VF s = hn::Set(df, sum);
  int64_t d = 0;
  for (; d + static_cast<int64_t>(kLanes) <= D; d += kLanes)
    hn::StoreU(RoundBf16V(hn::Div(hn::LoadU(df, acc + d), s)), df, out + d);
  for (; d < D; ++d) out[d] = RoundBf16(acc[d] / sum);
}

int64_t LanesF32() { return static_cast<int64_t>(kLanes); }

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(WidenRows);
HWY_EXPORT(Scores);
HWY_EXPORT(AddScaled);
HWY_EXPORT(Rescale);
HWY_EXPORT(Finish);
HWY_EXPORT(LanesF32);

void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* kv, const int32_t* slot, int n,
                     int32_t list_len, const float* sink, float softmax_scale, float* out) {
  constexpr int32_t kChunk = 64;
  auto* widen = HWY_DYNAMIC_DISPATCH(WidenRows);
  auto* scores = HWY_DYNAMIC_DISPATCH(Scores);
  auto* add_scaled = HWY_DYNAMIC_DISPATCH(AddScaled);
  auto* rescale_fn = HWY_DYNAMIC_DISPATCH(Rescale);
  auto* finish = HWY_DYNAMIC_DISPATCH(Finish);
  const int64_t L = HWY_DYNAMIC_DISPATCH(LanesF32)();
  const int64_t Hp = ((H + L - 1) / L) * L;
  // Scratch of the calling thread (grows, never shrinks: no allocation per
  // decode step), shared with the team below through the pointers.
  thread_local std::vector<float> kvf_buf, qt_buf, dots_buf;
  kvf_buf.assign(static_cast<size_t>(n) * D, 0.0f);
  qt_buf.assign(static_cast<size_t>(D * Hp), 0.0f);
  dots_buf.assign(static_cast<size_t>(n) * Hp, 0.0f);
  float* const kvf = kvf_buf.data();
  float* const qt = qt_buf.data();
  float* const dots = dots_buf.data();
  for (int h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d) qt[d * Hp + h] = q[h * D + d];
  // Heads in parallel only when the call is large (a long decode list): a
  // fork/join costs tens of microseconds, more than a short list's work.
  const bool par = static_cast<int64_t>(n) * D * H >= (int64_t{1} << 21);
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int i0 = 0; i0 < n; i0 += 8) {
      const int i1 = std::min(n, i0 + 8);
      widen(kv + i0, i1 - i0, D, kvf + static_cast<int64_t>(i0) * D);
      scores(qt, Hp, D, kvf, i0, i1, dots);
    }
    thread_local std::vector<float> acc, part, pchunk, s;
    thread_local std::vector<int> members;
    acc.assign(static_cast<size_t>(D), 0.0f);
    part.assign(static_cast<size_t>(D), 0.0f);
    pchunk.assign(kChunk, 0.0f);
    s.assign(kChunk, 0.0f);
#pragma omp for schedule(static)
    for (int h = 0; h < H; ++h) {
      float m = -1e30f, sum_exp = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      int i = 0;
      for (int32_t c0 = 0; c0 < list_len; c0 += kChunk) {
        const int32_t clen = std::min(kChunk, list_len - c0);
        members.clear();
        while (i < n && slot[i] < c0 + clen) members.push_back(i++);
        if (members.empty()) continue;  // all absent: scale 1, zero contributions
        float cmax = -std::numeric_limits<float>::infinity();
        for (size_t t = 0; t < members.size(); ++t) {
          s[t] = dots[static_cast<int64_t>(members[t]) * Hp + h] * softmax_scale;
          cmax = std::max(cmax, s[t]);
        }
        const float m_new = std::max(m, cmax);
        const float rescale = ref::SleefExpf(m - m_new);
        std::fill(pchunk.begin(), pchunk.begin() + clen, 0.0f);
        std::fill(part.begin(), part.end(), 0.0f);
        for (size_t t = 0; t < members.size(); ++t) {
          const float p = ref::SleefExpf(s[t] - m_new);
          pchunk[slot[members[t]] - c0] = p;
          const float pb = RoundBf16(p);
          add_scaled(part.data(), pb, kvf + static_cast<int64_t>(members[t]) * D, D);
        }
        sum_exp = sum_exp * rescale + ref::TorchSum(pchunk.data(), clen);
        rescale_fn(acc.data(), rescale, part.data(), D);
        m = m_new;
      }
      sum_exp = sum_exp + ref::SleefExpf(sink[h] - m);
      finish(acc.data(), sum_exp, out + static_cast<int64_t>(h) * D, D);
    }
  }
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
