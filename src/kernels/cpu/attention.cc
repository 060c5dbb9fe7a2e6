// Sparse attention with sink for one query row (cpu_ops.h), bit-identical to
// ref::SparseAttention: the same chunked online softmax, in three phases:
//   1. scores, kScoreBlock candidates at a time: their rows are widened to
//      FP32 in a per-thread block and the q·k dot products computed kLanes
//      heads per vector (q transposed once to qt[d][h], each candidate's k[d]
//      broadcast, one accumulator per candidate), every lane summing its
//      head's products in increasing d, as the reference's scalar loop does;
//   2. softmax statistics, kLanes heads per vector: per chunk the running
//      max, the rescale factor, every member's exp (SleefExpfV: SLEEF's expf
//      with the reference's operations per lane) with its BF16 weight, and
//      the chunk sum (TorchSumV: ref::TorchSum's addition order per lane);
//   3. P·V per register tile of heads × d vectors, the keys read from the
//      BF16 rows: per chunk the partial sums part + pb·k over the members in
//      order, in registers, then acc·rescale + part; finally
//      out = bf16(acc / sum).
// The q·k and pb·k products are fused with their additions where tracked
// exponent ranges show them exact (see "Fused multiply-adds" below), which
// gives the multiply-then-add's bits.
// Every output element sees exactly the reference's operations in its order.
// The scratch is thread_local and only grows (no allocation per decode step).
// A large call made outside any parallel region splits candidates (1), head
// vectors (2) and tiles (3) over the OpenMP team; each element's arithmetic
// stays inside one thread, so the result does not depend on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/aligned_allocator.h>
#include <omp.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "format/numerics.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "kernels/ref/ref_math.h"

#ifndef DEEPINFER_KERNELS_CPU_ATTENTION_ONCE_
#define DEEPINFER_KERNELS_CPU_ATTENTION_ONCE_
namespace deepinfer::cpu {
constexpr int32_t kChunk = 64;  // ref::SparseAttention's softmax chunk
constexpr int kScoreBlockMax = 12;  // candidates per score block, at most (ScoreBlockSize)
// A chunk with members: slots [c0, c0 + clen), candidates [i0, i1).
struct AttnChunk {
  int32_t c0, clen;
  int i0, i1;
};
// Per-call scratch; Hp, Dp: H and D rounded up to whole vectors.
struct AttnScratch {
  const uint16_t* const* kv;  // [n] BF16 candidate rows
  const float* qt;     // [D][Hp] transposed query
  float* kvt;          // [n][Dp - PvTailStart] widened tails of the rows, padding zero
  float* dots;         // [n][Hp] q·k
  float* pb;           // [n][Hp] bf16(exp(s - m))
  float* pt;           // [kChunk][Hp] one chunk's exp values by slot
  float* rescale;      // [chunks][Hp]
  float* sum;          // [Hp]
  const float* sink;   // [Hp]
  // FMA guard (see "Fused multiply-adds" below): biased FP32 exponents.
  bool q_exact;        // every q element BF16-exact and finite
  int32_t q_emin, q_emax;  // over q's nonzero elements (255 / 0 when none)
  int32_t* k_emin;     // [n] per candidate row, over its nonzero elements (255 when none)
  int32_t* k_emax;     // [n] (0 when none; 255: a non-finite element)
  int32_t* pb_emin;    // [chunks][Hp / lanes] over the nonzero pb of a chunk and head vector; -1 if one is NaN
  int32_t* chunk_kmin;  // [chunks] the k_emin / k_emax of a chunk's members, merged (after phase 1)
  int32_t* chunk_kmax;
  // BF16 pair dots (bf16_dot.h, AVX-512 target with AVX512_BF16, D a
  // multiple of 64, q BF16-exact): null when off.
  const uint32_t* qp;  // [D/2][Hp] the query's pairs, element 2p in the high word
  uint32_t* pbp;       // [n][Hp] pb pairs of members i, i+1 at the chunk's i0, i0+2, ...
};
// Fused multiply-adds: q·k (BF16 × BF16) and pb·k (pb is BF16-rounded) have
// at most 16 significant bits, so they are exact in FP32 unless they
// underflow or overflow, and then an FMA gives the same bits as the
// reference's multiply-then-add (docs/kernels.md, "FMAs"). The kernels track
// the operands' exponent ranges and use FMAs where Bf16FieldsProductsExact
// (linear_common.h) holds for them, multiplying then adding elsewhere (a
// special value, an FP32 query, probabilities small enough to underflow).
}  // namespace deepinfer::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

// ref::SleefExpf on every lane. The FMA targets run its operations as
// vectors (same roundings: fused where it uses std::fma, the same
// nearest-even conversion; out-of-range conversions only reach lanes the
// final selects overwrite); the fallback calls it per lane, as its MulAdd
// is not fused.
HWY_INLINE VF SleefExpfV(VF d) {
  const DF df;
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  HWY_ALIGN float x[kLanes];
  hn::Store(d, df, x);
  for (size_t l = 0; l < kLanes; ++l) x[l] = ref::SleefExpf(x[l]);
  return hn::Load(df, x);
#else
  const hn::RebindToSigned<DF> di;
  const VF rln2 = hn::Set(df, 1.442695040888963407359924681001892137426645954152985934135449406931f);
  const auto q = hn::NearestInt(hn::Mul(d, rln2));
  const VF qf = hn::ConvertTo(df, q);
  VF s = hn::MulAdd(qf, hn::Set(df, -0.693145751953125f), d);
  s = hn::MulAdd(qf, hn::Set(df, -1.428606765330187045e-06f), s);
  VF u = hn::Set(df, 0.000198527617612853646278381f);
  u = hn::MulAdd(u, s, hn::Set(df, 0.00139304355252534151077271f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.00833336077630519866943359f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.0416664853692054748535156f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.166666671633720397949219f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.5f));
  u = hn::Add(hn::Set(df, 1.0f), hn::MulAdd(hn::Mul(s, s), u, s));
  // Ldexp2: u·2^(q>>1)·2^(q - (q>>1)).
  const auto q1 = hn::ShiftRight<1>(q);
  const auto bias = hn::Set(di, 0x7f);
  u = hn::Mul(u, hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(q1, bias))));
  u = hn::Mul(u, hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::Sub(q, q1), bias))));
  u = hn::IfThenZeroElse(hn::Lt(d, hn::Set(df, -104.0f)), u);
  u = hn::IfThenElse(hn::Lt(hn::Set(df, 100.0f), d), hn::Set(df, std::numeric_limits<float>::infinity()), u);
  return hn::IfThenElse(hn::IsNaN(d), d, u);
