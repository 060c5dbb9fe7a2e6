// deepinfer/model/v4/ops.cc — see ops.h.
#include "model/v4/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <omp.h>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/ref/ref_math.h"

namespace deepinfer::v4 {

namespace {
constexpr int kActBlock = 128;
constexpr int64_t kParallelWork = int64_t{1} << 18;
int CeilLog2(int64_t n) {
  int k = 0;
  while ((int64_t{1} << k) < n) ++k;
  return k;
}
// Per-thread scratch (thread_local at the call site) filled with n
// value-initialised elements, as the per-call vector it replaces; its
// capacity only grows, so a call at a size already seen allocates nothing
// (model/v4/workspace.h).
template <class T>
T* Scratch(std::vector<T>& v, int64_t n) {
  v.assign(static_cast<size_t>(n), T{});
  return v.data();
}
}  // namespace

void LinearFp8Ref(const float* x, int64_t M, const Fp8Weight& w, float* y) {
  const int64_t K = w.in, N = w.out, nkb = K / kActBlock;
#pragma omp parallel if(M * N * K > kParallelWork && !InParallelRegion())
  {
    std::vector<uint8_t> q(K), sa(nkb);
    std::vector<double> qd(K);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      QuantizeActE4M3(x + m * K, K, kActBlock, q.data(), sa.data());
      for (int64_t k = 0; k < K; ++k) qd[k] = E4M3ToFloat(q[k]);
      for (int64_t n = 0; n < N; ++n) {
        const uint8_t* wr = w.w + n * K;
        float acc = 0.0f;
        for (int64_t kb = 0; kb < nkb; ++kb) {
          double part = 0.0;
          for (int64_t k = kb * kActBlock; k < (kb + 1) * kActBlock; ++k) part += qd[k] * E4M3ToFloat(wr[k]);
          const float sc = E8M0ToFloat(sa[kb]) * E8M0ToFloat(w.scale[(n / kActBlock) * nkb + kb]);
          acc = acc + static_cast<float>(part) * sc;
        }
        y[m * N + n] = RoundBf16(acc);
      }
    }
  }
}

void LinearFp4Ref(const float* x, int64_t M, const Fp4Weight& w, float* y) {
  const int64_t K = w.in, N = w.out, nkb = K / kActBlock, ng = K / 32;
#pragma omp parallel if(M * N * K > kParallelWork && !InParallelRegion())
  {
    std::vector<uint8_t> q(K), sa(nkb);
    std::vector<double> qd(K);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      QuantizeActE4M3(x + m * K, K, kActBlock, q.data(), sa.data());
      for (int64_t k = 0; k < K; ++k) qd[k] = E4M3ToFloat(q[k]);
      for (int64_t n = 0; n < N; ++n) {
        const uint8_t* wr = w.w + n * (K / 2);
        float acc = 0.0f;
        for (int64_t g = 0; g < ng; ++g) {
          double part = 0.0;
          for (int64_t k = g * 32; k < (g + 1) * 32; ++k) part += qd[k] * E2M1ToFloat(E2M1PackedCode(wr, k));
          acc = acc + static_cast<float>(part) * E8M0ToFloat(sa[g / 4]) * E8M0ToFloat(w.scale[n * ng + g]);
        }
        y[m * N + n] = RoundBf16(acc);
      }
    }
  }
}

// Fast forms: the block partial is an exact sum (every product E4M3·E4M3 or
// E2M1·E4M3 is a multiple of 2^-18 resp. 2^-10 below 2^18, and 128 of them need
// at most 43 bits), so any summation order in double gives the same value; 8
// independent accumulators, decoded through byte tables, rows × outputs in
// parallel. Bit-identical to the Ref forms (v4_ops_test).
namespace {
struct Tables {
  double e4m3[256];
  double fp4lo[256], fp4hi[256];
  Tables() {
    for (int b = 0; b < 256; ++b) {
      e4m3[b] = E4M3ToFloat(static_cast<uint8_t>(b));
      fp4lo[b] = E2M1ToFloat(static_cast<uint8_t>(b & 0xF));
      fp4hi[b] = E2M1ToFloat(static_cast<uint8_t>(b >> 4));
    }
  }
};
const Tables& Tab() {
  static const Tables t;
  return t;
}
}  // namespace

