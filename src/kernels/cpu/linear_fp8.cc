// FP8 E4M3 × FP8-quantised-activation linear (GEMV for decode, GEMM for
// prefill), bit-identical to ref::LinearFp8 (see cpu_ops.h for the argument).
//
// Per output row n (one SIMD lane) and activation row m, exactly as the
// reference: for each K block kb (act_block wide), partial = 0; for k in the
// block in increasing order, partial = partial + q[m,k]·w[n,k]; then
// acc = acc + (partial·s_act[m,kb])·s_w(n,kb); y = bf16(acc). The operands are
// q·2^8 (from QuantizeActRows) and w·2^-8 (the E4M3 code turned into an FP16
// bit pattern by a sign-extend, a shift and a mask, then converted to FP32),
// whose product is the exact q·w.
// (Operands: see linear_common.h kActOperandScale — products are q·w/2 and
// the activation scale 2·s_act, which gives the same bits.)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/linear_fp8.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "kernels/cpu/linear_common.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

// Micro-tile: V vectors of output rows (V·kLanes rows starting at row `roff`
// of the 64-row tile) × MT activation rows, over the whole K.
template <int V, int MT>
HWY_INLINE void Fp8Micro(const QArgs& a, const uint8_t* wt, const float* ws_t, int64_t roff, int64_t m0,
                      int64_t n0) {
  const DF df;
  // Whole dwords of codes (E4M3Scaled4) where the micro column is a multiple
  // of 4 vectors; the rows then sit permuted in the partial sums.
  constexpr bool kDwords = kFp8Dwords && V % 4 == 0 && V * MT <= kFp8DwordsMaxSums;
  const int64_t kblocks = a.K / a.ab;
  HWY_ALIGN float acc[MT][V * kLanes];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) hn::Store(hn::Zero(df), df, acc[m] + v * kLanes);
  const float* q = a.q + m0 * a.ldq;
  const float* sa = a.sa + m0 * kblocks;
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    VF part[MT][V];
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) part[m][v] = hn::Zero(df);
    }
    const int64_t k0 = kb * a.ab;
    const uint8_t* wk = wt + k0 * kTileRows + roff;
    for (int64_t k = k0; k < k0 + a.ab; ++k, wk += kTileRows) {
      hwy::Prefetch(wk + kPrefetchBytes);
      if constexpr (kDwords) {
        HWY_UNROLL(8)
        for (int g = 0; g < V / 4; ++g) {
          VF w[4];
          E4M3Scaled4(wk + g * 4 * kLanes, w);
          HWY_UNROLL(4)
          for (int j = 0; j < 4; ++j) {
            HWY_UNROLL(8)
            for (int m = 0; m < MT; ++m)
              part[m][4 * g + j] = hn::MulAdd(hn::Set(df, q[m * a.ldq + k]), w[j], part[m][4 * g + j]);
          }
        }
      } else {
        HWY_UNROLL(8)
        for (int v = 0; v < V; ++v) {
          const VF w = E4M3Scaled(wk + v * kLanes);
          HWY_UNROLL(8)
          for (int m = 0; m < MT; ++m) part[m][v] = hn::MulAdd(hn::Set(df, q[m * a.ldq + k]), w, part[m][v]);
        }
      }
    }
    const float* wsk = ws_t + (k0 / 32) * 4;
    // Vector v's weight scale: one per 16 rows. With kDwords, lane l of
    // vector 4g + j is row roff + 4·kLanes·g + 4l + j (the 4 rows of a dword
    // lie in one 16-row group).
    VF sw[V];
    if constexpr (kDwords) {
      HWY_ALIGN float swl[kLanes];
      HWY_UNROLL(8)
      for (int g = 0; g < V / 4; ++g) {
        for (size_t l = 0; l < kLanes; ++l)
          swl[l] = wsk[(roff + g * 4 * static_cast<int64_t>(kLanes) + 4 * static_cast<int64_t>(l)) / 16];
        HWY_UNROLL(4)
        for (int j = 0; j < 4; ++j) sw[4 * g + j] = hn::Load(df, swl);
      }
    } else {
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) sw[v] = hn::Set(df, wsk[(roff + v * static_cast<int64_t>(kLanes)) / 16]);
    }
    HWY_UNROLL(8)
    for (int m = 0; m < MT; ++m) {
      const VF s = hn::Set(df, sa[m * kblocks + kb]);
      HWY_UNROLL(8)
      for (int v = 0; v < V; ++v) {
        const VF prev = hn::Load(df, acc[m] + v * kLanes);
        hn::Store(hn::Add(prev, hn::Mul(hn::Mul(part[m][v], s), sw[v])), df, acc[m] + v * kLanes);
      }
    }
  }
  if constexpr (kDwords) {
    StoreRowsPermuted<4, V, MT>(acc[0], a, m0, n0 + roff, /*round=*/true);
  } else {
    StoreRows<V, MT>(acc[0], a, m0, n0 + roff, /*round=*/true);
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Prefill on a CPU with the BF16 pair dots (bf16_dot.h): per (tile, m-chunk)
// item, each activation block (a.ab columns) of the tile converted once into
// BF16 pairs and run by every 6-row group of the chunk; accumulators of the
// chunk in BlockScratch::acc as RunBlockItems.
HWY_INLINE void RunFp8DotItems(const QArgs& a, int64_t item0, int64_t item1) {
  constexpr int kMT = 6;
  BlockScratch& s = ThreadBlockScratch();
  s.ResizePairs((a.ab / 2) * kTileRows);
  s.Resize(0, a.mchunk * kTileRows);
  const AlignedArray<uint32_t>& wp = s.wp;
  float* HWY_RESTRICT acc = s.acc.get();
  const int64_t kblocks = a.K / a.ab, ldqp = a.K / 2;
  for (int64_t it = item0; it < item1; ++it) {
    const int64_t tile = it / a.mchunks, mc = it % a.mchunks;
    const int64_t m_begin = mc * a.mchunk, m_end = std::min(a.M, m_begin + a.mchunk);
    const int64_t rows = std::min<int64_t>(kTileRows, a.N - tile * kTileRows);
    const int vt = static_cast<int>((rows + 15) / 16);
    std::fill(acc, acc + (m_end - m_begin) * kTileRows, 0.0f);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const int64_t k0 = kb * a.ab;
      for (int64_t c = 0; c < a.ab; c += 32)
        Fp8Bf16DotConvertBlock(a.w + (tile * a.K + k0 + c) * kTileRows, wp.get() + (c / 2) * kTileRows);
      const float* sw = a.ws + (tile * (a.K / 32) + k0 / 32) * 4;
      for (int64_t m0 = m_begin; m0 < m_end; m0 += kMT) {
        const int mt = static_cast<int>(std::min<int64_t>(kMT, m_end - m0));
        // Zen 4, 2 threads, N x K = 1024 x 4096 / 2304 x 5120, M = 1024,
        // alternated 3 times: 208-250 -> 239-276 / 144-242 -> 240-264
        // GFLOP/s with the prefetch; 8192 x 512 level.
        PrefetchNextPairGroup(a.qp, ldqp, m0, kMT, m_begin, m_end, k0 / 2, a.ab / 2, a.K / 2);
        Fp8Bf16DotBlockMicro(wp.get(), a.ab / 2, 0, a.qp + m0 * ldqp + k0 / 2, ldqp, a.sa + m0 * kblocks + kb,
                             kblocks, sw, acc + (m0 - m_begin) * kTileRows, vt, mt);
      }
    }
    for (int64_t m = m_begin; m < m_end; ++m)
      StoreRows<static_cast<int>(kTileRows / kLanes), 1>(acc + (m - m_begin) * kTileRows, a, m, tile * kTileRows,
                                                          /*round=*/true);
  }
}
#endif