#endif
}

// std::max(a, b) per lane (a unless a < b: NaN b and ±0 ties keep a).
HWY_INLINE VF StdMax(VF a, VF b) { return hn::IfThenElse(hn::Lt(a, b), b, a); }

// c10::utils::CeilLog2.
inline int64_t CeilLog2(int64_t x) {
  if (x <= 2) return 1;
  uint64_t v = static_cast<uint64_t>(x) - 1;
  int64_t n = 0;
  while (v) { ++n; v >>= 1; }
  return n;
}

// ref::TorchRowSum<L> per lane: `size` elements of L scalars, scalar j of
// the row at x[j·stride].
template <int L>
HWY_INLINE void TorchRowSumV(const float* x, int64_t stride, int64_t size, VF* out) {
  const DF df;
  constexpr int kIlp = 4, kLevels = 4;
  const int64_t size_ilp = size / kIlp;
  VF acc[kLevels][kIlp][L];
  for (int j = 0; j < kLevels; ++j)
    for (int k = 0; k < kIlp; ++k)
      for (int l = 0; l < L; ++l) acc[j][k][l] = hn::Zero(df);
  const int64_t level_power = std::max<int64_t>(4, CeilLog2(size_ilp) / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  auto add_row = [&](int64_t i) {
    for (int k = 0; k < kIlp; ++k)
      for (int l = 0; l < L; ++l)
        acc[0][k][l] = hn::Add(acc[0][k][l], hn::Load(df, x + ((i * kIlp + k) * L + l) * stride));
  };
  int64_t i = 0;
  for (; i + level_step <= size_ilp;) {
    for (int64_t j = 0; j < level_step; ++j, ++i) add_row(i);
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kIlp; ++k)
        for (int l = 0; l < L; ++l) {
          acc[j][k][l] = hn::Add(acc[j][k][l], acc[j - 1][k][l]);
          acc[j - 1][k][l] = hn::Zero(df);
        }
      const int64_t mask = level_mask << (j * level_power);
      if ((i & mask) != 0) break;
    }
  }
  for (; i < size_ilp; ++i) add_row(i);
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kIlp; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] = hn::Add(acc[0][k][l], acc[j][k][l]);
  for (int64_t v = size_ilp * kIlp; v < size; ++v)
    for (int l = 0; l < L; ++l) acc[0][0][l] = hn::Add(acc[0][0][l], hn::Load(df, x + (v * L + l) * stride));
  for (int k = 1; k < kIlp; ++k)
    for (int l = 0; l < L; ++l) acc[0][0][l] = hn::Add(acc[0][0][l], acc[0][k][l]);
  for (int l = 0; l < L; ++l) out[l] = acc[0][0][l];
}

// ref::TorchSum per lane over n scalars x[j·stride] (j < n).
HWY_INLINE VF TorchSumV(const float* x, int64_t stride, int64_t n) {
  const DF df;
  constexpr int kTorchLanes = 8;
  if (n < kTorchLanes) {
    VF r;
    TorchRowSumV<1>(x, stride, n, &r);
    return r;
  }
  const int64_t vec_size = n / kTorchLanes;
  VF lanes[kTorchLanes];
  TorchRowSumV<kTorchLanes>(x, stride, vec_size, lanes);
  VF final_acc = hn::Zero(df);
  for (int64_t k = vec_size * kTorchLanes; k < n; ++k) final_acc = hn::Add(final_acc, hn::Load(df, x + k * stride));
  for (int l = 0; l < kTorchLanes; ++l) final_acc = hn::Add(final_acc, lanes[l]);
  return final_acc;
}

// Tile shape: at most kPvHT heads × kPvV vectors; the HT·V partial sums, V
// key vectors and a broadcast fit the register file (AVX-512: 16 + 4 + 1 of
// 32 zmm; AVX2: 12 + 2 + 1 of 16 ymm: up to 6 heads, 12 independent sums
// where 8 left the FMA pipes short, ~3% of a call faster on Zen 4). Pv
// splits the heads evenly over PvTilesH(H) tiles (TileH0).
constexpr int kPvV = kLanes >= 16 ? 4 : 2;
constexpr int kPvHT = kLanes >= 16 ? 4 : (kLanes == 8 ? 6 : 2);

constexpr int64_t kPvStep = kPvV * static_cast<int64_t>(kLanes);

int64_t PvTilesD(int64_t Dp) { return (Dp + kPvStep - 1) / kPvStep; }
int64_t PvTilesH(int64_t H) { return (H + kPvHT - 1) / kPvHT; }
// Start of the last d tile when D is not a whole number of vectors (its keys
// come from kvt), else Dp.
int64_t PvTailStart(int64_t D, int64_t Dp) {
  return D % static_cast<int64_t>(kLanes) == 0 ? Dp : (Dp - 1) / kPvStep * kPvStep;
}

// dots[(i0 + j)·Hp + h] for candidates j < NC, heads [h0, h0 + kLanes), the
// keys k[j·Dp + d]: one accumulator per candidate (NC independent addition
// chains), each lane summing q[h][d]·k[d] in increasing d.
template <int NC, bool kFma>
HWY_INLINE void ScoreBlock(const float* qt, int64_t Hp, int64_t D, int64_t Dp, const float* k, int i0, int64_t h0,
                           float* dots) {
  const DF df;
  VF a[NC];
  HWY_UNROLL(8)
  for (int j = 0; j < NC; ++j) a[j] = hn::Zero(df);
  for (int64_t d = 0; d < D; ++d) {
    const VF qv = hn::Load(df, qt + d * Hp + h0);
    HWY_UNROLL(8)
    for (int j = 0; j < NC; ++j) {
      if constexpr (kFma) {
        a[j] = hn::MulAdd(qv, hn::Set(df, k[j * Dp + d]), a[j]);
      } else {
        a[j] = hn::Add(a[j], hn::Mul(qv, hn::Set(df, k[j * Dp + d])));
      }
    }
  }
  HWY_UNROLL(8)
  for (int j = 0; j < NC; ++j) hn::Store(a[j], df, dots + (i0 + j) * Hp + h0);
}

