// The FP4 linears (decode GEMVs and prefill GEMMs) and the FP8 prefill GEMM
// on AVX-512 CPUs that have AVX512_BF16: the products of two consecutive
// columns in one VDPBF16PS (bf16_dot.h has the exactness argument and the
// contract; docs/kernels.md "BF16 pair dots" the measurements).
//
// FP4: per output row n (one FP32 lane) and activation row m, as the reference
// (ref::LinearFp4): for each 32-column group g, partial = 0; for k = 32g ..
// 32g+31 in order, partial = partial + q[m,k]·w[n,k]; then acc = acc +
// (partial·s_act)·s_w[n,g]. VDPBF16PS adds the high BF16 pair product, then
// the low one, each as an FMA rounded to nearest even: with column k in the
// high words and k+1 in the low words that is the reference's two steps
// (the products are exact, so each FMA equals the multiply then add).
//
// The weight words come from the packed FP4 tile (pack.cc: dword (row, j)
// holds columns 8j..8j+7, nibble i = column 8j+i) by one vpmultishiftqb (the
// pair's first column into bits 16..19, its second into bits 0..3) and a
// vpermw over the 16 E2M1 values as BF16 (the table repeated twice, so the
// index bit above each nibble is ignored): per 32 weights three vector
// instructions (multishift, vpermw, VDPBF16PS) where the FP32 path needs six
// (two shifts, two vpermps, two adds). Needs AVX512_VBMI too (every CPU with
// AVX512_BF16 but Cooper Lake has it).
#include "kernels/cpu/bf16_dot.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "kernels/cpu/linear_common.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DEEPINFER_BF16_DOT 1
#endif

namespace deepinfer::cpu {

#if DEEPINFER_BF16_DOT

// GCC 12's AVX-512 shift and convert intrinsics pass _mm512_undefined_*() as
// the unused merge operand, which -W(maybe-)uninitialized reports once
// inlined; nothing is read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vbmi")

namespace {

// E2M1 values × 2^-120 (linear_common.h kActOperandScale) as BF16 bit
// patterns, twice (vpermw reads 5 index bits).
alignas(64) constexpr uint16_t kE2M1Bf16x2[32] = {
    0x0000, 0x0300, 0x0380, 0x03C0, 0x0400, 0x0440, 0x0480, 0x04C0,
    0x8000, 0x8300, 0x8380, 0x83C0, 0x8400, 0x8440, 0x8480, 0x84C0,
    0x0000, 0x0300, 0x0380, 0x03C0, 0x0400, 0x0440, 0x0480, 0x04C0,
    0x8000, 0x8300, 0x8380, 0x83C0, 0x8400, 0x8440, 0x8480, 0x84C0};

// The index words of column pair t (columns 8j+2t, 8j+2t+1) of the dwords x:
// high word bits 0..3 ← nibble 2t, low word bits 0..3 ← nibble 2t+1 (the
// bits above are ignored). One vpmultishiftqb: each control byte is the bit
// offset, inside the qword (two rows' dwords), of the byte it selects.
template <int T>
inline __m512i PairIndex(__m512i x) {
  constexpr uint64_t lo0 = 8 * T + 4, hi0 = 8 * T, lo1 = 32 + 8 * T + 4, hi1 = 32 + 8 * T;
  constexpr uint64_t ctrl = lo0 | (hi0 << 16) | (lo1 << 32) | (hi1 << 48);
  return _mm512_multishift_epi64_epi8(_mm512_set1_epi64(static_cast<long long>(ctrl)), x);
}

// G consecutive groups g0.. of V row vectors (16 rows each, from row `roff`
// of the 64-row tile) × MT activation rows, their partials added to acc in
// increasing group order.
template <int V, int MT, int G>
inline void DotGroups(const Fp4DotArgs& a, const uint32_t* w32, const uint8_t* st, int64_t roff, int64_t m0,
                      int64_t g0, __m512 (&acc)[MT][V]) {
  const __m512i tbl = _mm512_load_si512(kE2M1Bf16x2);
  __m512 part[G][MT][V];
  for (int gg = 0; gg < G; ++gg)
    for (int m = 0; m < MT; ++m)
      for (int v = 0; v < V; ++v) part[gg][m][v] = _mm512_setzero_ps();
  const uint32_t* qp = a.qp + m0 * a.ldqp;
#pragma GCC unroll 4
  for (int64_t j = 0; j < 4; ++j) {
#pragma GCC unroll 4
    for (int gg = 0; gg < G; ++gg) {
      const int64_t g = g0 + gg;
      const uint32_t* wj = w32 + (g * 4 + j) * kTileRows + roff;
      const char* pf = reinterpret_cast<const char*>(wj) + kPrefetchBytes;
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) _mm_prefetch(pf + v * 64, _MM_HINT_T0);
      const int64_t pair0 = (g * 32 + j * 8) / 2;
      __m512i x[V];
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) x[v] = _mm512_loadu_si512(wj + v * 16);
      auto step = [&](auto tc) {
        constexpr int T = decltype(tc)::value;
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          const __m512bh w = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(PairIndex<T>(x[v]), tbl));
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) {
            const __m512bh q = reinterpret_cast<__m512bh>(
                _mm512_set1_epi32(static_cast<int>(qp[m * a.ldqp + pair0 + T])));
            part[gg][m][v] = _mm512_dpbf16_ps(part[gg][m][v], w, q);
          }
        }
      };
      step(std::integral_constant<int, 0>());
      step(std::integral_constant<int, 1>());
      step(std::integral_constant<int, 2>());
      step(std::integral_constant<int, 3>());
    }
  }
  const int64_t kblocks = a.K / a.ab;
