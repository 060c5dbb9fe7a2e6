// FP4 E2M1 routed-expert linear × FP8-quantised activations (GEMV/GEMM),
// bit-identical to ref::LinearFp4 (see cpu_ops.h).
//
// Per output row n (one SIMD lane) and activation row m, as the reference:
// for each 32-wide weight group g, partial = 0; for k = 32g .. 32g+31 in
// order, partial = partial + q[m,k]·w[n,k]; then acc = acc +
// (partial·s_act[m, 32g/act_block])·s_w[n,g]; y = bf16(acc). Operands: q·2^119
// and the E2M1 value ·2^-120 from a 16-entry table, activation scale 2·s_act
// (linear_common.h kActOperandScale: same bits). The
// repacked dword of (row, j) holds k = 8j .. 8j+7 (nibble i = column 8j+i).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/linear_fp4.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "base/error.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "kernels/cpu/linear_common.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

// E2M1 values × 2^-120 (code 8 is −0; all normal floats): the weight operand
// of linear_common.h kActOperandScale.
HWY_ALIGN static constexpr float kE2M1Scaled[16] = {
    0.0f,           0x1p-121f,  0x1p-120f,  0x1.8p-120f,  0x1p-119f,  0x1.8p-119f,  0x1p-118f,  0x1.8p-118f,
    -0.0f,          -0x1p-121f, -0x1p-120f, -0x1.8p-120f, -0x1p-119f, -0x1.8p-119f, -0x1p-118f, -0x1.8p-118f};

// Nibble codes (bits 3..0 of each u32 lane; higher bits are ignored) →
// E2M1 value × 2^-120.
HWY_INLINE VF E2M1Lookup(hn::Vec<hn::RebindToUnsigned<DF>> code) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // vpermps reads only bits 3..0 of each index.
  return VF{_mm512_permutexvar_ps(code.raw, hn::Load(df, kE2M1Scaled).raw)};
#else
  if constexpr (kLanes == 8) {
    const VF tbl = hn::Load(df, kE2M1Scaled);  // magnitudes: first 8 entries
    const VF mag = hn::TableLookupLanes(tbl, hn::IndicesFromVec(df, hn::BitCast(di, hn::And(code, hn::Set(du, 7u)))));
    const auto sign = hn::And(hn::ShiftLeft<28>(code), hn::Set(du, 0x80000000u));
    return hn::BitCast(df, hn::Or(hn::BitCast(du, mag), sign));
  } else {
    return hn::GatherIndex(df, kE2M1Scaled, hn::BitCast(di, hn::And(code, hn::Set(du, 15u))));
  }
#endif
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
inline constexpr bool kFp4Gemv = true;
// GEMV (one activation row): G consecutive 32-column groups g0.. of V
// vectors of output rows, their partial sums independent, each then added to
// acc in increasing group order as the reference does. G = 1: two groups at
// a time (2·V add chains in flight) measured slower on Zen 5 on both targets
// (AVX-512: the lookups, one vpermps per 16 weights, are the limit; AVX2, 2
// threads, 2304×5120: 7.0–8.6 GB/s against 10.5–11.3 with one group, the
// second group's registers spill). Per column the possible products q·w form a table (the
// exact values the multiply would give), so each weight costs a shift, one
// lookup and one add:
// - AVX-512: the 16 products of the column in one zmm, vpermps reads bits
//   3..0 of each index (the nibble);
// - AVX2 (8-lane vpermps): the 8 magnitudes' products, and the weight's sign
//   bit (bit 4i+3 of the dword, moved to bit 31) xor-ed in.
template <int V, int G>
HWY_INLINE void Fp4GemvGroups(const QArgs& a, const uint32_t* w32, const uint8_t* st, int64_t roff, int64_t g0,
                              VF* acc) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint8_t, DF> d8;
  const VF tbl = hn::Load(df, kE2M1Scaled);  // AVX2: entries 0..7 are the +magnitudes
  VF part[G][V];
  HWY_UNROLL(8)
  for (int gg = 0; gg < G; ++gg) {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) part[gg][v] = hn::Zero(df);
  }
  for (int64_t j = 0; j < 4; ++j) {
    const uint32_t* wj[G];
    HWY_UNROLL(8)
    for (int gg = 0; gg < G; ++gg) {
      wj[gg] = w32 + ((g0 + gg) * 4 + j) * kTileRows + roff;
      const uint8_t* pf = reinterpret_cast<const uint8_t*>(wj[gg]) + kPrefetchBytes;
      HWY_UNROLL(8)
      for (int v = 0; v < V; v += 4) hwy::Prefetch(pf + v * kLanes * 4);
    }
    HWY_UNROLL(8)
    for (int i = 0; i < 8; ++i) {
      HWY_UNROLL(8)
      for (int gg = 0; gg < G; ++gg) {
        const VF t = hn::Mul(hn::Set(df, a.q[(g0 + gg) * 32 + j * 8 + i]), tbl);
        HWY_UNROLL(8)
        for (int v = 0; v < V; ++v) {
          const auto x = hn::LoadU(du, wj[gg] + v * kLanes);
          const auto idx = i == 0 ? x : hn::ShiftRightSame(x, 4 * i);
#if HWY_TARGET == HWY_AVX2
          const VF mag = VF{_mm256_permutevar8x32_ps(t.raw, idx.raw)};
          const auto sgn = hn::And(hn::ShiftLeftSame(x, 28 - 4 * i), hn::Set(du, 0x80000000u));
          part[gg][v] = hn::Add(part[gg][v], hn::BitCast(df, hn::Xor(hn::BitCast(du, mag), sgn)));
#else
          part[gg][v] = hn::Add(part[gg][v], VF{_mm512_permutexvar_ps(idx.raw, t.raw)});
#endif
        }
      }
    }
  }
  HWY_UNROLL(8)
  for (int gg = 0; gg < G; ++gg) {
    const int64_t g = g0 + gg;
    const VF s = hn::Set(df, a.sa[(g * 32) / a.ab]);
    const uint8_t* sg = st + g * kTileRows + roff;
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) {
      // UE8M0 byte b (1..254, checked at pack time) → 2^(b−127).
      const VF sw = hn::BitCast(df, hn::ShiftLeft<23>(hn::PromoteTo(du, hn::LoadU(d8, sg + v * kLanes))));
      acc[v] = hn::Add(acc[v], hn::Mul(hn::Mul(part[gg][v], s), sw));
    }
  }
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The vector operations of the integer dots (Fp4GroupIntDots) at one width:
// 8 rows per vector (AVX2), 16 (AVX-512 BW).
struct IntDots256 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kRows = 8;
  static I Load(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I Table(__m128i t) { return _mm256_broadcastsi128_si256(t); }
  static I Set8(int8_t v) { return _mm256_set1_epi8(v); }
  static I Set16(int16_t v) { return _mm256_set1_epi16(v); }
  static I Set32(int32_t v) { return _mm256_set1_epi32(v); }
  static I And(I a, I b) { return _mm256_and_si256(a, b); }
  static I Nibble1(I x) { return _mm256_srli_epi16(x, 4); }
  static I Lookup(I t, I i) { return _mm256_shuffle_epi8(t, i); }
  static I MulBytes(I u8, I s8) { return _mm256_maddubs_epi16(u8, s8); }
  static I MulWords(I a, I b) { return _mm256_madd_epi16(a, b); }
  static I Add16(I a, I b) { return _mm256_add_epi16(a, b); }
  static I Add32(I a, I b) { return _mm256_add_epi32(a, b); }
  static F Partial(I acc, int32_t corr) {  // (acc − corr)·2^-8, exact
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, Set32(corr))), _mm256_set1_ps(0x1p-8f));
  }
};
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
struct IntDots512 {
  using I = __m512i;
  using F = __m512;
  static constexpr int kRows = 16;
  static I Load(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static I Table(__m128i t) { return _mm512_broadcast_i32x4(t); }
  static I Set8(int8_t v) { return _mm512_set1_epi8(v); }
  static I Set16(int16_t v) { return _mm512_set1_epi16(v); }
  static I Set32(int32_t v) { return _mm512_set1_epi32(v); }
  static I And(I a, I b) { return _mm512_and_si512(a, b); }
  static I Nibble1(I x) { return _mm512_srli_epi16(x, 4); }
  static I Lookup(I t, I i) { return _mm512_shuffle_epi8(t, i); }
  static I MulBytes(I u8, I s8) { return _mm512_maddubs_epi16(u8, s8); }
  static I MulWords(I a, I b) { return _mm512_madd_epi16(a, b); }
  static I Add16(I a, I b) { return _mm512_add_epi16(a, b); }
  static I Add32(I a, I b) { return _mm512_add_epi32(a, b); }
  static F Partial(I acc, int32_t corr) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, Set32(corr))), _mm512_set1_ps(0x1p-8f));
  }
};
#endif

