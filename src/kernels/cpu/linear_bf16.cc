// BF16-weight linears: LinearBf16 / GroupedLinearBf16 (BF16 output) and
// LinearF32Bf16W (FP32 output: head, router, ratio-2 compressor), and the
// FP32-weight LinearF32 (mHC `hc_*_fn`),
// bit-identical to the ref:: operators of the same names (see cpu_ops.h).
//
// Per output row n (one SIMD lane) and input row m: acc = 0; for k in
// increasing order acc = acc + x[m,k]·w[n,k] (FP32, BF16 weight widened
// exactly); in `pairs` order (ref::DotBf16) k+1 is added before k inside each
// pair. y = bf16(acc) or acc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/linear_bf16.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <array>

#include "format/numerics.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "kernels/cpu/linear_common.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

// The AVX2 BF16 GEMM (RunBf16Items): columns per converted block, and when
// it takes the block path. Measured (Zen 5, AVX2, N = 2304, K = 5120, 2
// threads, interleaved with the micro-tile build): with FMAs the micro-tile
// is 5-30% faster below 128 rows and as fast up to 512; at 1024 the block
// path is 5-12% faster (the micro-tile streams the tile's 640 KB of weights
// once per 3 rows: L2-sized). Multiply-then-add: the block path is 30-50%
// faster from 64 rows (76-98 -> 102-145 GFLOP/s) and 10% slower at 16.
// With FMAs from 256 rows (was 512): on Zen 4 (AVX2 forced, same driver,
// alternated twice) the block path was 12-21% faster at M = 128-384 for
// 2304 x 5120 (2 threads 166-170 -> 198-200 GFLOP/s at 256-384; 1 thread
// 84-86 -> 102-104) and 28% at 256 for 512 x 1024, but 20% slower at 128
// for 512 x 1024; Zen 5 measured the two level from 128 to 512.
inline constexpr int64_t kBf16BlockK = 32;
HWY_INLINE bool Bf16BlockPath(const QArgs& a) {
  return kUseBlockGemm && a.wf == nullptr && a.M >= (a.fma ? 256 : 64);
}

HWY_INLINE VF LoadW(const float* p) { return hn::LoadU(DF(), p); }

// The BF16 pair dots (AVX-512 with AVX512_BF16) from this many rows.
// Measured (Zen 4, against the FP32 micro-tiles, same binary): one thread
// N x K = 512 x 1024 M = 32 / 64 / 1024 103 / 99 / 98 -> 151 / 155 / 132
// GFLOP/s, 2304 x 5120 M = 256 / 1024 103 / 106 -> 146 / 173; two threads
// 125 / 132 / 156 -> 141 / 163 / 213 and 196 / 181 -> 246 / 293.
inline constexpr int64_t kBf16DotMinM = 32;

HWY_INLINE VF LoadW(const uint16_t* p) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

// Whole dwords of BF16 weights (the GEMV-sized micro-tiles): 2·kLanes
// weights at p (rows r … r + 2·kLanes − 1 of one packed column) from one
// load; w[1] lane l is row r + 2l + 1 (the high half: a mask), w[0] lane l
// row r + 2l (the low half: a shift). One shift and one `and` per 2 vectors
// instead of 2 widening shuffles and 2 shifts, which share two of Zen's four
// vector pipes (docs/kernels-log.md, "Whole dwords in the FP8 and BF16 GEMVs").
// Used where V is even and V·MT <= kBf16DwordsMaxSums.
constexpr bool kBf16Dwords = kLanes >= 8;
constexpr int kBf16DwordsMaxSums = kLanes >= 16 ? 16 : 8;
HWY_INLINE void LoadW2(const uint16_t* p, VF w[2]) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const auto b = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  w[0] = hn::BitCast(df, hn::ShiftLeft<16>(b));
  w[1] = hn::BitCast(df, hn::And(b, hn::Set(du, 0xFFFF0000u)));
}

template <typename WT, int V, int MT>
constexpr bool Bf16UseDwords() {
  return kBf16Dwords && sizeof(WT) == 2 && V % 2 == 0 && V * MT <= kBf16DwordsMaxSums;
}