#pragma GCC unroll 4
  for (int gg = 0; gg < G; ++gg) {
    const int64_t g = g0 + gg;
    const int64_t kb = (g * 32) / a.ab;
    const uint8_t* sg = st + g * kTileRows + roff;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      // UE8M0 byte b (1..254, checked at pack time) → 2^(b−127).
      const __m512 sw = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sg + v * 16))), 23));
#pragma GCC unroll 8
      for (int m = 0; m < MT; ++m) {
        const __m512 s = _mm512_set1_ps(a.sa[(m0 + m) * kblocks + kb]);
        acc[m][v] = _mm512_add_ps(acc[m][v], _mm512_mul_ps(_mm512_mul_ps(part[gg][m][v], s), sw));
      }
    }
  }
}

template <int V, int MT>
void Micro(const Fp4DotArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0, float* out) {
  __m512 acc[MT][V];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) acc[m][v] = _mm512_setzero_ps();
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(wt);
  const int64_t groups = a.K / 32;
  int64_t g = 0;
  if constexpr (MT == 1) {
    // One activation row: two groups at a time (2·V independent dot chains).
    for (; g + 2 <= groups; g += 2) DotGroups<V, MT, 2>(a, w32, st, roff, m0, g, acc);
  }
  for (; g < groups; ++g) DotGroups<V, MT, 1>(a, w32, st, roff, m0, g, acc);
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) _mm512_store_ps(out + (m * V + v) * 16, acc[m][v]);
}

template <int V>
void MicroMT(const Fp4DotArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0, int mt, float* out) {
  switch (mt) {
    case 1: Micro<V, 1>(a, wt, st, roff, m0, out); break;
    case 2: Micro<V, 2>(a, wt, st, roff, m0, out); break;
    case 3: Micro<V, 3>(a, wt, st, roff, m0, out); break;
    default: Micro<V, 4>(a, wt, st, roff, m0, out); break;
  }
}