// The partial sums (reference units / 2, as the FP32 paths) of group g for
// V·O::kRows rows roff.. and MT activation rows by the integer dots (see
// BuildFp4IntActs below: row m's operands at qg[m], its correction corr[m]):
// part[m][v], lanes in row order. The weight bytes of each block of rows ×
// 8 columns are formed once for the MT rows.
template <class O, int V, int MT>
HWY_INLINE void Fp4GroupIntDots(const uint32_t* w32, const int8_t* const* qg, const int32_t* corr, int64_t g,
                                int64_t roff, typename O::F (*part)[V]) {
  using I = typename O::I;
  const I lo4 = O::Set8(0x0F);
  // 2·E2M1(code) + 12 for codes 0..15 (code 8 is −0: 12), per 128-bit lane.
  const I wtab = O::Table(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const I ones = O::Set16(1), c256 = O::Set16(256);
  HWY_UNROLL(8)
  for (int v = 0; v < V; ++v) {
    I acc[MT];
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) acc[m] = O::Set32(0);
    HWY_UNROLL(2)
    for (int jp = 0; jp < 2; ++jp) {
      I sl[MT], sh[MT];
      HWY_UNROLL(2)
      for (int jj = 0; jj < 2; ++jj) {
        const int64_t j = 2 * jp + jj;
        const I x = O::Load(w32 + (g * 4 + j) * kTileRows + roff + O::kRows * v);
        const I wl = O::Lookup(wtab, O::And(x, lo4));
        const I wh = O::Lookup(wtab, O::And(O::Nibble1(x), lo4));
        HWY_UNROLL(8)
        for (int m = 0; m < MT; ++m) {
          int32_t d[4];
          std::memcpy(d, qg[m] + 16 * j, 16);
          const I tl = O::Add16(O::MulBytes(wl, O::Set32(d[0])), O::MulBytes(wh, O::Set32(d[2])));
          const I th = O::Add16(O::MulBytes(wl, O::Set32(d[1])), O::MulBytes(wh, O::Set32(d[3])));
          sl[m] = jj == 0 ? tl : O::Add16(sl[m], tl);
          sh[m] = jj == 0 ? th : O::Add16(sh[m], th);
        }
      }
      // Dwords: the Ql words plus 256 × the Qh words (|·| < 2^24: no overflow).
      HWY_UNROLL(8)
      for (int m = 0; m < MT; ++m)
        acc[m] = O::Add32(acc[m], O::Add32(O::MulWords(sl[m], ones), O::MulWords(sh[m], c256)));
    }
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) part[m][v] = O::Partial(acc[m], corr[m]);
  }
}
#endif


