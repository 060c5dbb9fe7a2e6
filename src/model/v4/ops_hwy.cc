// deepinfer/model/v4/ops_hwy.cc — Highway forms of V4 operators (ops.h):
// the Hadamard butterfly, the C4 indexer scoring and the 128×128-block FP8
// linear on the repacked weight. Each is bit-identical to its scalar oracle
// in ops.cc (HadamardRef, IndexerScoresRef, LinearFp8Ref): every output value
// is formed by the same FP32 operations in the same order, one SIMD lane per
// output element (no sum is split across lanes; -ffp-contract=off; an FMA
// only where the product and the sum are both exact, so it rounds nowhere).
//   * Hadamard: each butterfly stage's outputs are one FP32 add or subtract
//     of two values of the previous stage; stages with stride ≥ the vector
//     width are plain vector add/sub, the narrower ones pair lanes with a
//     lane permutation (lane i with lane i^h).
//   * Indexer scoring: one lane per compressed key j; per head the q·k dot in
//     increasing c, then the BF16 roundings, max(·, 0), the head weight and
//     the sum over heads in increasing h, exactly as the scalar loop.
//   * FP8 linear: a block partial is an exact sum (ops.cc), formed here in
//     double lanes (one lane per output row); products q·w of the scaled
//     operands of kernels/cpu (q·2^119, w·2^-120) are exact in double, so the
//     partial is exactly half the reference's; ×2 (exact), one rounding to
//     FP32, then acc = acc + partial·(s_a·s_w) in FP32 as the reference.
//     Finite operands run Fp8MicroF (16 codes converted per vector, FMAs,
//     up to 4 activation rows per pass), others Fp8MicroD.
//   * FP4 linear: exact integer group partials (see Fp4MicroI), the products
//     looked up from per-column tables on AVX-512 / AVX2 (Fp4MicroT).
//   * Sparse attention: see SparseAttentionV.
// The packed linears split their output tiles over the OpenMP team from 2^17
// multiply-adds (SplitTiles); a single attention row splits its heads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/v4/ops_hwy.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#include "base/parallel.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "model/v4/ops.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::v4 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using cpu::HWY_NAMESPACE::RoundBf16V;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr size_t kL = hn::MaxLanes(DF());

// Software prefetch distance of the packed weight streams (the linears below
// read each tile front to back): 8 KiB ahead, as kernels/cpu's GEMVs.
constexpr int64_t kPrefetchBytes = 8192;

// Per-thread scratch of at least n elements, aligned for hn::Load (the
// caller's buffer is thread_local); it only grows, so a call at a size
// already seen allocates nothing (model/v4/workspace.h). Its contents are
// unspecified: every caller writes what it reads.
template <class T>
T* AlignedScratch(hwy::AlignedFreeUniquePtr<T[]>& buf, size_t& cap, int64_t n) {
  if (cap < static_cast<size_t>(n)) {
    buf = hwy::AllocateAligned<T>(static_cast<size_t>(n));
    cap = static_cast<size_t>(n);
  }
  return buf.get();
}

// Returns false (caller uses the scalar form) when n is not a multiple of the vector width.
bool HadamardV(float* x, int64_t n, float scale) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  if (n < static_cast<int64_t>(kL) || n % static_cast<int64_t>(kL) != 0) return false;
  for (int64_t h = 1; h < n; h *= 2) {
    if (h < static_cast<int64_t>(kL)) {
      HWY_ALIGN int32_t idx[kL];
      for (size_t i = 0; i < kL; ++i) idx[i] = static_cast<int32_t>(i ^ static_cast<size_t>(h));
      const auto perm = hn::SetTableIndices(df, idx);
      const auto hi = hn::RebindMask(
          df, hn::Ne(hn::And(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(h))), hn::Zero(di)));
      for (int64_t i = 0; i < n; i += static_cast<int64_t>(kL)) {
        const VF v = hn::LoadU(df, x + i);
        const VF p = hn::TableLookupLanes(v, perm);
        // Low lane i: a + c with a = v[i], c = v[i+h]; high lane i+h: a − c with a = p, c = v.
        hn::StoreU(hn::IfThenElse(hi, hn::Sub(p, v), hn::Add(v, p)), df, x + i);
      }
    } else {
      for (int64_t b = 0; b < n; b += 2 * h)
        for (int64_t i = b; i < b + h; i += static_cast<int64_t>(kL)) {
          const VF a = hn::LoadU(df, x + i), c = hn::LoadU(df, x + i + h);
          hn::StoreU(hn::Add(a, c), df, x + i);
          hn::StoreU(hn::Sub(a, c), df, x + i + h);
        }
    }
  }
  const VF s = hn::Set(df, scale);
  for (int64_t i = 0; i < n; i += static_cast<int64_t>(kL))
    hn::StoreU(RoundBf16V(hn::Mul(hn::LoadU(df, x + i), s)), df, x + i);
  return true;
}

