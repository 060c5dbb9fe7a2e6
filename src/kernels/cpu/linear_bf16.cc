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

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "kernels/cpu/linear_common.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

HWY_INLINE VF LoadW(const float* p) { return hn::LoadU(DF(), p); }

HWY_INLINE VF LoadW(const uint16_t* p) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

// kFma: every product exact (linear_common.h Bf16FmaExact), so an FMA gives
// the multiply-then-add bits.
template <typename WT, bool kFma, int V, int MT>
HWY_INLINE void Bf16Micro(const QArgs& a, const WT* wt, const float* x, int64_t roff, int64_t m0, int64_t n0) {
  const DF df;
  VF acc[MT][V];
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) acc[m][v] = hn::Zero(df);
  }
  const float* xr = x + m0 * a.ldq;
  const int64_t K = a.K;
  constexpr int64_t kPf = kPrefetchBytes / static_cast<int64_t>(sizeof(WT));
  auto step = [&](int64_t k) HWY_ATTR {
    const WT* wk = wt + k * kTileRows + roff;
    hwy::Prefetch(wk + kPf);
    if constexpr (sizeof(WT) * kTileRows > 64) hwy::Prefetch(wk + kPf + 64 / sizeof(WT));
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) {
      const VF w = LoadW(wk + v * kLanes);
      HWY_UNROLL(8)
      for (int m = 0; m < MT; ++m) {
        if constexpr (kFma) {
          acc[m][v] = hn::MulAdd(hn::Set(df, xr[m * a.ldq + k]), w, acc[m][v]);
        } else {
          acc[m][v] = hn::Add(acc[m][v], hn::Mul(hn::Set(df, xr[m * a.ldq + k]), w));
        }
      }
    }
  };
  if (!a.pairs) {
    for (int64_t k = 0; k < K; ++k) step(k);
  } else {
    int64_t k = 0;
    for (; k + 1 < K; k += 2) {
      step(k + 1);
      step(k);
    }
    if (k < K) step(k);
  }
  HWY_ALIGN float out[MT][V * kLanes];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) hn::Store(acc[m][v], df, out[m] + v * kLanes);
  StoreRows<V, MT>(out[0], a, m0, n0 + roff, a.round);
}

// Block GEMM micro-tile (prefill, BF16 weights): the running sums of V
// vectors of rows × MT activation rows are loaded from acc, continued over
// the converted K chunk w[k·64 + r] (k0 .. k0+klen, in the reference's order,
// or the pair order), and stored back.
template <bool kFma, int V, int MT>
HWY_INLINE void Bf16BlockMicro(const float* HWY_RESTRICT w, int64_t k0, int64_t klen, bool pairs,
                               const float* HWY_RESTRICT x, int64_t ldx, float* HWY_RESTRICT accp) {
  const DF df;
  VF acc[MT][V];
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) acc[m][v] = hn::LoadU(df, accp + m * kTileRows + v * kLanes);
  }
  auto step = [&](int64_t k) HWY_ATTR {
    VF wv[V];
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) wv[v] = hn::LoadU(df, w + (k - k0) * kTileRows + v * kLanes);
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      const VF xb = hn::Set(df, x[m * ldx + k]);
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) {
        if constexpr (kFma) {
          acc[m][v] = hn::MulAdd(xb, wv[v], acc[m][v]);
        } else {
          acc[m][v] = hn::Add(acc[m][v], hn::Mul(xb, wv[v]));
        }
      }
    }
  };
  const int64_t k1 = k0 + klen;
  if (!pairs) {
    for (int64_t k = k0; k < k1; ++k) step(k);
  } else {
    int64_t k = k0;  // k0 is even: pairs never straddle chunks
    for (; k + 1 < k1; k += 2) {
      step(k + 1);
      step(k);
    }
    if (k < k1) step(k);
  }
  HWY_UNROLL(8)
  for (int m = 0; m < MT; ++m) {
    HWY_UNROLL(8)
    for (int v = 0; v < V; ++v) hn::StoreU(acc[m][v], df, accp + m * kTileRows + v * kLanes);
  }
}

