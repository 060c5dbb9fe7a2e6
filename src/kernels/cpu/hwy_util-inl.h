// deepinfer/kernels/cpu/hwy_util-inl.h — per-target helpers shared by the
// kernels/cpu translation units (Highway "-inl" header: included once per
// target from inside a foreach_target TU).

// Per-target include guard (the Highway idiom).
#if defined(DEEPINFER_KERNELS_CPU_HWY_UTIL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DEEPINFER_KERNELS_CPU_HWY_UTIL_INL_H_
#undef DEEPINFER_KERNELS_CPU_HWY_UTIL_INL_H_
#else
#define DEEPINFER_KERNELS_CPU_HWY_UTIL_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>

#include "base/parallel.h"
#include "kernels/cpu/linear_common.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr size_t kLanes = hn::MaxLanes(DF());

// RoundBf16 (format/numerics.h) on a vector: round-to-nearest-even to BF16,
// NaN kept quiet with its sign and top payload bits; returns the FP32 value.
HWY_INLINE VF RoundBf16V(VF v) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::And(hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)), lsb), hn::Set(du, 0xFFFF0000u));
  const auto nan = hn::And(hn::Or(u, hn::Set(du, 0x00400000u)), hn::Set(du, 0xFFFF0000u));
  return hn::IfThenElse(hn::IsNaN(v), hn::BitCast(df, nan), hn::BitCast(df, rounded));
}

// Stores the first `n` lanes of v (n <= kLanes).
HWY_INLINE void StorePartial(VF v, size_t n, float* p) {
  const DF df;
  if (n == kLanes) {
    hn::StoreU(v, df, p);
  } else {
    HWY_ALIGN float tmp[kLanes];
    hn::Store(v, df, tmp);
    for (size_t i = 0; i < n; ++i) p[i] = tmp[i];
  }
}


// ---------------------------------------------------------------- E4M3 codes
// (the FP8 linears, linear_fp8.cc, and the BF16 linears' 8-bit decode copy,
// linear_bf16.cc Bf16Micro8)
// 16/8/.. E4M3 codes at p (one per lane) → FP32 value × 2^-120 (exact; E4M3
// subnormals become FP32 subnormals): sign-extend to 32 bits, shift the 7
// magnitude bits to bits 20..26, keep them and the sign bit.
HWY_INLINE VF E4M3Scaled(const uint8_t* p) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const auto b = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
  return hn::BitCast(df, hn::And(hn::ShiftLeft<20>(b), hn::Set(di, static_cast<int32_t>(0x87F00000u))));
}

// The same conversion for 4·kLanes codes at p (rows r … r + 4·kLanes − 1 of
// one packed column) from one load, without the sign-extending shuffle: f[j]
// lane l holds row r + 4l + j (byte j of dword l). Per dword: a 16-bit
// arithmetic shift by 4 puts byte 3 at bits 31..20 and byte 1 at 15..4 with
// their signs spread over the bits above; a 32-bit shift by 8 first does the
// same for bytes 2 and 0; a 32-bit shift by 16 lifts the low halves; the mask
// keeps bit 31 and bits 26..20. Same bits as E4M3Scaled, 5 shifts and 4 ands
// per 4 vectors instead of 4 shuffles, 4 shifts and 4 ands: the shuffles and
// shifts share two of Zen's four vector pipes (docs/kernels-log.md, "Whole
// dwords in the FP8 and BF16 GEMVs").
HWY_INLINE void E4M3Scaled4(const uint8_t* p, VF f[4]) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no 16-bit halves (kFp8Dwords is false there)
  for (int j = 0; j < 4; ++j) f[j] = E4M3Scaled(p + j);
#else
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Repartition<int16_t, DF> d16;
  const auto b = hn::LoadU(di, reinterpret_cast<const int32_t*>(p));
  const auto mask = hn::Set(di, static_cast<int32_t>(0x87F00000u));
  const auto r31 = hn::BitCast(di, hn::ShiftRight<4>(hn::BitCast(d16, b)));
  const auto r20 = hn::BitCast(di, hn::ShiftRight<4>(hn::BitCast(d16, hn::ShiftLeft<8>(b))));
  f[3] = hn::BitCast(df, hn::And(r31, mask));
  f[1] = hn::BitCast(df, hn::And(hn::ShiftLeft<16>(r31), mask));
  f[2] = hn::BitCast(df, hn::And(r20, mask));
  f[0] = hn::BitCast(df, hn::And(hn::ShiftLeft<16>(r20), mask));
#endif
}

// Whether the micro-tiles convert whole dwords of codes (E4M3Scaled4), and
// up to how many partial sums (V·MT): its four converted vectors are live at
// once, so larger tiles spill (measured AVX2 M = 3 with 4 × 3: 0.96×).
constexpr bool kFp8Dwords = kLanes >= 8;
constexpr int kFp8DwordsMaxSums = kLanes >= 16 ? 16 : 8;