namespace {
// Activations of M rows: E4M3 codes decoded to double [M, K] and their block scales [M, K/128].
void QuantizeRows(const float* x, int64_t M, int64_t K, std::vector<double>* qd, std::vector<float>* sa) {
  const Tables& tb = Tab();
  const int64_t nkb = K / kActBlock;
  qd->resize(M * K);
  sa->resize(M * nkb);
#pragma omp parallel if(M * K > kParallelWork)
  {
    thread_local std::vector<uint8_t> q_tl, s_tl;
    uint8_t* q = Scratch(q_tl, K);
    uint8_t* s = Scratch(s_tl, nkb);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      QuantizeActE4M3(x + m * K, K, kActBlock, q, s);
      for (int64_t k = 0; k < K; ++k) (*qd)[m * K + k] = tb.e4m3[q[k]];
      for (int64_t kb = 0; kb < nkb; ++kb) (*sa)[m * nkb + kb] = E8M0ToFloat(s[kb]);
    }
  }
}

// Exact sum of n products (n a multiple of 8) with 8 independent accumulators.
inline double Dot8(const double* a, const double* b, int64_t n) {
  double acc[8] = {};
  for (int64_t k = 0; k < n; k += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[k + u] * b[k + u];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

// Per output n: its weight row decoded once to double, then every activation row.
void LinearFp8(const float* x, int64_t M, const Fp8Weight& w, float* y) {
  const int64_t K = w.in, N = w.out, nkb = K / kActBlock;
  const Tables& tb = Tab();
  thread_local std::vector<double> qd;
  thread_local std::vector<float> sa;
  QuantizeRows(x, M, K, &qd, &sa);
  const double* qdp = qd.data();  // the calling thread's scratch (qd and sa name each thread's own in the region)
  const float* sap = sa.data();
#pragma omp parallel if(M * N * K > kParallelWork && !InParallelRegion())
  {
    thread_local std::vector<double> wd_tl;
    thread_local std::vector<float> sw_tl;
    double* wd = Scratch(wd_tl, K);
    float* sw = Scratch(sw_tl, nkb);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* wr = w.w + n * K;
      for (int64_t k = 0; k < K; ++k) wd[k] = tb.e4m3[wr[k]];
      for (int64_t kb = 0; kb < nkb; ++kb) sw[kb] = E8M0ToFloat(w.scale[(n / kActBlock) * nkb + kb]);
      for (int64_t m = 0; m < M; ++m) {
        const double* qr = qdp + m * K;
        float acc = 0.0f;
        for (int64_t kb = 0; kb < nkb; ++kb) {
          const double part = Dot8(qr + kb * kActBlock, wd + kb * kActBlock, kActBlock);
          acc = acc + static_cast<float>(part) * (sap[m * nkb + kb] * sw[kb]);
        }
        y[m * N + n] = RoundBf16(acc);
      }
    }
  }
}

void LinearFp4(const float* x, int64_t M, const Fp4Weight& w, float* y) {
  const int64_t K = w.in, N = w.out, nkb = K / kActBlock, ng = K / 32;
  const Tables& tb = Tab();
  thread_local std::vector<double> qd;
  thread_local std::vector<float> sa;
  QuantizeRows(x, M, K, &qd, &sa);
  const double* qdp = qd.data();  // the calling thread's scratch (qd and sa name each thread's own in the region)
  const float* sap = sa.data();
#pragma omp parallel if(M * N * K > kParallelWork && !InParallelRegion())
  {
    thread_local std::vector<double> wd_tl;
    thread_local std::vector<float> sw_tl;
    double* wd = Scratch(wd_tl, K);
    float* sw = Scratch(sw_tl, ng);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* wr = w.w + n * (K / 2);
      for (int64_t j = 0; j < K / 2; ++j) {
        wd[2 * j] = tb.fp4lo[wr[j]];
        wd[2 * j + 1] = tb.fp4hi[wr[j]];
      }
      for (int64_t g = 0; g < ng; ++g) sw[g] = E8M0ToFloat(w.scale[n * ng + g]);
      for (int64_t m = 0; m < M; ++m) {
        const double* qr = qdp + m * K;
        float acc = 0.0f;
        for (int64_t g = 0; g < ng; ++g) {
          const double part = Dot8(qr + g * 32, wd + g * 32, 32);
          acc = acc + static_cast<float>(part) * sap[m * nkb + g / 4] * sw[g];
        }
        y[m * N + n] = RoundBf16(acc);
      }
    }
  }
}

