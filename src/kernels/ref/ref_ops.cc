// Scalar reference operators; see ref_ops.h for the contract of each.
#include "kernels/ref/ref_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/ref/ref_math.h"

namespace deepinfer::ref {

namespace {
// Below this many multiply-adds an operator runs on the calling thread: an
// OpenMP region costs more than it saves (results do not depend on it).
constexpr int64_t kParallelWork = int64_t{1} << 20;
}  // namespace

// ------------------------------------------------------------------ linears

void LinearFp8(const float* x, int64_t M, const Fp8Weight& w, int act_block, float* y, Fp8Format act_format) {
  const int64_t K = w.in, N = w.out;
  const int B = w.block;
  if (act_block <= 0 || K % act_block != 0)
    Fail(ErrorKind::kInvalidArgument, "LinearFp8: activation block {} does not divide the input width {}", act_block,
         K);
  if (B <= 0) Fail(ErrorKind::kInvalidArgument, "LinearFp8: weight block {} is not positive", B);
  const int64_t kblocks = K / act_block;
  const int64_t scale_cols = (K + B - 1) / B;
  // The reference's fp8_gemm requires act_block == weight block (32 in V4.1).
#pragma omp parallel if(M * N * K > kParallelWork)
  {
    std::vector<uint8_t> q(K), sa(kblocks);
    std::vector<float> qf(K), saf(kblocks);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      QuantizeActE4M3(x + m * K, K, act_block, q.data(), sa.data(), act_format);
      for (int64_t k = 0; k < K; ++k) qf[k] = E4M3ToFloat(q[k]);
      for (int64_t b = 0; b < kblocks; ++b) saf[b] = E8M0ToFloat(sa[b]);
      float* yr = y + m * N;
      for (int64_t n = 0; n < N; ++n) {
        const uint8_t* wr = w.w + n * K;
        const uint8_t* sr = w.scale + (n / B) * scale_cols;
        float acc = 0.0f;
        for (int64_t b = 0; b < kblocks; ++b) {
          float partial = 0.0f;
          const int64_t k0 = b * act_block;
          for (int64_t k = k0; k < k0 + act_block; ++k) partial += qf[k] * E4M3ToFloat(wr[k]);
          acc += (partial * saf[b]) * E8M0ToFloat(sr[k0 / B]);
        }
        yr[n] = RoundBf16(acc);
      }
    }
  }
}

void LinearFp4(const float* x, int64_t M, const Fp4Weight& w, int act_block, float* y, Fp8Format act_format) {
  const int64_t K = w.in, N = w.out;
  if (act_block <= 0 || K % act_block != 0 || K % 32 != 0)
    Fail(ErrorKind::kInvalidArgument,
         "LinearFp4: activation block {} and the 32-column scale groups must divide the input width {}", act_block, K);
  const int64_t kblocks = K / act_block;
  const int64_t groups = K / 32;
#pragma omp parallel if(M * N * K > kParallelWork)
  {
    std::vector<uint8_t> q(K), sa(kblocks);
    std::vector<float> qf(K), saf(kblocks);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      QuantizeActE4M3(x + m * K, K, act_block, q.data(), sa.data(), act_format);
      for (int64_t k = 0; k < K; ++k) qf[k] = E4M3ToFloat(q[k]);
      for (int64_t b = 0; b < kblocks; ++b) saf[b] = E8M0ToFloat(sa[b]);
      float* yr = y + m * N;
      for (int64_t n = 0; n < N; ++n) {
        const uint8_t* wr = w.w + n * (K / 2);
        const uint8_t* sr = w.scale + n * groups;
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          float partial = 0.0f;
          const int64_t k0 = g * 32;
          for (int64_t k = k0; k < k0 + 32; ++k) partial += qf[k] * E2M1ToFloat(E2M1PackedCode(wr, k));
          acc += (partial * saf[k0 / act_block]) * E8M0ToFloat(sr[g]);
        }
        yr[n] = RoundBf16(acc);
      }
    }
  }
}

void LinearBf16(const float* x, int64_t M, const Bf16Weight& w, float* y) {
  const int64_t K = w.in, N = w.out;
#pragma omp parallel for schedule(static) collapse(2) if(M * N * K > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + m * K;
      const uint16_t* wr = w.w + n * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * Bf16ToFloat(wr[k]);
      y[m * N + n] = RoundBf16(acc);
    }
  }
}