// ScoreBlock over two head vectors [h0, h0 + 2·kLanes) at once: each
// broadcast key element feeds 2·NC accumulators (AVX2: 6 candidates × 2
// vectors = 12 sums, 2 query vectors and a broadcast: 15 of the 16 ymm
// registers, 8 loads per 12 FMAs). Each lane's operations are ScoreBlock's.
template <int NC, bool kFma>
HWY_INLINE void ScoreBlock2(const float* qt, int64_t Hp, int64_t D, int64_t Dp, const float* k, int i0, int64_t h0,
                            float* dots) {
  const DF df;
  VF a[2][NC];
  HWY_UNROLL(8)
  for (int j = 0; j < NC; ++j) a[0][j] = a[1][j] = hn::Zero(df);
  for (int64_t d = 0; d < D; ++d) {
    const VF q0 = hn::Load(df, qt + d * Hp + h0), q1 = hn::Load(df, qt + d * Hp + h0 + kLanes);
    HWY_UNROLL(8)
    for (int j = 0; j < NC; ++j) {
      const VF kv = hn::Set(df, k[j * Dp + d]);
      if constexpr (kFma) {
        a[0][j] = hn::MulAdd(q0, kv, a[0][j]);
        a[1][j] = hn::MulAdd(q1, kv, a[1][j]);
      } else {
        a[0][j] = hn::Add(a[0][j], hn::Mul(q0, kv));
        a[1][j] = hn::Add(a[1][j], hn::Mul(q1, kv));
      }
    }
  }
  HWY_UNROLL(8)
  for (int j = 0; j < NC; ++j) {
    hn::Store(a[0][j], df, dots + (i0 + j) * Hp + h0);
    hn::Store(a[1][j], df, dots + (i0 + j) * Hp + h0 + kLanes);
  }
}

// A key row widened: dst[d] = FP32 of the BF16 src[d] for d < D, and the
// row's exponent range for the FMA guard (cpu_ops.h WidenBf16Row). From the
// BF16 magnitudes a = bits & 0x7FFF, 2·kLanes elements at a time: the
// largest a has the largest field (NaN and Inf: 255), and the smallest
// nonzero a, min(a − 1) + 1 with the subtraction wrapping zero to 0xFFFF,
// the smallest (a subnormal's field 0 counts as 1, as
// Bf16FieldsProductsExact expects). The elements past the last whole pair of
// vectors (all of them on HWY_SCALAR) go one by one.
HWY_INLINE void WidenRow(const uint16_t* HWY_RESTRICT src, int64_t D, float* HWY_RESTRICT dst, int32_t& rmin,
                         int32_t& rmax) {
  rmin = 255, rmax = 0;
  int64_t d = 0;
#if HWY_TARGET != HWY_SCALAR
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Repartition<uint16_t, DF> dw;  // 2·kLanes BF16 values
  auto amin1 = hn::Set(dw, 0xFFFF), amax = hn::Zero(dw);
  for (; d + 2 * static_cast<int64_t>(kLanes) <= D; d += 2 * kLanes) {
    const auto x = hn::LoadU(dw, src + d);
    const auto a = hn::And(x, hn::Set(dw, 0x7FFF));
    amin1 = hn::Min(amin1, hn::Sub(a, hn::Set(dw, 1)));
    amax = hn::Max(amax, a);
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LowerHalf(d16, x)))), df, dst + d);
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::UpperHalf(d16, x)))), df, dst + d + kLanes);
  }
  if (d > 0) {
    const auto m1 = hn::Min(hn::PromoteTo(du, hn::LowerHalf(d16, amin1)), hn::PromoteTo(du, hn::UpperHalf(d16, amin1)));
    const auto mx = hn::Max(hn::PromoteTo(du, hn::LowerHalf(d16, amax)), hn::PromoteTo(du, hn::UpperHalf(d16, amax)));
    const uint32_t amin_m1 = hn::GetLane(hn::MinOfLanes(du, m1)), amax_all = hn::GetLane(hn::MaxOfLanes(du, mx));
    if (amin_m1 != 0xFFFF) rmin = std::max<int32_t>(static_cast<int32_t>((amin_m1 + 1) >> 7), 1);
    rmax = static_cast<int32_t>(amax_all >> 7);
  }
#endif
  for (; d < D; ++d) {
    dst[d] = Bf16ToFloat(src[d]);
    const int32_t e = (src[d] >> 7) & 0xFF;
    if ((src[d] & 0x7FFF) != 0) rmin = std::min(rmin, std::max(e, 1)), rmax = std::max(rmax, e);
  }
}

// WidenRow for the tests (cpu_ops.h WidenBf16Row).
void WidenBf16RowV(const uint16_t* src, int64_t D, float* dst, int32_t* emin, int32_t* emax) {
  WidenRow(src, D, dst, *emin, *emax);
}

// Candidates per score block: AVX2, 12 (two passes of 6 candidates × 2 head
// vectors, 12 independent sums where 4 × 2 = 8 left the FMA pipes short);
// else 8 (the BF16 pair dots take up to 8).
constexpr int kScoreBlock = kLanes == 8 ? 12 : 8;
static_assert(kScoreBlock <= kScoreBlockMax, "the per-thread score block holds kScoreBlockMax rows");
int ScoreBlockSize() { return kScoreBlock; }