template <int V>
HWY_INLINE void Fp4Gemv(const QArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0, int64_t n0) {
  const DF df;
  VF acc[V];
  HWY_UNROLL(8)
  for (int v = 0; v < V; ++v) acc[v] = hn::Zero(df);
  QArgs row = a;  // activation row m0
  row.q = a.q + m0 * a.ldq;
  row.sa = a.sa + m0 * (a.K / a.ab);
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(wt);
  const int64_t groups = a.K / 32;
  for (int64_t g = 0; g < groups; ++g) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if (a.pcorr != nullptr && a.pcorr[m0 * groups + g] != INT32_MIN) {
      const int8_t* qg = a.pqi + m0 * kFp4IntActBytes * a.K + g * 64;
      const int32_t corr = a.pcorr[m0 * groups + g];
      const uint8_t* pf = reinterpret_cast<const uint8_t*>(w32 + g * 4 * kTileRows + roff) + kPrefetchBytes;
      HWY_UNROLL(4)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < V; ++l) hwy::Prefetch(pf + j * kTileRows * 4 + 64 * l);
      __m512 part[1][V];
      Fp4GroupIntDots<IntDots512, V, 1>(w32, &qg, &corr, g, roff, part);
      const hn::RebindToUnsigned<DF> du;
      const hn::Rebind<uint8_t, DF> d8;
      const VF s = hn::Set(df, row.sa[(g * 32) / a.ab]);
      const uint8_t* sg = st + g * kTileRows + roff;
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) {
        // UE8M0 byte b (1..254, checked at pack time) → 2^(b−127).
        const VF sw = hn::BitCast(df, hn::ShiftLeft<23>(hn::PromoteTo(du, hn::LoadU(d8, sg + v * kLanes))));
        acc[v] = hn::Add(acc[v], hn::Mul(hn::Mul(VF{part[0][v]}, s), sw));
      }
      continue;
    }
#endif
    Fp4GemvGroups<V, 1>(row, w32, st, roff, g, acc);
  }
  HWY_ALIGN float out[V * kLanes];
  HWY_UNROLL(8)
  for (int v = 0; v < V; ++v) hn::Store(acc[v], df, out + v * kLanes);
  StoreRows<V, 1>(out, a, m0, n0 + roff, /*round=*/true);
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// ---------------------------------------------------------------- AVX2 GEMV by byte tables
// AVX2 has no 16-entry float lookup and no BF16 dot, so the GEMV above costs
// six instructions per 8 weights (two shifts, vpermps, and, xor, add). Every
// product q·w of a column (the E4M3 activation × an E2M1 value, in the
// kernels' scaled units) has at most 6 significant bits, so it is exactly a
// BF16 value: per column the 16 possible products are two 16-byte tables
// (the product's bits 23..16 and 31..24), and vpshufb looks up 32 rows'
// bytes at once. Per 32 weights: two vpshufb, two byte unpacks (BF16 words),
// two shifts and two ands (the FP32 products, exactly the values the
// multiply gives: a dword's low word shifted up, its high word masked, on
// more ports than word unpacks) and four adds; the packed tile's dwords (8 columns of one
// row) are first transposed into 32 rows × one column pair (four vpshufb and
// eight unpacks per 256 weights). Each lane still adds its row's products in
// increasing k. Measured (Zen 5, one thread, 512×1024 in L2): 15 → 23-24
// Gweights/s.

// Row a's tables: tb[32k + n] = bits 23..16 and tb[32k + 16 + n] = bits
// 31..24 of the FP32 product of q[k] and code n, as the GEMV above forms it
// (q·|w| from the magnitude table, the code's sign bit xor-ed in).
void BuildFp4ProductTables(const float* q, int64_t K, uint8_t* tb) {
  const __m256 mag0 = _mm256_setr_ps(kE2M1Scaled[0], kE2M1Scaled[1], kE2M1Scaled[2], kE2M1Scaled[3], kE2M1Scaled[0],
                                     kE2M1Scaled[1], kE2M1Scaled[2], kE2M1Scaled[3]);
  const __m256 mag1 = _mm256_setr_ps(kE2M1Scaled[4], kE2M1Scaled[5], kE2M1Scaled[6], kE2M1Scaled[7], kE2M1Scaled[4],
                                     kE2M1Scaled[5], kE2M1Scaled[6], kE2M1Scaled[7]);
  const __m256i sgn = _mm256_setr_epi32(0, 0, 0, 0, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN);
  // Per 128-bit lane: the low bytes of the 8 words, then their high bytes.
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                         14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t k = 0; k < K; ++k) {
    const __m256 qv = _mm256_set1_ps(q[k]);
    // Codes 0-3 | 8-11 and 4-7 | 12-15.
    const __m256i p0 = _mm256_xor_si256(_mm256_castps_si256(_mm256_mul_ps(qv, mag0)), sgn);
    const __m256i p1 = _mm256_xor_si256(_mm256_castps_si256(_mm256_mul_ps(qv, mag1)), sgn);
    // Words: lane 0 codes 0-7, lane 1 codes 8-15 (the upper 16 bits).
    const __m256i w = _mm256_packus_epi32(_mm256_srli_epi32(p0, 16), _mm256_srli_epi32(p1, 16));
    const __m256i b = _mm256_shuffle_epi8(w, split);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tb + 32 * k), _mm256_permute4x64_epi64(b, 0xD8));
  }
}

// ---------------------------------------------------------------- AVX2 below 16 rows: integer dots
// Most 32-column groups need neither tables nor FP32 adds (docs/kernels.md
// "FP4 on AVX2 below 16 rows: exact integer dots"). If every nonzero
// |q| of the group (the E4M3 activations, in the reference's units) is at
// least 2^-3, every q is a multiple of 2^-6 and every product q·w of a 2^-7
// (w a multiple of 1/2); a running sum is at most 32·448·6 = 86016 < 2^17 in
// magnitude, so it is a multiple of 2^-7 below 2^24·2^-7: every one of the
// reference's partial sums is exact in FP32, whatever the weights. The
// group's partial sum is then the exact sum, in any order, and integers give
// it: with Q = 64q (|Q| <= 28672, split Q = 256·Qh + Ql into two signed
// bytes) and the weight byte 2w + 12 (0..24, unsigned), vpmaddubsw forms two
// products per word, vpmaddwd the dword of each row, and
// Σ(2w+12)·Q − 12·ΣQ = 128·Σq·w exactly (|·| < 2^24, so its conversion to
// FP32 is exact too). No word saturates: two products are at most 2·24·128
// in magnitude, four column pairs 24 576. Per 64 weights (one dword of 8
// columns for each of 8 rows): the two nibbles (3 instructions), two vpshufb
// to the weight bytes, four vpmaddubsw, three or four word adds, one
// vpmaddwd and one dword add (two each per 16 columns), four vpbroadcastd of
// the activation bytes — 18, against ~30 for the tables — and no
// transposition: the lanes are the rows in order. A group with a smaller
// nonzero |q|, or a NaN/Inf, takes the tables (the GEMV) or the FP32
// micro-tile (several rows: also when another row of the tile fails).