// dst = src0 (odd word / first) · src1 ... : the reference two-step FMA of one
// lane, for the self-check.
float TwoFma(uint32_t a, uint32_t b, float c) {
  auto bf = [](uint32_t h) {
    const uint32_t u = h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  c = std::fma(bf(a >> 16), bf(b >> 16), c);
  return std::fma(bf(a & 0xFFFFu), bf(b & 0xFFFFu), c);
}

bool SelfCheck() {
  // Lanes (a pair, b pair, c). Crafted: the odd-then-even order against
  // even-then-odd and against one rounding of the exact sum (1 + 2^-24 ties
  // to 1), then pseudo-random pairs whose accumulator is 1 to 2^14 times the
  // products, so that the steps round: of these 1,020 lanes 124 tell the
  // two-step definition from one rounding of the exact sum and 53 from the
  // even-then-odd order.
  alignas(64) uint32_t av[16 * 64], bv[16 * 64];
  alignas(64) float cv[16 * 64];
  const uint32_t two_m12 = 0x3980u;  // BF16 2^-12
  const uint32_t one_5_m12 = 0x39C0u;  // BF16 1.5·2^-12
  const uint32_t one = 0x3F80u;
  int n = 0;
  av[n] = (two_m12 << 16) | two_m12, bv[n] = (two_m12 << 16) | two_m12, cv[n++] = 1.0f;      // 1+2^-24+2^-24
  av[n] = (two_m12 << 16) | one_5_m12, bv[n] = (two_m12 << 16) | two_m12, cv[n++] = 1.0f;    // order
  av[n] = (one_5_m12 << 16) | two_m12, bv[n] = (two_m12 << 16) | two_m12, cv[n++] = 1.0f;    // order
  av[n] = (one << 16) | two_m12, bv[n] = (one << 16) | two_m12, cv[n++] = -1.0f;             // cancellation
  std::mt19937 rng(20261205);
  for (; n < 16 * 64; ++n) {
    const uint32_t ea = 120u + rng() % 15u, eb = 120u + rng() % 15u;  // BF16 exponent fields
    auto r16 = [&](uint32_t e) { return (rng() & 0x807Fu) | (e << 7); };
    av[n] = (r16(ea) << 16) | r16(ea + rng() % 3u);
    bv[n] = (r16(eb) << 16) | r16(eb + rng() % 3u);
    const uint32_t ec = ea + eb + 4u - 127u + rng() % 15u;  // FP32 exponent field of c
    const uint32_t u = (rng() & 0x807FFFFFu) | (ec << 23);
    std::memcpy(&cv[n], &u, 4);
  }
  for (int i = 0; i < 64; ++i) {
    alignas(64) float out[16];
    const __m512 r = _mm512_dpbf16_ps(_mm512_load_ps(cv + 16 * i),
                                      reinterpret_cast<__m512bh>(_mm512_load_si512(av + 16 * i)),
                                      reinterpret_cast<__m512bh>(_mm512_load_si512(bv + 16 * i)));
    _mm512_store_ps(out, r);
    for (int l = 0; l < 16; ++l) {
      const int k = 16 * i + l;
      const float want = TwoFma(av[k], bv[k], cv[k]);
      if (std::memcmp(&want, &out[l], 4) != 0) return false;
    }
  }
  return true;
}

}  // namespace

#pragma GCC pop_options

namespace {
std::atomic<int> g_enabled{1};
bool Supported() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
                         __builtin_cpu_supports("avx512vbmi") && SelfCheck();
  return ok;
}
}  // namespace

bool Bf16DotSupported() { return Supported(); }
void SetBf16Dot(bool enable) { g_enabled.store(enable ? 1 : 0); }
bool Bf16DotActive() { return g_enabled.load(std::memory_order_relaxed) != 0 && Supported(); }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vbmi")
// 16 floats (8 pairs per zmm half) → 8 pair dwords in the low half; or-s
// into bad the low BF16 halves and the non-finite lanes.
static inline __m256i PairsOf(__m512 v, __m512i shift, __m512i& bad) {
  __m512i u = _mm512_castps_si512(v);
  // Nonzero lanes: exponent − exp_shift (a lane whose exponent field would
  // reach 0 or below is flagged: it would not stay a normal BF16).
  const __mmask16 nz = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7F800000));
  bad = _mm512_mask_or_epi32(bad, _mm512_mask_cmple_epi32_mask(nz, mag, shift), bad, _mm512_set1_epi32(1));
  // Not finite (exponent field all ones), or not exactly a BF16.
  bad = _mm512_mask_or_epi32(bad, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F800000)), bad,
                             _mm512_set1_epi32(1));
  bad = _mm512_or_si512(bad, _mm512_and_si512(u, _mm512_set1_epi32(0xFFFF)));
  u = _mm512_mask_sub_epi32(u, nz, u, shift);
  // qword j = q[2j] | q[2j+1] << 32 → dword (q[2j] & 0xFFFF0000) | q[2j+1] >> 16.
  const __m512i hi = _mm512_srli_epi64(u, 48);
  const __m512i d = _mm512_ternarylogic_epi64(hi, u, _mm512_set1_epi64(0xFFFF0000LL), 0xD8);  // mask ? u : hi
  return _mm512_cvtepi64_epi32(d);
}

