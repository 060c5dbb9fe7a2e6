// The sparse attention's q·k and pb·k products as BF16 pair dots (VDPBF16PS)
// on AVX-512 CPUs with AVX512_BF16 (bf16_dot.h "Sparse attention" has the
// contract; attention.cc calls these from its AVX-512 target only, per block
// and per chunk where Bf16PairDotsExact holds).
//
// VDPBF16PS adds, per FP32 lane, the high BF16 pair product and then the low
// one, each an FMA rounded to nearest even (bf16_dot.cc checks the CPU's
// instruction once against that definition). With element d in the high word
// and d + 1 in the low word (scores: q and the key row; P·V: member i and
// i + 1 of a chunk), that is the reference's two steps s = s + a_d·b_d;
// s = s + a_{d+1}·b_{d+1}. The guard makes both steps equal to the
// multiply-then-add: the products are exact (at most 16 significant bits,
// neither underflowing nor overflowing) and no operand is subnormal, and every
// partial sum, a multiple of the smallest product's last bit (at least
// 2^-126), is 0 or normal, so the instruction's flushing of subnormal inputs
// and outputs never applies.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/bf16_dot.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DEEPINFER_ATTN_BF16_DOT 1
#endif

namespace deepinfer::cpu {

#if DEEPINFER_ATTN_BF16_DOT

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")

namespace {

// Smallest and largest of 32 unsigned 16-bit lanes.
inline uint32_t MinU16(__m512i v) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(v));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1));
  return static_cast<uint32_t>(_mm512_reduce_min_epu32(_mm512_min_epu32(lo, hi)));
}
inline uint32_t MaxU16(__m512i v) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(v));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1));
  return static_cast<uint32_t>(_mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi)));
}

template <int NC>
inline void ScorePairs(const uint32_t* qp, int64_t Hp, int64_t D2, const uint32_t* kp, int64_t ldk, int64_t h0,
                       float* dots) {
  __m512 a[NC];
  for (int j = 0; j < NC; ++j) a[j] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t d2 = 0; d2 < D2; ++d2) {
    const __m512bh qv = reinterpret_cast<__m512bh>(_mm512_load_si512(qp + d2 * Hp + h0));
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j)
      a[j] = _mm512_dpbf16_ps(a[j], qv,
                              reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(kp[j * ldk + d2]))));
  }
  for (int j = 0; j < NC; ++j) _mm512_store_ps(dots + j * Hp + h0, a[j]);
}

// Lane l of the natural vectors of 16 d from the two interleaved ones
// (unpacklo: d 0-3, 8-11, 16-19, 24-27 of 32; unpackhi: 4-7, 12-15, ...).
alignas(64) constexpr int32_t kNat0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
alignas(64) constexpr int32_t kNat1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

template <int HT>
inline void PvPairs(const uint16_t* const* kv, const uint32_t* pbp, int64_t Hp, int i0, int i1, int64_t h0,
                    int64_t d0, const float* rescale, float* acc) {
  __m512 part[HT][4];
  for (int t = 0; t < HT; ++t)
    for (int u = 0; u < 4; ++u) part[t][u] = _mm512_setzero_ps();
  for (int i = i0; i < i1; i += 2) {
    const uint16_t* k0 = kv[i] + d0;
    const __m512i r0a = _mm512_loadu_si512(k0), r0b = _mm512_loadu_si512(k0 + 32);
    __m512i r1a = _mm512_setzero_si512(), r1b = _mm512_setzero_si512();
    if (i + 1 < i1) {
      const uint16_t* k1 = kv[i + 1] + d0;
      r1a = _mm512_loadu_si512(k1), r1b = _mm512_loadu_si512(k1 + 32);
    }
    // Dword = member i's element (high word) | member i+1's (low word).
    const __m512bh kp[4] = {reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(r1a, r0a)),
                            reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(r1a, r0a)),
                            reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(r1b, r0b)),
                            reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(r1b, r0b))};
    const uint32_t* pi = pbp + static_cast<int64_t>(i) * Hp + h0;