void LinearF32Bf16W(const float* x, int64_t M, const Bf16Weight& w, float* y) {
  const int64_t K = w.in, N = w.out;
#pragma omp parallel for schedule(static) collapse(2) if(M * N * K > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + m * K;
      const uint16_t* wr = w.w + n * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * Bf16ToFloat(wr[k]);
      y[m * N + n] = acc;
    }
  }
}

void LinearF32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y) {
#pragma omp parallel for schedule(static) collapse(2) if(M * N * K > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + m * K;
      const float* wr = w + n * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * wr[k];
      y[m * N + n] = acc;
    }
  }
}

void GroupedLinearBf16(const float* o, int64_t M, int groups, const Bf16Weight& wa, float* z) {
  const int64_t Kg = wa.in;               // per-group input width
  const int64_t R = wa.out / groups;      // per-group output width
  const int64_t in_row = Kg * groups, out_row = wa.out;
#pragma omp parallel for schedule(static) collapse(2) if(M * wa.out * Kg > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < wa.out; ++n) {
      const int64_t g = n / R;
      const float* orow = o + m * in_row + g * Kg;
      const uint16_t* wr = wa.w + n * Kg;
      float acc = 0.0f;
      for (int64_t k = 0; k < Kg; ++k) acc += orow[k] * Bf16ToFloat(wr[k]);
      z[m * out_row + n] = RoundBf16(acc);
    }
  }
}

// ------------------------------------------------------------------ norms

void RmsNorm(const float* x, int64_t M, int64_t n, const uint16_t* w_bf16, float eps, float* y) {
  ParallelFor(M, M * n > kParallelWork / 16, [&](int64_t m) {
    thread_local std::vector<float> sq;  // grows, never shrinks: no allocation per step
    if (sq.size() < static_cast<size_t>(n)) sq.resize(static_cast<size_t>(n));
    const float* xr = x + m * n;
    for (int64_t i = 0; i < n; ++i) sq[i] = xr[i] * xr[i];
    const float var = TorchSum(sq.data(), n) / static_cast<float>(n);
    const float r = 1.0f / std::sqrt(var + eps);
    float* yr = y + m * n;
    for (int64_t i = 0; i < n; ++i) yr[i] = RoundBf16(Bf16ToFloat(w_bf16[i]) * (xr[i] * r));
  });
}

// ------------------------------------------------------------------ RoPE

RopeTable::RopeTable(int64_t rope_dim, double base, int64_t yarn_original_len, double factor,
                     double beta_fast, double beta_slow)
    : rope_dim_(rope_dim), theta_(rope_dim / 2) {
  const int64_t half = rope_dim / 2;
  const float base_f = static_cast<float>(base);
  for (int64_t k = 0; k < half; ++k) {
    const float e = static_cast<float>(2 * k) / static_cast<float>(rope_dim);
    theta_[k] = 1.0f / SleefPowf(base_f, e);
  }
  if (yarn_original_len > 0) {
    auto corrected_dim = [&](double rotations) {
      return static_cast<double>(rope_dim) *
             std::log(static_cast<double>(yarn_original_len) / (rotations * 2.0 * M_PI)) /
             (2.0 * std::log(base));
    };
    const double low = std::max(std::floor(corrected_dim(beta_fast)), 0.0);
    const double high = std::min(std::ceil(corrected_dim(beta_slow)), static_cast<double>(rope_dim - 1));
    const float denom = static_cast<float>(std::max(high - low, 1e-3));
    const float low_f = static_cast<float>(low);
    const float factor_f = static_cast<float>(factor);
    for (int64_t k = 0; k < half; ++k) {
      float ramp = (static_cast<float>(k) - low_f) / denom;
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float smooth = 1.0f - ramp;
      const float f = theta_[k];
      theta_[k] = (f / factor_f) * (1.0f - smooth) + f * smooth;
    }
  }
}

void RopeTable::CosSin(int64_t pos, float* cs, float* sn) const {
  const float p = static_cast<float>(pos);
  for (size_t k = 0; k < theta_.size(); ++k) {
    const float a = p * theta_[k];
    cs[k] = std::cos(a);
    sn[k] = std::sin(a);
  }
}

namespace {
// One vector's rotation by the pairs' cos/sin (RopeTable::Apply).
void RotatePairs(float* x, int64_t half, const float* cs, const float* sn, bool inverse) {
  for (int64_t k = 0; k < half; ++k) {
    const float a = x[2 * k], b = x[2 * k + 1];
    const float c = cs[k], d = inverse ? -sn[k] : sn[k];
    const float ac = a * c, bd = b * d, ad = a * d, bc = b * c;
    x[2 * k] = RoundBf16(ac - bd);
    x[2 * k + 1] = RoundBf16(ad + bc);
  }
}
}  // namespace