bool PackActPairs(const float* q, int64_t M, int64_t K, int64_t ldq, uint32_t* qp, int exp_shift, bool swap) {
  if (K % 32 != 0) return false;
  __m512i bad = _mm512_setzero_si512();
  const __m512i shift = _mm512_set1_epi32(exp_shift << 23);
  for (int64_t m = 0; m < M; ++m) {
    const float* qr = q + m * ldq;
    uint32_t* o = qp + m * (K / 2);
    for (int64_t k = 0; k < K; k += 32) {
      const __m256i lo = PairsOf(_mm512_loadu_ps(qr + k), shift, bad);
      const __m256i hi = PairsOf(_mm512_loadu_ps(qr + k + 16), shift, bad);
      const __m512i d = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      _mm512_storeu_si512(o + k / 2, swap ? _mm512_rol_epi32(d, 16) : d);
    }
  }
  return _mm512_test_epi32_mask(bad, bad) == 0;
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vbmi")
void Fp4Bf16DotMicro(const Fp4DotArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0, int v,
                     int mt, float* out) {
  switch (v) {
    case 1: MicroMT<1>(a, wt, st, roff, m0, mt, out); break;
    case 2: MicroMT<2>(a, wt, st, roff, m0, mt, out); break;
    case 3: MicroMT<3>(a, wt, st, roff, m0, mt, out); break;
    default: MicroMT<4>(a, wt, st, roff, m0, mt, out); break;
  }
}
#pragma GCC pop_options

// ---------------------------------------------------------------- FP8
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vbmi")
namespace {

// BF16 bits of (E4M3 code's value × 2^-100) for 16 codes (one per dword):
// exponent field e ≥ 1: sign | (e + 20) << 7 | m << 4; e = 0 (subnormal
// m·2^-9): m·2^-109, a normal BF16 from an 8-entry table.
alignas(64) constexpr uint32_t kE4M3SubBf16[16] = {0x0000, 0x0900, 0x0980, 0x09C0, 0x0A00, 0x0A20, 0x0A40, 0x0A60,
                                                   0, 0, 0, 0, 0, 0, 0, 0};
inline __m512i E4M3Bf16(__m128i codes) {
  const __m512i c = _mm512_cvtepu8_epi32(codes);
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 8);
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x7F)), 4),
                                          _mm512_set1_epi32(20 << 7));
  const __m512i sub = _mm512_permutexvar_epi32(c, _mm512_load_si512(kE4M3SubBf16));  // reads bits 3..0: m (e = 0)
  const __mmask16 is_sub = _mm512_testn_epi32_mask(c, _mm512_set1_epi32(0x78));
  return _mm512_or_si512(_mm512_mask_mov_epi32(normal, is_sub, sub), sign);
}

// kRowScales: sw holds one weight scale per row (FP4), else one per 16 rows (FP8).
template <int V, int MT, bool kRowScales = false>
inline void BlockMicro(const uint32_t* wp, int64_t npairs, int64_t roff, const uint32_t* qp, int64_t ldqp,
                       const float* sa, int64_t lds, const float* sw, float* acc) {
  __m512 part[MT][V];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) part[m][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k2 = 0; k2 < npairs; ++k2) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m512bh w = reinterpret_cast<__m512bh>(_mm512_load_si512(wp + k2 * kTileRows + roff + v * 16));
#pragma GCC unroll 8
      for (int m = 0; m < MT; ++m) {
        const __m512bh q = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(qp[m * ldqp + k2])));
        part[m][v] = _mm512_dpbf16_ps(part[m][v], w, q);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) {
    const __m512 s = _mm512_set1_ps(sa[m * lds]);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m512 swv = kRowScales ? _mm512_loadu_ps(sw + roff + v * 16) : _mm512_set1_ps(sw[(roff + v * 16) / 16]);
      float* p = acc + m * kTileRows + v * 16;
      _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), _mm512_mul_ps(_mm512_mul_ps(part[m][v], s), swv)));
    }
  }
}