// Scores of keys [j0, j0 + kJ·kL) (keys past n are zero padding, not stored).
constexpr int kJ = 4;
void IndexerScoresV(const float* q, const float* w, int nh, int64_t D, const float* keys, int64_t n,
                    float* score) {
  const DF df;
  constexpr int64_t kW = kJ * static_cast<int64_t>(kL);
  thread_local hwy::AlignedFreeUniquePtr<float[]> kt_buf;
  thread_local size_t kt_cap = 0;
  float* kt = AlignedScratch(kt_buf, kt_cap, D * kW);  // every element is written per key block
  const VF zero = hn::Zero(df);
  for (int64_t j0 = 0; j0 < n; j0 += kW) {
    const int64_t jn = std::min<int64_t>(kW, n - j0);
    for (int64_t t = 0; t < kW; ++t)
      for (int64_t c = 0; c < D; ++c) kt[c * kW + t] = t < jn ? keys[(j0 + t) * D + c] : 0.0f;
    VF acc[kJ];
    for (int u = 0; u < kJ; ++u) acc[u] = zero;
    for (int h = 0; h < nh; ++h) {
      const float* qh = q + h * D;
      VF dot[kJ];
      for (int u = 0; u < kJ; ++u) dot[u] = zero;
      const float* kc = kt;
      for (int64_t c = 0; c < D; ++c, kc += kW) {
        const VF qc = hn::Set(df, qh[c]);
        HWY_UNROLL(4)
        for (int u = 0; u < kJ; ++u) dot[u] = hn::Add(dot[u], hn::Mul(qc, hn::Load(df, kc + u * kL)));
      }
      const VF wh = hn::Set(df, w[h]);
      for (int u = 0; u < kJ; ++u) {
        VF t = RoundBf16V(dot[u]);
        t = hn::IfThenElse(hn::Lt(t, zero), zero, t);  // std::max(t, 0.0f)
        acc[u] = hn::Add(acc[u], RoundBf16V(hn::Mul(t, wh)));
      }
    }
    HWY_ALIGN float out[kW];
    for (int u = 0; u < kJ; ++u) hn::Store(RoundBf16V(acc[u]), df, out + u * kL);
    std::memcpy(score + j0, out, static_cast<size_t>(jn) * sizeof(float));
  }
}

// FP8 linear, tiles [t0, t1) of the packed weight, all M rows.
using DD = hn::ScalableTag<double>;
using VD = hn::Vec<DD>;
constexpr size_t kDL = hn::MaxLanes(DD());
constexpr int kV = kDL >= 4 ? 4 : 8;  // double vectors per micro column (kRows divides 64)
constexpr int64_t kRows = kV * static_cast<int64_t>(kDL);

// kDL E4M3 codes → double value × 2^-120 (exact), as kernels/cpu/linear_fp8.cc's E4M3Scaled.
HWY_INLINE VD E4M3ScaledD(const uint8_t* p) {
  const DD dd;
  const hn::Rebind<float, DD> dfh;
  const hn::Rebind<int32_t, DD> di;
  const hn::Rebind<int8_t, DD> d8;
  const auto b = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
  const auto f = hn::BitCast(dfh, hn::And(hn::ShiftLeft<20>(b), hn::Set(di, static_cast<int32_t>(0x87F00000u))));
  return hn::PromoteTo(dd, f);
}

template <int MT>
HWY_INLINE void Fp8MicroD(const float* q, const float* sa, int64_t K, const uint8_t* wt, const float* ws_t,
                          int64_t roff, float* acc /*[MT][kRows]*/) {
  const DD dd;
  const int64_t nkb = K / 128;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    VD part[MT][kV];
    for (int m = 0; m < MT; ++m)
      for (int v = 0; v < kV; ++v) part[m][v] = hn::Zero(dd);
    const uint8_t* wk = wt + kb * 128 * cpu::kTileRows + roff;
    for (int64_t k = kb * 128; k < kb * 128 + 128; ++k, wk += cpu::kTileRows) {
      HWY_UNROLL(8)
      for (int v = 0; v < kV; ++v) {
        const VD wv = E4M3ScaledD(wk + v * kDL);
        HWY_UNROLL(4)
        for (int m = 0; m < MT; ++m)
          part[m][v] = hn::Add(part[m][v], hn::Mul(hn::Set(dd, static_cast<double>(q[m * K + k])), wv));
      }
    }
    const float sw = ws_t[(kb * 4) * 4];  // the tile's 64 rows lie in one 128-row scale block
    for (int m = 0; m < MT; ++m) {
      const float sc = (sa[m * nkb + kb] * 0.5f) * sw;  // s_a·s_w as the reference (sa is 2·s_a)
      HWY_ALIGN double pd[kRows];
      for (int v = 0; v < kV; ++v) hn::Store(hn::Add(part[m][v], part[m][v]), dd, pd + v * kDL);
      float* am = acc + m * kRows;
      for (int64_t r = 0; r < kRows; ++r) am[r] = am[r] + static_cast<float>(pd[r]) * sc;
    }
  }
}