void RopeTable::Apply(float* x, int64_t pos, bool inverse) const { ApplyHeads(x, 1, 0, pos, inverse); }

void RopeTable::ApplyHeads(float* x, int64_t heads, int64_t stride, int64_t pos, bool inverse) const {
  const int64_t half = rope_dim_ / 2;
  float cs[512], sn[512];
  CosSin(pos, cs, sn);
  for (int64_t h = 0; h < heads; ++h) RotatePairs(x + h * stride, half, cs, sn, inverse);
}

// ------------------------------------------------------------------ attention

void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* kv,
                     const int32_t* slot, int n, int32_t list_len, const float* sink,
                     float softmax_scale, float* out) {
  constexpr int32_t kChunk = 64;
  std::vector<float> kvf(static_cast<size_t>(n) * D);
  for (int i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) kvf[i * D + d] = Bf16ToFloat(kv[i][d]);
  std::vector<float> acc(D), part(D), pchunk(kChunk), s(kChunk);
  std::vector<int> members;
  for (int h = 0; h < H; ++h) {
    const float* qh = q + h * D;
    float m = -1e30f, sum_exp = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    int i = 0;
    for (int32_t c0 = 0; c0 < list_len; c0 += kChunk) {
      const int32_t clen = std::min(kChunk, list_len - c0);
      members.clear();
      while (i < n && slot[i] < c0 + clen) members.push_back(i++);
      if (members.empty()) continue;  // all absent: scale 1, zero contributions
      float cmax = -std::numeric_limits<float>::infinity();
      for (size_t t = 0; t < members.size(); ++t) {
        const float* kr = kvf.data() + members[t] * D;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qh[d] * kr[d];
        s[t] = dot * softmax_scale;
        cmax = std::max(cmax, s[t]);
      }
      const float m_new = std::max(m, cmax);
      const float rescale = SleefExpf(m - m_new);
      std::fill(pchunk.begin(), pchunk.begin() + clen, 0.0f);
      std::fill(part.begin(), part.end(), 0.0f);
      for (size_t t = 0; t < members.size(); ++t) {
        const float p = SleefExpf(s[t] - m_new);
        pchunk[slot[members[t]] - c0] = p;
        const float pb = RoundBf16(p);
        const float* kr = kvf.data() + members[t] * D;
        for (int64_t d = 0; d < D; ++d) part[d] += pb * kr[d];
      }
      sum_exp = sum_exp * rescale + TorchSum(pchunk.data(), clen);
      for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * rescale + part[d];
      m = m_new;
    }
    sum_exp = sum_exp + SleefExpf(sink[h] - m);
    float* oh = out + h * D;
    for (int64_t d = 0; d < D; ++d) oh[d] = RoundBf16(acc[d] / sum_exp);
  }
}

// ------------------------------------------------------------------ mHC

void HcMixesTail(const float* mixes, int hc, const float* base, const float* scale, int sinkhorn_iters, float hc_eps,
                 int32_t sig_vec, float* rs, float* cs, float* pre, float* post, float* comb) {
  for (int j = 0; j < hc; ++j) {
    const bool vec = j < sig_vec;
    pre[j] = TorchSigmoid(mixes[j] * scale[0] + base[j], vec) + hc_eps;
    post[j] = 2.0f * TorchSigmoid(mixes[hc + j] * scale[1] + base[hc + j], vec);
  }
  float* c = comb;
  for (int j = 0; j < hc * hc; ++j) c[j] = mixes[2 * hc + j] * scale[2] + base[2 * hc + j];
  // softmax over k (exp via torch.exp → SLEEF on every element), + eps
  for (int j = 0; j < hc; ++j) {
    float mx = c[j * hc];
    for (int k = 1; k < hc; ++k) mx = std::max(mx, c[j * hc + k]);
    for (int k = 0; k < hc; ++k) c[j * hc + k] = SleefExpf(c[j * hc + k] - mx);
  }
  auto row_sums = [&]() {
    for (int j = 0; j < hc; ++j) rs[j] = TorchSum(c + j * hc, hc);
  };
  auto col_sums = [&]() {
    for (int k = 0; k < hc; ++k) {
      float a = 0.0f;
      for (int j = 0; j < hc; ++j) a += c[j * hc + k];
      cs[k] = a;
    }
  };
  SinkhornNormalize(c, hc, sinkhorn_iters, hc_eps, rs, cs, row_sums, col_sums);
}