// Micro-tile shape per target: V vectors of kLanes output rows (V·kLanes
// divides 64) × MT activation rows. Chosen so the MT·V partial sums, one
// weight vector and the broadcasts fit the register file (32 zmm / 16 ymm).
constexpr int kMicroV = kLanes >= 8 ? 4 : (kLanes == 4 ? 4 : 8);
constexpr int kMicroMT = kLanes >= 16 ? 6 : (kLanes == 8 ? 3 : 1);
constexpr int64_t kMicroRows = kMicroV * static_cast<int64_t>(kLanes);
static_assert(kTileRows % kMicroRows == 0, "micro-tile rows must divide the tile");

template <int I>
using IntC = std::integral_constant<int, I>;

// Calls f(IntC<V>, IntC<mt>) for mt = rem (1 <= rem <= MT).
template <int V, int MT, typename F>
HWY_INLINE void WithMT(int rem, F&& f) {
  if constexpr (MT >= 1) {
    if (rem >= MT) {
      f(IntC<V>(), IntC<MT>());
    } else {
      WithMT<V, MT - 1>(rem, f);
    }
  }
}

// Calls f(IntC<v>, IntC<mt>) for v = vt (1 <= vt <= V) and mt = rem.
template <int V, int MT, typename F>
HWY_INLINE void WithVMT(int vt, int rem, F&& f) {
  if constexpr (V >= 1) {
    if (vt >= V) {
      WithMT<V, MT>(rem, f);
    } else {
      WithVMT<V - 1, MT>(vt, rem, f);
    }
  }
}

// Runs items [item0, item1) of a: each item is (tile, m-chunk); inside it,
// every micro column of the tile × every MT rows of the chunk. A micro column
// past the last real row is skipped and the last one is narrowed to the
// vectors that hold real rows (so an N = 24 weight streams 32 rows, not 64).
// micro(IntC<V>, IntC<MT>, a, tile, roff, m0).
// With a.slices (linear_common.h ParallelItems) item s is instead the
// kSliceRows rows from 16·s, over all M rows.
template <int V, int MT, typename Micro>
HWY_INLINE void RunItems(const QArgs& a, int64_t item0, int64_t item1, Micro&& micro) {
  static_assert(kTileRows % kSliceRows == 0, "a slice lies in one tile");
  constexpr int64_t kRows = V * static_cast<int64_t>(kLanes);  // rows of one micro column
  static_assert(kTileRows % kRows == 0, "micro columns must divide the tile");
  if (a.slices > 0) {
    for (int64_t s = item0; s < item1; ++s) {
      const int64_t r0 = s * kSliceRows, tile = r0 / kTileRows;
      const int64_t slice_rows = std::min<int64_t>(kSliceRows, a.N - r0);
      for (int64_t sub = 0; sub < slice_rows; sub += kRows) {
        const int64_t roff = r0 % kTileRows + sub, rows_here = std::min<int64_t>(kRows, slice_rows - sub);
        const int vt = static_cast<int>((rows_here + static_cast<int64_t>(kLanes) - 1) / static_cast<int64_t>(kLanes));
        for (int64_t m0 = 0; m0 < a.M; m0 += MT) {
          const int rem = static_cast<int>(std::min<int64_t>(MT, a.M - m0));
          WithVMT<V, MT>(vt, rem, [&](auto v, auto mt) { micro(v, mt, a, tile, roff, m0); });
        }
      }
    }
    return;
  }
  for (int64_t it = item0; it < item1; ++it) {
    const int64_t tile = it / a.mchunks, mc = it % a.mchunks;
    const int64_t m_begin = mc * a.mchunk, m_end = std::min(a.M, m_begin + a.mchunk);
    const int64_t rows_left = a.N - tile * kTileRows;
    for (int64_t roff = 0; roff < kTileRows && roff < rows_left; roff += kRows) {
      const int64_t rows_here = std::min<int64_t>(kRows, rows_left - roff);
      const int vt = static_cast<int>((rows_here + static_cast<int64_t>(kLanes) - 1) / static_cast<int64_t>(kLanes));
      for (int64_t m0 = m_begin; m0 < m_end; m0 += MT) {
        const int rem = static_cast<int>(std::min<int64_t>(MT, m_end - m0));
        WithVMT<V, MT>(vt, rem, [&](auto v, auto mt) { micro(v, mt, a, tile, roff, m0); });
      }
    }
  }
}

