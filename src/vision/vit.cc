// deepinfer/vision/vit.cc — see vit.h.
#include "vision/vit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "format/numerics.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "vision/image.h"
#include "vision/vit_attn.h"
#include "vision/vit_linear.h"

namespace deepinfer::vision {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::vector<uint16_t> Bf16(const TensorStore& store, const std::string& name, const std::vector<int64_t>& shape) {
  const TensorView& t = store.Get(name);
  if (t.dtype != DType::kBF16)
    Fail(ErrorKind::kCorruptData, "tensor {} in {}: expected dtype BF16, found {}", name, store.dir().string(),
         DTypeName(t.dtype));
  if (t.shape != shape)
    Fail(ErrorKind::kCorruptData, "tensor {} in {}: expected shape {}, found {}", name, store.dir().string(),
         ShapeStr(shape), ShapeStr(t.shape));
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 2);
  return v;
}

std::vector<float> ToFloat(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = Bf16ToFloat(b[i]);
  return f;
}

VisionLinear Linear(const TensorStore& store, const std::string& prefix, int64_t out, int64_t in, bool bias) {
  VisionLinear l;
  l.out = out;
  l.in = in;
  l.w = Bf16(store, prefix + ".weight", {out, in});
  if (bias) l.bias = ToFloat(Bf16(store, prefix + ".bias", {out}));
  l.wT.resize(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) l.wT[i * out + o] = Bf16ToFloat(l.w[o * in + i]);
  return l;
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ATen's Vectorized<float>::fexp_u20 (AVX2 form, one lane): 2^(x·log2 e) with
// the fraction's correction from a cubic in Horner form (FMAs), the exponent
// bits formed by fma(2^23, ·, 127·2^23) and truncated to an integer. Relative
// error about 1e-4: the value the CPU flash kernel rounds to BF16 for P·V.
float TorchFexpU20(float x) {
  const float log2e = BitsToFloat(0x3fb8aa3bu), ln_min = BitsToFloat(0xc2aeac50u), ln_max = BitsToFloat(0x42b17218u);
  if (x < ln_min) return 0.0f;
  if (x > ln_max) return INFINITY;
  const float c0 = 0.00010703434948458272f, c1 = 0.30354260500649682f, c2 = static_cast<float>(-0.22433836478672356),
              c3 = static_cast<float>(-0.079204240219773236);
  float src = x * log2e;
  const float frac = src - std::floor(src);
  float r = std::fma(frac, c3, c2);
  r = std::fma(frac, r, c1);
  r = std::fma(frac, r, c0);
  src = src - r;
  const float t = std::fma(8388608.0f, src, 8388608.0f * 127.0f);
  const int32_t bits = static_cast<int32_t>(t);  // cvttps: truncation
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

// One query row of torch's CPU flash attention for BF16 inputs
// (FlashAttentionKernel.cpp, one kv block since n <= 512): s = (q·k)·scale in
// FP32, e = exp(s − max) with fexp_u20 over the first n − n%8 keys (a 16-wide
// loop of two 8-lane halves, then one 8-lane step) and std::exp on the scalar
// tail, sum = the lane sums (half 0 + 8-lane step, + half 1, AVX2
// reduce_all) plus the tail in order; e is rounded to BF16 in place (the P of
// P·V). Returns 1/sum.
float TorchFlashRow(float* s, int64_t n, float scale) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = s[j] * scale;
    mx = std::max(mx, s[j]);
  }
  const int64_t n16 = n - n % 16, n8 = n - n % 8;
  for (int64_t j = 0; j < n; ++j) s[j] = j < n8 ? TorchFexpU20(s[j] - mx) : std::exp(s[j] - mx);
  float v0[8] = {}, v1[8] = {}, vt[8] = {};
  for (int64_t d = 0; d < n16; d += 16)
    for (int l = 0; l < 8; ++l) {
      v0[l] += s[d + l];
      v1[l] += s[d + 8 + l];
    }
  for (int64_t d = n16; d < n8; d += 8)
    for (int l = 0; l < 8; ++l) vt[l] += s[d + l];
  float a[8], b[4];
  for (int l = 0; l < 8; ++l) a[l] = (v0[l] + vt[l]) + v1[l];
  for (int l = 0; l < 4; ++l) b[l] = a[l] + a[l + 4];
  float sum = (b[0] + b[2]) + (b[1] + b[3]);
  for (int64_t j = n8; j < n; ++j) sum += s[j];
  for (int64_t j = 0; j < n; ++j) s[j] = RoundBf16(s[j]);
  return 1.0f / sum;
}

// Torch's vectorised erf (AVX2 Vectorized<float>::erf): Abramowitz–Stegun
// 7.1.26 with FMAs and SLEEF exp.
float TorchErf(float x) {
  const float ax = std::fabs(x);
  const float t = 1.0f / std::fma(0.3275911f, ax, 1.0f);
  float r = std::fma(1.061405429f, t, -1.453152027f);
  r = std::fma(r, t, 1.421413741f);
  r = std::fma(r, t, -0.284496736f);
  r = std::fma(r, t, 0.254829592f);
  const float e = ref::SleefExpf(-(x * x));
  const float y = std::fma(-e * t, r, 1.0f);
  return std::signbit(x) ? -y : y;
}