float Exp32(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

void SparseAttentionRef(const float* q, int H, int64_t D, const uint16_t* const* rows, int64_t list_len,
                        const float* sink, float softmax_scale, float* out) {
  constexpr int64_t kChunk = 64;
  const float ninf = -std::numeric_limits<float>::infinity();
  thread_local std::vector<double> kv_tl;
  thread_local std::vector<float> acc_o_tl, p_tl;
  thread_local std::vector<char> valid_tl;
  double* kv = Scratch(kv_tl, kChunk * D);
  float* acc_o = Scratch(acc_o_tl, D);
  float* p = Scratch(p_tl, kChunk);
  char* valid = Scratch(valid_tl, kChunk);
  for (int h = 0; h < H; ++h) {
    const float* qh = q + h * D;
    std::fill(acc_o, acc_o + D, 0.0f);
    float sum_exp = 0.0f, m = ninf;
    for (int64_t c0 = 0; c0 < list_len; c0 += kChunk) {
      float acc_s[kChunk];
      float cmax = ninf;
      for (int64_t t = 0; t < kChunk; ++t) {
        const int64_t i = c0 + t;
        valid[t] = i < list_len && rows[i] != nullptr;
        if (!valid[t]) {
          acc_s[t] = ninf;
          continue;
        }
        double dot = 0.0;
        for (int64_t c = 0; c < D; ++c) {
          kv[t * D + c] = Bf16ToFloat(rows[i][c]);
          dot += static_cast<double>(qh[c]) * kv[t * D + c];
        }
        acc_s[t] = static_cast<float>(dot) * softmax_scale;
        cmax = std::max(cmax, acc_s[t]);
      }
      const float prev = m;
      m = std::max(prev, cmax);
      const float sc = Exp32(prev - m);
      double psum = 0.0;
      for (int64_t t = 0; t < kChunk; ++t) {
        p[t] = Exp32(acc_s[t] - m);
        psum += p[t];
      }
      sum_exp = sum_exp * sc + static_cast<float>(psum);
      for (int64_t c = 0; c < D; ++c) {
        double pv = 0.0;
        for (int64_t t = 0; t < kChunk; ++t)
          if (valid[t]) pv += static_cast<double>(RoundBf16(p[t])) * kv[t * D + c];
        acc_o[c] = acc_o[c] * sc;
        acc_o[c] = acc_o[c] + static_cast<float>(pv);
      }
    }
    sum_exp = sum_exp + Exp32(sink[h] - m);
    for (int64_t c = 0; c < D; ++c) out[h * D + c] = RoundBf16(acc_o[c] / sum_exp);
  }
}

namespace {
// The kernel part of hc_split_sinkhorn for one row, from its mixes m·ρ
// (mixes [mix], overwritten): pre [hc], post [hc], comb [hc, hc]; rs, cs [hc] scratch.
void HcSplitRow(float* mixes, int hc, const float* base, const float* scale, int sinkhorn_iters, float hc_eps,
                float* pr, float* po, float* c, float* rs, float* cs) {
  auto sigmoid = [](float v) { return 1.0f / (1.0f + Exp32(-v)); };
  for (int j = 0; j < hc; ++j) {
    pr[j] = sigmoid(mixes[j] * scale[0] + base[j]) + hc_eps;
    po[j] = 2.0f * sigmoid(mixes[hc + j] * scale[1] + base[hc + j]);
  }
  for (int j = 0; j < hc * hc; ++j) c[j] = mixes[2 * hc + j] * scale[2] + base[2 * hc + j];
  for (int j = 0; j < hc; ++j) {
    float mx = c[j * hc];
    for (int k = 1; k < hc; ++k) mx = std::max(mx, c[j * hc + k]);
    for (int k = 0; k < hc; ++k) c[j * hc + k] = Exp32(c[j * hc + k] - mx);
  }
  auto row_sums = [&]() {
    for (int j = 0; j < hc; ++j) {
      float a = c[j * hc];
      for (int k = 1; k < hc; ++k) a = a + c[j * hc + k];
      rs[j] = a;
    }
  };
  auto col_sums = [&]() {
    for (int k = 0; k < hc; ++k) {
      float a = c[k];
      for (int j = 1; j < hc; ++j) a = a + c[j * hc + k];
      cs[k] = a;
    }
  };
  ref::SinkhornNormalize(c, hc, sinkhorn_iters, hc_eps, rs, cs, row_sums, col_sums);
}

// ρ of one row: 1/sqrt(mean(f²) + eps), torch's sum order; sq [flat] scratch.
float HcRsq(const float* f, int64_t flat, float norm_eps, float* sq) {
  for (int64_t i = 0; i < flat; ++i) sq[i] = f[i] * f[i];
  return 1.0f / std::sqrt(ref::TorchSum(sq, flat) / static_cast<float>(flat) + norm_eps);
}
}  // namespace

void HcMixes(const float* X, int64_t M, int hc, int64_t d, const float* fn, const float* base, const float* scale,
             float norm_eps, int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb) {
  const int64_t flat = hc * d;
  const int64_t mix = (2 + hc) * hc;
#pragma omp parallel if(M * mix * flat > kParallelWork)
  {
    thread_local std::vector<float> sq_tl, mixes_tl, rs_tl, cs_tl;
    float* sq = Scratch(sq_tl, flat);
    float* mixes = Scratch(mixes_tl, mix);
    float* rs = Scratch(rs_tl, hc);
    float* cs = Scratch(cs_tl, hc);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; ++r) {
      const float* f = X + r * flat;
      const float rsq = HcRsq(f, flat, norm_eps, sq);
      for (int64_t j = 0; j < mix; ++j) {
        const float* w = fn + j * flat;
        float acc = 0.0f;
        for (int64_t i = 0; i < flat; ++i) acc += f[i] * w[i];
        mixes[j] = acc * rsq;
      }
      HcSplitRow(mixes, hc, base, scale, sinkhorn_iters, hc_eps, pre + r * hc, post + r * hc, comb + r * hc * hc, rs,
                 cs);
    }
  }
}