// The BF16 pair-dot block paths (linear_fp8.cc RunFp8DotItems, linear_fp4.cc
// RunFp4DotItems, linear_bf16.cc RunBf16DotItems) run groups of `mt` rows of
// an m-chunk [m_begin, m_end) over a block of `step` activation pairs from
// pair p0 (of np per row, row stride ldqp). While group m0 runs, this
// prefetches the next group's pairs of the block (or the first group's of
// the next block): short runs ldqp dwords apart, which the hardware
// prefetchers do not follow (as RunBlockItems on AVX2).
HWY_INLINE void PrefetchNextPairGroup(const uint32_t* qp, int64_t ldqp, int64_t m0, int64_t mt, int64_t m_begin,
                                      int64_t m_end, int64_t p0, int64_t step, int64_t np) {
  const bool same_block = m0 + mt < m_end;
  const int64_t mn = same_block ? m0 + mt : m_begin, pn = same_block ? p0 : p0 + step;
  if (pn >= np) return;
  const int64_t len = std::min(step, np - pn);
  for (int64_t r = mn; r < std::min(m_end, mn + mt); ++r)
    for (int64_t c = 0; c < len; c += 16) hwy::Prefetch(qp + r * ldqp + pn + c);
}

// Writes the FP32 accumulators acc[MT][V·kLanes] of rows m0.. and output
// columns n0.. to a.y (row stride a.ldy), BF16-rounded when `round`, clipped
// at a.N.
template <int V, int MT>
HWY_INLINE void StoreRows(const float* acc, const QArgs& a, int64_t m0, int64_t n0, bool round) {
  const DF df;
  for (int m = 0; m < MT; ++m) {
    float* yr = a.y + (m0 + m) * a.ldy;
    for (int v = 0; v < V; ++v) {
      const int64_t n = n0 + v * static_cast<int64_t>(kLanes);
      if (n >= a.N) break;
      VF r = hn::Load(df, acc + m * V * kLanes + v * kLanes);
      if (round) r = RoundBf16V(r);
      StorePartial(r, static_cast<size_t>(std::min<int64_t>(kLanes, a.N - n)), yr + n);
    }
  }
}

// StoreRows of `rows` consecutive rows m0.. of a tile's accumulators (acc:
// kTileRows floats per row).
HWY_INLINE void StoreBlockRows(const float* acc, const QArgs& a, int64_t m0, int64_t rows, int64_t n0, bool round) {
  for (int64_t i = 0; i < rows; ++i)
    StoreRows<static_cast<int>(kTileRows / kLanes), 1>(acc + i * kTileRows, a, m0 + i, n0, round);
}

// StoreRows for sums whose rows sit permuted by whole-dword weight loads of
// D values per lane (D = 4: E4M3Scaled4, D = 2: LoadW2): acc[m][(D·g + j)·kLanes
// + l] is row D·kLanes·g + D·l + j of the micro column; put back in row order.
template <int D, int V, int MT>
HWY_INLINE void StoreRowsPermuted(const float* acc, const QArgs& a, int64_t m0, int64_t n0, bool round) {
  static_assert(V % D == 0, "whole dword groups");
  HWY_ALIGN float rows[MT][V * kLanes];
  for (int m = 0; m < MT; ++m)
    for (int g = 0; g < V / D; ++g)
      for (int j = 0; j < D; ++j)
        for (size_t l = 0; l < kLanes; ++l)
          rows[m][g * D * kLanes + D * l + j] = acc[(m * V + D * g + j) * kLanes + l];
  StoreRows<V, MT>(rows[0], a, m0, n0, round);
}

// FloatsExpRange (linear_common.h) vectorised: the same ExpRange for rows
// x[m·ld + k], m < M, k < K (linear_bf16.cc ActExpRange / ActExpRangeTeam,
// attention.cc QueryExpRange).
HWY_INLINE ExpRange ActExpRangeV(const float* x, int64_t M, int64_t K, int64_t ld) {
  const hn::RebindToUnsigned<DF> du;
  using VU = hn::Vec<decltype(du)>;
  VU low = hn::Zero(du), any = hn::Zero(du), e_lo = hn::Set(du, 0xFFu), e_hi = hn::Zero(du);
  uint32_t low_s = 0, any_s = 0, e_lo_s = 0xFF, e_hi_s = 0;
  for (int64_t m = 0; m < M; ++m) {
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(x + m * ld);
    int64_t k = 0;
    for (; k + static_cast<int64_t>(kLanes) <= K; k += kLanes) {
      const VU u = hn::LoadU(du, xr + k);
      const VU mag = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
      const VU e = hn::ShiftRight<23>(mag);
      const auto nz = hn::Ne(mag, hn::Zero(du));
      low = hn::Or(low, hn::And(u, hn::Set(du, 0xFFFFu)));
      any = hn::Or(any, mag);
      e_lo = hn::Min(e_lo, hn::IfThenElse(nz, e, hn::Set(du, 0xFFu)));
      e_hi = hn::Max(e_hi, hn::IfThenElseZero(nz, e));
    }
    for (; k < K; ++k) {
      const uint32_t u = xr[k], mag = u & 0x7FFFFFFFu, e = mag >> 23;
      low_s |= u & 0xFFFFu;
      any_s |= mag;
      e_lo_s = std::min(e_lo_s, mag != 0 ? e : 0xFFu);
      e_hi_s = std::max(e_hi_s, mag != 0 ? e : 0u);
    }
  }
  HWY_ALIGN uint32_t lanes[4][kLanes];
  hn::Store(low, du, lanes[0]);
  hn::Store(any, du, lanes[1]);
  hn::Store(e_lo, du, lanes[2]);
  hn::Store(e_hi, du, lanes[3]);
  for (size_t l = 0; l < kLanes; ++l) {
    low_s |= lanes[0][l];
    any_s |= lanes[1][l];
    e_lo_s = std::min(e_lo_s, lanes[2][l]);
    e_hi_s = std::max(e_hi_s, lanes[3][l]);
  }
  ExpRange r;  // as ExpRange::Add: biased exponent 0 (a subnormal) counts as -150
  r.bf16 = low_s == 0;
  r.finite = e_hi_s != 0xFFu;
  r.any_nonzero = any_s != 0;
  if (r.any_nonzero) {
    r.lo = e_lo_s == 0 ? -150 : static_cast<int>(e_lo_s) - 127;
    r.hi = e_hi_s == 0 ? -150 : static_cast<int>(e_hi_s) - 127;
  }
  return r;
}