// F.gelu (exact) on a BF16 value, vectorised path: x·0.5·(1 + erf(x·√½)).
float TorchGelu(float x) {
  const float a = static_cast<float>(M_SQRT1_2);
  return RoundBf16((x * 0.5f) * (1.0f + TorchErf(x * a)));
}

}  // namespace

void VisionLinearForward(const float* x, int64_t M, const VisionLinear& l, float* y) {
  if (l.transposed_input)
    VitLinearRowsSum4(x, M, l.in, l.wT.data(), l.out, y);
  else
    VitLinearRows(x, M, l.in, l.wT.data(), l.out, y);
  const int64_t N = l.out;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float v = y[m * N + n];
      if (!l.bias.empty()) v = v + l.bias[n];
      y[m * N + n] = RoundBf16(v);
    }
}

std::unique_ptr<VisionTower> VisionTower::Bind(const TensorStore& store, const ModelConfig& cfg) {
  if (!cfg.vision_enabled())
    Fail(ErrorKind::kInvalidArgument, "model in {} has no vision tower (vision_config absent or 0 layers)",
         store.dir().string());
  auto t = std::make_unique<VisionTower>();
  t->dim_ = cfg.dim;
  t->vdim_ = cfg.vision_dim;
  t->inter_ = cfg.vision_inter_dim;
  t->heads_ = cfg.vision_n_heads;
  t->ratio_ = cfg.vision_downsample_ratio;
  t->patch_ = cfg.vision_patch_size;
  t->rope_theta_ = cfg.vision_rope_theta;
  const int64_t D = t->vdim_, I = t->inter_, d = t->dim_, p = t->patch_, r = t->ratio_;
  t->patch_embed_ = Linear(store, "vision.patch_embed.proj", D, 3 * p * p, true);
  for (int b = 0; b < cfg.vision_n_layers; ++b) {
    const std::string q = fmt::format("vision.blocks.{}.", b);
    VisionBlockWeights w;
    w.norm1 = Bf16(store, q + "norm1.weight", {D});
    w.norm2 = Bf16(store, q + "norm2.weight", {D});
    w.wqkv = Linear(store, q + "attn.wqkv", 3 * D, D, true);
    w.wo = Linear(store, q + "attn.wo", D, D, true);
    w.w1 = Linear(store, q + "mlp.w1", 2 * I, D, false);
    w.w2 = Linear(store, q + "mlp.w2", D, I, false);
    t->blocks_.push_back(std::move(w));
  }
  t->norm_ = Bf16(store, "vision.norm.weight", {D});
  t->aligner_w1_ = Linear(store, "aligner.w1", d, D * r * r, true);
  t->aligner_w2_ = Linear(store, "aligner.w2", d, d, true);
  // The reference's aligner input is the transposed unfold (a strided view): torch's GEMM
  // takes its transposed-operand path there (vit_linear.h).
  t->aligner_w1_.transposed_input = true;
  t->image_start_ = ToFloat(Bf16(store, "image_start", {d}));
  t->image_end_ = ToFloat(Bf16(store, "image_end", {d}));
  t->image_newline_ = ToFloat(Bf16(store, "image_newline", {d}));
  return t;
}