void HcMixes(const float* X, int64_t M, int hc, int64_t d, const cpu::PackedF32& fn, const float* base,
             const float* scale, float norm_eps, int sinkhorn_iters, float hc_eps, float* pre, float* post,
             float* comb) {
  const int64_t flat = hc * d;
  const int64_t mix = (2 + hc) * hc;
  // The M·mix dot products: cpu::LinearF32 forms each as the loop above does
  // (acc = 0; acc += f[i]·w[i] in increasing i, multiply then add).
  thread_local std::vector<float> dots_tl;
  float* dots = Scratch(dots_tl, M * mix);
  cpu::LinearF32(X, M, fn, dots);
#pragma omp parallel if(M * flat > kParallelWork)
  {
    thread_local std::vector<float> sq_tl, mixes_tl, rs_tl, cs_tl;
    float* sq = Scratch(sq_tl, flat);
    float* mixes = Scratch(mixes_tl, mix);
    float* rs = Scratch(rs_tl, hc);
    float* cs = Scratch(cs_tl, hc);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; ++r) {
      const float rsq = HcRsq(X + r * flat, flat, norm_eps, sq);
      for (int64_t j = 0; j < mix; ++j) mixes[j] = dots[r * mix + j] * rsq;
      HcSplitRow(mixes, hc, base, scale, sinkhorn_iters, hc_eps, pre + r * hc, post + r * hc, comb + r * hc * hc, rs,
                 cs);
    }
  }
}

void IndexerScoresRef(const float* q, const float* w, int nh, int64_t D, const float* keys, int64_t n,
                      float* score) {
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int h = 0; h < nh; ++h) {
      const float* qh = q + h * D;
      const float* kj = keys + j * D;
      float dot = 0.0f;
      for (int64_t c = 0; c < D; ++c) dot += qh[c] * kj[c];
      acc += RoundBf16(std::max(RoundBf16(dot), 0.0f) * w[h]);
    }
    score[j] = RoundBf16(acc);
  }
}

void HadamardRef(float* x, int64_t n, float scale) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t b = 0; b < n; b += 2 * h)
      for (int64_t i = b; i < b + h; ++i) {
        const float a = x[i], c = x[i + h];
        x[i] = a + c;
        x[i + h] = a - c;
      }
  for (int64_t i = 0; i < n; ++i) x[i] = RoundBf16(x[i] * scale);
}

float OuterSum(const float* v, int64_t n) {
  constexpr int kLevels = 4;
  const int64_t level_power = std::max<int64_t>(4, CeilLog2(n) / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  float acc[kLevels] = {};
  int64_t i = 0;
  for (; i + level_step <= n;) {
    for (int64_t j = 0; j < level_step; ++j, ++i) acc[0] += v[i];
    for (int j = 1; j < kLevels; ++j) {
      acc[j] += acc[j - 1];
      acc[j - 1] = 0.0f;
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < n; ++i) acc[0] += v[i];
  for (int j = 1; j < kLevels; ++j) acc[0] += acc[j];
  return acc[0];
}

// Without NaN, "v[a] > v[b]" is a strict weak order whose ties are equal
// values, so the stable sort's order is the total order (value descending,
// index ascending) and its first k are partial_sort's under that order, which
// needs no buffer (std::stable_sort allocates one on every call). With a NaN
// the stable sort itself runs, as before.
void StableTopK(const float* v, int64_t n, int64_t k, int64_t* idx) {
  thread_local std::vector<int64_t> order;
  if (static_cast<int64_t>(order.capacity()) < n) order.reserve(static_cast<size_t>((n + 1023) / 1024 * 1024));
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  bool nan = false;
  for (int64_t i = 0; i < n && !nan; ++i) nan = std::isnan(v[i]);
  if (nan) {
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  } else {
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return v[a] > v[b] || (!(v[b] > v[a]) && a < b);
    });
  }
  for (int64_t j = 0; j < k; ++j) idx[j] = order[j];
}

}  // namespace deepinfer::v4