// Prefill BF16 GEMM: per item (tile, m-chunk), K in chunks of kChunk: the
// tile's chunk widened to FP32 once, then every row of the m-chunk continues
// its sums over it (sums kept in BlockScratch::acc between chunks).
template <bool kFma>
void RunBf16Block(const QArgs& a, int64_t item0, int64_t item1) {
  constexpr int V = kBlockV, MT = kBlockMT;
  constexpr int64_t kRows = V * static_cast<int64_t>(kLanes);
  constexpr int64_t kChunk = 128;
  const DF df;
  BlockScratch& s = ThreadBlockScratch();
  s.Resize(kChunk * kTileRows, a.mchunk * kTileRows);
  float* HWY_RESTRICT wbuf = s.w.get();
  float* HWY_RESTRICT acc = s.acc.get();
  for (int64_t it = item0; it < item1; ++it) {
    const int64_t tile = it / a.mchunks, mc = it % a.mchunks;
    const int64_t m_begin = mc * a.mchunk, m_end = std::min(a.M, m_begin + a.mchunk);
    const int64_t rows_left = a.N - tile * kTileRows;
    const float* x = a.q;
    if (a.group_rows > 0) x += ((tile * kTileRows) / a.group_rows) * a.group_in;
    const uint16_t* wt = a.wb + tile * a.K * kTileRows;
    std::fill(acc, acc + (m_end - m_begin) * kTileRows, 0.0f);
    for (int64_t k0 = 0; k0 < a.K; k0 += kChunk) {
      const int64_t klen = std::min(kChunk, a.K - k0);
      for (int64_t i = 0; i < klen * kTileRows; i += static_cast<int64_t>(kLanes))
        hn::StoreU(LoadW(wt + k0 * kTileRows + i), df, wbuf + i);
      for (int64_t roff = 0; roff < kTileRows && roff < rows_left; roff += kRows) {
        const int64_t rows_here = std::min<int64_t>(kRows, rows_left - roff);
        const int vt =
            static_cast<int>((rows_here + static_cast<int64_t>(kLanes) - 1) / static_cast<int64_t>(kLanes));
        for (int64_t m0 = m_begin; m0 < m_end; m0 += MT) {
          const int rem = static_cast<int>(std::min<int64_t>(MT, m_end - m0));
          WithVMT<V, MT>(vt, rem, [&](auto v, auto mt) {
            constexpr int kV = decltype(v)::value, kMT = decltype(mt)::value;
            Bf16BlockMicro<kFma, kV, kMT>(wbuf + roff, k0, klen, a.pairs, x + m0 * a.ldq, a.ldq,
                                          acc + (m0 - m_begin) * kTileRows + roff);
          });
        }
      }
    }
    for (int64_t m = m_begin; m < m_end; ++m)
      StoreRows<static_cast<int>(kTileRows / kLanes), 1>(acc + (m - m_begin) * kTileRows, a, m, tile * kTileRows,
                                                          a.round);
  }
}

void RunBf16Items(const QArgs& a, int64_t item0, int64_t item1) {
  if (a.wb != nullptr && a.M >= kBlockGemmMinM) {
    if (a.fma) {
      RunBf16Block<true>(a, item0, item1);
    } else {
      RunBf16Block<false>(a, item0, item1);
    }
    return;
  }
  RunItems<kMicroV, kMicroMT>(a, item0, item1, [&](auto vt, auto mt, const QArgs& aa, int64_t tile, int64_t roff,
                                                     int64_t m0) {
    constexpr int kV = decltype(vt)::value, kMT = decltype(mt)::value;
    const float* x = aa.q;
    if (aa.group_rows > 0) x += ((tile * kTileRows) / aa.group_rows) * aa.group_in;
    if (aa.wf != nullptr) {
      Bf16Micro<float, false, kV, kMT>(aa, aa.wf + tile * aa.K * kTileRows, x, roff, m0, tile * kTileRows);
    } else if (aa.fma) {
      Bf16Micro<uint16_t, true, kV, kMT>(aa, aa.wb + tile * aa.K * kTileRows, x, roff, m0, tile * kTileRows);
    } else {
      Bf16Micro<uint16_t, false, kV, kMT>(aa, aa.wb + tile * aa.K * kTileRows, x, roff, m0, tile * kTileRows);
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(RunBf16Items);

namespace {
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
  if (M >= kBlockGemmMinM) {
    ExpRange wr;
    wr.lo = w.exp_lo;
    wr.hi = w.exp_hi;
    wr.finite = w.finite;
    wr.any_nonzero = w.any_nonzero;
    a.fma = Bf16FmaExact(FloatsExpRange(x, M, ldq, ldq), wr);
  }
  ParallelItems(a, HWY_DYNAMIC_DISPATCH(RunBf16Items));
}
}  // namespace

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
  a.q = x;
  a.ldq = w.in;
  a.y = y;
  a.ldy = a.N;
  a.round = false;
  ParallelItems(a, HWY_DYNAMIC_DISPATCH(RunBf16Items));
}

void LinearF32Bf16W(const float* x, int64_t M, const PackedBf16& w, float* y) {
  if (M <= 0) return;
  RunBf16(x, M, w, y, /*pairs=*/false, /*round=*/false, w.src.in, 0, 0);
}

void GroupedLinearBf16(const float* o, int64_t M, int groups, const PackedBf16& wa, float* z, bool pairs) {
  if (M <= 0) return;
  const int64_t R = wa.src.out / groups;
  if (R % kTileRows != 0) {
    // A tile would straddle two groups: keep the reference's loop. (It
    // reproduces the sequential order; the pair order is ref-only here.)
    ref::GroupedLinearBf16(o, M, groups, wa.src, z);
    return;
  }
  RunBf16(o, M, wa, z, pairs, /*round=*/true, wa.src.in * groups, R, wa.src.in);
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