// Weight vector w (column k, vector v of the micro column) into every row's sums.
template <bool kFma, int V, int MT>
HWY_INLINE void Bf16Column(VF (&acc)[MT][V], int v, VF w, const float* xr, int64_t ldq, int64_t k) {
  const DF df;
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    if constexpr (kFma) {
      acc[m][v] = hn::MulAdd(hn::Set(df, xr[m * ldq + k]), w, acc[m][v]);
    } else {
      acc[m][v] = hn::Add(acc[m][v], hn::Mul(hn::Set(df, xr[m * ldq + k]), w));
    }
  }
}

// One k of the micro-tile (an always-inlined function, not a lambda: with
// the FMA variants g++ stopped inlining a lambda here and spilled the sums).
// R: rows per packed tile (kTileRows; a small PackedF32: 16 or 32).
template <typename WT, bool kFma, int V, int MT>
HWY_INLINE void Bf16Step(VF (&acc)[MT][V], const WT* wt, int64_t R, int64_t roff, const float* xr, int64_t ldq,
                         int64_t k) {
  constexpr int64_t kPf = kPrefetchBytes / static_cast<int64_t>(sizeof(WT));
  const WT* wk = wt + k * R + roff;
  hwy::Prefetch(wk + kPf);
  if constexpr (sizeof(WT) * kTileRows > 64) hwy::Prefetch(wk + kPf + 64 / sizeof(WT));
  if constexpr (Bf16UseDwords<WT, V, MT>()) {
    HWY_UNROLL(8)
    for (int g = 0; g < V / 2; ++g) {
      VF w[2];
      LoadW2(wk + g * 2 * kLanes, w);
      Bf16Column<kFma, V, MT>(acc, 2 * g, w[0], xr, ldq, k);
      Bf16Column<kFma, V, MT>(acc, 2 * g + 1, w[1], xr, ldq, k);
    }
  } else {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) Bf16Column<kFma, V, MT>(acc, v, LoadW(wk + v * kLanes), xr, ldq, k);
  }
}

// kFma: every product exact (linear_common.h Bf16FmaExact), so an FMA gives
// the multiply-then-add bits.
template <typename WT, bool kFma, int V, int MT>
HWY_INLINE void Bf16Micro(const QArgs& a, const WT* wt, int64_t R, const float* x, int64_t roff, int64_t m0,
                          int64_t n0) {
  const DF df;
  VF acc[MT][V];
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) acc[m][v] = hn::Zero(df);
  }
  const float* xr = x + m0 * a.ldq;
  const int64_t K = a.K;
  if (!a.pairs) {
    for (int64_t k = 0; k < K; ++k) Bf16Step<WT, kFma, V, MT>(acc, wt, R, roff, xr, a.ldq, k);
  } else {
    int64_t k = 0;
    for (; k + 1 < K; k += 2) {
      Bf16Step<WT, kFma, V, MT>(acc, wt, R, roff, xr, a.ldq, k + 1);
      Bf16Step<WT, kFma, V, MT>(acc, wt, R, roff, xr, a.ldq, k);
    }
    if (k < K) Bf16Step<WT, kFma, V, MT>(acc, wt, R, roff, xr, a.ldq, k);
  }
  HWY_ALIGN float out[MT][V * kLanes];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) hn::Store(acc[m][v], df, out[m] + v * kLanes);
  if constexpr (Bf16UseDwords<WT, V, MT>()) {
    StoreRowsPermuted<2, V, MT>(out[0], a, m0, n0 + roff, a.round);
  } else {
    StoreRows<V, MT>(out[0], a, m0, n0 + roff, a.round);
  }
}

// Rows up to which a call streams the decode copy on this target (RunBf16
// offers it up to kBf16CodesMaxM). Measured (Zen 5, 2 threads, the `large`
// preset's wo_a, 4096 × 1024 in 8 groups, 10 copies so it streams from DRAM,
// against the BF16 weights in the same process): AVX-512 1.9-2.2x at M = 1,
// 1.6-1.9x at 2, 1.3x at 3, 1.1-1.5x at 4, 0.7-0.8x at 8; AVX2 (8 sums per
// micro-tile with dwords: 8 vectors × 1 row at M = 1, 4 × 2 from 2, see
// RunBf16Items) 1.4-2.0x at M = 1, 1.6x at 2, 1.1x at 3, 1.5x at 4 (with the
// BF16 path's 4 × 3 tile, no dwords, the copy was slower from 3).
// (The scalar and EMU128 targets: the plain form, up to 2 rows.)
constexpr int64_t kBf16CodesRows = kLanes >= 8 ? 4 : 2;