void HcMixes(const float* X, int64_t M, int hc, int64_t d, const float* fn, const float* base,
             const float* scale, float norm_eps, int sinkhorn_iters, float hc_eps,
             const int32_t* sig_vec, float* pre, float* post, float* comb) {
  const int64_t flat = hc * d;
  const int64_t mix = (2 + hc) * hc;
#pragma omp parallel if(M * mix * flat > kParallelWork)
  {
    std::vector<float> sq(flat), mixes(mix), rs(hc), cs(hc);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; ++r) {
      const float* f = X + r * flat;
      for (int64_t i = 0; i < flat; ++i) sq[i] = f[i] * f[i];
      const float rsq = 1.0f / std::sqrt(TorchSum(sq.data(), flat) / static_cast<float>(flat) + norm_eps);
      for (int64_t j = 0; j < mix; ++j) {
        const float* w = fn + j * flat;
        float acc = 0.0f;
        for (int64_t i = 0; i < flat; ++i) acc += f[i] * w[i];
        mixes[j] = acc * rsq;
      }
      HcMixesTail(mixes.data(), hc, base, scale, sinkhorn_iters, hc_eps, sig_vec[r], rs.data(), cs.data(),
                  pre + r * hc, post + r * hc, comb + r * hc * hc);
    }
  }
}

void HcCollapse(const float* X, const float* pre, int64_t M, int hc, int64_t d, float* x) {
#pragma omp parallel for schedule(static) if(M * hc * d > kParallelWork / 16)
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t i = 0; i < d; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < hc; ++j) acc += pre[r * hc + j] * X[(r * hc + j) * d + i];
      x[r * d + i] = RoundBf16(acc);
    }
  }
}

void HcExpand(const float* v, const float* X, const float* post, const float* comb, int64_t M,
              int hc, int64_t d, float* Xout) {
#pragma omp parallel for schedule(static) if(M * hc * hc * d > kParallelWork / 16)
  for (int64_t r = 0; r < M; ++r) {
    const float* cb = comb + r * hc * hc;
    for (int k = 0; k < hc; ++k) {
      for (int64_t i = 0; i < d; ++i) {
        float acc = 0.0f;
        for (int j = 0; j < hc; ++j) acc += cb[j * hc + k] * X[(r * hc + j) * d + i];
        Xout[(r * hc + k) * d + i] = RoundBf16(post[r * hc + k] * v[r * d + i] + acc);
      }
    }
  }
}

// ------------------------------------------------------------------ router

void Router(const float* x, int64_t M, const Bf16Weight& gate, const float* const* bias, int topk,
            float gate_temp, bool norm_topk_prob, float route_scale, const int32_t* softplus_vec,
            int32_t* indices, float* weights) {
  const int64_t E = gate.out, K = gate.in;
#pragma omp parallel if(M * E * K > kParallelWork)
  {
    std::vector<float> s(E), sel(E);
    std::vector<int64_t> idx(topk);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      for (int64_t e = 0; e < E; ++e) {
        const uint16_t* wr = gate.w + e * K;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += xr[k] * Bf16ToFloat(wr[k]);
        const float logit = acc / gate_temp;
        const float sp = e < softplus_vec[m] ? TorchSoftplus(logit)
                                             : (logit > 20.0f ? logit : std::log1p(std::exp(logit)));
        s[e] = std::sqrt(sp);
        sel[e] = s[e] + bias[m][e];
      }
      TorchTopK(sel.data(), E, topk, /*sorted=*/true, idx.data());
      float* wr = weights + m * topk;
      for (int i = 0; i < topk; ++i) {
        indices[m * topk + i] = static_cast<int32_t>(idx[i]);
        wr[i] = s[idx[i]];
      }
      if (norm_topk_prob && topk > 1) {
        const float denom = TorchSum(wr, topk) + 1e-20f;
        for (int i = 0; i < topk; ++i) wr[i] = wr[i] / denom;
      }
      for (int i = 0; i < topk; ++i) wr[i] = wr[i] * route_scale;
    }
  }
}

int32_t VectorPathCount(int64_t r, int64_t rows, int64_t per_row, int lanes) {
  // vectorized_loop handles 2 vectors per step.
  const int64_t step = 2 * lanes;
  const int64_t vec_end = (rows * per_row) / step * step;
  const int64_t c = vec_end - r * per_row;
  return static_cast<int32_t>(std::clamp<int64_t>(c, 0, per_row));
}

}  // namespace deepinfer::ref