// Row q's operands (kFp4IntActBytes per column), per 32-column group g:
// pqi[64g + 16j ..] = the 4 dwords
// Ql(8j+0,2,4,6), Qh(8j+0,2,4,6), Ql(8j+1,3,5,7), Qh(8j+1,3,5,7) (the even
// columns are the packed bytes' low nibbles); pcorr[g] = 12·ΣQ, or INT32_MIN
// where the group cannot take them (its tables are then built into tb, 32
// bytes per column as BuildFp4ProductTables, unless tb is null).
// q: QuantizeActRows' output (E4M3 values × 2^119, or NaN/Inf).
void BuildFp4IntActs(const float* q, int64_t K, int8_t* pqi, int32_t* pcorr, uint8_t* tb) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const int32_t lo_bits = std::bit_cast<int32_t>(0x1p116f);             // 2^-3 · 2^119
  const int32_t hi_bits = std::bit_cast<int32_t>(448.0f * 0x1p119f);    // 448 · 2^119
  const __m256i lo_m1 = _mm256_set1_epi32(lo_bits - 1), hi_p1 = _mm256_set1_epi32(hi_bits + 1);
  const __m256 to_q = _mm256_set1_ps(0x1p-113f);  // q·2^119 → 64q
  const __m256i even_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  // Per 128-bit lane: byte 0 of each dword into bytes 0..3 (Ql), the rest zero.
  const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                             -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i to_hi = _mm256_setr_epi8(-1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                         0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i c128 = _mm256_set1_epi32(128);
  for (int64_t g = 0; g < K / 32; ++g) {
    __m256i ok = _mm256_set1_epi32(-1), sum = _mm256_setzero_si256();
    for (int64_t j = 0; j < 4; ++j) {
      const __m256 v = _mm256_loadu_ps(q + g * 32 + j * 8);
      const __m256i bits = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
      const __m256i in_range = _mm256_and_si256(_mm256_cmpgt_epi32(bits, lo_m1), _mm256_cmpgt_epi32(hi_p1, bits));
      ok = _mm256_and_si256(ok, _mm256_or_si256(in_range, _mm256_cmpeq_epi32(bits, _mm256_setzero_si256())));
      // 64q: an integer wherever ok (a garbage value elsewhere, then unused).
      const __m256i qi = _mm256_permutevar8x32_epi32(_mm256_cvttps_epi32(_mm256_mul_ps(v, to_q)), even_odd);
      sum = _mm256_add_epi32(sum, qi);
      const __m256i qh = _mm256_srai_epi32(_mm256_add_epi32(qi, c128), 8);  // Q = 256·Qh + Ql, Ql in [-128, 127]
      const __m256i b = _mm256_or_si256(_mm256_shuffle_epi8(qi, low_bytes), _mm256_shuffle_epi8(qh, to_hi));
      // Lane 0 (even columns): Ql, Qh; lane 1 (odd): Ql, Qh → 16 bytes.
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pqi + g * 64 + j * 16),
                       _mm256_castsi256_si128(_mm256_permute4x64_epi64(b, 0x08)));
    }
    if (_mm256_movemask_epi8(ok) == -1) {
      const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
      pcorr[g] = 12 * _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
    } else {
      pcorr[g] = INT32_MIN;
      if (tb != nullptr) BuildFp4ProductTables(q + g * 32, 32, tb + g * 32 * 32);
    }
  }
}

#endif  // the operands: AVX2 and AVX-512
#if HWY_TARGET == HWY_AVX2
// The partial sums of group g of one activation row (a.pt holds its
// tables) for 32·H rows roff.. of one packed tile, by the byte product
// tables (see above); part[v] in row order.
template <int H>
HWY_INLINE void Fp4GroupTables(const QArgs& a, const uint32_t* w32, int64_t g, int64_t roff, __m256* part) {
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  const __m256i hword = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  // Per 128-bit lane (4 rows × 4 bytes): byte c of each row's dword together.
  const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13,
                                      2, 6, 10, 14, 3, 7, 11, 15);
  for (int v = 0; v < 4 * H; ++v) part[v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < 4; ++j) {
    const uint32_t* wj = w32 + (g * 4 + j) * kTileRows + roff;
    const uint8_t* pf = reinterpret_cast<const uint8_t*>(wj) + kPrefetchBytes;
    HWY_UNROLL(4)
    for (int l = 0; l < 2 * H; ++l) hwy::Prefetch(pf + 64 * l);
    // Half hh: a_v = rows 32hh+8v..+7 (lane l: rows +4l..+3), byte c of
    // each dword = columns 8j+2c (low nibble) and 8j+2c+1 (high nibble).
    // b[hh][c], lane l, byte 4v+i: row 32hh + 8v + 4l + i, column pair c.
    __m256i b[H][4];
    HWY_UNROLL(2)
    for (int hh = 0; hh < H; ++hh) {
      const uint32_t* wh = wj + 32 * hh;
      const __m256i a0 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh)), tr);
      const __m256i a1 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh + 8)), tr);
      const __m256i a2 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh + 16)), tr);
      const __m256i a3 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh + 24)), tr);
      const __m256i t0 = _mm256_unpacklo_epi32(a0, a1), t1 = _mm256_unpackhi_epi32(a0, a1);
      const __m256i t2 = _mm256_unpacklo_epi32(a2, a3), t3 = _mm256_unpackhi_epi32(a2, a3);
      b[hh][0] = _mm256_unpacklo_epi64(t0, t2);
      b[hh][1] = _mm256_unpackhi_epi64(t0, t2);
      b[hh][2] = _mm256_unpacklo_epi64(t1, t3);
      b[hh][3] = _mm256_unpackhi_epi64(t1, t3);
    }
    HWY_UNROLL(4)
    for (int c = 0; c < 4; ++c) {
      HWY_UNROLL(2)
      for (int h = 0; h < 2; ++h) {
        const int64_t k = g * 32 + j * 8 + 2 * c + h;
        const __m256i tlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.pt + 32 * k)));
        const __m256i thi =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.pt + 32 * k + 16)));
        HWY_UNROLL(2)
        for (int hh = 0; hh < H; ++hh) {
          const __m256i idx =
              h == 0 ? _mm256_and_si256(b[hh][c], lo4) : _mm256_and_si256(_mm256_srli_epi16(b[hh][c], 4), lo4);
          const __m256i lo = _mm256_shuffle_epi8(tlo, idx), hi = _mm256_shuffle_epi8(thi, idx);
          // BF16 words, then FP32: a dword's low word shifted up (part[4hh+0|2]) and its high
          // word masked (part[4hh+1|3]); the lanes are put back in row order at the group end.
          const __m256i w0 = _mm256_unpacklo_epi8(lo, hi), w1 = _mm256_unpackhi_epi8(lo, hi);
          __m256* p = part + 4 * hh;
          p[0] = _mm256_add_ps(p[0], _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)));
          p[1] = _mm256_add_ps(p[1], _mm256_castsi256_ps(_mm256_and_si256(w0, hword)));
          p[2] = _mm256_add_ps(p[2], _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)));
          p[3] = _mm256_add_ps(p[3], _mm256_castsi256_ps(_mm256_and_si256(w1, hword)));
        }
      }
    }
  }
  // part[4hh+2u] holds the even and part[4hh+2u+1] the odd of the 16 rows
  // 32hh+16u..; interleaved, they are rows 32hh+16u..+7 and +8..+15 in order.
  for (int v = 0; v < 4 * H; v += 2) {
    const __m256 ev = part[v], od = part[v + 1];
    part[v] = _mm256_unpacklo_ps(ev, od);
    part[v + 1] = _mm256_unpackhi_ps(ev, od);
  }
}