int64_t Bf16CodesRows() { return kBf16CodesRows; }

// FloatsExpRange (linear_common.h) vectorised (hwy_util-inl.h
// ActExpRangeV): the decode calls check every call's activations (8192
// values for wo_a: ~7 us scalar, a tenth of the call).
ExpRange ActExpRange(const float* x, int64_t M, int64_t K, int64_t ld) { return ActExpRangeV(x, M, K, ld); }

// The same over the team for calls of 16 rows or more: rows in up to 64
// slices (a fixed array: no allocation), each slice's range on one thread,
// merged (ExpRange::Merge: min, max, and, or; the result does not depend on
// the split). Serial and scalar it was ~1.8% of a 1 024-token prefill on
// AVX2, on one thread while the other waited.
ExpRange ActExpRangeTeam(const float* x, int64_t M, int64_t K, int64_t ld) {
  constexpr int64_t kMaxSlices = 64;
  const bool team = M * K >= (int64_t{1} << 16);
  const int64_t slices = team ? std::min<int64_t>(kMaxSlices, std::min<int64_t>(M, 4 * int64_t{NumThreads()})) : 1;
  if (slices <= 1) return ActExpRangeV(x, M, K, ld);
  std::array<ExpRange, kMaxSlices> part;
  ParallelFor(slices, true, [&](int64_t s) {
    const int64_t m0 = M * s / slices, m1 = M * (s + 1) / slices;
    part[static_cast<size_t>(s)] = ActExpRangeV(x + m0 * ld, m1 - m0, K, ld);
  });
  ExpRange r = part[0];
  for (int64_t s = 1; s < slices; ++s) r.Merge(part[static_cast<size_t>(s)]);
  return r;
}

// One k of Bf16Micro8 (an always-inlined function: see Bf16Step). sv[i]:
// the block factors of the rows in vector i (kDwords: of dword group i).
template <int V, int MT, bool kDwords>
HWY_INLINE void Bf16Step8(VF (&acc)[MT][V], const uint8_t* wt, int64_t roff, const float* xr, int64_t ldq,
                          const VF (&sv)[kDwords ? V / 4 : V], int64_t k) {
  const DF df;
  const uint8_t* wk = wt + k * kTileRows + roff;
  hwy::Prefetch(wk + kPrefetchBytes);
  // The factor goes onto whichever side takes fewer multiplies: the MT
  // activations of a dword group (MT < 4) or its 4 weight vectors; onto each
  // weight vector without dwords.
  if constexpr (kDwords && MT < 4) {
    HWY_UNROLL(8)
    for (int g = 0; g < V / 4; ++g) {
      VF xs[MT];
      HWY_UNROLL(8)
      for (int m = 0; m < MT; ++m) xs[m] = hn::Mul(hn::Set(df, xr[m * ldq + k]), sv[g]);
      VF w[4];
      E4M3Scaled4(wk + g * 4 * kLanes, w);
      HWY_UNROLL(4)
      for (int j = 0; j < 4; ++j) {
        HWY_UNROLL(8)
        for (int m = 0; m < MT; ++m) acc[m][4 * g + j] = hn::MulAdd(xs[m], w[j], acc[m][4 * g + j]);
      }
    }
  } else if constexpr (kDwords) {
    HWY_UNROLL(8)
    for (int g = 0; g < V / 4; ++g) {
      VF w[4];
      E4M3Scaled4(wk + g * 4 * kLanes, w);
      HWY_UNROLL(4)
      for (int j = 0; j < 4; ++j) {
        const VF ws = hn::Mul(w[j], sv[g]);
        HWY_UNROLL(8)
        for (int m = 0; m < MT; ++m)
          acc[m][4 * g + j] = hn::MulAdd(hn::Set(df, xr[m * ldq + k]), ws, acc[m][4 * g + j]);
      }
    }
  } else {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) {
      const VF ws = hn::Mul(E4M3Scaled(wk + v * kLanes), sv[v]);
      HWY_UNROLL(8)
      for (int m = 0; m < MT; ++m) acc[m][v] = hn::MulAdd(hn::Set(df, xr[m * ldq + k]), ws, acc[m][v]);
    }
  }
}