void LinearFp8Tiles(const float* q, const float* sa, int64_t M, int64_t K, int64_t N, const uint8_t* w,
                    const float* ws, int64_t t0, int64_t t1, float* y) {
  constexpr int kMT = kDL >= 8 ? 2 : 1;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* wt = w + t * K * cpu::kTileRows;
    const float* ws_t = ws + t * (K / 32) * 4;
    for (int64_t roff = 0; roff < cpu::kTileRows && t * cpu::kTileRows + roff < N; roff += kRows) {
      const int64_t n0 = t * cpu::kTileRows + roff, nr = std::min<int64_t>(kRows, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += kMT) {
        HWY_ALIGN float acc[kMT * kRows] = {};
        const int mt = static_cast<int>(std::min<int64_t>(kMT, M - m0));
        if (mt == kMT) {
          Fp8MicroD<kMT>(q + m0 * K, sa + m0 * (K / 128), K, wt, ws_t, roff, acc);
        } else {
          Fp8MicroD<1>(q + m0 * K, sa + m0 * (K / 128), K, wt, ws_t, roff, acc);
        }
        for (int m = 0; m < mt; ++m)
          for (int64_t r = 0; r < nr; ++r) y[(m0 + m) * N + n0 + r] = RoundBf16(acc[m * kRows + r]);
      }
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// The same FP8 linear for finite operands, the weights converted a whole
// vector of codes at a time: per k the 64-row tile's codes are one contiguous
// line; kL codes → kL floats (E4M3ScaledD's bit trick, w·2^-120) → two double
// vectors. Every product (q·2^119)·(w·2^-120) = q·w/2 is exact in double (at
// most 8 significant bits), and so is every partial sum of a 128-block: each
// is a multiple of 2^-19 below 128·448²/2 < 2^24, i.e. at most 43 significant
// bits. So a fused multiply-add gives exactly the bits of the multiply then
// add of Fp8MicroD. The block step per row: ×2 (exact), one rounding to FP32
// (DemoteTo, as the cast), then acc = acc + partial·(s_a·s_w) as separate
// FP32 multiply and add. Non-finite activations or scales take Fp8MicroD (its
// NaN propagation is the oracle's operation order). MT activation rows share
// each converted weight vector; NF float vectors (NF·kL rows) per micro column.
template <int MT, int NF>
HWY_INLINE void Fp8MicroF(const double* qd, const float* sa, int64_t K, const uint8_t* wt, const float* ws_t,
                          int64_t roff, float* acc /*[MT][NF·kL]*/) {
  const DD dd;
  const DF df;
  const hn::Rebind<float, DD> dh;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  constexpr int64_t kR = NF * static_cast<int64_t>(kL);
  const int64_t nkb = K / 128;
  const auto mask = hn::Set(di, static_cast<int32_t>(0x87F00000u));
  for (int64_t kb = 0; kb < nkb; ++kb) {
    VD part[MT][2 * NF];
    for (int m = 0; m < MT; ++m)
      for (int v = 0; v < 2 * NF; ++v) part[m][v] = hn::Zero(dd);
    const uint8_t* wk = wt + kb * 128 * cpu::kTileRows + roff;
    const double* qk = qd + kb * 128;
    for (int64_t k = 0; k < 128; ++k, wk += cpu::kTileRows) {
      hwy::Prefetch(wk + kPrefetchBytes);
      VD qv[MT];
      HWY_UNROLL(4)
      for (int m = 0; m < MT; ++m) qv[m] = hn::Set(dd, qk[m * K + k]);
      HWY_UNROLL(4)
      for (int f = 0; f < NF; ++f) {
        const auto b = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(wk + f * kL)));
        const VF wf = hn::BitCast(df, hn::And(hn::ShiftLeft<20>(b), mask));
        const VD w0 = hn::PromoteTo(dd, hn::LowerHalf(dh, wf));
        const VD w1 = hn::PromoteTo(dd, hn::UpperHalf(dh, wf));
        HWY_UNROLL(4)
        for (int m = 0; m < MT; ++m) {
          part[m][2 * f] = hn::MulAdd(qv[m], w0, part[m][2 * f]);
          part[m][2 * f + 1] = hn::MulAdd(qv[m], w1, part[m][2 * f + 1]);
        }
      }
    }
    const float sw = ws_t[(kb * 4) * 4];  // the tile's 64 rows lie in one 128-row scale block
    for (int m = 0; m < MT; ++m) {
      const auto sc = hn::Set(dh, (sa[m * nkb + kb] * 0.5f) * sw);  // s_a·s_w as the reference (sa is 2·s_a)
      float* am = acc + m * kR;
      for (int v = 0; v < 2 * NF; ++v) {
        const auto pf = hn::DemoteTo(dh, hn::Add(part[m][v], part[m][v]));
        const auto a = hn::Load(dh, am + v * kDL);
        hn::Store(hn::Add(a, hn::Mul(pf, sc)), dh, am + v * kDL);
      }
    }
  }
}

// Rows [m0, m0 + MT) of tile t: every micro column of NF·kL rows.
template <int MT, int NF>
HWY_NOINLINE void Fp8TileF(const double* qd, const float* sa, int64_t K, int64_t N, const uint8_t* wt,
                           const float* ws_t, int64_t n_t0, float* y /*row m0*/) {
  constexpr int64_t kR = NF * static_cast<int64_t>(kL);
  static_assert(cpu::kTileRows % kR == 0, "micro columns tile the 64 rows");
  for (int64_t roff = 0; roff < cpu::kTileRows && n_t0 + roff < N; roff += kR) {
    HWY_ALIGN float acc[MT * kR] = {};
    Fp8MicroF<MT, NF>(qd, sa, K, wt, ws_t, roff, acc);
    const int64_t nr = std::min<int64_t>(kR, N - n_t0 - roff);
    for (int m = 0; m < MT; ++m)
      for (int64_t r = 0; r < nr; ++r) y[m * N + n_t0 + roff + r] = RoundBf16(acc[m * kR + r]);
  }
}