template <int V, bool kRowScales = false>
void BlockMicroMT(const uint32_t* wp, int64_t npairs, int64_t roff, const uint32_t* qp, int64_t ldqp,
                  const float* sa, int64_t lds, const float* sw, float* acc, int mt) {
  switch (mt) {
    case 1: BlockMicro<V, 1, kRowScales>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc); break;
    case 2: BlockMicro<V, 2, kRowScales>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc); break;
    case 3: BlockMicro<V, 3, kRowScales>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc); break;
    case 4: BlockMicro<V, 4, kRowScales>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc); break;
    case 5: BlockMicro<V, 5, kRowScales>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc); break;
    default: BlockMicro<V, 6, kRowScales>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc); break;
  }
}

}  // namespace

void Fp8Bf16DotConvertBlock(const uint8_t* wt, uint32_t* wp) {
  for (int k2 = 0; k2 < 16; ++k2) {
    const uint8_t* ca = wt + (2 * k2) * kTileRows;
    const uint8_t* cb = ca + kTileRows;
    for (int r = 0; r < kTileRows; r += 16) {
      const __m512i a = E4M3Bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ca + r)));
      const __m512i b = E4M3Bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb + r)));
      _mm512_store_si512(wp + k2 * kTileRows + r, _mm512_or_si512(_mm512_slli_epi32(a, 16), b));
    }
  }
}

void Fp8Bf16DotBlockMicro(const uint32_t* wp, int64_t npairs, int64_t roff, const uint32_t* qp, int64_t ldqp,
                          const float* sa, int64_t lds, const float* sw, float* acc, int v, int mt) {
  switch (v) {
    case 1: BlockMicroMT<1>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
    case 2: BlockMicroMT<2>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
    case 3: BlockMicroMT<3>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
    default: BlockMicroMT<4>(wp, npairs, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
  }
}
// ---------------------------------------------------------------- BF16 blocks
namespace {
template <int V, int MT>
inline void AccMicro(const uint32_t* wp, int64_t npairs, const uint32_t* qp, int64_t ldqp, float* acc) {
  __m512 c[MT][V];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) c[m][v] = _mm512_load_ps(acc + m * kTileRows + v * 16);
#pragma GCC unroll 4
  for (int64_t k2 = 0; k2 < npairs; ++k2) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m512bh w = reinterpret_cast<__m512bh>(_mm512_load_si512(wp + k2 * kTileRows + v * 16));
#pragma GCC unroll 8
      for (int m = 0; m < MT; ++m)
        c[m][v] = _mm512_dpbf16_ps(c[m][v], w,
                                   reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(qp[m * ldqp + k2]))));
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) _mm512_store_ps(acc + m * kTileRows + v * 16, c[m][v]);
}
template <int V>
void AccMicroMT(const uint32_t* wp, int64_t npairs, const uint32_t* qp, int64_t ldqp, float* acc, int mt) {
  switch (mt) {
    case 1: AccMicro<V, 1>(wp, npairs, qp, ldqp, acc); break;
    case 2: AccMicro<V, 2>(wp, npairs, qp, ldqp, acc); break;
    case 3: AccMicro<V, 3>(wp, npairs, qp, ldqp, acc); break;
    case 4: AccMicro<V, 4>(wp, npairs, qp, ldqp, acc); break;
    case 5: AccMicro<V, 5>(wp, npairs, qp, ldqp, acc); break;
    default: AccMicro<V, 6>(wp, npairs, qp, ldqp, acc); break;
  }
}
}  // namespace

void Bf16Bf16DotConvertBlock(const uint16_t* wt, int64_t npairs, bool pairs_order, uint32_t* wp) {
  for (int64_t k2 = 0; k2 < npairs; ++k2) {
    const uint16_t* ca = wt + (2 * k2) * kTileRows;  // column 2k2, then 2k2+1
    const uint16_t* cb = ca + kTileRows;
    for (int64_t r = 0; r < kTileRows; r += 32) {
      const __m512i a = _mm512_loadu_si512(ca + r), b = _mm512_loadu_si512(cb + r);
      // Dword = first-added column (high word) | second (low word).
      const __m512i hi = pairs_order ? b : a, lo = pairs_order ? a : b;
      const __m512i d0 = _mm512_unpacklo_epi16(lo, hi), d1 = _mm512_unpackhi_epi16(lo, hi);
      // unpacklo/hi interleave per 128-bit lane: rows r+0..3, 8..11, ... and
      // r+4..7, 12..15, ...: put them back in row order.
      _mm512_store_si512(wp + k2 * kTileRows + r,
                         _mm512_permutex2var_epi64(d0, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), d1));
      _mm512_store_si512(wp + k2 * kTileRows + r + 16,
                         _mm512_permutex2var_epi64(d0, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), d1));
    }
  }
}