std::vector<float> VisionTower::Vit(const float* patches, int nh, int nw) const {
  const int64_t n = static_cast<int64_t>(nh) * nw, D = vdim_, I = inter_, H = heads_, hd = D / H, half = hd / 2;
  std::vector<float> x(n * D), h(n * D), qkv(n * 3 * D), o(n * D), g(n * 2 * I), a(n * I);
  VisionLinearForward(patches, n, patch_embed_, x.data());

  // Rotary tables [n, half]: angles [row·θ_0..θ_{R/2−1}, col·θ_0..] with R = half.
  const int64_t R = half;
  std::vector<float> inv(R / 2);
  for (int64_t j = 0; j < R / 2; ++j)
    inv[j] = 1.0f / ref::SleefPowf(static_cast<float>(rope_theta_), static_cast<float>(2 * j) / static_cast<float>(R));
  std::vector<float> cs(n * half), sn(n * half);
  for (int64_t i = 0; i < n; ++i)
    for (int axis = 0; axis < 2; ++axis)
      for (int64_t j = 0; j < R / 2; ++j) {
        const float pos = static_cast<float>(axis == 0 ? i / nw : i % nw);
        const float ang = pos * inv[j];
        cs[i * half + axis * (R / 2) + j] = std::cos(ang);
        sn[i * half + axis * (R / 2) + j] = std::sin(ang);
      }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));

  std::vector<float> qs(n * D), ks(n * D), vv(n * D), kt(n * D), scores(n), orow(hd);
  for (const VisionBlockWeights& b : blocks_) {
    ref::RmsNorm(x.data(), n, D, b.norm1.data(), 1e-6f, h.data());
    VisionLinearForward(h.data(), n, b.wqkv, qkv.data());
    // q, k rotated (FP32, rounded to BF16); the flash kernel scales the scores.
    for (int64_t i = 0; i < n; ++i)
      for (int64_t hh = 0; hh < H; ++hh)
        for (int part = 0; part < 3; ++part) {
          const float* src = qkv.data() + i * 3 * D + part * D + hh * hd;
          float* dst = (part == 0 ? qs.data() : part == 1 ? ks.data() : vv.data()) + i * D + hh * hd;
          if (part == 2) {
            std::memcpy(dst, src, hd * sizeof(float));
            continue;
          }
          for (int64_t j = 0; j < half; ++j) {
            const float x1 = src[j], x2 = src[j + half], c = cs[i * half + j], sv = sn[i * half + j];
            const float a1 = x1 * c, b1 = x2 * sv, a2 = x2 * c, b2 = x1 * sv;
            dst[j] = RoundBf16(a1 - b1);
            dst[j + half] = RoundBf16(a2 + b2);
          }
        }
    // Keys transposed per head, [H][hd][n], so that the score loop runs one lane per key.
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t e = 0; e < hd; ++e) kt[(hh * hd + e) * n + j] = ks[j * D + hh * hd + e];
#pragma omp parallel for schedule(static) collapse(2) firstprivate(scores, orow) if (n * n * D > (1 << 16))
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t i = 0; i < n; ++i) {
        VitScoresRow(qs.data() + i * D + hh * hd, kt.data() + hh * hd * n, n, hd, scores.data());
        const float inv_sum = TorchFlashRow(scores.data(), n, scale);
        VitPvRow(scores.data(), vv.data() + hh * hd, n, hd, D, orow.data());
        float* out = o.data() + i * D + hh * hd;
        for (int64_t e = 0; e < hd; ++e) out[e] = RoundBf16(orow[e] * inv_sum);
      }
    VisionLinearForward(o.data(), n, b.wo, h.data());
    for (int64_t i = 0; i < n * D; ++i) x[i] = RoundBf16(x[i] + h[i]);
    ref::RmsNorm(x.data(), n, D, b.norm2.data(), 1e-6f, h.data());
    VisionLinearForward(h.data(), n, b.w1, g.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < I; ++j) {
        const float gate = g[i * 2 * I + j], up = g[i * 2 * I + I + j];
        a[i * I + j] = RoundBf16(RoundBf16(ref::TorchSilu(gate)) * up);
      }
    VisionLinearForward(a.data(), n, b.w2, h.data());
    for (int64_t i = 0; i < n * D; ++i) x[i] = RoundBf16(x[i] + h[i]);
  }
  ref::RmsNorm(x.data(), n, D, norm_.data(), 1e-6f, h.data());
  return h;
}

std::vector<float> VisionTower::Align(const float* vit, int nh, int nw) const {
  const int r = ratio_;
  const int64_t D = vdim_, d = dim_;
  const int ch = (nh + r - 1) / r, cw = (nw + r - 1) / r;
  const int64_t L = static_cast<int64_t>(ch) * cw, F = D * r * r;
  std::vector<float> u(L * F, 0.0f);
  for (int cy = 0; cy < ch; ++cy)
    for (int cx = 0; cx < cw; ++cx) {
      float* row = u.data() + (static_cast<int64_t>(cy) * cw + cx) * F;
      for (int64_t c = 0; c < D; ++c)
        for (int dy = 0; dy < r; ++dy)
          for (int dx = 0; dx < r; ++dx) {
            const int y = cy * r + dy, xx = cx * r + dx;
            row[c * r * r + dy * r + dx] = (y < nh && xx < nw) ? vit[(static_cast<int64_t>(y) * nw + xx) * D + c] : 0.0f;
          }
    }
  std::vector<float> h(L * d), out(L * d);
  VisionLinearForward(u.data(), L, aligner_w1_, h.data());
  for (float& v : h) v = TorchGelu(v);
  VisionLinearForward(h.data(), L, aligner_w2_, out.data());
  return out;
}

std::vector<float> VisionTower::SpanEmbeddings(const float* patches, int n_vit_h, int n_vit_w, int n_llm_h,
                                               int n_llm_w) const {
  const std::vector<float> vit = Vit(patches, n_vit_h, n_vit_w);
  const std::vector<float> al = Align(vit.data(), n_vit_h, n_vit_w);
  return AssembleSpan(al.data(), n_llm_h, n_llm_w);
}

std::vector<float> VisionTower::AssembleSpan(const float* al, int n_llm_h, int n_llm_w) const {
  ImagePlan plan;
  plan.n_llm_h = n_llm_h;
  plan.n_llm_w = n_llm_w;
  const std::vector<int8_t> types = ImageTokenTypes(plan);
  std::vector<float> out(types.size() * dim_);
  int64_t next = 0;
  for (size_t t = 0; t < types.size(); ++t) {
    const float* src = types[t] == kImageStart     ? image_start_.data()
                       : types[t] == kImageEnd     ? image_end_.data()
                       : types[t] == kImageNewLine ? image_newline_.data()
                                                   : al + (next++) * dim_;
    std::memcpy(out.data() + t * dim_, src, dim_ * sizeof(float));
  }
  return out;
}

}  // namespace deepinfer::vision