// Up to 4 activation rows per pass over a tile (32 vector registers on
// AVX-512: 16 sums at most; 16 on AVX2: 8).
constexpr bool kWideRegs = kL >= 16;
void LinearFp8TilesF(const double* qd, const float* sa, int64_t M, int64_t K, int64_t N, const uint8_t* w,
                     const float* ws, int64_t t0, int64_t t1, float* y) {
  const int64_t nkb = K / 128;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* wt = w + t * K * cpu::kTileRows;
    const float* ws_t = ws + t * (K / 32) * 4;
    const int64_t n_t0 = t * cpu::kTileRows;
    for (int64_t m0 = 0; m0 < M;) {
      const int64_t mt = std::min<int64_t>(4, M - m0);
      const double* q = qd + m0 * K;
      const float* s = sa + m0 * nkb;
      float* ym = y + m0 * N;
      if (kWideRegs) {
        if (mt == 1) Fp8TileF<1, 4>(q, s, K, N, wt, ws_t, n_t0, ym);
        else if (mt == 2) Fp8TileF<2, 4>(q, s, K, N, wt, ws_t, n_t0, ym);
        else if (mt == 3) Fp8TileF<3, 2>(q, s, K, N, wt, ws_t, n_t0, ym);
        else Fp8TileF<4, 2>(q, s, K, N, wt, ws_t, n_t0, ym);
      } else {
        if (mt == 1) Fp8TileF<1, 4>(q, s, K, N, wt, ws_t, n_t0, ym);
        else if (mt == 2) Fp8TileF<2, 2>(q, s, K, N, wt, ws_t, n_t0, ym);
        else if (mt == 3) Fp8TileF<3, 1>(q, s, K, N, wt, ws_t, n_t0, ym);
        else Fp8TileF<4, 1>(q, s, K, N, wt, ws_t, n_t0, ym);
      }
      m0 += mt;
    }
  }
}
#else
// HWY_SCALAR (one lane): the double-lane kernel above on finite operands too.
void LinearFp8TilesF(const double* qd, const float* sa, int64_t M, int64_t K, int64_t N, const uint8_t* w,
                     const float* ws, int64_t t0, int64_t t1, float* y) {
  (void)qd, (void)sa, (void)M, (void)K, (void)N, (void)w, (void)ws, (void)t0, (void)t1, (void)y;
}
#endif
constexpr bool kHasFp8TilesF = HWY_TARGET != HWY_SCALAR;
bool HasFp8TilesF() { return kHasFp8TilesF; }

// Sparse attention (SparseAttentionRef's arithmetic): per chunk of 64
// candidates the valid rows are decoded once to double in both layouts ([t][c]
// for P·V, [c][t] for the dots); per head the dots run one lane per candidate
// in increasing c, the softmax steps are the scalar code, P·V runs one lane
// per c over the valid candidates in list order (8 vectors of c at a time, so
// the sums are independent chains). Work whose result is discarded or known
// is skipped: the dot vectors past the chunk's last valid candidate (absent
// candidates' scores are −∞ whatever their dot), and, once the running max is
// finite, an absent candidate's exp (exp(−∞ − m) = +0, which adds nothing to
// a sum that is never −0). Returns false when D is not a multiple of the
// double vector width.
bool SparseAttentionV(const float* q, int H, int64_t D, const uint16_t* const* rows, int64_t list_len,
                      const float* sink, float softmax_scale, float* out) {
  constexpr int64_t kChunk = 64;
  constexpr int64_t kNV = kChunk / static_cast<int64_t>(kDL);
  constexpr int64_t kG = kNV < 8 ? kNV : 8;  // dot vectors held at once
  constexpr int64_t kCV = 8;                  // P·V: c vectors held at once
  const DD dd;
  const hn::Rebind<float, DD> dfh;
  const hn::Rebind<uint32_t, DD> du32;
  const hn::Rebind<uint16_t, DD> du16;
  if (D % static_cast<int64_t>(kDL) != 0) return false;
  const float ninf = -std::numeric_limits<float>::infinity();
  thread_local hwy::AlignedFreeUniquePtr<double[]> kv_buf, kvt_buf;
  thread_local hwy::AlignedFreeUniquePtr<float[]> acc_buf;
  thread_local size_t kv_cap = 0, kvt_cap = 0, acc_cap = 0;
  thread_local std::vector<float> sum_exp, mx;
  double* kv = AlignedScratch(kv_buf, kv_cap, kChunk * D);  // the valid rows' elements written per chunk
  double* kvt = AlignedScratch(kvt_buf, kvt_cap, kChunk * D);  // columns t < nt written per chunk
  float* acc_o = AlignedScratch(acc_buf, acc_cap, H * D);
  std::fill(acc_o, acc_o + H * D, 0.0f);
  sum_exp.assign(static_cast<size_t>(H), 0.0f);
  mx.assign(static_cast<size_t>(H), ninf);
  HWY_ALIGN double dot[kChunk];
  float acc_s[kChunk], p[kChunk];
  double pb[kChunk];
  bool valid[kChunk];
  int64_t vt[kChunk];  // the valid candidates, in list order
  for (int64_t c0 = 0; c0 < list_len; c0 += kChunk) {
    int64_t nvalid = 0, last = -1;
    for (int64_t t = 0; t < kChunk; ++t) {
      const int64_t i = c0 + t;
      valid[t] = i < list_len && rows[i] != nullptr;
      if (valid[t]) {
        vt[nvalid++] = t;
        last = t;
      }
    }
    // Dot vectors [0, nv): every valid candidate lies in them.
    const int64_t nv = (last + static_cast<int64_t>(kDL)) / static_cast<int64_t>(kDL);
    const int64_t nt = nv * static_cast<int64_t>(kDL);
    for (int64_t t = 0; t < nt; ++t) {
      if (!valid[t]) {
        for (int64_t c = 0; c < D; ++c) kvt[c * kChunk + t] = 0.0;
        continue;
      }
      const uint16_t* src = rows[c0 + t];
      double* dst = kv + t * D;
      for (int64_t c = 0; c < D; c += static_cast<int64_t>(kDL)) {
        const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + c)));
        hn::Store(hn::PromoteTo(dd, hn::BitCast(dfh, bits)), dd, dst + c);
      }
      for (int64_t c = 0; c < D; ++c) kvt[c * kChunk + t] = dst[c];
    }
    for (int h = 0; h < H; ++h) {
      const float* qh = q + h * D;
      for (int64_t g0 = 0; g0 < nv; g0 += kG) {
        VD acc[kG];
        for (int64_t v = 0; v < kG; ++v) acc[v] = hn::Zero(dd);
        const double* kc = kvt + g0 * kDL;
        if (g0 + kG <= nv) {
          for (int64_t c = 0; c < D; ++c, kc += kChunk) {
            const VD qc = hn::Set(dd, static_cast<double>(qh[c]));
            HWY_UNROLL(8)
            for (int64_t v = 0; v < kG; ++v) acc[v] = hn::Add(acc[v], hn::Mul(qc, hn::Load(dd, kc + v * kDL)));
          }
        } else {
          const int64_t gn = nv - g0;
          for (int64_t c = 0; c < D; ++c, kc += kChunk) {
            const VD qc = hn::Set(dd, static_cast<double>(qh[c]));
            for (int64_t v = 0; v < gn; ++v) acc[v] = hn::Add(acc[v], hn::Mul(qc, hn::Load(dd, kc + v * kDL)));
          }
        }
        for (int64_t v = 0; v < kG && g0 + v < nv; ++v) hn::Store(acc[v], dd, dot + (g0 + v) * kDL);
      }
      float cmax = ninf;
      for (int64_t t = 0; t < kChunk; ++t) {
        acc_s[t] = valid[t] ? static_cast<float>(dot[t]) * softmax_scale : ninf;
        if (valid[t]) cmax = std::max(cmax, acc_s[t]);
      }
      const float prev = mx[h];
      mx[h] = std::max(prev, cmax);
      const float m = mx[h];
      const float sc = Exp32(prev - m);
      double psum = 0.0;
      if (std::isfinite(m)) {
        for (int64_t j = 0; j < nvalid; ++j) {
          const int64_t t = vt[j];
          p[t] = Exp32(acc_s[t] - m);
          psum += p[t];
          pb[t] = static_cast<double>(RoundBf16(p[t]));
        }
      } else {
        for (int64_t t = 0; t < kChunk; ++t) {
          p[t] = Exp32(acc_s[t] - m);
          psum += p[t];
          pb[t] = static_cast<double>(RoundBf16(p[t]));
        }
      }
      sum_exp[h] = sum_exp[h] * sc + static_cast<float>(psum);
      float* ao = acc_o + h * D;
      const auto scv = hn::Set(dfh, sc);
      int64_t c = 0;
      for (; c + kCV * static_cast<int64_t>(kDL) <= D; c += kCV * static_cast<int64_t>(kDL)) {
        VD pv[kCV];
        for (int64_t v = 0; v < kCV; ++v) pv[v] = hn::Zero(dd);
        for (int64_t j = 0; j < nvalid; ++j) {
          const int64_t t = vt[j];
          const VD pt = hn::Set(dd, pb[t]);
          const double* kr = kv + t * D + c;
          HWY_UNROLL(8)
          for (int64_t v = 0; v < kCV; ++v) pv[v] = hn::Add(pv[v], hn::Mul(pt, hn::Load(dd, kr + v * kDL)));
        }
        for (int64_t v = 0; v < kCV; ++v) {
          float* a = ao + c + v * kDL;
          hn::StoreU(hn::Add(hn::Mul(hn::LoadU(dfh, a), scv), hn::DemoteTo(dfh, pv[v])), dfh, a);
        }
      }
      for (; c < D; c += static_cast<int64_t>(kDL)) {
        VD pv = hn::Zero(dd);
        for (int64_t j = 0; j < nvalid; ++j)
          pv = hn::Add(pv, hn::Mul(hn::Set(dd, pb[vt[j]]), hn::Load(dd, kv + vt[j] * D + c)));
        hn::StoreU(hn::Add(hn::Mul(hn::LoadU(dfh, ao + c), scv), hn::DemoteTo(dfh, pv)), dfh, ao + c);
      }
    }
  }
  for (int h = 0; h < H; ++h) {
    const float se = sum_exp[h] + Exp32(sink[h] - mx[h]);
    for (int64_t c = 0; c < D; ++c) out[h * D + c] = RoundBf16(acc_o[h * D + c] / se);
  }
  return true;
}