// ---------------------------------------------------------------- block GEMM
// Block GEMM micro-tile shape: the MT·V partial sums, V weight vectors and
// one broadcast fit the register file (AVX-512: 24 + 4 + 1 of 32 zmm; AVX2:
// 12 + 2 + 1 of 16 ymm).
constexpr int kBlockV = kLanes >= 16 ? 4 : (kLanes == 8 ? 2 : 4);
constexpr int kBlockMT = kLanes >= 8 ? 6 : 1;
// Whether the FP8/FP4 prefill GEMMs take the block path on this target.
// Measured (bench kernels GEMM, M = 256, one thread): on AVX2 the weight
// conversion inside the micro-tile is the bottleneck and the block path is
// 2.2-2.4x faster; on AVX-512 the in-register conversion is cheap relative
// to 24 FMAs per weight vector and the direct micro-tile is as fast or faster.
constexpr bool kUseBlockGemm = kLanes == 8;
// The block GEMM's largest m-chunk (QArgs::max_mchunk): its accumulators
// (96 KB) stay in L2 beside the converted block and the activations.
// Measured (Zen 4, AVX2 forced, one thread, N = 2304, K = 5120, M = 1024,
// chunks 96 / 192 / 384 / 1024 alternated twice): FP8 0.94-0.99 / 0.97-0.99 /
// 1.00-1.03 / 1.00 of sgemm, FP4 0.97-0.98 / 0.98-1.03 / 1.01 / 1.01-1.03.
inline constexpr int64_t kBlockMaxMChunk = 4 * kMChunk;
// The m-chunks of ParallelItems start at multiples of kMChunk (96): every chunk then
// starts at a group boundary of the packed activations below.
static_assert(kMChunk % kBlockMT == 0, "packed activation groups must not straddle an m-chunk");

// Activations of the block GEMM, packed once per call: rows in groups of
// kBlockMT, out[(g·K + k)·kBlockMT + i] = q[(g·kBlockMT + i)·K + k] (the
// unused rows of the last group are left unset; the micro-tile never reads
// them). The micro-tile's broadcasts then walk one contiguous stream per
// group instead of kBlockMT rows K floats apart (with K = 5120 those rows
// all fall into one L1 set).
// PackActGroupsPairs: the same over rows of `ld` floats, with column k of
// each `seg`-column segment taken from column Bf16PairColumn(k) (the BF16
// linears' pair order; identity when !pairs). PackActGroups is the plain case.
//
// Pair order within a segment of n columns: column j holds j's partner j ^ 1
// (a lone last column keeps its own).
HWY_INLINE int64_t PairPartner(int64_t j, int64_t n, bool pairs) { return pairs && (j ^ 1) < n ? (j ^ 1) : j; }
HWY_INLINE int64_t Bf16PairColumn(int64_t k, int64_t seg, bool pairs) {
  if (!pairs) return k;
  const int64_t base = k - k % seg;
  return base + PairPartner(k - base, seg, pairs);
}
#if HWY_TARGET == HWY_AVX2
// Columns k..k+7 of a whole group's 6 rows (t[i]: row i's 8 values) into
// the packed layout: dst[j·6 + i] = t[i][j] (dst at column k). An 8×6
// transpose (unpack, shuffle, 128-bit permute); column j's store writes 8
// floats, its last 2 (zero) overwritten by column j+1's, and the group's
// last column (`last`) stores just its 6. So a group's 8-column blocks must
// be stored in increasing k by one thread (each block's column 7 spills into
// the next block, which overwrites it); the callers walk a group's columns
// upwards inside one ParallelFor item. Moves values only: the bits of the
// scalar copy.
HWY_INLINE void StorePackedColumns6(const __m256 (&t)[6], bool last, float* HWY_RESTRICT dst) {
  const __m256 z = _mm256_setzero_ps();
  const __m256 a0 = _mm256_unpacklo_ps(t[0], t[1]), a1 = _mm256_unpackhi_ps(t[0], t[1]);
  const __m256 a2 = _mm256_unpacklo_ps(t[2], t[3]), a3 = _mm256_unpackhi_ps(t[2], t[3]);
  const __m256 a4 = _mm256_unpacklo_ps(t[4], t[5]), a5 = _mm256_unpackhi_ps(t[4], t[5]);
  // b[j]: rows 0..3 (b0..b3) or 4, 5, 0, 0 (b4..b7) of columns j (low half) and j + 4 (high half).
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, z, 0x44), b5 = _mm256_shuffle_ps(a4, z, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, z, 0x44), b7 = _mm256_shuffle_ps(a5, z, 0xEE);
  const __m256 c[8] = {_mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
                       _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
                       _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
                       _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
  HWY_UNROLL(8)
  for (int j = 0; j < 7; ++j) _mm256_storeu_ps(dst + j * 6, c[j]);
  if (last) {
    _mm_storeu_ps(dst + 42, _mm256_castps256_ps128(c[7]));
    _mm_storel_pi(reinterpret_cast<__m64*>(dst + 46), _mm256_extractf128_ps(c[7], 1));
  } else {
    _mm256_storeu_ps(dst + 42, c[7]);
  }
}
#endif