// The micro-tile over the 8-bit decode copy (PackedBf16::w8; wt, st: the
// tile's codes and block factors): the same sums as Bf16Micro, each product
// formed as (x·s8)·(E4M3 value·2^-120). RunBf16 takes this path only when
// every x·s8 is exact and every product x·w is (Bf16FmaExact), so the factor
// moved onto x changes no value and an FMA gives the multiply-then-add bits.
// Whole dwords of codes (E4M3Scaled4) where V is a multiple of 4 and the
// sums fit the registers; the rows then sit permuted (lane l of vector 4g + j
// is row 4·kLanes·g + 4l + j) until the store.
template <int V, int MT>
HWY_INLINE void Bf16Micro8(const QArgs& a, const uint8_t* wt, const float* st, const float* x, int64_t roff,
                           int64_t m0, int64_t n0) {
  const DF df;
  constexpr bool kDwords = kFp8Dwords && V % 4 == 0 && V * MT <= kFp8DwordsMaxSums;
  constexpr int G = kDwords ? V / 4 : V;
  VF acc[MT][V];
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) acc[m][v] = hn::Zero(df);
  }
  const float* xr = x + m0 * a.ldq;
  for (int64_t kb = 0; kb < a.K / 32; ++kb) {
    // Lane l of vector (group) i: its row's 32-row half of the tile.
    VF sv[G];
    HWY_ALIGN float lanes[kLanes];
    for (int i = 0; i < G; ++i) {
      for (size_t l = 0; l < kLanes; ++l) {
        const int64_t r = kDwords ? roff + 4 * static_cast<int64_t>(kLanes) * i + 4 * static_cast<int64_t>(l)
                                  : roff + static_cast<int64_t>(kLanes) * i + static_cast<int64_t>(l);
        lanes[l] = st[kb * 2 + r / 32];
      }
      sv[i] = hn::Load(df, lanes);
    }
    const int64_t k0 = 32 * kb;
    if (!a.pairs) {
      for (int64_t k = k0; k < k0 + 32; ++k) Bf16Step8<V, MT, kDwords>(acc, wt, roff, xr, a.ldq, sv, k);
    } else {
      for (int64_t k = k0; k < k0 + 32; k += 2) {
        Bf16Step8<V, MT, kDwords>(acc, wt, roff, xr, a.ldq, sv, k + 1);
        Bf16Step8<V, MT, kDwords>(acc, wt, roff, xr, a.ldq, sv, k);
      }
    }
  }
  HWY_ALIGN float out[MT][V * kLanes];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) hn::Store(acc[m][v], df, out[m] + v * kLanes);
  if constexpr (kDwords) {
    StoreRowsPermuted<4, V, MT>(out[0], a, m0, n0 + roff, a.round);
  } else {
    StoreRows<V, MT>(out[0], a, m0, n0 + roff, a.round);
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Prefill on a CPU with the BF16 pair dots (bf16_dot.h; RunBf16Call set a.qp
// only where a.pair_dots_exact): per (tile, m-chunk) item, blocks of
// kBf16DotBlockPairs column pairs of the tile interleaved once into pairs and
// run by every 6-row group of the chunk, each output's one running sum kept
// in BlockScratch::acc between blocks (the same additions in the same order
// as Bf16Micro).
inline constexpr int64_t kBf16DotBlockPairs = 64;
HWY_INLINE void RunBf16DotItems(const QArgs& a, int64_t item0, int64_t item1) {
  constexpr int kMT = 6;
  HWY_ALIGN uint32_t wp[kBf16DotBlockPairs * kTileRows];
  BlockScratch& s = ThreadBlockScratch();
  s.Resize(0, a.mchunk * kTileRows);
  float* HWY_RESTRICT acc = s.acc.get();
  const int64_t ldqp = a.ldq / 2, np = a.K / 2;
  for (int64_t it = item0; it < item1; ++it) {
    const int64_t tile = it / a.mchunks, mc = it % a.mchunks;
    const int64_t m_begin = mc * a.mchunk, m_end = std::min(a.M, m_begin + a.mchunk);
    const int64_t rows = std::min<int64_t>(kTileRows, a.N - tile * kTileRows);
    const int vt = static_cast<int>((rows + 15) / 16);
    const uint16_t* wt = a.wb + tile * a.K * kTileRows;
    const uint32_t* qt = a.qp + (a.group_rows > 0 ? ((tile * kTileRows) / a.group_rows) * a.group_in / 2 : 0);
    std::fill(acc, acc + (m_end - m_begin) * kTileRows, 0.0f);
    for (int64_t p0 = 0; p0 < np; p0 += kBf16DotBlockPairs) {
      const int64_t n = std::min(kBf16DotBlockPairs, np - p0);
      Bf16Bf16DotConvertBlock(wt + 2 * p0 * kTileRows, n, a.pairs, wp);
      for (int64_t m0 = m_begin; m0 < m_end; m0 += kMT) {
        const int mt = static_cast<int>(std::min<int64_t>(kMT, m_end - m0));
        PrefetchNextPairGroup(qt, ldqp, m0, kMT, m_begin, m_end, p0, kBf16DotBlockPairs, np);
        Bf16Bf16DotBlockMicro(wp, n, qt + m0 * ldqp + p0, ldqp, acc + (m0 - m_begin) * kTileRows, vt, mt);
      }
    }
    for (int64_t m = m_begin; m < m_end; ++m)
      StoreRows<static_cast<int>(kTileRows / kLanes), 1>(acc + (m - m_begin) * kTileRows, a, m, tile * kTileRows,
                                                          a.round);
  }
}
#endif

void RunBf16Items(const QArgs& a, int64_t item0, int64_t item1) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (a.qp != nullptr) {
    RunBf16DotItems(a, item0, item1);
    return;
  }
#endif
  if constexpr (kUseBlockGemm) {
    if (Bf16BlockPath(a)) {
      // Prefill (AVX2): the block GEMM of the quantised linears without
      // scales. Each (tile, 32-column block) is widened to FP32 once for the
      // m-chunk, in the pair order when a.pairs (a.q was packed by
      // RunBf16Call in the same order), and every lane continues its one
      // running sum over the blocks: the same additions in the same order
      // as Bf16Micro.
      const auto conv = [&](int64_t tile, int64_t b, float* w, float*) {
        const DF df;
        const int64_t k0 = b * kBf16BlockK, kl = std::min<int64_t>(kBf16BlockK, a.K - k0);
        const uint16_t* wt = a.wb + tile * a.K * kTileRows;
        for (int64_t kk = 0; kk < kl; ++kk) {
          const uint16_t* src = wt + Bf16PairColumn(k0 + kk, a.K, a.pairs) * kTileRows;
          HWY_UNROLL(8)
          for (int64_t r = 0; r < kTileRows; r += static_cast<int64_t>(kLanes))
            hn::StoreU(LoadW(src + r), df, w + kk * kTileRows + r);
        }
      };
      const auto x_off = [&](int64_t tile) {
        return a.group_rows > 0 ? ((tile * kTileRows) / a.group_rows) * a.group_in : int64_t{0};
      };
      if (a.fma) {
        RunBlockItems<kBlockV, kBlockMT, BlockMode::kUnscaledFma>(a, item0, item1, kBf16BlockK, conv, x_off);
      } else {
        RunBlockItems<kBlockV, kBlockMT, BlockMode::kUnscaledMulAdd>(a, item0, item1, kBf16BlockK, conv, x_off);
      }
      return;
    }
  }
  const auto micro = [&](auto vt, auto mt, const QArgs& aa, int64_t tile, int64_t roff, int64_t m0) {
    constexpr int kV = decltype(vt)::value, kMT = decltype(mt)::value;
    const float* x = aa.q;
    if (aa.group_rows > 0) x += ((tile * kTileRows) / aa.group_rows) * aa.group_in;
    if (aa.w8 != nullptr) {
      Bf16Micro8<kV, kMT>(aa, aa.w8 + tile * aa.K * kTileRows, aa.s8 + tile * (aa.K / 32) * 2, x, roff, m0,
                          tile * kTileRows);
    } else if (aa.wf != nullptr) {
      // A narrow pack (wf_rows < kTileRows) has one tile: tile == 0 here.
      Bf16Micro<float, false, kV, kMT>(aa, aa.wf + tile * aa.K * aa.wf_rows, aa.wf_rows, x, roff, m0,
                                       tile * kTileRows);
    } else if (aa.fma) {
      Bf16Micro<uint16_t, true, kV, kMT>(aa, aa.wb + tile * aa.K * kTileRows, kTileRows, x, roff, m0,
                                         tile * kTileRows);
    } else {
      Bf16Micro<uint16_t, false, kV, kMT>(aa, aa.wb + tile * aa.K * kTileRows, kTileRows, x, roff, m0,
                                          tile * kTileRows);
    }
  };
  if constexpr (kLanes == 8) {
    // AVX2 GEMV over BF16 weights: all 64 rows of a tile per pass, as the FP8
    // GEMV (linear_fp8.cc): one pass reads whole 128-byte k rows instead of
    // alternate cache lines in two passes.
    if (a.M == 1 && a.wf == nullptr) {
      RunItems<8, 1>(a, item0, item1, micro);
      return;
    }
    // The decode copy at 2-4 rows: 4 vectors × 2 rows, the dword form.
    if (a.w8 != nullptr) {
      RunItems<4, 2>(a, item0, item1, micro);
      return;
    }
  }
  RunItems<kMicroV, kMicroMT>(a, item0, item1, micro);
}

// Per-target entry: for the block path the activations are packed first
// (hwy_util-inl.h PackActGroupsPairs, over the team).
void RunBf16Call(QArgs& a) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // The BF16 pair dots from kBf16DotMinM rows (the 8-bit decode copy and
  // FP32 weights keep their paths; K and the row stride whole 32-column groups).
  if (a.pair_dots_exact && a.M >= kBf16DotMinM && a.wb != nullptr && a.w8 == nullptr && a.wf == nullptr &&
      a.K % 32 == 0 && a.ldq % 32 == 0 && a.group_in % 32 == 0 && Bf16DotActive()) {
    ActBuffers& buf = ThreadActBuffers();  // a.q is the caller's x, not buf.q
    if (static_cast<int64_t>(buf.qp.size()) < a.M * (a.ldq / 2)) buf.qp.resize(a.M * (a.ldq / 2));
    if (PackActPairs(a.q, a.M, a.ldq, a.ldq, buf.qp.data(), /*exp_shift=*/0, /*swap=*/a.pairs)) a.qp = buf.qp.data();
  }
#endif
  if constexpr (kUseBlockGemm) {
    if (Bf16BlockPath(a)) {
      a.max_mchunk = kBlockMaxMChunk;
      float* packed = PackedActBuffer(a.M, a.ldq);
      PackActGroupsPairs(a.q, a.M, a.ldq, a.K, a.pairs, packed);
      a.q = packed;
    }
  }
  ParallelItems(a, &RunBf16Items);
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(RunBf16Call);
HWY_EXPORT(Bf16CodesRows);
HWY_EXPORT(ActExpRange);
HWY_EXPORT(ActExpRangeTeam);

namespace {
// One output of a BF16 linear in the pair order (k+1 added before k inside
// each pair, a lone last k last), FP32 accumulation, BF16 weights widened.
// Not vectorised: g++ 12.2 at -O2 vectorises this two-statement reduction
// chain and reassociates it (docs/kernels.md).
__attribute__((optimize("no-tree-vectorize"))) float DotPairsScalar(const float* x, const uint16_t* w, int64_t K) {
  float acc = 0.0f;
  int64_t k = 0;
  for (; k + 1 < K; k += 2) {
    acc = acc + x[k + 1] * Bf16ToFloat(w[k + 1]);
    acc = acc + x[k] * Bf16ToFloat(w[k]);
  }
  if (k < K) acc = acc + x[k] * Bf16ToFloat(w[k]);
  return acc;
}

// GroupedLinearBf16 in the pair order when R % 64 != 0 (no packed tiles):
// z[m, g·R + r] = bf16(pairs dot of o[m, g·K ..] and wa row g·R + r).
void GroupedLinearBf16PairsScalar(const float* o, int64_t M, int groups, const ref::Bf16Weight& wa, float* z) {
  const int64_t R = wa.out / groups, K = wa.in;
  for (int64_t m = 0; m < M; ++m)
    for (int g = 0; g < groups; ++g)
      for (int64_t r = 0; r < R; ++r) {
        const int64_t n = g * R + r;
        z[m * wa.out + n] = RoundBf16(DotPairsScalar(o + m * groups * K + g * K, wa.w + n * K, K));
      }
}

void RunBf16(const float* x, int64_t M, const PackedBf16& w, float* y, bool pairs, bool round, int64_t ldq,
             int64_t group_rows, int64_t group_in) {
  QArgs a;
  a.K = w.src.in;
  a.N = w.src.out;
  a.M = M;
  a.tiles = w.tiles;
  a.wb = w.w.get();
  a.q = x;
  a.ldq = ldq;
  a.y = y;
  a.ldy = a.N;
  a.pairs = pairs;
  a.round = round;
  a.group_rows = group_rows;
  a.group_in = group_in;
  ExpRange wr;  // the weights' range, measured at pack time
  wr.lo = w.exp_lo;
  wr.hi = w.exp_hi;
  wr.finite = w.finite;
  wr.any_nonzero = w.any_nonzero;
  if (w.w8 && M <= HWY_DYNAMIC_DISPATCH(Bf16CodesRows)()) {
    // The 8-bit decode copy when every x·s8 (no overflow or underflow: x
    // and s8 exponents summed stay in the normal range) and every product
    // x·w is exact: then the same bits as the BF16 weights.
    const ExpRange xr = HWY_DYNAMIC_DISPATCH(ActExpRange)(x, M, ldq, ldq);
    const bool scaled_exact =
        !xr.any_nonzero || (xr.lo + w.s8_exp_lo >= -126 && xr.hi + w.s8_exp_hi <= 126);
    if (scaled_exact && Bf16FmaExact(xr, wr)) {
      a.w8 = w.w8.get();
      a.s8 = w.s8.get();
    }
  }
  if (M >= kBlockGemmMinM) {
    const ExpRange xr = HWY_DYNAMIC_DISPATCH(ActExpRangeTeam)(x, M, ldq, ldq);
    a.fma = Bf16FmaExact(xr, wr);
    a.pair_dots_exact = Bf16PairDotsExactRanges(xr, wr);
  }
  HWY_DYNAMIC_DISPATCH(RunBf16Call)(a);
}
}  // namespace

ExpRange ActivationExpRange(const float* x, int64_t M, int64_t K, int64_t ld) {
  return HWY_DYNAMIC_DISPATCH(ActExpRangeTeam)(x, M, K, ld);
}

void LinearBf16(const float* x, int64_t M, const PackedBf16& w, float* y, bool pairs) {
  if (M <= 0) return;
  RunBf16(x, M, w, y, pairs, /*round=*/true, w.src.in, 0, 0);
}

void LinearF32(const float* x, int64_t M, const PackedF32& w, float* y) {
  if (M <= 0) return;
  QArgs a;
  a.K = w.in;
  a.N = w.out;
  a.M = M;
  a.tiles = w.tiles;
  a.wf = w.w.get();
  a.wf_rows = w.rows;
  a.no_slices = w.rows < kTileRows;
  a.q = x;
  a.ldq = w.in;
  a.y = y;
  a.ldy = a.N;
  a.round = false;
  HWY_DYNAMIC_DISPATCH(RunBf16Call)(a);
}

void LinearF32Bf16W(const float* x, int64_t M, const PackedBf16& w, float* y) {
  if (M <= 0) return;
  RunBf16(x, M, w, y, /*pairs=*/false, /*round=*/false, w.src.in, 0, 0);
}

void GroupedLinearBf16(const float* o, int64_t M, int groups, const PackedBf16& wa, float* z, bool pairs) {
  if (M <= 0) return;
  const int64_t R = wa.src.out / groups;
  if (R % kTileRows != 0) {
    // A tile would straddle two groups: the reference's loop (sequential
    // order), or the scalar pair-order loop below.
    if (!pairs) {
      ref::GroupedLinearBf16(o, M, groups, wa.src, z);
    } else {
      GroupedLinearBf16PairsScalar(o, M, groups, wa.src, z);
    }
    return;
  }
  RunBf16(o, M, wa, z, pairs, /*round=*/true, wa.src.in * groups, R, wa.src.in);
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