// Phase 1 for candidates [i0, i1) (at most kScoreBlock): the rows widened
// into kb[(i - i0)·Dp + d] (padding zero; their tails from PvTailStart also
// to kvt) and dots[i·Hp + h] = Σ_d q[h][d]·k_i[d] (increasing d).
static_assert(kScoreBlock <= 12, "Scores' switch covers blocks of up to 12 candidates");
void Scores(int64_t D, int64_t Dp, int64_t Hp, int i0, int i1, float* kb, uint32_t* kp, const AttnScratch& w) {
  const int64_t dt = PvTailStart(D, Dp), tw = Dp - dt;
  int32_t bmin = 255, bmax = 0;  // the block's key exponent range
  if (w.qp != nullptr) {
    // Pair dots: the rows as pairs (no tails: D is a multiple of the tiles),
    // the widened rows only where the guard refuses the block.
    for (int i = i0; i < i1; ++i) {
      AttnKeyPairsRow(w.kv[i], D, kp + (i - i0) * (D / 2), &w.k_emin[i], &w.k_emax[i]);
      bmin = std::min(bmin, w.k_emin[i]);
      bmax = std::max(bmax, w.k_emax[i]);
    }
    if (Bf16PairDotsExact(w.q_emin, w.q_emax, bmin, bmax)) {
      for (int64_t h0 = 0; h0 < Hp; h0 += kLanes)
        AttnScorePairs(w.qp, Hp, D, kp, D / 2, i1 - i0, h0, w.dots + i0 * Hp);
      return;
    }
    bmin = 255, bmax = 0;
  }
  for (int i = i0; i < i1; ++i) {
    float* row = kb + (i - i0) * Dp;
    int32_t rmin, rmax;
    WidenRow(w.kv[i], D, row, rmin, rmax);
    for (int64_t d = D; d < Dp; ++d) row[d] = 0.0f;
    for (int64_t d = dt; d < Dp; ++d) w.kvt[i * tw + d - dt] = row[d];
    w.k_emin[i] = rmin;
    w.k_emax[i] = rmax;
    bmin = std::min(bmin, rmin);
    bmax = std::max(bmax, rmax);
  }
  const bool fma = w.q_exact && Bf16FieldsProductsExact(w.q_emin, w.q_emax, bmin, bmax);
  for (int64_t h0 = 0; h0 < Hp;) {
    // AVX2, a whole block and two head vectors left: two passes of 6
    // candidates × 2 head vectors (ScoreBlock2). Measured (Zen 4, AVX2
    // forced, one thread, H = 16, D = 512, 640 candidates, with the P·V
    // changes below): one pass of 8 per head vector -> two of 4 × 2,
    // 293-295 -> 268 us a call (H = 64: 1136-1152 -> 1041-1046); blocks of
    // 12 as two of 6 × 2, 284-292 -> 277-285 us (keys in L2).
    const bool two = kLanes == 8 && i1 - i0 == kScoreBlock && h0 + 2 * static_cast<int64_t>(kLanes) <= Hp;
    auto run = [&](auto fma_c) {
      constexpr bool kF = decltype(fma_c)::value;
      if (two) {
        constexpr int kHalf = kScoreBlock / 2;
        ScoreBlock2<kHalf, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots);
        ScoreBlock2<kHalf, kF>(w.qt, Hp, D, Dp, kb + kHalf * Dp, i0 + kHalf, h0, w.dots);
        return;
      }
      switch (i1 - i0) {
        case 12: ScoreBlock<12, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 11: ScoreBlock<11, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 10: ScoreBlock<10, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 9: ScoreBlock<9, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 8: ScoreBlock<8, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 7: ScoreBlock<7, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 6: ScoreBlock<6, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 5: ScoreBlock<5, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 4: ScoreBlock<4, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 3: ScoreBlock<3, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        case 2: ScoreBlock<2, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
        default: ScoreBlock<1, kF>(w.qt, Hp, D, Dp, kb, i0, h0, w.dots); break;
      }
    };
    if (fma) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
    h0 += two ? 2 * static_cast<int64_t>(kLanes) : static_cast<int64_t>(kLanes);
  }
}

// Phase 2 for heads [v·kLanes, (v+1)·kLanes): the reference's per-head
// softmax loop, lane h its head: rescale[c·Hp + h] per chunk, pb[i·Hp + h]
// per member, sum[h] with the sink.
void Stats(const int32_t* slot, const AttnChunk* chunks, int nchunks, int64_t Hp, int64_t v, float softmax_scale,
           const AttnScratch& w) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t h0 = v * static_cast<int64_t>(kLanes);
  const VF scale = hn::Set(df, softmax_scale);
  VF m = hn::Set(df, -1e30f), sum_exp = hn::Zero(df);
  for (int c = 0; c < nchunks; ++c) {
    const AttnChunk& ch = chunks[c];
    VF cmax = hn::Set(df, -std::numeric_limits<float>::infinity());
    for (int i = ch.i0; i < ch.i1; ++i) cmax = StdMax(cmax, hn::Mul(hn::Load(df, w.dots + i * Hp + h0), scale));
    const VF m_new = StdMax(m, cmax);
    const VF rescale = SleefExpfV(hn::Sub(m, m_new));
    hn::Store(rescale, df, w.rescale + c * Hp + h0);
    for (int32_t j = 0; j < ch.clen; ++j) hn::Store(hn::Zero(df), df, w.pt + j * Hp + h0);
    auto emin = hn::Set(di, 255), emax = hn::Zero(di);
    for (int i = ch.i0; i < ch.i1; ++i) {
      const VF p = SleefExpfV(hn::Sub(hn::Mul(hn::Load(df, w.dots + i * Hp + h0), scale), m_new));
      hn::Store(p, df, w.pt + (slot[i] - ch.c0) * Hp + h0);
      const VF pb = RoundBf16V(p);
      hn::Store(pb, df, w.pb + i * Hp + h0);
      const auto ib = hn::BitCast(di, pb);
      const auto e = hn::And(hn::ShiftRight<23>(ib), hn::Set(di, 0xFF));
      const auto nz = hn::Ne(hn::And(ib, hn::Set(di, 0x7FFFFFFF)), hn::Zero(di));
      emin = hn::Min(emin, hn::IfThenElse(nz, hn::Max(e, hn::Set(di, 1)), hn::Set(di, 255)));
      emax = hn::Max(emax, hn::IfThenElseZero(nz, e));
    }
    w.pb_emin[c * (Hp / static_cast<int64_t>(kLanes)) + v] =
        hn::GetLane(hn::MaxOfLanes(di, emax)) < 255 ? hn::GetLane(hn::MinOfLanes(di, emin)) : -1;
    if (w.pbp != nullptr) {
      // Pairs for the P·V pair dots: member i's BF16 bits high, i+1's low.
      const hn::RebindToUnsigned<DF> du;
      for (int i = ch.i0; i < ch.i1; i += 2) {
        const auto hi = hn::And(hn::BitCast(du, hn::Load(df, w.pb + i * Hp + h0)), hn::Set(du, 0xFFFF0000u));
        const auto lo = i + 1 < ch.i1 ? hn::ShiftRight<16>(hn::BitCast(du, hn::Load(df, w.pb + (i + 1) * Hp + h0)))
                                      : hn::Zero(du);
        hn::Store(hn::Or(hi, lo), du, w.pbp + i * Hp + h0);
      }
    }
    sum_exp = hn::Add(hn::Mul(sum_exp, rescale), TorchSumV(w.pt + h0, Hp, ch.clen));
    m = m_new;
  }
  sum_exp = hn::Add(sum_exp, SleefExpfV(hn::Sub(hn::Load(df, w.sink + h0), m)));
  hn::Store(sum_exp, df, w.sum + h0);
}