// FP4 linear (routed experts), tiles [t0, t1), in exact integer arithmetic:
// w·2 is an integer in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12} and q·2^9 an integer
// below 2^18 (E4M3's quantum is 2^-9), so a 32-column group partial ×2^10 is
// an int32 sum (|Σ| < 2^27) of int32 products, exact in any order; it is
// rounded to FP32 once (int → float), ×2^-10 (exact), and the block step is
// the reference's acc = acc + (partial·s_a)·s_w. One int32 lane per output row.
using DI = hn::ScalableTag<int32_t>;
using VI = hn::Vec<DI>;
constexpr size_t kIL = hn::MaxLanes(DI());
constexpr int kIV = static_cast<int>(64 / kIL > 4 ? 4 : 64 / kIL);  // int vectors per micro column
constexpr int64_t kIRows = kIV * static_cast<int64_t>(kIL);
HWY_ALIGN static constexpr int32_t kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Nibble codes in bits 3..0 of each lane (higher bits ignored) → 2·E2M1 value.
HWY_INLINE VI E2M1x2(VI code) {
  const DI di;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return VI{_mm512_permutexvar_epi32(code.raw, hn::Load(di, kE2M1x2).raw)};  // reads index bits 3..0
#else
  return hn::GatherIndex(di, kE2M1x2, hn::And(code, hn::Set(di, 15)));
#endif
}

struct E8M0Table {
  float v[256];
  E8M0Table() {
    for (int b = 0; b < 256; ++b) v[b] = E8M0ToFloat(static_cast<uint8_t>(b));
  }
};