// GEMV of activation row m0 (a.pt holds its tables, a.pqi its integer
// operands) over 32·H rows roff.. of one packed tile (H = 2: the whole tile,
// so each 256-byte stripe of the tile is read in one pass and each column's
// tables are loaded once for 64 rows); each group by the integer dots where
// it can, else by the tables; the same fold and rounding as Fp4Gemv.
template <int H>
HWY_INLINE void Fp4GemvTables(const QArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0,
                              int64_t n0) {
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(wt);
  const float* sa = a.sa + m0 * (a.K / a.ab);
  HWY_ALIGN float acc[32 * H];
  for (int v = 0; v < 4 * H; ++v) _mm256_store_ps(acc + 8 * v, _mm256_setzero_ps());
  const int64_t groups = a.K / 32;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 parts[1][4 * H];
    __m256* part = parts[0];
    if (a.pcorr[m0 * groups + g] != INT32_MIN) {
      const uint8_t* pf = reinterpret_cast<const uint8_t*>(w32 + g * 4 * kTileRows + roff) + kPrefetchBytes;
      HWY_UNROLL(8)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 2 * H; ++l) hwy::Prefetch(pf + j * kTileRows * 4 + 64 * l);
      const int8_t* qg = a.pqi + m0 * kFp4IntActBytes * a.K + g * 64;
      const int32_t corr = a.pcorr[m0 * groups + g];
      Fp4GroupIntDots<IntDots256, 4 * H, 1>(w32, &qg, &corr, g, roff, parts);
    } else {
      Fp4GroupTables<H>(a, w32, g, roff, part);
    }
    const __m256 s = _mm256_set1_ps(sa[(g * 32) / a.ab]);
    const uint8_t* sg = st + g * kTileRows + roff;
    for (int v = 0; v < 4 * H; ++v) {
      // UE8M0 byte b (1..254, checked at pack time) → 2^(b−127).
      const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sg + 8 * v));
      const __m256 sw = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(b8), 23));
      _mm256_store_ps(acc + 8 * v,
                      _mm256_add_ps(_mm256_load_ps(acc + 8 * v), _mm256_mul_ps(_mm256_mul_ps(part[v], s), sw)));
    }
  }
  StoreRows<4 * H, 1>(acc, a, m0, n0 + roff, /*round=*/true);
}
#endif  // HWY_AVX2
#else
inline constexpr bool kFp4Gemv = false;
template <int V>
HWY_INLINE void Fp4Gemv(const QArgs&, const uint8_t*, const uint8_t*, int64_t, int64_t, int64_t) {}
#endif