// P·V units: kPvGroup consecutive d tiles (the tiles whose BF16 keys share
// a 64-byte line) × every head. A unit walks the chunks once; for each chunk
// every register tile of the unit runs over the chunk's members, so a chunk's
// key lines (64 members) are read from memory once and then from L1 by the
// unit's other tiles. (Tile by tile over the whole list, each of the
// 2·PvTilesH(H) tiles sharing a line re-read all n lines from L2 or L3.)
constexpr int64_t kPvGroup = kPvStep >= 32 ? 1 : 32 / kPvStep;
constexpr int64_t kPvTileFloats = kPvHT * kPvStep;  // one tile's running sums
int64_t PvUnits(int64_t Dp) { return (PvTilesD(Dp) + kPvGroup - 1) / kPvGroup; }
int64_t PvUnitAccFloats(int64_t H) { return kPvGroup * PvTilesH(H) * kPvTileFloats; }

// AVX2 tiles of 2 vectors from the BF16 rows read their 16 keys as 8 dwords
// (one load, a shift and an `and` instead of two widening loads and two
// shifts): the tile's sums then hold the even and the odd d in its two
// vectors, and PvStore interleaves them back.
constexpr bool kPvDwords = kLanes == 8;

// One register tile, one chunk: heads [h0, h0 + HT) × V vectors from d0,
// the partial sums part + pb·k over the chunk's members in order, in
// registers (multiply, then add; fused when kFma: the caller's guard has
// shown every product exact), then acc = acc·rescale + part. The keys
// come from the BF16 rows, or (kTail: the tile holds the partial vector at
// D) from the widened tails kvt (row stride tw, column 0 at d0).
template <int V, int HT, bool kTail, bool kFma>
HWY_INLINE void PvChunk(const AttnChunk& ch, int c, int64_t Hp, int64_t tw, int64_t h0, int64_t d0,
                        const AttnScratch& w, float* HWY_RESTRICT acc) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  VF part[HT][V];
  HWY_UNROLL(8)
  for (int t = 0; t < HT; ++t) {
    HWY_UNROLL(8)
    for (int u = 0; u < V; ++u) part[t][u] = hn::Zero(df);
  }
  for (int i = ch.i0; i < ch.i1; ++i) {
    const float* pbi = w.pb + i * Hp + h0;
    VF k[V];
    if constexpr (kTail) {
      HWY_UNROLL(8)
      for (int u = 0; u < V; ++u) k[u] = hn::Load(df, w.kvt + i * tw + u * kLanes);
    } else if constexpr (kPvDwords && V == 2) {
      // 16 keys as 8 dwords: the even elements by a shift, the odd ones by
      // a mask (part[t][0] sums d0 + 2l, part[t][1] d0 + 2l + 1).
      const auto x = hn::LoadU(du, reinterpret_cast<const uint32_t*>(w.kv[i] + d0));
      k[0] = hn::BitCast(df, hn::ShiftLeft<16>(x));
      k[1] = hn::BitCast(df, hn::And(x, hn::Set(du, 0xFFFF0000u)));
    } else {
      const uint16_t* kr = w.kv[i] + d0;
      HWY_UNROLL(8)
      for (int u = 0; u < V; ++u)
        k[u] = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, kr + u * kLanes))));
    }
    HWY_UNROLL(8)
    for (int t = 0; t < HT; ++t) {
      const VF p = hn::Set(df, pbi[t]);
      HWY_UNROLL(8)
      for (int u = 0; u < V; ++u) {
        if constexpr (kFma) {
          part[t][u] = hn::MulAdd(p, k[u], part[t][u]);
        } else {
          part[t][u] = hn::Add(part[t][u], hn::Mul(p, k[u]));
        }
      }
    }
  }
  const float* r = w.rescale + c * Hp + h0;
  HWY_UNROLL(8)
  for (int t = 0; t < HT; ++t) {
    const VF rv = hn::Set(df, r[t]);
    HWY_UNROLL(8)
    for (int u = 0; u < V; ++u) {
      float* a = acc + (t * V + u) * kLanes;
      hn::Store(hn::Add(hn::Mul(hn::Load(df, a), rv), part[t][u]), df, a);
    }
  }
}

// out = bf16(acc / sum) for one register tile.
// `dwords`: the tile's sums are in PvChunk's even/odd layout (kPvDwords).
template <int V, int HT>
HWY_INLINE void PvStore(const float* HWY_RESTRICT acc, int64_t D, int64_t h0, int64_t d0, bool dwords,
                        const AttnScratch& w, float* out) {
  const DF df;
  for (int t = 0; t < HT; ++t) {
    const VF s = hn::Set(df, w.sum[h0 + t]);
    VF a[V];
    for (int u = 0; u < V; ++u) a[u] = hn::Load(df, acc + (t * V + u) * kLanes);
#if HWY_TARGET != HWY_SCALAR
    if constexpr (kPvDwords && V == 2) {
      if (dwords) {
        const VF lo = hn::InterleaveLower(df, a[0], a[1]), hi = hn::InterleaveUpper(df, a[0], a[1]);
        a[0] = hn::ConcatLowerLower(df, hi, lo);
        a[1] = hn::ConcatUpperUpper(df, hi, lo);
      }
    }
#endif
    for (int u = 0; u < V; ++u) {
      const int64_t d = d0 + u * static_cast<int64_t>(kLanes);
      if (d >= D) break;
      StorePartial(RoundBf16V(hn::Div(a[u], s)), static_cast<size_t>(std::min<int64_t>(kLanes, D - d)),
                   out + (h0 + t) * D + d);
    }
  }
}