// One group g of PackActGroupsPairs; the calls below run the groups over
// the team (each group writes its own rows of `out`).
HWY_INLINE void PackActGroupPairs(const float* HWY_RESTRICT q, int64_t M, int64_t ld, int64_t seg, bool pairs,
                                  int64_t g, float* HWY_RESTRICT out) {
  constexpr int64_t R = kBlockMT;
  const int64_t rows = std::min<int64_t>(R, M - g * R);
  const float* src = q + g * R * ld;
  float* dst = out + g * R * ld;
#if HWY_TARGET == HWY_AVX2
  // A whole group, 8 columns at a time (pair order: adjacent columns
  // swapped, every pair whole when the segments are multiples of 8).
  if (rows == 6 && ld % 8 == 0 && (!pairs || seg % 8 == 0)) {
    for (int64_t k = 0; k < ld; k += 8) {
      __m256 t[6];
      HWY_UNROLL(6)
      for (int i = 0; i < 6; ++i) {
        t[i] = _mm256_loadu_ps(src + i * ld + k);
        if (pairs) t[i] = _mm256_permute_ps(t[i], 0xB1);
      }
      StorePackedColumns6(t, k + 8 == ld, dst + k * R);
    }
    return;
  }
#endif
  for (int64_t s0 = 0; s0 < ld; s0 += seg) {
    const int64_t n = std::min(seg, ld - s0);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t ks = s0 + PairPartner(j, n, pairs);
      float* d = dst + (s0 + j) * R;
      if (rows == R) {
        HWY_UNROLL(8)
        for (int64_t i = 0; i < R; ++i) d[i] = src[i * ld + ks];
      } else {
        for (int64_t i = 0; i < rows; ++i) d[i] = src[i * ld + ks];
      }
    }
  }
}
// The packing runs its groups over the team (base/parallel.h ParallelFor)
// from 2^16 values, the size from which QuantizeActRows splits its rows:
// serial, it took ~0.8% of a one-thread M = 1 024, K = 5 120 FP8 GEMM and
// twice that share with two threads.
HWY_INLINE bool PackOnTeam(int64_t M, int64_t ld) { return M * ld >= (int64_t{1} << 16); }
HWY_INLINE int64_t PackGroups(int64_t M) { return (M + kBlockMT - 1) / kBlockMT; }
HWY_INLINE void PackActGroupsPairs(const float* HWY_RESTRICT q, int64_t M, int64_t ld, int64_t seg, bool pairs,
                                   float* HWY_RESTRICT out) {
  ParallelFor(PackGroups(M), PackOnTeam(M, ld),
              [&](int64_t g) { PackActGroupPairs(q, M, ld, seg, pairs, g, out); });
}
HWY_INLINE void PackActGroups(const float* HWY_RESTRICT q, int64_t M, int64_t K, float* HWY_RESTRICT out) {
  PackActGroupsPairs(q, M, K, K, /*pairs=*/false, out);
}
// PackActGroups of the dequantised activations (linear_common.h, prescaled
// operands): out = (q·2^-120)·sa of the row's block, i.e. the E4M3 value ×
// s_act (q holds QuantizeActRows' value × 2^119, sa = 2·s_act; both factors
// are powers of two and BlockPrescaleExact has checked the range, so each
// product is exact).
HWY_INLINE void PackActGroupsScaled(const float* HWY_RESTRICT q, const float* HWY_RESTRICT sa, int64_t M, int64_t K,
                                    int64_t ab, float* HWY_RESTRICT out) {
  constexpr int64_t R = kBlockMT;
  const int64_t kb = K / ab;
  ParallelFor(PackGroups(M), PackOnTeam(M, K), [&](int64_t g) {
    const int64_t rows = std::min<int64_t>(R, M - g * R);
#if HWY_TARGET == HWY_AVX2
    // A whole group, 8 columns (within one activation block) at a time: the
    // same two multiplies per value, then StorePackedColumns6.
    if (rows == 6 && ab % 8 == 0 && K % ab == 0) {
      const __m256 down = _mm256_set1_ps(0x1p-120f);
      for (int64_t k = 0; k < K; k += 8) {
        __m256 t[6];
        HWY_UNROLL(6)
        for (int i = 0; i < 6; ++i) {
          const __m256 f = _mm256_set1_ps(sa[(g * R + i) * kb + k / ab]);
          t[i] = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(q + (g * R + i) * K + k), down), f);
        }
        StorePackedColumns6(t, k + 8 == K, out + g * R * K + k * R);
      }
      return;
    }
#endif
    for (int64_t i = 0; i < rows; ++i) {
      const float* src = q + (g * R + i) * K;
      const float* s = sa + (g * R + i) * kb;
      float* dst = out + g * R * K + i;
      for (int64_t b = 0; b < kb; ++b) {
        const float f = s[b];
        for (int64_t k = b * ab; k < (b + 1) * ab; ++k) dst[k * R] = (src[k] * 0x1p-120f) * f;
      }
    }
  });
}
// Per-thread buffer for PackActGroups (grows, never shrinks).
HWY_INLINE float* PackedActBuffer(int64_t M, int64_t K) {
  thread_local AlignedArray<float> buf;
  thread_local int64_t cap = 0;
  const int64_t n = (M + kBlockMT - 1) / kBlockMT * kBlockMT * K;
  if (cap < n) {
    buf = AllocateAligned<float>(static_cast<size_t>(n));
    cap = n;
  }
  return buf.get();
}