void RunFp8(const QArgs& a, int64_t item0, int64_t item1) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (a.qp != nullptr) {  // set by RunFp8Call for M >= kFp8DotMinM
    RunFp8DotItems(a, item0, item1);
    return;
  }
#endif
  if (kUseBlockGemm && a.M >= kBlockGemmMinM) {
    // Prefill: each (tile, act block) converted once for the whole m-chunk.
    const int64_t klen = a.ab;
    const auto conv = [&](int64_t tile, int64_t b, float* w, float* sw) {
      const DF df;
      const uint8_t* wt = a.w + tile * a.K * kTileRows + b * klen * kTileRows;
      const float* ws = a.ws + tile * (a.K / 32) * 4 + ((b * klen) / 32) * 4;
      if (a.prescaled) {
        // w·s_w (linear_common.h BlockPrescaleExact): the value × 2^-120
        // times 2^120·s_w, or where that factor would overflow (e_w > 7)
        // times 2^120 and then s_w; each step exact. One scale per 16 rows.
        const auto prescale = [&](auto one_factor) {
          constexpr bool kOne = decltype(one_factor)::value;
          VF f[4];
          HWY_UNROLL(4)
          for (int g = 0; g < 4; ++g) f[g] = hn::Set(df, kOne ? ws[g] * 0x1p120f : ws[g]);
          const VF up = hn::Set(df, 0x1p120f);
          constexpr int kVecs = static_cast<int>(kTileRows / kLanes);
          for (int64_t k = 0; k < klen; ++k) {
            HWY_UNROLL(16)
            for (int v = 0; v < kVecs; ++v) {
              const int64_t off = k * kTileRows + v * static_cast<int64_t>(kLanes);
              VF x = E4M3Scaled(wt + off);
              if constexpr (!kOne) x = hn::Mul(x, up);
              hn::StoreU(hn::Mul(x, f[(v * static_cast<int>(kLanes)) / 16]), df, w + off);
            }
          }
        };
        if (a.w_exp_hi <= 7) {
          prescale(std::true_type{});
        } else {
          prescale(std::false_type{});
        }
        return;
      }
      for (int64_t i = 0; i < klen * kTileRows; i += static_cast<int64_t>(kLanes))
        hn::StoreU(E4M3Scaled(wt + i), df, w + i);
      for (int64_t r = 0; r < kTileRows; ++r) sw[r] = ws[r / 16];
    };
    if (a.prescaled) {
      RunBlockItems<kBlockV, kBlockMT, BlockMode::kPrescaled>(a, item0, item1, klen, conv);
    } else {
      RunBlockItems<kBlockV, kBlockMT>(a, item0, item1, klen, conv);
    }
    return;
  }
  const auto micro = [&](auto vt, auto mt, const QArgs& aa, int64_t tile, int64_t roff, int64_t m0) {
    constexpr int kV = decltype(vt)::value, kMT = decltype(mt)::value;
    const int64_t K = aa.K;
    Fp8Micro<kV, kMT>(aa, aa.w + tile * K * kTileRows, aa.ws + tile * (K / 32) * 4, roff, m0, tile * kTileRows);
  };
  if constexpr (kLanes == 8) {
    // AVX2 GEMV: all 64 rows of the tile per pass (8 vectors). The packed
    // tile holds 64 bytes (one cache line) per column, and the 32-row micro
    // column read half of each line in one pass and the other half a whole K
    // sweep later (from L2 at best). Measured bench kernels --target avx2,
    // 2 threads, wo_b 5120×8192: 59% → see docs/kernels.md.
    if (a.M == 1) {
      RunItems<8, 1>(a, item0, item1, micro);
      return;
    }
    // 4 or 5 rows (batched decode): one pass of 2 vectors × M rows, each
    // converted weight vector used M times, instead of 4 vectors × 3 rows
    // plus a pass for the rest that converts every weight again. Measured
    // bench kernels --target avx2, 2 threads, N 2304 × K 5120, three
    // interleaved rounds, GFLOP/s: M = 4 110 / 99 / 87 → 169 / 129 / 152,
    // M = 5 101 / 111 / 83 → 163 / 102 / 143; M = 6 (two full 3-row passes)
    // was not faster (108 / 126 / 98 → 109 / 88 / 95). Same K order per output.
    if (a.M == 4 || a.M == 5) {
      RunItems<2, 6>(a, item0, item1, micro);
      return;
    }
  }
  RunItems<kMicroV, kMicroMT>(a, item0, item1, micro);
}