// Phase 3 for units [u0, u1) of PvUnits(Dp); acc: PvUnitAccFloats(H) floats
// of the calling thread (vector-aligned).
void Pv(const AttnChunk* chunks, int nchunks, int64_t H, int64_t Hp, int64_t D, int64_t Dp, int64_t u0, int64_t u1,
        const AttnScratch& w, float* acc, float* out) {
  const int64_t th = PvTilesH(H), td = PvTilesD(Dp), dt = PvTailStart(D, Dp), tw = Dp - dt;
  // Heads split evenly over the th tiles (H = 16 on AVX2: 5 / 5 / 6, not
  // 6 / 6 / 4, whose last tile's 8 sums left the FMA pipes short).
  auto TileH0 = [&](int64_t j) { return j * H / th; };
  for (int64_t unit = u0; unit < u1; ++unit) {
    const int64_t g0 = unit * kPvGroup, g1 = std::min(td, g0 + kPvGroup);
    std::fill(acc, acc + (g1 - g0) * th * kPvTileFloats, 0.0f);
    // Tile (g, j): d tile g, heads [TileH0(j), TileH0(j + 1)); its sums at acc + ((g - g0)·th + j)·kPvTileFloats.
    auto each_tile = [&](auto&& f) {
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t j = 0; j < th; ++j) f(g, j, acc + ((g - g0) * th + j) * kPvTileFloats);
    };
    const int64_t nvec = Hp / static_cast<int64_t>(kLanes);
    // The unit's key bytes of a chunk's members, [dk0, dk1) of each row: the
    // first tile over a chunk reads them from L2 or L3 (one line a member,
    // rows at scattered addresses no hardware prefetcher follows) and the
    // unit's other tiles from L1. Requested one chunk ahead.
    const int64_t dk0 = g0 * kPvStep, dk1 = std::min(D, g1 * kPvStep);
    auto prefetch_chunk = [&](int c) {
      if (c >= nchunks) return;
      for (int i = chunks[c].i0; i < chunks[c].i1; ++i) {
        const uint16_t* r = w.kv[i];
        for (int64_t d = dk0; d < dk1; d += 32) hwy::Prefetch(r + d);
        hwy::Prefetch(r + dk1 - 1);
      }
    };
    if (unit == u0) prefetch_chunk(0);
    for (int c = 0; c < nchunks; ++c) {
      prefetch_chunk(c + 1);
      const int32_t kmin = w.chunk_kmin[c], kmax = w.chunk_kmax[c];  // the chunk's key exponent range
      each_tile([&](int64_t g, int64_t j, float* a) {
        const int64_t d0 = g * kPvStep, h0 = TileH0(j);
        const int vt = static_cast<int>(std::min<int64_t>(kPvV, (Dp - d0) / static_cast<int64_t>(kLanes)));
        const int ht = static_cast<int>(TileH0(j + 1) - h0);
        int32_t pmin = 255;  // the tile's heads' pb range (-1: a NaN)
        for (int64_t hv = h0 / static_cast<int64_t>(kLanes); hv <= (h0 + ht - 1) / static_cast<int64_t>(kLanes); ++hv)
          pmin = std::min(pmin, w.pb_emin[c * nvec + hv]);
        if (w.pbp != nullptr && pmin >= 0 && Bf16PairDotsExact(pmin, 127, kmin, kmax)) {
          // Whole tiles only: D is a multiple of kPvStep when w.pbp is set.
          AttnPvPairs(w.kv, w.pbp, Hp, chunks[c].i0, chunks[c].i1, h0, ht, d0, w.rescale + c * Hp + h0, a);
          return;
        }
        const bool fma = pmin >= 0 && Bf16FieldsProductsExact(pmin, 127, kmin, kmax);  // pb <= 1
        auto run = [&](auto fma_c) {
          constexpr bool kF = decltype(fma_c)::value;
          if (vt == kPvV && ht == kPvHT && d0 < dt) {
            PvChunk<kPvV, kPvHT, false, kF>(chunks[c], c, Hp, 0, h0, d0, w, a);
            return;
          }
          WithVMT<kPvV, kPvHT>(vt, ht, [&](auto v, auto mt) {
            constexpr int kV = decltype(v)::value, kHT = decltype(mt)::value;
            if (d0 < dt) {
              PvChunk<kV, kHT, false, kF>(chunks[c], c, Hp, 0, h0, d0, w, a);
            } else {
              PvChunk<kV, kHT, true, kF>(chunks[c], c, Hp, tw, h0, d0, w, a);
            }
          });
        };
        if (fma) {
          run(std::true_type{});
        } else {
          run(std::false_type{});
        }
      });
    }
    each_tile([&](int64_t g, int64_t j, float* a) {
      const int64_t d0 = g * kPvStep, h0 = TileH0(j);
      const int vt = static_cast<int>(std::min<int64_t>(kPvV, (Dp - d0) / static_cast<int64_t>(kLanes)));
      const int ht = static_cast<int>(TileH0(j + 1) - h0);
      WithVMT<kPvV, kPvHT>(vt, ht, [&](auto v, auto mt) {
        PvStore<decltype(v)::value, decltype(mt)::value>(a, D, h0, d0, d0 < dt, w, out);
      });
    });
  }
}