// Micro-tile (see linear_fp8.cc). The repacked FP4 tile holds, per 8 columns
// and row, one little-endian dword whose nibble i is column k+i (the
// checkpoint's own byte order, so the dword is 4 checkpoint bytes copied):
// a vector load gives kLanes rows × 8 columns, and column k+i is the dword
// shifted right by 4i (the lookup ignores the bits above).
template <int V, int MT>
HWY_INLINE void Fp4Micro(const QArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0, int64_t n0) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t groups = a.K / 32, kblocks = a.K / a.ab;
  HWY_ALIGN float acc[MT][V * kLanes];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) hn::Store(hn::Zero(df), df, acc[m] + v * kLanes);
  const float* q = a.q + m0 * a.ldq;
  const float* sa = a.sa + m0 * kblocks;
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(wt);
  for (int64_t g = 0; g < groups; ++g) {
    VF part[MT][V];
#if HWY_TARGET == HWY_AVX2
    // The integer dots (Fp4GroupIntDots) where every row's group can take them.
    // (AVX2 only: on AVX-512 the 16-entry vpermps lookup is one instruction
    // shared by the tile's rows, and the integers measured 2-2.5x slower at
    // 2 and 4 rows.)
    bool ints = a.pcorr != nullptr;
    const int8_t* qg[MT];
    int32_t corr[MT];
    HWY_UNROLL(4)
    for (int m = 0; m < MT; ++m) {
      corr[m] = ints ? a.pcorr[(m0 + m) * groups + g] : INT32_MIN;
      qg[m] = ints ? a.pqi + (m0 + m) * kFp4IntActBytes * a.K + g * 64 : nullptr;
      ints = ints && corr[m] != INT32_MIN;
    }
    if (ints) {
      const uint8_t* pf = reinterpret_cast<const uint8_t*>(w32 + g * 4 * kTileRows + roff) + kPrefetchBytes;
      HWY_UNROLL(4)
      for (int j = 0; j < 4; ++j) hwy::Prefetch(pf + j * kTileRows * 4);
      __m256 ip[MT][V];
      Fp4GroupIntDots<IntDots256, V, MT>(w32, qg, corr, g, roff, ip);
      HWY_UNROLL(4)
      for (int m = 0; m < MT; ++m) {
        HWY_UNROLL(8)
        for (int v = 0; v < V; ++v) part[m][v] = VF{ip[m][v]};
      }
    } else {
#endif
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) part[m][v] = hn::Zero(df);
    }
    for (int64_t k8 = g * 32; k8 < g * 32 + 32; k8 += 8) {
      const uint32_t* wj = w32 + (k8 / 8) * kTileRows + roff;
      hwy::Prefetch(reinterpret_cast<const uint8_t*>(wj) + kPrefetchBytes);
      hwy::Prefetch(reinterpret_cast<const uint8_t*>(wj) + kPrefetchBytes + 64);
      hwy::Prefetch(reinterpret_cast<const uint8_t*>(wj) + kPrefetchBytes + 128);
      hwy::Prefetch(reinterpret_cast<const uint8_t*>(wj) + kPrefetchBytes + 192);
      HWY_UNROLL(8)
      for (int i = 0; i < 8; ++i) {
        HWY_UNROLL(8)
        for (int v = 0; v < V; ++v) {
          // Reloaded (L1) rather than kept: MT·V partial sums need the registers.
          const auto xv = hn::LoadU(du, wj + v * kLanes);
          const VF w = E2M1Lookup(i == 0 ? xv : hn::ShiftRightSame(xv, 4 * i));
          HWY_UNROLL(8)
          for (int m = 0; m < MT; ++m)
            part[m][v] = hn::MulAdd(hn::Set(df, q[m * a.ldq + k8 + i]), w, part[m][v]);
        }
      }
    }
#if HWY_TARGET == HWY_AVX2
    }
#endif
    const uint8_t* sg = st + g * kTileRows + roff;
    const int64_t kb = (g * 32) / a.ab;
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) {
      // UE8M0 byte b (1..254, checked at pack time) → 2^(b−127).
      const VF sw = hn::BitCast(df, hn::ShiftLeft<23>(hn::PromoteTo(du, hn::LoadU(d8, sg + v * kLanes))));
      HWY_UNROLL(8)
      for (int m = 0; m < MT; ++m) {
        const VF s = hn::Set(df, sa[m * kblocks + kb]);
        const VF prev = hn::Load(df, acc[m] + v * kLanes);
        hn::Store(hn::Add(prev, hn::Mul(hn::Mul(part[m][v], s), sw)), df, acc[m] + v * kLanes);
      }
    }
  }
  StoreRows<V, MT>(acc[0], a, m0, n0 + roff, /*round=*/true);
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Prefill on a CPU with the BF16 pair dots: per (tile, m-chunk) item, each
// 32-column group of the tile converted once into BF16 pairs and run by every
// 6-row group of the chunk (RunFp8DotItems' scheme), accumulators of the chunk
// in BlockScratch::acc. Below kFp4BlockDotMinM rows Fp4Bf16DotMicro converts
// per 4 rows instead. Measured (Zen 4, one thread as the MoE's experts run,
// N = 1024, alternated twice): K = 1024 M = 16 / 24 / 48 / 96 143-145 /
// 141-144 / 142-143 / 141-144 -> 149 / 155 / 158-160 / 160-161 GFLOP/s,
// K = 512 M = 48 142 -> 158; M = 1024, 2304 x 5120 136-137 -> 151-153.
// From kBlockGemmMinM rows (act_quant.cc ReserveBlockScratch reserves its accumulators: 96-row chunks here).
inline constexpr int64_t kFp4BlockDotMinM = kBlockGemmMinM;
HWY_INLINE void RunFp4DotItems(const QArgs& a, int64_t item0, int64_t item1) {
  constexpr int kMT = 6;
  HWY_ALIGN uint32_t wp[16 * kTileRows];
  HWY_ALIGN float sw[kTileRows];
  BlockScratch& s = ThreadBlockScratch();
  s.Resize(0, a.mchunk * kTileRows);
  float* HWY_RESTRICT acc = s.acc.get();
  const int64_t groups = a.K / 32, kblocks = a.K / a.ab, ldqp = a.K / 2;
  for (int64_t it = item0; it < item1; ++it) {
    const int64_t tile = it / a.mchunks, mc = it % a.mchunks;
    const int64_t m_begin = mc * a.mchunk, m_end = std::min(a.M, m_begin + a.mchunk);
    const int64_t rows = std::min<int64_t>(kTileRows, a.N - tile * kTileRows);
    const int vt = static_cast<int>((rows + 15) / 16);
    const uint8_t* wt = a.w + tile * (a.K / 2) * kTileRows;
    const uint8_t* st = a.s + tile * groups * kTileRows;
    std::fill(acc, acc + (m_end - m_begin) * kTileRows, 0.0f);
    for (int64_t g = 0; g < groups; ++g) {
      Fp4Bf16DotConvertGroup(wt, st, g, wp, sw);
      const int64_t kb = (g * 32) / a.ab;
      for (int64_t m0 = m_begin; m0 < m_end; m0 += kMT) {
        const int mt = static_cast<int>(std::min<int64_t>(kMT, m_end - m0));
        PrefetchNextPairGroup(a.qp, ldqp, m0, kMT, m_begin, m_end, g * 16, 16, ldqp);
        Fp4Bf16DotBlockMicro(wp, 0, a.qp + m0 * ldqp + g * 16, ldqp, a.sa + m0 * kblocks + kb, kblocks, sw,
                             acc + (m0 - m_begin) * kTileRows, vt, mt);
      }
    }
    for (int64_t m = m_begin; m < m_end; ++m)
      StoreRows<static_cast<int>(kTileRows / kLanes), 1>(acc + (m - m_begin) * kTileRows, a, m, tile * kTileRows,
                                                          /*round=*/true);
  }
}
#endif