template <int MT>
HWY_INLINE void Fp4MicroI(const int32_t* q, const float* sa, int64_t K, const uint8_t* wt, const uint8_t* st,
                          int64_t roff, float* acc /*[MT][kIRows]*/) {
  const DI di;
  const int64_t groups = K / 32, nkb = K / 128;
  const int32_t* w32 = reinterpret_cast<const int32_t*>(wt);
  static const E8M0Table e8m0;
  for (int64_t g = 0; g < groups; ++g) {
    VI part[MT][kIV];
    for (int m = 0; m < MT; ++m)
      for (int v = 0; v < kIV; ++v) part[m][v] = hn::Zero(di);
    for (int64_t k8 = g * 32; k8 < g * 32 + 32; k8 += 8) {
      const int32_t* wj = w32 + (k8 / 8) * cpu::kTileRows + roff;
      HWY_UNROLL(4)
      for (int v = 0; v < kIV; ++v) {
        VI code = hn::LoadU(di, wj + v * kIL);
        HWY_UNROLL(8)
        for (int i = 0; i < 8; ++i) {
          const VI wv = E2M1x2(code);
          HWY_UNROLL(4)
          for (int m = 0; m < MT; ++m) part[m][v] = hn::Add(part[m][v], hn::Mul(hn::Set(di, q[m * K + k8 + i]), wv));
          code = hn::ShiftRight<4>(code);
        }
      }
    }
    const uint8_t* sg = st + g * cpu::kTileRows + roff;
    for (int m = 0; m < MT; ++m) {
      const float s_a = sa[m * nkb + g / 4] * 0.5f;  // sa is 2·s_a
      HWY_ALIGN int32_t ps[kIRows];
      for (int v = 0; v < kIV; ++v) hn::Store(part[m][v], di, ps + v * kIL);
      float* am = acc + m * kIRows;
      for (int64_t r = 0; r < kIRows; ++r) {
        const float pf = static_cast<float>(ps[r]) * 0x1p-10f;
        am[r] = am[r] + pf * s_a * e8m0.v[sg[r]];
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
// The same integer partials with the products looked up instead of
// multiplied: per column k and activation row m the products of q[m][k] with
// the 16 codes' 2·E2M1 values form a table (exact int32, |·| < 2^22); a
// code's product is then one lane permutation of it (AVX-512: the 16-entry
// table; AVX2: the 8 magnitudes and their negations, chosen by the sign bit).
// The group step is vectorised: int → FP32 (one rounding, as the cast),
// ×2^-10 (exact), (·s_a)·s_w with s_w = 2^(b−127) formed from the scale byte
// b (1..254: PackFp4 leaves 0x00 / 0xFF to the scalar path), then acc + ·;
// each a separate FP32 operation in the reference's order.
struct Fp4Tab {
#if HWY_TARGET == HWY_AVX2
  VI pos, neg;
#else
  VI t;
#endif
};
HWY_INLINE Fp4Tab MakeFp4Tab(int32_t q) {
  const DI di;
  const VI qv = hn::Set(di, q);
#if HWY_TARGET == HWY_AVX2
  const VI pos = hn::Mul(qv, hn::Load(di, kE2M1x2));  // lanes 0..7: the magnitudes 0, 1, 2, 3, 4, 6, 8, 12
  return {pos, hn::Neg(pos)};
#else
  return {hn::Mul(qv, hn::Load(di, kE2M1x2))};
#endif
}
// q·2·E2M1(code) for the code in bits 3..0 of each lane (higher bits ignored).
HWY_INLINE VI Fp4Product(const Fp4Tab& tb, VI code) {
#if HWY_TARGET == HWY_AVX2
  const __m256i a = _mm256_permutevar8x32_epi32(tb.pos.raw, code.raw);  // reads index bits 2..0
  const __m256i b = _mm256_permutevar8x32_epi32(tb.neg.raw, code.raw);
  const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(code.raw, 28));  // bit 3 → sign bit
  return VI{_mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), sign))};
#else
  return VI{_mm512_permutexvar_epi32(code.raw, tb.t.raw)};  // reads index bits 3..0
#endif
}

template <int MT>
HWY_INLINE void Fp4MicroT(const int32_t* q, const float* sa, int64_t K, const uint8_t* wt, const uint8_t* st,
                          int64_t roff, float* acc /*[MT][kIRows]*/) {
  const DI di;
  const hn::Rebind<float, DI> df;
  const hn::Rebind<uint8_t, DI> d8;
  const int64_t groups = K / 32, nkb = K / 128;
  const int32_t* w32 = reinterpret_cast<const int32_t*>(wt);
  const auto two_m10 = hn::Set(df, 0x1p-10f);
  for (int64_t g = 0; g < groups; ++g) {
    VI part[MT][kIV];
    for (int m = 0; m < MT; ++m)
      for (int v = 0; v < kIV; ++v) part[m][v] = hn::Zero(di);
    for (int64_t k8 = g * 32; k8 < g * 32 + 32; k8 += 8) {
      const int32_t* wj = w32 + (k8 / 8) * cpu::kTileRows + roff;
      for (int v = 0; v < kIV * static_cast<int>(kIL) * 4; v += 64)
        hwy::Prefetch(reinterpret_cast<const uint8_t*>(wj) + kPrefetchBytes + v);
      HWY_UNROLL(8)
      for (int i = 0; i < 8; ++i) {
        Fp4Tab tb[MT];
        for (int m = 0; m < MT; ++m) tb[m] = MakeFp4Tab(q[m * K + k8 + i]);
        HWY_UNROLL(4)
        for (int v = 0; v < kIV; ++v) {
          // Nibble i of each lane into bits 3..0 (the codes are reloaded, not carried: L1).
          const VI code = hn::ShiftRightSame(hn::LoadU(di, wj + v * kIL), 4 * i);
          HWY_UNROLL(4)
          for (int m = 0; m < MT; ++m) part[m][v] = hn::Add(part[m][v], Fp4Product(tb[m], code));
        }
      }
    }
    const uint8_t* sg = st + g * cpu::kTileRows + roff;
    VF sw[kIV];
    for (int v = 0; v < kIV; ++v)
      sw[v] = hn::BitCast(df, hn::ShiftLeft<23>(hn::PromoteTo(di, hn::LoadU(d8, sg + v * kIL))));
    for (int m = 0; m < MT; ++m) {
      const auto s_a = hn::Set(df, sa[m * nkb + g / 4] * 0.5f);  // sa is 2·s_a
      float* am = acc + m * kIRows;
      for (int v = 0; v < kIV; ++v) {
        const auto pf = hn::Mul(hn::ConvertTo(df, part[m][v]), two_m10);
        hn::Store(hn::Add(hn::Load(df, am + v * kIL), hn::Mul(hn::Mul(pf, s_a), sw[v])), df, am + v * kIL);
      }
    }
  }
}
constexpr bool kHasFp4MicroT = true;
#else
template <int MT>
HWY_INLINE void Fp4MicroT(const int32_t* q, const float* sa, int64_t K, const uint8_t* wt, const uint8_t* st,
                          int64_t roff, float* acc) {
  Fp4MicroI<MT>(q, sa, K, wt, st, roff, acc);
}
constexpr bool kHasFp4MicroT = false;
#endif