// Per-target entry (hwy_util-inl.h RunLinearCall).
// On AVX-512 with the BF16 pair dots, a call of at least kFp8DotMinM rows
// packs its activations as BF16 pairs (× 2^-20, bf16_dot.h) first and runs
// RunFp8DotItems. Below that the per-chunk weight conversion does not pay:
// Zen 5, one thread, N = 2304, K = 5120, against the FP32 micro-tiles: M = 16
// x0.60, 64 x0.97, 96 x1.19, 256 x1.16, 512 x1.35, 1024 x1.27.
inline constexpr int64_t kFp8DotMinM = 96;
void RunFp8Call(QArgs& a) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (a.M >= kFp8DotMinM && Bf16DotActive()) {
    ActBuffers& buf = ThreadActBuffers();  // the caller's thread: a.q lives in buf.q, untouched here
    if (static_cast<int64_t>(buf.qp.size()) < a.M * (a.K / 2)) buf.qp.resize(a.M * (a.K / 2));
    if (PackActPairs(a.q, a.M, a.K, a.ldq, buf.qp.data(), /*exp_shift=*/20)) a.qp = buf.qp.data();
  }
#endif
  RunLinearCall(a, &RunFp8);
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(RunFp8Call);

void LinearFp8(const float* x, int64_t M, const PackedFp8& w, int act_block, float* y, Fp8Format act_format) {
  if (M <= 0) return;
  if (w.use_ref || act_block <= 0 || act_block % 32 != 0 || w.src.in % act_block != 0) {
    if (w.src.w == nullptr)  // a row concatenation (ConcatPackedRows) has no checkpoint view
      Fail(ErrorKind::kInvalidArgument,
           "LinearFp8: activation block {} needs the scalar path, which a concatenated weight ({} x {}) does not have",
           act_block, w.src.out, w.src.in);
    ref::LinearFp8(x, M, w.src, act_block, y, act_format);
    return;
  }
  QArgs a;
  a.K = w.src.in;
  a.N = w.src.out;
  a.M = M;
  a.ab = act_block;
  a.tiles = w.tiles;
  a.w = w.w.get();
  a.ws = w.ws.get();
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
  HWY_DYNAMIC_DISPATCH(RunFp8Call)(a);
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