// qt[d·Hp + h] = q[h·D + d] for h < H, 0 for H <= h < Hp: the query
// transposed for the score blocks (AttnScratch::qt). On the x86 targets whole
// 8 × 8 blocks go through registers (eight rows of q in, eight rows of qt
// out: unpacks, 64-bit shuffles and 128-bit permutes), the rest element by
// element; a value moved, never changed. The element loop was ~0.5% of an
// AVX2 prefill (8 192 strided loads and stores per call at H 16, D 512).
void TransposeQuery(const float* HWY_RESTRICT q, int H, int64_t D, int64_t Hp, float* HWY_RESTRICT qt) {
  int h0 = 0;
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  for (; h0 + 8 <= H; h0 += 8) {
    int64_t d0 = 0;
    for (; d0 + 8 <= D; d0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(q + (h0 + i) * D + d0);
      const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
      // b[j] (j < 4): heads 0..3 of columns j (low half) and j + 4 (high
      // half); b[j + 4] the same for heads 4..7.
      const __m256 b[8] = {_mm256_shuffle_ps(a0, a2, 0x44), _mm256_shuffle_ps(a0, a2, 0xEE),
                           _mm256_shuffle_ps(a1, a3, 0x44), _mm256_shuffle_ps(a1, a3, 0xEE),
                           _mm256_shuffle_ps(a4, a6, 0x44), _mm256_shuffle_ps(a4, a6, 0xEE),
                           _mm256_shuffle_ps(a5, a7, 0x44), _mm256_shuffle_ps(a5, a7, 0xEE)};
      for (int j = 0; j < 4; ++j) {
        _mm256_storeu_ps(qt + (d0 + j) * Hp + h0, _mm256_permute2f128_ps(b[j], b[j + 4], 0x20));
        _mm256_storeu_ps(qt + (d0 + j + 4) * Hp + h0, _mm256_permute2f128_ps(b[j], b[j + 4], 0x31));
      }
    }
    for (; d0 < D; ++d0)
      for (int h = h0; h < h0 + 8; ++h) qt[d0 * Hp + h] = q[h * D + d0];
  }
#endif
  for (int64_t d = 0; d < D; ++d) {
    for (int h = h0; h < H; ++h) qt[d * Hp + h] = q[h * D + d];
    for (int64_t h = H; h < Hp; ++h) qt[d * Hp + h] = 0.0f;
  }
}

int64_t LanesF32() { return static_cast<int64_t>(kLanes); }

// The query's range for the FMA guard: FloatsExpRange vectorised (one call
// per query row and layer; scalar it was ~1% of a 1 024-token prefill).
ExpRange QueryExpRange(const float* q, int64_t H, int64_t D) { return ActExpRangeV(q, H, D, D); }