// The FP8/FP4 linears' per-target entry: for the block path, the quantised
// activations are repacked into PackActGroups' layout first; then every
// (tile, m-chunk) item runs (ParallelItems).
template <typename Fn>
HWY_INLINE void RunLinearCall(QArgs& a, Fn* run) {
  if (kUseBlockGemm && a.M >= kBlockGemmMinM) {
    a.max_mchunk = kBlockMaxMChunk;
    float* packed = PackedActBuffer(a.M, a.K);
    a.prescaled = BlockPrescaleExact(a.w_exp_lo, a.w_exp_hi, a.sa, a.M * (a.K / a.ab));
    if (a.prescaled) {
      PackActGroupsScaled(a.q, a.sa, a.M, a.K, a.ab, packed);
    } else {
      PackActGroups(a.q, a.M, a.K, packed);
    }
    a.q = packed;
  }
  ParallelItems(a, run);
}

// The k loop of BlockMicro: KLEN columns (a compile-time 32 for the V4.1
// block, 0 = klen at run time).
template <int V, int MT, int MTS, int KLEN, bool kFma = true>
HWY_INLINE void BlockMicroK(VF (&part)[MT][V], const float* HWY_RESTRICT w, int64_t klen,
                            const float* HWY_RESTRICT q) {
  const DF df;
  const int64_t n = KLEN > 0 ? KLEN : klen;
  HWY_UNROLL(4)
  for (int64_t k = 0; k < n; ++k) {
    const float* wk = w + k * kTileRows;
    VF wv[V];
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) wv[v] = hn::LoadU(df, wk + v * kLanes);
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      const VF qb = hn::Set(df, q[k * MTS + m]);
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) {
        if constexpr (kFma) {
          part[m][v] = hn::MulAdd(qb, wv[v], part[m][v]);
        } else {
          part[m][v] = hn::Add(part[m][v], hn::Mul(qb, wv[v]));
        }
      }
    }
  }
}

// One micro-tile of the block GEMM of the quantised linears: V vectors of
// output rows × MT activation rows over one K block of `klen` columns whose
// weights are already FP32 operands (w[k·64 + r], r from the micro column)
// and whose activations are packed (q[k·MTS + m], PackActGroups), then
// acc = acc + (partial·s_act)·s_w as the reference's block step.
// Each lane's partial sum walks k in increasing order with FMAs (exact
// products: linear_common.h).
//
// Unscaled mode (the BF16 GEMM: no block scales): the partial sums are the
// running sums themselves; they are loaded from acc, continued over the
// block's columns and stored back, so each lane still adds all K products
// in one sequence. kFma false: multiply, then add (products not known to
// be exact).
//
// Prescaled mode (kPrescaled; linear_common.h BlockPrescaleExact): the
// weights are w·s_w and the activations q·s_act, so the partial sum is
// already partial·s_act·s_w and the fold is acc = acc + partial.
//
// first: acc holds nothing yet (the item's first K block), so the fold
// writes what +0 + (fold term) gives without a zero-filled acc: scaled,
// +0 + (partial·s_act)·s_w (the add kept: the product may underflow to −0,
// and +0 + −0 is +0); prescaled, the partial itself (it starts from +0 and
// every product is exact, so it is never −0: the same bits as +0 + partial);
// unscaled, the running sums start from +0 instead of acc.
enum class BlockMode { kScaled, kPrescaled, kUnscaledFma, kUnscaledMulAdd };

