// STREAM-style bandwidth kernels (membw.h). At most 256-bit vectors: on the
// Zen 5 machine this was written on, a stream of 512-bit loads from DRAM
// reaches only ~60% of the bandwidth of the same stream in 256-bit loads
// (measured: 14 vs 25 GB/s on one core), and the machine limit is what the
// benchmarks need.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/stream.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <omp.h>

#include <algorithm>

#include "kernels/cpu/membw.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void CopyRange(float* c, const float* a, int64_t n) {
  const hn::CappedTag<float, 8> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    const auto v0 = hn::LoadU(df, a + i), v1 = hn::LoadU(df, a + i + L);
    const auto v2 = hn::LoadU(df, a + i + 2 * L), v3 = hn::LoadU(df, a + i + 3 * L);
    hn::StoreU(v0, df, c + i);
    hn::StoreU(v1, df, c + i + L);
    hn::StoreU(v2, df, c + i + 2 * L);
    hn::StoreU(v3, df, c + i + 3 * L);
  }
  for (; i < n; ++i) c[i] = a[i];
}

void TriadRange(float* a, const float* b, const float* c, float s, int64_t n) {
  const hn::CappedTag<float, 8> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto vs = hn::Set(df, s);
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    hn::StoreU(hn::Add(hn::LoadU(df, b + i), hn::Mul(vs, hn::LoadU(df, c + i))), df, a + i);
    hn::StoreU(hn::Add(hn::LoadU(df, b + i + L), hn::Mul(vs, hn::LoadU(df, c + i + L))), df, a + i + L);
  }
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

uint64_t ReadRange(const uint8_t* p, int64_t n) {
  const hn::CappedTag<uint64_t, 4> du;
  const int64_t L = static_cast<int64_t>(hn::Lanes(du) * 8);  // bytes per vector
  auto s0 = hn::Zero(du), s1 = hn::Zero(du), s2 = hn::Zero(du), s3 = hn::Zero(du);
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    s0 = hn::Xor(s0, hn::LoadU(du, reinterpret_cast<const uint64_t*>(p + i)));
    s1 = hn::Xor(s1, hn::LoadU(du, reinterpret_cast<const uint64_t*>(p + i + L)));
    s2 = hn::Xor(s2, hn::LoadU(du, reinterpret_cast<const uint64_t*>(p + i + 2 * L)));
    s3 = hn::Xor(s3, hn::LoadU(du, reinterpret_cast<const uint64_t*>(p + i + 3 * L)));
  }
  uint64_t r = hn::GetLane(hn::SumOfLanes(du, hn::Xor(hn::Xor(s0, s1), hn::Xor(s2, s3))));
  for (; i < n; ++i) r += p[i];
  return r;
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(CopyRange);
HWY_EXPORT(TriadRange);
HWY_EXPORT(ReadRange);

namespace {
// Contiguous static share [b, e) of n for this thread, 64-byte granular.
void Share(int64_t n, int64_t unit, int64_t* b, int64_t* e) {
  const int nt = omp_get_num_threads(), t = omp_get_thread_num();
  const int64_t blocks = (n + unit - 1) / unit;
  *b = std::min(n, (blocks * t / nt) * unit);
  *e = std::min(n, (blocks * (t + 1) / nt) * unit);
}
}  // namespace

void StreamCopy(float* c, const float* a, int64_t n) {
  auto* fn = HWY_DYNAMIC_DISPATCH(CopyRange);
#pragma omp parallel
  {
    int64_t b, e;
    Share(n, 16, &b, &e);
    fn(c + b, a + b, e - b);
  }
}

void StreamTriad(float* a, const float* b, const float* c, float s, int64_t n) {
  auto* fn = HWY_DYNAMIC_DISPATCH(TriadRange);
#pragma omp parallel
  {
    int64_t lo, hi;
    Share(n, 16, &lo, &hi);
    fn(a + lo, b + lo, c + lo, s, hi - lo);
  }
}

uint64_t StreamRead(const uint8_t* p, int64_t n) {
  auto* fn = HWY_DYNAMIC_DISPATCH(ReadRange);
  uint64_t r = 0;
#pragma omp parallel reduction(^ : r)
  {
    int64_t b, e;
    Share(n, 64, &b, &e);
    r ^= fn(p + b, e - b);
  }
  return r;
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