#pragma GCC unroll 4
    for (int t = 0; t < HT; ++t) {
      const __m512bh p = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pi[t])));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) part[t][u] = _mm512_dpbf16_ps(part[t][u], kp[u], p);
    }
  }
  const __m512i n0 = _mm512_load_si512(kNat0), n1 = _mm512_load_si512(kNat1);
  for (int t = 0; t < HT; ++t) {
    const __m512 rv = _mm512_set1_ps(rescale[t]);
    for (int g = 0; g < 2; ++g) {
      const __m512 lo = part[t][2 * g], hi = part[t][2 * g + 1];
      float* a0 = acc + (t * 4 + 2 * g) * 16;
      float* a1 = a0 + 16;
      // acc·rescale, then + part: the reference's chunk step, multiply then add.
      _mm512_store_ps(a0, _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(a0), rv), _mm512_permutex2var_ps(lo, n0, hi)));
      _mm512_store_ps(a1, _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(a1), rv), _mm512_permutex2var_ps(lo, n1, hi)));
    }
  }
}

}  // namespace

void AttnKeyPairsRow(const uint16_t* src, int64_t D, uint32_t* dst, int32_t* emin, int32_t* emax) {
  int32_t rmin = 255, rmax = 0;
  int64_t d = 0;
  __m512i amin1 = _mm512_set1_epi16(-1), amax = _mm512_setzero_si512();
  const __m512i mag = _mm512_set1_epi16(0x7FFF), one = _mm512_set1_epi16(1);
  for (; d + 32 <= D; d += 32) {
    const __m512i x = _mm512_loadu_si512(src + d);
    const __m512i a = _mm512_and_si512(x, mag);
    amin1 = _mm512_min_epu16(amin1, _mm512_sub_epi16(a, one));
    amax = _mm512_max_epu16(amax, a);
    _mm512_storeu_si512(dst + d / 2, _mm512_rol_epi32(x, 16));
  }
  if (d > 0) {
    const uint32_t amin_m1 = MinU16(amin1);
    if (amin_m1 != 0xFFFFu) rmin = std::max<int32_t>(static_cast<int32_t>((amin_m1 + 1) >> 7), 1);
    rmax = static_cast<int32_t>(MaxU16(amax) >> 7);
  }
  for (; d < D; ++d) {
    if (d % 2 == 0) {
      dst[d / 2] = static_cast<uint32_t>(src[d]) << 16;
    } else {
      dst[d / 2] |= src[d];
    }
    const int32_t e = (src[d] >> 7) & 0xFF;
    if ((src[d] & 0x7FFF) != 0) {
      rmin = std::min(rmin, std::max(e, 1));
      rmax = std::max(rmax, e);
    }
  }
  *emin = rmin;
  *emax = rmax;
}

void AttnScorePairs(const uint32_t* qp, int64_t Hp, int64_t D, const uint32_t* kp, int64_t ldk, int nc, int64_t h0,
                    float* dots) {
  const int64_t D2 = D / 2;
  switch (nc) {
    case 8: ScorePairs<8>(qp, Hp, D2, kp, ldk, h0, dots); break;
    case 7: ScorePairs<7>(qp, Hp, D2, kp, ldk, h0, dots); break;
    case 6: ScorePairs<6>(qp, Hp, D2, kp, ldk, h0, dots); break;
    case 5: ScorePairs<5>(qp, Hp, D2, kp, ldk, h0, dots); break;
    case 4: ScorePairs<4>(qp, Hp, D2, kp, ldk, h0, dots); break;
    case 3: ScorePairs<3>(qp, Hp, D2, kp, ldk, h0, dots); break;
    case 2: ScorePairs<2>(qp, Hp, D2, kp, ldk, h0, dots); break;
    default: ScorePairs<1>(qp, Hp, D2, kp, ldk, h0, dots); break;
  }
}

void AttnPvPairs(const uint16_t* const* kv, const uint32_t* pbp, int64_t Hp, int i0, int i1, int64_t h0, int ht,
                 int64_t d0, const float* rescale, float* acc) {
  switch (ht) {
    case 1: PvPairs<1>(kv, pbp, Hp, i0, i1, h0, d0, rescale, acc); break;
    case 2: PvPairs<2>(kv, pbp, Hp, i0, i1, h0, d0, rescale, acc); break;
    case 3: PvPairs<3>(kv, pbp, Hp, i0, i1, h0, d0, rescale, acc); break;
    default: PvPairs<4>(kv, pbp, Hp, i0, i1, h0, d0, rescale, acc); break;
  }
}

#pragma GCC pop_options
#pragma GCC diagnostic pop

#else  // !DEEPINFER_ATTN_BF16_DOT

void AttnKeyPairsRow(const uint16_t*, int64_t, uint32_t*, int32_t*, int32_t*) {}
void AttnScorePairs(const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, int, int64_t, float*) {}
void AttnPvPairs(const uint16_t* const*, const uint32_t*, int64_t, int, int, int64_t, int, int64_t, const float*,
                 float*) {}

#endif

}  // namespace deepinfer::cpu