void RunFp4(const QArgs& a, int64_t item0, int64_t item1) {
  if (kUseBlockGemm && a.M >= kBlockGemmMinM) {
    // Prefill: each (tile, 32-column group) converted once for the m-chunk.
    const auto conv = [&](int64_t tile, int64_t g, float* w, float* sw) {
      const DF df;
      const hn::RebindToUnsigned<DF> du;
      const hn::Rebind<uint8_t, DF> d8;
      const uint32_t* w32 = reinterpret_cast<const uint32_t*>(a.w + tile * (a.K / 2) * kTileRows) + g * 4 * kTileRows;
      const uint8_t* sg = a.s + tile * (a.K / 32) * kTileRows + g * kTileRows;
      for (int64_t r = 0; r < kTileRows; r += static_cast<int64_t>(kLanes))
        hn::StoreU(hn::BitCast(df, hn::ShiftLeft<23>(hn::PromoteTo(du, hn::LoadU(d8, sg + r)))), df, sw + r);
      const VF up = hn::Set(df, 0x1p120f);
      // w·s_w (linear_common.h BlockPrescaleExact): the table's value × 2^-120
      // times 2^120·s_w, one exact multiply, where every s_w of the weight is
      // at most 2^7 (2^120·s_w finite), as the FP8 conversion; else times
      // 2^120, then times s_w, each exact.
      const bool one_mul = a.w_exp_hi <= 7;
      for (int64_t j = 0; j < 4; ++j) {
        for (int64_t r = 0; r < kTileRows; r += static_cast<int64_t>(kLanes)) {
          const auto xv = hn::LoadU(du, w32 + j * kTileRows + r);
          float* wr = w + 8 * j * kTileRows + r;
          if (a.prescaled && one_mul) {
            const VF f = hn::Mul(up, hn::LoadU(df, sw + r));
            HWY_UNROLL(8)
            for (int i = 0; i < 8; ++i)
              hn::StoreU(hn::Mul(E2M1Lookup(i == 0 ? xv : hn::ShiftRightSame(xv, 4 * i)), f), df, wr + i * kTileRows);
          } else if (a.prescaled) {
            const VF f = hn::LoadU(df, sw + r);
            HWY_UNROLL(8)
            for (int i = 0; i < 8; ++i)
              hn::StoreU(hn::Mul(hn::Mul(E2M1Lookup(i == 0 ? xv : hn::ShiftRightSame(xv, 4 * i)), up), f), df,
                         wr + i * kTileRows);
          } else {
            HWY_UNROLL(8)
            for (int i = 0; i < 8; ++i)
              hn::StoreU(E2M1Lookup(i == 0 ? xv : hn::ShiftRightSame(xv, 4 * i)), df, wr + i * kTileRows);
          }
        }
      }
    };
    if (a.prescaled) {
      RunBlockItems<kBlockV, kBlockMT, BlockMode::kPrescaled>(a, item0, item1, 32, conv);
    } else {
      RunBlockItems<kBlockV, kBlockMT>(a, item0, item1, 32, conv);
    }
    return;
  }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (a.qp != nullptr && a.M >= kFp4BlockDotMinM) {
    RunFp4DotItems(a, item0, item1);
    return;
  }
  if (a.qp != nullptr) {
    // A CPU with AVX512_BF16: BF16 pair dots (bf16_dot.h), M >= 2 (RunFp4Call).
    Fp4DotArgs d;
    d.K = a.K;
    d.ab = a.ab;
    d.qp = a.qp;
    d.ldqp = a.K / 2;
    d.sa = a.sa;
    RunItems<kMicroV, 4>(a, item0, item1, [&](auto vt, auto mt, const QArgs& aa, int64_t tile, int64_t roff,
                                              int64_t m0) {
      constexpr int kV = decltype(vt)::value, kMT = decltype(mt)::value;
      HWY_ALIGN float acc[kMT * kV * kLanes];
      Fp4Bf16DotMicro(d, aa.w + tile * (aa.K / 2) * kTileRows, aa.s + tile * (aa.K / 32) * kTileRows, roff, m0, kV,
                      kMT, acc);
      StoreRows<kV, kMT>(acc, aa, m0, tile * kTileRows + roff, /*round=*/true);
    });
    return;
  }
#endif
  const auto micro = [&](auto vt, auto mt, const QArgs& aa, int64_t tile, int64_t roff, int64_t m0) {
    constexpr int kV = decltype(vt)::value, kMT = decltype(mt)::value;
    if constexpr (kMT == 1 && kFp4Gemv) {
#if HWY_TARGET == HWY_AVX2
      if constexpr (kV == 4 || kV == 8) {
        if (aa.pt != nullptr) {  // row m0's tables at pt + 32·K·m0
          QArgs row = aa;
          row.pt = aa.pt + 32 * aa.K * m0;
          Fp4GemvTables<kV / 4>(row, aa.w + tile * (aa.K / 2) * kTileRows, aa.s + tile * (aa.K / 32) * kTileRows,
                                roff, m0, tile * kTileRows);
          return;
        }
      }
#endif
      Fp4Gemv<kV>(aa, aa.w + tile * (aa.K / 2) * kTileRows, aa.s + tile * (aa.K / 32) * kTileRows, roff, m0,
                  tile * kTileRows);
      return;
    }
    Fp4Micro<kV, kMT>(aa, aa.w + tile * (aa.K / 2) * kTileRows, aa.s + tile * (aa.K / 32) * kTileRows, roff, m0,
                   tile * kTileRows);
  };
#if HWY_TARGET == HWY_AVX2
  // The integer-dot / table GEMV over whole 64-row tiles: one row, or several
  // rows one after the other over each tile when most of their groups take
  // the integer dots (fp4_rowwise). Measured (Zen 5, one thread, 1024×1024,
  // Gaussian rows: the integer dots): the multi-row micro-tile below spent
  // 40-46 us per row (its integer form spills registers), the GEMV 29-32 us
  // per row: M = 2 / 3 / 4 / 8 1.50 / 1.46 / 1.35 / 1.41× faster; with rows
  // that take the tables (activations over 18 binades) the micro-tile's FP32
  // path stays faster (46 against 60 us per row), hence the vote.
  if (a.pt != nullptr && (a.M == 1 || a.fp4_rowwise)) {
    RunItems<8, 1>(a, item0, item1, micro);
    return;
  }
#endif
  RunItems<kMicroV, kMicroMT>(a, item0, item1, micro);
}