template <int V, int MT, int MTS, BlockMode kMode = BlockMode::kScaled>
HWY_INLINE void BlockMicro(const float* HWY_RESTRICT w, int64_t klen, const float* HWY_RESTRICT sw,
                           const float* HWY_RESTRICT q, const float* HWY_RESTRICT sa, int64_t lds,
                           float* HWY_RESTRICT acc, bool first) {
  const DF df;
  VF part[MT][V];
  if constexpr (kMode == BlockMode::kUnscaledFma || kMode == BlockMode::kUnscaledMulAdd) {
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) part[m][v] = first ? hn::Zero(df) : hn::LoadU(df, acc + m * kTileRows + v * kLanes);
    }
    constexpr bool kFma = kMode == BlockMode::kUnscaledFma;
    if (klen == 32) {
      BlockMicroK<V, MT, MTS, 32, kFma>(part, w, klen, q);
    } else {
      BlockMicroK<V, MT, MTS, 0, kFma>(part, w, klen, q);
    }
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) hn::StoreU(part[m][v], df, acc + m * kTileRows + v * kLanes);
    }
    return;
  }
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) part[m][v] = hn::Zero(df);
  }
  if (klen == 32) {
    BlockMicroK<V, MT, MTS, 32>(part, w, klen, q);
  } else {
    BlockMicroK<V, MT, MTS, 0>(part, w, klen, q);
  }
  if constexpr (kMode == BlockMode::kPrescaled) {
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) {
        float* p = acc + m * kTileRows + v * kLanes;
        hn::StoreU(first ? part[m][v] : hn::Add(hn::LoadU(df, p), part[m][v]), df, p);
      }
    }
    return;
  }
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    const VF s = hn::Set(df, sa[m * lds]);
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) {
      float* p = acc + m * kTileRows + v * kLanes;
      const VF swv = hn::LoadU(df, sw + v * kLanes);
      hn::StoreU(hn::Add(first ? hn::Zero(df) : hn::LoadU(df, p), hn::Mul(hn::Mul(part[m][v], s), swv)), df, p);
    }
  }
}