void Bf16Bf16DotBlockMicro(const uint32_t* wp, int64_t npairs, const uint32_t* qp, int64_t ldqp, float* acc, int v,
                           int mt) {
  switch (v) {
    case 1: AccMicroMT<1>(wp, npairs, qp, ldqp, acc, mt); break;
    case 2: AccMicroMT<2>(wp, npairs, qp, ldqp, acc, mt); break;
    case 3: AccMicroMT<3>(wp, npairs, qp, ldqp, acc, mt); break;
    default: AccMicroMT<4>(wp, npairs, qp, ldqp, acc, mt); break;
  }
}

// ---------------------------------------------------------------- FP4 blocks
void Fp4Bf16DotConvertGroup(const uint8_t* wt, const uint8_t* st, int64_t g, uint32_t* wp, float* sw) {
  const __m512i tbl = _mm512_load_si512(kE2M1Bf16x2);
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(wt) + g * 4 * kTileRows;
  const uint8_t* sg = st + g * kTileRows;
  for (int64_t r = 0; r < kTileRows; r += 16)
    _mm512_store_ps(sw + r, _mm512_castsi512_ps(_mm512_slli_epi32(
                                _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sg + r))), 23)));
  for (int64_t j = 0; j < 4; ++j) {
    for (int64_t r = 0; r < kTileRows; r += 16) {
      const __m512i x = _mm512_loadu_si512(w32 + j * kTileRows + r);
      uint32_t* o = wp + (4 * j) * kTileRows + r;
      _mm512_store_si512(o, _mm512_permutexvar_epi16(PairIndex<0>(x), tbl));
      _mm512_store_si512(o + kTileRows, _mm512_permutexvar_epi16(PairIndex<1>(x), tbl));
      _mm512_store_si512(o + 2 * kTileRows, _mm512_permutexvar_epi16(PairIndex<2>(x), tbl));
      _mm512_store_si512(o + 3 * kTileRows, _mm512_permutexvar_epi16(PairIndex<3>(x), tbl));
    }
  }
}

void Fp4Bf16DotBlockMicro(const uint32_t* wp, int64_t roff, const uint32_t* qp, int64_t ldqp, const float* sa,
                          int64_t lds, const float* sw, float* acc, int v, int mt) {
  switch (v) {
    case 1: BlockMicroMT<1, true>(wp, 16, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
    case 2: BlockMicroMT<2, true>(wp, 16, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
    case 3: BlockMicroMT<3, true>(wp, 16, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
    default: BlockMicroMT<4, true>(wp, 16, roff, qp, ldqp, sa, lds, sw, acc, mt); break;
  }
}

#pragma GCC pop_options

#pragma GCC diagnostic pop

#else  // !DEEPINFER_BF16_DOT

bool Bf16DotSupported() { return false; }
void SetBf16Dot(bool) {}
bool Bf16DotActive() { return false; }
bool PackActPairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int, bool) { return false; }
void Bf16Bf16DotConvertBlock(const uint16_t*, int64_t, bool, uint32_t*) {}
void Bf16Bf16DotBlockMicro(const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int, int) {}
void Fp4Bf16DotMicro(const Fp4DotArgs&, const uint8_t*, const uint8_t*, int64_t, int64_t, int, int, float*) {}
void Fp8Bf16DotConvertBlock(const uint8_t*, uint32_t*) {}
void Fp8Bf16DotBlockMicro(const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, const float*, int64_t,
                          const float*, float*, int, int) {}
void Fp4Bf16DotConvertGroup(const uint8_t*, const uint8_t*, int64_t, uint32_t*, float*) {}
void Fp4Bf16DotBlockMicro(const uint32_t*, int64_t, const uint32_t*, int64_t, const float*, int64_t, const float*,
                          float*, int, int) {}

#endif

}  // namespace deepinfer::cpu