void LinearFp4Tiles(const int32_t* q, const float* sa, int64_t M, int64_t K, int64_t N, const uint8_t* w,
                    const uint8_t* s, int64_t t0, int64_t t1, float* y) {
  constexpr int kMT = kIL >= 16 ? 4 : kIL >= 8 ? 2 : 1;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* wt = w + t * (K / 2) * cpu::kTileRows;
    const uint8_t* st = s + t * (K / 32) * cpu::kTileRows;
    for (int64_t roff = 0; roff < cpu::kTileRows && t * cpu::kTileRows + roff < N; roff += kIRows) {
      const int64_t n0 = t * cpu::kTileRows + roff, nr = std::min<int64_t>(kIRows, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += kMT) {
        HWY_ALIGN float acc[kMT * kIRows] = {};
        const int mt = static_cast<int>(std::min<int64_t>(kMT, M - m0));
        if (mt == kMT) {
          Fp4MicroT<kMT>(q + m0 * K, sa + m0 * (K / 128), K, wt, st, roff, acc);
        } else if (kHasFp4MicroT && mt == 2) {
          Fp4MicroT<2>(q + m0 * K, sa + m0 * (K / 128), K, wt, st, roff, acc);
        } else if (kHasFp4MicroT && mt == 3) {
          Fp4MicroT<3>(q + m0 * K, sa + m0 * (K / 128), K, wt, st, roff, acc);
        } else {
          for (int m = 0; m < mt; ++m)
            Fp4MicroT<1>(q + (m0 + m) * K, sa + (m0 + m) * (K / 128), K, wt, st, roff, acc + m * kIRows);
        }
        for (int m = 0; m < mt; ++m)
          for (int64_t r = 0; r < nr; ++r) y[(m0 + m) * N + n0 + r] = RoundBf16(acc[m * kIRows + r]);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::v4
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::v4 {
namespace {
// Whether a packed linear of `macs` multiply-adds splits its output tiles over
// the OpenMP team: from 2^17 (the decode GEMVs of a 1024-wide model, ~0.5 M,
// are split; a fork/join costs a few µs), never inside a parallel region (the
// routed experts run one per thread) and never with one tile. Each output
// element is computed by one lane of one thread either way.
bool SplitTiles(int64_t macs, int64_t tiles) {
  return macs >= (int64_t{1} << 17) && tiles >= 2 && omp_get_max_threads() > 1 && !InParallelRegion();
}

// The packed linears' per-thread activation scratch (only growing): the
// quantised activations q and block scales sa, q as doubles (FP8) or integers
// (FP4).
struct LinearScratch {
  std::vector<float> q, sa;
  std::vector<double> qd;
  std::vector<int32_t> qi;
  void Reserve(int64_t M, int64_t K) {
    if (static_cast<int64_t>(q.size()) < M * K) q.resize(M * K), qd.resize(M * K), qi.resize(M * K);
    if (static_cast<int64_t>(sa.size()) < M * (K / 128)) sa.resize(M * (K / 128));
  }
};
thread_local LinearScratch tl_linear;
}  // namespace

void ReserveLinearScratch(int64_t M, int64_t K) { tl_linear.Reserve(M, K); }

HWY_EXPORT(HadamardV);
HWY_EXPORT(IndexerScoresV);
HWY_EXPORT(LinearFp8Tiles);
HWY_EXPORT(LinearFp8TilesF);
HWY_EXPORT(HasFp8TilesF);
HWY_EXPORT(LinearFp4Tiles);
HWY_EXPORT(SparseAttentionV);

// Heads are independent (each its own statistics and output), so a large call
// made outside any parallel region (a single query row: a batch-1 decode
// step) splits them over the team, each thread decoding the chunks itself.
void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* rows, int64_t list_len,
                     const float* sink, float softmax_scale, float* out) {
  auto run = [&](int h0, int h1) {
    if (!HWY_DYNAMIC_DISPATCH(SparseAttentionV)(q + h0 * D, h1 - h0, D, rows, list_len, sink + h0, softmax_scale,
                                                out + h0 * D))
      SparseAttentionRef(q + h0 * D, h1 - h0, D, rows, list_len, sink + h0, softmax_scale, out + h0 * D);
  };
  const int nt = std::min(omp_get_max_threads(), H);
  if (nt < 2 || InParallelRegion() || list_len * H * D < (int64_t{1} << 18)) {
    run(0, H);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const int h0 = static_cast<int>(int64_t{H} * t / n), h1 = static_cast<int>(int64_t{H} * (t + 1) / n);
    if (h1 > h0) run(h0, h1);
  }
}

void Hadamard(float* x, int64_t n, float scale) {
  if (!HWY_DYNAMIC_DISPATCH(HadamardV)(x, n, scale)) HadamardRef(x, n, scale);
}

void IndexerScores(const float* q, const float* w, int nh, int64_t D, const float* keys, int64_t n,
                   float* score) {
  if (n <= 0) return;
  // Every key's score is its own lane's work: chunks of keys split over the
  // team give the same bits (ParallelForStealing runs them in order on the
  // calling thread inside a parallel region or with one thread).
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  auto* fn = HWY_DYNAMIC_DISPATCH(IndexerScoresV);
  if (chunks < 2 || n * nh * D < (int64_t{1} << 19)) {
    fn(q, w, nh, D, keys, n, score);
    return;
  }
  ParallelForStealing(chunks, [&](int64_t t) {
    const int64_t j0 = t * kChunk;
    fn(q, w, nh, D, keys + j0 * D, std::min(kChunk, n - j0), score + j0);
  });
}

PackedFp8Weight PackFp8Weight(const Fp8Weight& w) {
  PackedFp8Weight p;
  p.src = w;
  if (w.in % 128 == 0) p.packed = cpu::PackFp8(ref::Fp8Weight{w.w, w.scale, w.out, w.in, 128});
  p.fast = w.in % 128 == 0 && !p.packed.use_ref;
  return p;
}

void LinearFp8(const float* x, int64_t M, const PackedFp8Weight& w, float* y) {
  if (M <= 0) return;
  if (!w.fast) {
    LinearFp8(x, M, w.src, y);
    return;
  }
  const int64_t K = w.src.in, N = w.src.out, tiles = w.packed.tiles;
  LinearScratch& scr = tl_linear;
  scr.Reserve(M, K);
  std::vector<float>& q = scr.q;
  std::vector<float>& sa = scr.sa;
  cpu::QuantizeActRows(x, M, K, 128, q.data(), sa.data());
  const float* qp = q.data();
  const float* sp = sa.data();
  const uint8_t* wp = w.packed.w.get();
  const float* wsp = w.packed.ws.get();
  // Finite operands (every block's scale and every code): the fused kernel on
  // the activations as doubles; otherwise (NaN / Inf rows) the
  // multiply-then-add kernel, whose NaN propagation is the oracle's order.
  std::vector<double>& qd = scr.qd;
  bool finite = HWY_DYNAMIC_DISPATCH(HasFp8TilesF)();
  for (int64_t i = 0; i < M * (K / 128) && finite; ++i) finite = std::isfinite(sa[i]);
  if (finite) {
    for (int64_t i = 0; i < M * K && finite; ++i) {
      finite = std::isfinite(qp[i]);
      qd[i] = static_cast<double>(qp[i]);
    }
  }
  if (finite) {
    const double* qdp = qd.data();
    const auto fnf = HWY_DYNAMIC_DISPATCH(LinearFp8TilesF);
    if (!SplitTiles(M * N * K, tiles)) {
      fnf(qdp, sp, M, K, N, wp, wsp, 0, tiles, y);
      return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) fnf(qdp, sp, M, K, N, wp, wsp, t, t + 1, y);
    return;
  }
  const auto fn = HWY_DYNAMIC_DISPATCH(LinearFp8Tiles);
  if (!SplitTiles(M * N * K, tiles)) {
    fn(qp, sp, M, K, N, wp, wsp, 0, tiles, y);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) fn(qp, sp, M, K, N, wp, wsp, t, t + 1, y);
}

PackedFp4Weight PackFp4Weight(const Fp4Weight& w) {
  PackedFp4Weight p;
  p.src = w;
  if (w.in % 128 == 0) p.packed = cpu::PackFp4(ref::Fp4Weight{w.w, w.scale, w.out, w.in});
  p.fast = w.in % 128 == 0 && !p.packed.use_ref;
  return p;
}

void LinearFp4(const float* x, int64_t M, const PackedFp4Weight& w, float* y) {
  if (M <= 0) return;
  if (!w.fast) {
    LinearFp4(x, M, w.src, y);
    return;
  }
  const int64_t K = w.src.in, N = w.src.out, tiles = w.packed.tiles;
  LinearScratch& scr = tl_linear;
  scr.Reserve(M, K);
  std::vector<float>& q = scr.q;
  std::vector<float>& sa = scr.sa;
  std::vector<int32_t>& qi = scr.qi;
  cpu::QuantizeActRows(x, M, K, 128, q.data(), sa.data());
  // q = E4M3 value × 2^119 → the integer value × 2^9; a NaN / Inf row takes the double path.
  for (int64_t i = 0; i < M * K; ++i) {
    const float v = q[i] * 0x1p-110f;
    if (!(std::fabs(v) <= 0x1p20f)) {
      LinearFp4(x, M, w.src, y);
      return;
    }
    qi[i] = static_cast<int32_t>(v);
  }
  const int32_t* qp = qi.data();
  const float* sp = sa.data();
  const uint8_t* wp = w.packed.w.get();
  const uint8_t* ssp = w.packed.s.get();
  const auto fn = HWY_DYNAMIC_DISPATCH(LinearFp4Tiles);
  if (!SplitTiles(M * N * K, tiles)) {
    fn(qp, sp, M, K, N, wp, ssp, 0, tiles, y);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) fn(qp, sp, M, K, N, wp, ssp, t, t + 1, y);
}

}  // namespace deepinfer::v4
#endif  // HWY_ONCE