// Per-target entry (hwy_util-inl.h RunLinearCall). On AVX-512 with the BF16
// pair dots (bf16_dot.h) the activations of a call with two rows or more are
// packed as BF16 pairs first. A single row (the decode GEMV) takes the
// integer dots below instead: from DRAM they ran the expert GEMVs at 73% of
// the triad against the pair dots' 33% on Zen 4 (whose 512-bit operations
// are two 256-bit halves), 87-89% against 82% on Zen 5 (bench kernels,
// `fast` vs `fast-fp32-path`).
void RunFp4Call(QArgs& a) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (Bf16DotActive() && a.M > 1) {
    ActBuffers& buf = ThreadActBuffers();  // the caller's thread: a.q lives in buf.q, untouched here
    if (static_cast<int64_t>(buf.qp.size()) < a.M * (a.K / 2)) buf.qp.resize(a.M * (a.K / 2));
    if (PackActPairs(a.q, a.M, a.K, a.ldq, buf.qp.data())) a.qp = buf.qp.data();
  }
  // Without them (no AVX512_BF16, or the pack refused the activations): the
  // integer dots for the row that runs alone (Fp4Gemv; the operands of every
  // row, as on AVX2, so any tiling finds its row's), with the FP32 path as
  // the fallback of a group. Several rows keep the FP32 micro-tile (above).
  if (a.qp == nullptr && a.M < kBlockGemmMinM && a.M % kMicroMT == 1) {
    ActBuffers& buf = ThreadActBuffers();
    const int64_t groups = a.K / 32;
    if (static_cast<int64_t>(buf.pqi.size()) < a.M * kFp4IntActBytes * a.K)
      buf.pqi.resize(a.M * kFp4IntActBytes * a.K);
    if (static_cast<int64_t>(buf.pcorr.size()) < a.M * groups) buf.pcorr.resize(a.M * groups);
    for (int64_t m = 0; m < a.M; ++m)
      BuildFp4IntActs(a.q + m * a.ldq, a.K, buf.pqi.data() + m * kFp4IntActBytes * a.K,
                      buf.pcorr.data() + m * groups, nullptr);
    a.pqi = buf.pqi.data();
    a.pcorr = buf.pcorr.data();
  }
#endif
#if HWY_TARGET == HWY_AVX2
  // Below the block GEMM's rows every activation row gets its integer-dot
  // operands (BuildFp4IntActs) and its product tables (for the groups that
  // cannot take the integers, in the GEMV: M = 1, the rows of an
  // fp4_rowwise call, or the last row when M % kMicroMT == 1). Both are exact
  // only because a.q holds QuantizeActRows' output (E4M3 values × 2^119, or
  // NaN/Inf); a caller with other activations must not set a.pt / a.pqi.
  // fp4_rowwise: at least 60% of the call's (row, group) pairs take the
  // integers (the break-even of the two forms measured above is ~53%).
  if (a.M < kBlockGemmMinM) {
    ActBuffers& buf = ThreadActBuffers();
    const int64_t groups = a.K / 32;
    if (static_cast<int64_t>(buf.pt.size()) < a.M * 32 * a.K) buf.pt.resize(a.M * 32 * a.K);
    if (static_cast<int64_t>(buf.pqi.size()) < a.M * kFp4IntActBytes * a.K)
      buf.pqi.resize(a.M * kFp4IntActBytes * a.K);
    if (static_cast<int64_t>(buf.pcorr.size()) < a.M * groups) buf.pcorr.resize(a.M * groups);
    for (int64_t m = 0; m < a.M; ++m)
      BuildFp4IntActs(a.q + m * a.ldq, a.K, buf.pqi.data() + m * kFp4IntActBytes * a.K,
                      buf.pcorr.data() + m * groups, buf.pt.data() + m * 32 * a.K);
    a.pqi = buf.pqi.data();
    a.pcorr = buf.pcorr.data();
    a.pt = buf.pt.data();
    int64_t ints = 0;
    for (int64_t i = 0; i < a.M * groups; ++i) ints += a.pcorr[i] != INT32_MIN;
    a.fp4_rowwise = ints * 10 >= a.M * groups * 6;
  }
#endif
  RunLinearCall(a, &RunFp4);
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(RunFp4Call);

void LinearFp4(const float* x, int64_t M, const PackedFp4& w, int act_block, float* y, Fp8Format act_format) {
  if (M <= 0) return;
  if (w.use_ref || act_block <= 0 || act_block % 32 != 0 || w.src.in % act_block != 0) {
    if (w.src.w == nullptr)  // a row concatenation (ConcatPackedRows) has no checkpoint view
      Fail(ErrorKind::kInvalidArgument,
           "LinearFp4: activation block {} needs the scalar path, which a concatenated weight ({} x {}) does not have",
           act_block, w.src.out, w.src.in);
    ref::LinearFp4(x, M, w.src, act_block, y, act_format);
    return;
  }
  QArgs a;
  a.K = w.src.in;
  a.N = w.src.out;
  a.M = M;
  a.ab = act_block;
  a.tiles = w.tiles;
  a.w = w.w.get();
  a.s = w.s.get();
  a.w_exp_lo = w.scale_exp_lo;
  a.w_exp_hi = w.scale_exp_hi;
  a.y = y;
  a.ldy = a.N;
  a.ldq = a.K;
  ActBuffers& buf = ThreadActBuffers();
  buf.Resize(M * a.K, M * (a.K / act_block));
  QuantizeActRows(x, M, a.K, act_block, buf.q.data(), buf.sa.data(), act_format);
  a.q = buf.q.data();
  a.sa = buf.sa.data();
  HWY_DYNAMIC_DISPATCH(RunFp4Call)(a);
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