// Vectorised ref::SleefExpf over a row (tests and elementwise callers).
void ExpRow(const float* x, int64_t n, float* y) {
  const DF df;
  int64_t i = 0;
  for (; i + static_cast<int64_t>(kLanes) <= n; i += kLanes) hn::StoreU(SleefExpfV(hn::LoadU(df, x + i)), df, y + i);
  if (i < n) {
    HWY_ALIGN float t[kLanes] = {};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
    StorePartial(SleefExpfV(hn::Load(df, t)), static_cast<size_t>(n - i), y + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(Scores);
HWY_EXPORT(ScoreBlockSize);
HWY_EXPORT(Stats);
HWY_EXPORT(Pv);
HWY_EXPORT(PvUnits);
HWY_EXPORT(PvUnitAccFloats);
HWY_EXPORT(PvTailStart);
HWY_EXPORT(LanesF32);
HWY_EXPORT(QueryExpRange);
HWY_EXPORT(ExpRow);
HWY_EXPORT(WidenBf16RowV);
HWY_EXPORT(TransposeQuery);

void SleefExpfRow(const float* x, int64_t n, float* y) { HWY_DYNAMIC_DISPATCH(ExpRow)(x, n, y); }

void WidenBf16Row(const uint16_t* src, int64_t D, float* dst, int32_t* emin, int32_t* emax) {
  HWY_DYNAMIC_DISPATCH(WidenBf16RowV)(src, D, dst, emin, emax);
}

namespace {
// Vector-aligned scratch that grows, never shrinks (no allocation per decode
// step once the largest call has been seen): FP32 rows, and the pair dots'
// BF16 pairs.
template <typename T>
struct GrowAligned {
  hwy::AlignedFreeUniquePtr<T[]> p;
  int64_t cap = 0;
  T* Get(int64_t n) {
    if (n > cap) {
      cap = std::max(n, cap + cap / 2);
      p = hwy::AllocateAligned<T>(static_cast<size_t>(cap));
    }
    return p.get();
  }
};
using GrowBuf = GrowAligned<float>;
using GrowU32Buf = GrowAligned<uint32_t>;
// The same for the guard's int32 exponents.
struct GrowIntBuf {
  std::vector<int32_t> v;
  int32_t* Get(int64_t n) {
    if (n > static_cast<int64_t>(v.size())) v.resize(static_cast<size_t>(std::max<int64_t>(n, v.size() + v.size() / 2)));
    return v.data();
  }
};
}  // namespace

void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* kv, const int32_t* slot, int n,
                     int32_t list_len, const float* sink, float softmax_scale, float* out) {
  auto* scores = HWY_DYNAMIC_DISPATCH(Scores);
  auto* stats = HWY_DYNAMIC_DISPATCH(Stats);
  auto* pv = HWY_DYNAMIC_DISPATCH(Pv);
  const int sblock = HWY_DYNAMIC_DISPATCH(ScoreBlockSize)();
  const int64_t L = HWY_DYNAMIC_DISPATCH(LanesF32)();
  const int64_t Hp = ((H + L - 1) / L) * L, Dp = ((D + L - 1) / L) * L;
  const int64_t units = HWY_DYNAMIC_DISPATCH(PvUnits)(Dp);
  const int64_t unit_acc = HWY_DYNAMIC_DISPATCH(PvUnitAccFloats)(H);
  // Scratch sized for n rounded up to kRowStep candidates (and the chunks of
  // list_len rounded the same way): n grows by one per decode step until the
  // window and top-k are full, and a buffer sized exactly would reallocate
  // every time a step first exceeds it (the decode step plan allows no heap
  // allocation in steady state; at most (window + top-k) / kRowStep per thread
  // over a whole generation).
  constexpr int64_t kRowStep = 256;
  const int64_t n_cap = (n + kRowStep - 1) / kRowStep * kRowStep;
  const int64_t chunk_cap = ((list_len + kRowStep - 1) / kRowStep * kRowStep) / kChunk + 1;
  // The chunks with members, as the reference walks them.
  thread_local std::vector<AttnChunk> chunks;
  if (static_cast<int64_t>(chunks.capacity()) < chunk_cap) chunks.reserve(static_cast<size_t>(chunk_cap));
  chunks.clear();
  for (int32_t c0 = 0, i = 0; c0 < list_len; c0 += kChunk) {
    const int32_t clen = std::min(kChunk, list_len - c0);
    const int i0 = i;
    while (i < n && slot[i] < c0 + clen) ++i;
    if (i > i0) chunks.push_back({c0, clen, i0, i});
  }
  const int nchunks = static_cast<int>(chunks.size());
  // Scratch of the calling thread (vector-aligned rows), shared with the team.
  thread_local GrowBuf qt_buf, kvt_buf, dots_buf, pb_buf, pt_buf, rescale_buf, sum_buf, sink_buf;
  AttnScratch w;
  float* qt = qt_buf.Get(D * Hp);
  float* sk = sink_buf.Get(Hp);
  HWY_DYNAMIC_DISPATCH(TransposeQuery)(q, H, D, Hp, qt);
  // The query's exponent range for the FMA guard (AttnScratch), as biased
  // fields; a subnormal counts as -150 (FloatsExpRange), which the guard refuses.
  const ExpRange qr = HWY_DYNAMIC_DISPATCH(QueryExpRange)(q, H, D);
  w.q_exact = qr.bf16 && qr.finite;
  w.q_emin = qr.any_nonzero ? qr.lo + 127 : 255;
  w.q_emax = qr.any_nonzero ? qr.hi + 127 : 0;
  for (int64_t h = 0; h < Hp; ++h) sk[h] = h < H ? sink[h] : 0.0f;
  w.kv = kv;
  w.qt = qt;
  w.sink = sk;
  w.kvt = kvt_buf.Get(n_cap * (Dp - HWY_DYNAMIC_DISPATCH(PvTailStart)(D, Dp)));
  w.dots = dots_buf.Get(n_cap * Hp);
  w.pb = pb_buf.Get(n_cap * Hp);
  w.pt = pt_buf.Get(kChunk * Hp);
  w.rescale = rescale_buf.Get(chunk_cap * Hp);
  w.sum = sum_buf.Get(Hp);
  thread_local GrowIntBuf kmin_buf, kmax_buf, pbe_buf;
  w.k_emin = kmin_buf.Get(n_cap);
  w.k_emax = kmax_buf.Get(n_cap);
  w.pb_emin = pbe_buf.Get(chunk_cap * (Hp / L));
  thread_local GrowIntBuf ckmin_buf, ckmax_buf;
  w.chunk_kmin = ckmin_buf.Get(chunk_cap);
  w.chunk_kmax = ckmax_buf.Get(chunk_cap);
  // BF16 pair dots (bf16_dot.h): on the AVX-512 target (16 lanes) of a CPU
  // with them, for a BF16-exact query and D a multiple of the P·V tiles (so
  // no tile is partial); the query's pairs here, the keys' per score block,
  // the probabilities' in the softmax statistics.
  w.qp = nullptr;
  w.pbp = nullptr;
  const bool pairs = L == 16 && D % 64 == 0 && w.q_exact && Bf16DotActive();
  thread_local GrowU32Buf qp_buf, pbp_buf;
  if (pairs) {
    uint32_t* qp = qp_buf.Get((D / 2) * Hp);
    for (int64_t p = 0; p < D / 2; ++p) {
      for (int h = 0; h < H; ++h)
        qp[p * Hp + h] = (FloatBits(q[h * D + 2 * p]) & 0xFFFF0000u) | (FloatBits(q[h * D + 2 * p + 1]) >> 16);
      for (int64_t h = H; h < Hp; ++h) qp[p * Hp + h] = 0;
    }
    w.qp = qp;
    w.pbp = pbp_buf.Get(n_cap * Hp);
  }
  const AttnChunk* ch = chunks.data();
  // A team only for a large call (a fork/join costs more than a short list's
  // work) made outside any parallel region: inside one (the model's row loop,
  // even with one row) the team would be nested, and libgomp starts its
  // threads anew on every call (large preset decode: the step's attention 6x
  // slower than on one thread, and a heap allocation per thread and call).
  // From 2^16 (was 2^20): a batch-1 decode step with a short context (the
  // `large` preset, 64-token prompt: n ~ 80) splits its heads too; measured
  // bench e2e --threads 2, batch 1: attention_core 11% -> 5% of the step on
  // AVX2, the step 32.5 -> 31.4 ms (a fork/join costs ~3 us on this VM).
  const bool par = static_cast<int64_t>(n) * D * H >= (int64_t{1} << 16) && !InParallelRegion();
#pragma omp parallel if (par)
  {
    thread_local GrowBuf kb_buf, acc_buf;  // each thread's widened score block and P·V sums
    thread_local GrowU32Buf kp_buf;        // and its pair rows
    float* kb = kb_buf.Get(kScoreBlockMax * Dp);
    uint32_t* kp = pairs ? kp_buf.Get(kScoreBlockMax * (D / 2)) : nullptr;
    float* acc = acc_buf.Get(unit_acc);
#pragma omp for schedule(static)
    for (int i0 = 0; i0 < n; i0 += sblock) scores(D, Dp, Hp, i0, std::min(n, i0 + sblock), kb, kp, w);
    // Each chunk's key range once (every P·V unit walks every chunk); the
    // barrier after the statistics orders it before phase 3.
#pragma omp single nowait
    for (int c = 0; c < nchunks; ++c) {
      int32_t kmin = 255, kmax = 0;
      for (int i = ch[c].i0; i < ch[c].i1; ++i) {
        kmin = std::min(kmin, w.k_emin[i]);
        kmax = std::max(kmax, w.k_emax[i]);
      }
      w.chunk_kmin[c] = kmin;
      w.chunk_kmax[c] = kmax;
    }
#pragma omp for schedule(static)
    for (int64_t v = 0; v < Hp / L; ++v) stats(slot, ch, nchunks, Hp, v, softmax_scale, w);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) pv(ch, nchunks, H, Hp, D, Dp, u, u + 1, w, acc, out);
  }
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