// Block GEMM over items [item0, item1), numbered chunk-major (item it is
// tile it % a.tiles of m-chunk it / a.tiles, unlike RunItems' tile-major
// order: consecutive items share their activation chunk): for each K block of
// `klen` columns, conv(tile, block, w, sw) writes the tile's 64 rows × klen
// weights as FP32 operands into w[k·64 + r] and the per-row weight scales of
// the block into sw[r]; then every MT-row group of the chunk runs over every
// micro column of that converted block (the group's packed activations stay
// in L1 for the 64/(V·kLanes) micro columns). a.q holds the activations
// packed by PackActGroups. The activation scale of block b is
// sa[m·(K/ab) + b·klen/ab]. Output rounded to BF16.
//
// Unscaled modes (the BF16 GEMM, linear_bf16.cc): conv(tile, block, w, sw)
// leaves sw alone, the last block may be shorter than klen (K % klen
// columns), the packed activations have row stride a.ldq (PackActGroups
// over ldq-wide rows) and column offset x_off(tile) (grouped wo_a), and the
// output is rounded as a.round says.
template <int V, int MT, BlockMode kMode = BlockMode::kScaled, typename Conv, typename XOff>
HWY_INLINE void RunBlockItems(const QArgs& a, int64_t item0, int64_t item1, int64_t klen, Conv&& conv,
                              XOff&& x_off) {
  constexpr int64_t kRows = V * static_cast<int64_t>(kLanes);
  static_assert(kTileRows % kRows == 0, "block micro-tile rows must divide the tile");
  static_assert(MT == kBlockMT, "activations are packed in groups of kBlockMT rows");
  BlockScratch& s = ThreadBlockScratch();
  s.Resize(klen * kTileRows, a.mchunk * kTileRows);
  float* HWY_RESTRICT wbuf = s.w.get();
  float* HWY_RESTRICT swbuf = s.sw.get();
  float* HWY_RESTRICT acc = s.acc.get();
  constexpr bool kScaled = kMode == BlockMode::kScaled || kMode == BlockMode::kPrescaled;
  const int64_t kblocks = kScaled ? a.K / a.ab : 0;
  const int64_t nblocks = kScaled ? a.K / klen : (a.K + klen - 1) / klen;
  const int64_t ldp = kScaled ? a.K : a.ldq;  // packed activations: row stride
  for (int64_t it = item0; it < item1; ++it) {
    const int64_t tile = it % a.tiles, mc = it / a.tiles;
    const int64_t m_begin = mc * a.mchunk, m_end = std::min(a.M, m_begin + a.mchunk);
    HWY_ASSERT(m_begin % MT == 0);  // ParallelItems' chunks are multiples of kMChunk, itself a multiple of MT
    const int64_t rows_left = a.N - tile * kTileRows;
    const int vcols = static_cast<int>(std::min<int64_t>(kTileRows, rows_left) + kRows - 1) / static_cast<int>(kRows);
    const bool full_tile = rows_left >= kTileRows;
    // The first K block writes every accumulator the stores read (no fill;
    // BlockMicro `first`); K = 0 stores the zeros filled here.
    if (nblocks == 0) std::fill(acc, acc + (m_end - m_begin) * kTileRows, 0.0f);
    const int64_t xo = x_off(tile);
    for (int64_t b = 0; b < nblocks; ++b) {
      conv(tile, b, wbuf, swbuf);
      const int64_t k0 = b * klen, kb = kScaled ? k0 / a.ab : 0;
      const int64_t kl = std::min(klen, a.K - k0);
      for (int64_t m0 = m_begin; m0 < m_end; m0 += MT) {
        const int rem = static_cast<int>(std::min<int64_t>(MT, m_end - m0));
        const float* qg = a.q + m0 * ldp + (xo + k0) * MT;  // group m0/MT, column xo + k0
        const float* sag = kScaled ? a.sa + m0 * kblocks + kb : nullptr;
        float* accg = acc + (m0 - m_begin) * kTileRows;
        // The next group's activations for this block (or the chunk's first
        // group's for the next block) prefetched while this group runs: the
        // groups lie K·MT floats apart, so each group's klen·MT floats are a
        // short run the hardware prefetchers do not follow, and the first
        // micro column's loads waited on L3 (the packed activations of an
        // M = 1 024, K = 5 120 call are 21 MB). Measured (Zen 3, AVX2,
        // N = 2304, K = 5120, with and without alternated in one process):
        // M = 1 024 / 2 048 +4-11%, M = 256 level (docs/kernels-log.md).
        {
          const float* next = m0 + MT < m_end   ? qg + MT * ldp
                              : b + 1 < nblocks ? a.q + m_begin * ldp + (xo + k0 + klen) * MT
                                                : nullptr;
          if (next != nullptr) {
            const char* p = reinterpret_cast<const char*>(next);
            const char* const end = p + klen * MT * static_cast<int64_t>(sizeof(float));
            for (; p < end; p += 64) hwy::Prefetch(p);
          }
        }
        if (rem == MT && full_tile) {
          // Whole micro-tiles: BlockMicro inlined here with its operands in
          // registers. Through WithVMT's generic lambda each micro-tile was a
          // call that first reloaded ~20 captured values, and with 384 FMAs
          // per call that start-up showed: measured (Zen 5, AVX2, N = 2304,
          // K = 5120, M = 256 / 1 024, one and two threads, the two builds
          // alternated) FP8 and FP4 +4-7% (docs/kernels-log.md).
          HWY_UNROLL(4)
          for (int c = 0; c < static_cast<int>(kTileRows / kRows); ++c)
            BlockMicro<V, MT, MT, kMode>(wbuf + c * kRows, kl, swbuf + c * kRows, qg, sag, kblocks, accg + c * kRows,
                                         b == 0);
        } else {
          for (int c = 0; c < vcols; ++c) {
            const int64_t roff = c * kRows;
            const int64_t rows_here = std::min<int64_t>(kRows, rows_left - roff);
            const int vt =
                static_cast<int>((rows_here + static_cast<int64_t>(kLanes) - 1) / static_cast<int64_t>(kLanes));
            WithVMT<V, MT>(vt, rem, [&](auto v, auto mt) {
              constexpr int kV = decltype(v)::value, kMT = decltype(mt)::value;
              BlockMicro<kV, kMT, MT, kMode>(wbuf + roff, kl, swbuf + roff, qg, sag, kblocks, accg + roff, b == 0);
            });
          }
        }
        // After the last block the group's sums are final: written out now,
        // between the next group's FMAs, rather than all rows of the chunk at
        // the end, whose burst of stores to rows N floats apart (a page or
        // two each) stalled on the store buffer (docs/kernels-log.md).
        if (b + 1 == nblocks) StoreBlockRows(accg, a, m0, rem, tile * kTileRows, /*round=*/kScaled || a.round);
      }
    }
    // K = 0: no block ran; the sums are the zeros of acc.
    if (nblocks == 0) StoreBlockRows(acc, a, m_begin, m_end - m_begin, tile * kTileRows, kScaled || a.round);
  }
}
template <int V, int MT, BlockMode kMode = BlockMode::kScaled, typename Conv>
HWY_INLINE void RunBlockItems(const QArgs& a, int64_t item0, int64_t item1, int64_t klen, Conv&& conv) {
  RunBlockItems<V, MT, kMode>(a, item0, item1, klen, conv, [](int64_t) { return int64_t{0}; });
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
