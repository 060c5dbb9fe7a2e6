// deepinfer/model/v4/ops_hwy.cc — Highway forms of V4 operators (ops.h):
// the Hadamard butterfly, the C4 indexer scoring and the 128×128-block FP8
// linear on the repacked weight. Each is bit-identical to its scalar oracle
// in ops.cc (HadamardRef, IndexerScoresRef, LinearFp8Ref): every output value
// is formed by the same FP32 operations in the same order, one SIMD lane per
// output element (no sum is split across lanes; -ffp-contract=off, no FMA).
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
//   * FP4 linear: exact integer group partials (see Fp4MicroI).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/v4/ops_hwy.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// Sparse attention (SparseAttentionRef's arithmetic): per chunk of 64
// candidates the rows are decoded once to double in both layouts ([t][c] for
// P·V, [c][t] for the dots); per head the dots run one lane per candidate in
// increasing c, the softmax steps are the scalar code, P·V runs one lane per c
// over the valid candidates in list order. Returns false when D is not a
// multiple of the double vector width.
bool SparseAttentionV(const float* q, int H, int64_t D, const uint16_t* const* rows, int64_t list_len,
                      const float* sink, float softmax_scale, float* out) {
  constexpr int64_t kChunk = 64;
  constexpr int64_t kNV = kChunk / static_cast<int64_t>(kDL);
  constexpr int64_t kG = kNV < 8 ? kNV : 8;  // dot vectors held at once
  const DD dd;
  const hn::Rebind<float, DD> dfh;
  if (D % static_cast<int64_t>(kDL) != 0) return false;
  const float ninf = -std::numeric_limits<float>::infinity();
  thread_local hwy::AlignedFreeUniquePtr<double[]> kv_buf, kvt_buf;
  thread_local hwy::AlignedFreeUniquePtr<float[]> acc_buf;
  thread_local size_t kv_cap = 0, kvt_cap = 0, acc_cap = 0;
  thread_local std::vector<float> sum_exp, mx;
  double* kv = AlignedScratch(kv_buf, kv_cap, kChunk * D);  // kv, kvt: every element written per chunk
  double* kvt = AlignedScratch(kvt_buf, kvt_cap, kChunk * D);
  float* acc_o = AlignedScratch(acc_buf, acc_cap, H * D);
  std::fill(acc_o, acc_o + H * D, 0.0f);
  sum_exp.assign(static_cast<size_t>(H), 0.0f);
  mx.assign(static_cast<size_t>(H), ninf);
  HWY_ALIGN double dot[kChunk];
  float acc_s[kChunk], p[kChunk];
  double pb[kChunk];
  bool valid[kChunk];
  for (int64_t c0 = 0; c0 < list_len; c0 += kChunk) {
    for (int64_t t = 0; t < kChunk; ++t) {
      const int64_t i = c0 + t;
      valid[t] = i < list_len && rows[i] != nullptr;
      for (int64_t c = 0; c < D; ++c) {
        const double v = valid[t] ? static_cast<double>(Bf16ToFloat(rows[i][c])) : 0.0;
        kv[t * D + c] = v;
        kvt[c * kChunk + t] = v;
      }
    }
    for (int h = 0; h < H; ++h) {
      const float* qh = q + h * D;
      for (int64_t g0 = 0; g0 < kNV; g0 += kG) {
        VD acc[kG];
        for (int64_t v = 0; v < kG; ++v) acc[v] = hn::Zero(dd);
        const double* kc = kvt + g0 * kDL;
        for (int64_t c = 0; c < D; ++c, kc += kChunk) {
          const VD qc = hn::Set(dd, static_cast<double>(qh[c]));
          HWY_UNROLL(8)
          for (int64_t v = 0; v < kG; ++v) acc[v] = hn::Add(acc[v], hn::Mul(qc, hn::Load(dd, kc + v * kDL)));
        }
        for (int64_t v = 0; v < kG; ++v) hn::Store(acc[v], dd, dot + (g0 + v) * kDL);
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
      for (int64_t t = 0; t < kChunk; ++t) {
        p[t] = Exp32(acc_s[t] - m);
        psum += p[t];
        pb[t] = static_cast<double>(RoundBf16(p[t]));
      }
      sum_exp[h] = sum_exp[h] * sc + static_cast<float>(psum);
      float* ao = acc_o + h * D;
      const auto scv = hn::Set(dfh, sc);
      for (int64_t c = 0; c < D; c += static_cast<int64_t>(kDL)) {
        VD pv = hn::Zero(dd);
        for (int64_t t = 0; t < kChunk; ++t)
          if (valid[t]) pv = hn::Add(pv, hn::Mul(hn::Set(dd, pb[t]), hn::Load(dd, kv + t * D + c)));
        const auto a = hn::Mul(hn::LoadU(dfh, ao + c), scv);
        hn::StoreU(hn::Add(a, hn::DemoteTo(dfh, pv)), dfh, ao + c);
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

void LinearFp4Tiles(const int32_t* q, const float* sa, int64_t M, int64_t K, int64_t N, const uint8_t* w,
                    const uint8_t* s, int64_t t0, int64_t t1, float* y) {
  constexpr int kMT = kIL >= 8 ? 4 : 1;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* wt = w + t * (K / 2) * cpu::kTileRows;
    const uint8_t* st = s + t * (K / 32) * cpu::kTileRows;
    for (int64_t roff = 0; roff < cpu::kTileRows && t * cpu::kTileRows + roff < N; roff += kIRows) {
      const int64_t n0 = t * cpu::kTileRows + roff, nr = std::min<int64_t>(kIRows, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += kMT) {
        HWY_ALIGN float acc[kMT * kIRows] = {};
        const int mt = static_cast<int>(std::min<int64_t>(kMT, M - m0));
        if (mt == kMT) {
          Fp4MicroI<kMT>(q + m0 * K, sa + m0 * (K / 128), K, wt, st, roff, acc);
        } else {
          for (int m = 0; m < mt; ++m)
            Fp4MicroI<1>(q + (m0 + m) * K, sa + (m0 + m) * (K / 128), K, wt, st, roff, acc + m * kIRows);
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
HWY_EXPORT(HadamardV);
HWY_EXPORT(IndexerScoresV);
HWY_EXPORT(LinearFp8Tiles);
HWY_EXPORT(LinearFp4Tiles);
HWY_EXPORT(SparseAttentionV);

void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* rows, int64_t list_len,
                     const float* sink, float softmax_scale, float* out) {
  if (!HWY_DYNAMIC_DISPATCH(SparseAttentionV)(q, H, D, rows, list_len, sink, softmax_scale, out))
    SparseAttentionRef(q, H, D, rows, list_len, sink, softmax_scale, out);
}

void Hadamard(float* x, int64_t n, float scale) {
  if (!HWY_DYNAMIC_DISPATCH(HadamardV)(x, n, scale)) HadamardRef(x, n, scale);
}

void IndexerScores(const float* q, const float* w, int nh, int64_t D, const float* keys, int64_t n,
                   float* score) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(IndexerScoresV)(q, w, nh, D, keys, n, score);
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
  thread_local std::vector<float> q, sa;
  if (static_cast<int64_t>(q.size()) < M * K) q.resize(M * K);
  if (static_cast<int64_t>(sa.size()) < M * (K / 128)) sa.resize(M * (K / 128));
  cpu::QuantizeActRows(x, M, K, 128, q.data(), sa.data());
  const float* qp = q.data();
  const float* sp = sa.data();
  const uint8_t* wp = w.packed.w.get();
  const float* wsp = w.packed.ws.get();
  const auto fn = HWY_DYNAMIC_DISPATCH(LinearFp8Tiles);
  if (M * N * K < (int64_t{1} << 20) || tiles < 2) {
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
  thread_local std::vector<float> q, sa;
  thread_local std::vector<int32_t> qi;
  if (static_cast<int64_t>(q.size()) < M * K) q.resize(M * K), qi.resize(M * K);
  if (static_cast<int64_t>(sa.size()) < M * (K / 128)) sa.resize(M * (K / 128));
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
  if (M * N * K < (int64_t{1} << 20) || tiles < 2) {
    fn(qp, sp, M, K, N, wp, ssp, 0, tiles, y);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) fn(qp, sp, M, K, N, wp, ssp, t, t + 1, y);
}

}  // namespace deepinfer::v4
#endif  // HWY_ONCE
