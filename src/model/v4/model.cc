// The DeepSeek-V4 forward pass (model.h). Each function reproduces one module
// of the reference model.py (named in its comment); model-spec §3.2 says what
// each computes and §4 where it rounds. The kernel-level operators are in
// model/v4/ops.h (V4's tilelang semantics), the torch-level ones are V4.1's
// (kernels/ref/ref_ops.h), shared because both references run the same torch.
#include "model/v4/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "format/numerics.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "model/v4/ops.h"

namespace deepinfer::v4 {

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

struct Bf16 {
  std::vector<uint16_t> w;
  int64_t out = 0, in = 0;
  ref::Bf16Weight view() const { return {w.data(), out, in}; }
};

struct CompressorW {
  int ratio = 0, coff = 1;
  int64_t hd = 0;             // head dim of the entries (attention: head_dim, indexer: index_head_dim)
  std::vector<float> ape;     // [ratio, coff·hd]
  Bf16 wkv, wgate;            // [coff·hd, dim]
  std::vector<uint16_t> norm; // [hd]
};

struct AttentionW {
  Fp8Weight wq_a, wq_b, wkv, wo_b;
  std::vector<uint16_t> wo_a;  // BF16-dequantised wo_a (convert.py), [o_groups·o_lora, H·D/o_groups]
  std::vector<uint16_t> q_norm, kv_norm;
  std::vector<float> sink;
  CompressorW comp;           // ratio > 0
  Fp8Weight idx_wq_b;         // ratio 4
  Bf16 idx_wproj;
  CompressorW idx_comp;
};

struct FfnW {
  Bf16 gate;
  std::vector<float> bias;       // learned routing
  std::vector<int32_t> tid2eid;  // hash routing [vocab, topk]
  std::vector<Fp4Weight> w1, w2, w3;
  Fp8Weight s1, s2, s3;
};

struct HcHeadW {
  std::vector<float> fn, base, scale;
};

struct BlockW {
  std::vector<uint16_t> attn_norm, ffn_norm;
  std::vector<float> hc_fn[2], hc_base[2], hc_scale[2];
  AttentionW attn;
  FfnW ffn;
  // mtp.* only
  Fp8Weight e_proj, h_proj;
  std::vector<uint16_t> enorm, hnorm, norm;
  HcHeadW hc_head;
};

}  // namespace

struct Weights {
  std::vector<uint16_t> embed;  // [vocab, dim]
  Bf16 head;
  std::vector<uint16_t> norm;
  HcHeadW hc_head;
  std::vector<BlockW> blocks;   // n_layers, then mtp.*
};

struct Ropes {
  ref::RopeTable swa;       // ratio 0: rope_theta, no YaRN
  ref::RopeTable compress;  // ratio > 0: compress_rope_theta with YaRN
  const ref::RopeTable& For(int ratio) const { return ratio > 0 ? compress : swa; }
};

namespace {

class Binder {
 public:
  Binder(const TensorStore& s) : s_(s) {}
  const TensorView& Get(const std::string& name, DType dt, const std::vector<int64_t>& shape) {
    const TensorView& t = s_.Get(name);
    if (t.dtype != dt || t.shape != shape)
      Fail(ErrorKind::kInvalidArgument, "{}: tensor {}: expected {} {}, found {} {}", t.file, name, DTypeName(dt),
           ShapeString(shape), DTypeName(t.dtype), ShapeString(t.shape));
    return t;
  }
  std::vector<uint16_t> Bf16Vec(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView& t = Get(name, DType::kBF16, shape);
    std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * 2);
    return v;
  }
  Bf16 Bf16W(const std::string& name, int64_t out, int64_t in) { return {Bf16Vec(name, {out, in}), out, in}; }
  std::vector<float> F32(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView& t = Get(name, DType::kF32, shape);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * 4);
    return v;
  }
  Fp8Weight Fp8(const std::string& pre, int64_t out, int64_t in) {
    const TensorView& w = Get(pre + ".weight", DType::kF8E4M3, {out, in});
    const TensorView& s = Get(pre + ".scale", DType::kF8E8M0, {(out + 127) / 128, (in + 127) / 128});
    return {w.data, s.data, out, in};
  }
  Fp4Weight Fp4(const std::string& pre, int64_t out, int64_t in) {
    const TensorView& w = Get(pre + ".weight", DType::kI8, {out, in / 2});
    const TensorView& s = Get(pre + ".scale", DType::kF8E8M0, {out, in / 32});
    return {w.data, s.data, out, in};
  }

 private:
  const TensorStore& s_;
};

CompressorW BindCompressor(Binder& b, const std::string& pre, int ratio, int64_t hd, int64_t dim) {
  CompressorW c;
  c.ratio = ratio;
  c.coff = ratio == 4 ? 2 : 1;
  c.hd = hd;
  c.ape = b.F32(pre + "ape", {ratio, c.coff * hd});
  c.wkv = b.Bf16W(pre + "wkv.weight", c.coff * hd, dim);
  c.wgate = b.Bf16W(pre + "wgate.weight", c.coff * hd, dim);
  c.norm = b.Bf16Vec(pre + "norm.weight", {hd});
  return c;
}

HcHeadW BindHcHead(Binder& b, const std::string& pre, const ModelConfig& c) {
  return {b.F32(pre + "hc_head_fn", {c.hc_mult, c.hc_mult * c.dim}), b.F32(pre + "hc_head_base", {c.hc_mult}),
          b.F32(pre + "hc_head_scale", {1})};
}

BlockW BindBlock(Binder& b, const std::string& pre, int l, const ModelConfig& c) {
  BlockW B;
  const int64_t d = c.dim, H = c.n_heads, D = c.head_dim, hc = c.hc_mult, mix = c.hc_mix_dim();
  const bool is_mtp = l >= c.n_layers;
  const int ratio = c.compress_ratios[l];
  B.attn_norm = b.Bf16Vec(pre + "attn_norm.weight", {d});
  B.ffn_norm = b.Bf16Vec(pre + "ffn_norm.weight", {d});
  const char* sites[2] = {"attn", "ffn"};
  for (int s = 0; s < 2; ++s) {
    B.hc_fn[s] = b.F32(pre + "hc_" + sites[s] + "_fn", {mix, hc * d});
    B.hc_base[s] = b.F32(pre + "hc_" + sites[s] + "_base", {mix});
    B.hc_scale[s] = b.F32(pre + "hc_" + sites[s] + "_scale", {3});
  }
  const std::string a = pre + "attn.";
  AttentionW& A = B.attn;
  A.wq_a = b.Fp8(a + "wq_a", c.q_lora_rank, d);
  A.q_norm = b.Bf16Vec(a + "q_norm.weight", {c.q_lora_rank});
  A.wq_b = b.Fp8(a + "wq_b", H * D, c.q_lora_rank);
  A.wkv = b.Fp8(a + "wkv", D, d);
  A.kv_norm = b.Bf16Vec(a + "kv_norm.weight", {D});
  {
    const int64_t out = c.o_groups * c.o_lora_rank, in = H * D / c.o_groups;
    const Fp8Weight wa = b.Fp8(a + "wo_a", out, in);  // convert.py: E4M3 × block scale → BF16 (exact)
    A.wo_a.resize(static_cast<size_t>(out * in));
    const int64_t nkb = (in + 127) / 128;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        A.wo_a[o * in + i] =
            FloatToBf16(E4M3ToFloat(wa.w[o * in + i]) * E8M0ToFloat(wa.scale[(o / 128) * nkb + i / 128]));
  }
  A.wo_b = b.Fp8(a + "wo_b", d, c.o_groups * c.o_lora_rank);
  A.sink = b.F32(a + "attn_sink", {H});
  if (ratio > 0) A.comp = BindCompressor(b, a + "compressor.", ratio, D, d);
  if (ratio == 4) {
    A.idx_wq_b = b.Fp8(a + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    A.idx_wproj = b.Bf16W(a + "indexer.weights_proj.weight", c.index_n_heads, d);
    A.idx_comp = BindCompressor(b, a + "indexer.compressor.", ratio, c.index_head_dim, d);
  }
  const std::string f = pre + "ffn.";
  FfnW& F = B.ffn;
  const int E = c.n_routed_experts;
  F.gate = b.Bf16W(f + "gate.weight", E, d);
  if (!is_mtp && l < c.n_hash_layers) {
    const TensorView& t = b.Get(f + "gate.tid2eid", DType::kI64, {c.vocab_size, c.n_activated_experts});
    F.tid2eid.resize(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t v;
      std::memcpy(&v, t.data + 8 * i, 8);
      if (v < 0 || v >= E)
        Fail(ErrorKind::kInvalidArgument, "{}: tensor {}: entry {} = {} is not an expert id in [0, {})", t.file,
             t.name, i, v, E);
      F.tid2eid[i] = static_cast<int32_t>(v);
    }
  } else {
    F.bias = b.F32(f + "gate.bias", {E});
  }
  const int64_t I = c.moe_inter_dim;
  for (int e = 0; e < E; ++e) {
    const std::string x = f + "experts." + std::to_string(e) + ".";
    F.w1.push_back(b.Fp4(x + "w1", I, d));
    F.w2.push_back(b.Fp4(x + "w2", d, I));
    F.w3.push_back(b.Fp4(x + "w3", I, d));
  }
  F.s1 = b.Fp8(f + "shared_experts.w1", I, d);
  F.s2 = b.Fp8(f + "shared_experts.w2", d, I);
  F.s3 = b.Fp8(f + "shared_experts.w3", I, d);
  if (is_mtp) {
    B.e_proj = b.Fp8(pre + "e_proj", d, d);
    B.h_proj = b.Fp8(pre + "h_proj", d, d);
    B.enorm = b.Bf16Vec(pre + "enorm.weight", {d});
    B.hnorm = b.Bf16Vec(pre + "hnorm.weight", {d});
    B.norm = b.Bf16Vec(pre + "norm.weight", {d});
    B.hc_head = BindHcHead(b, pre, c);
  }
  return B;
}

}  // namespace

V4Model::~V4Model() = default;

std::unique_ptr<V4Model> V4Model::Load(const std::filesystem::path& model_dir) {
  std::unique_ptr<V4Model> m(new V4Model());
  m->cfg_ = ModelConfig::Load(model_dir);
  const ModelConfig& c = m->cfg_;
  const std::string src = (model_dir / "config.json").string();
  if (c.arch != Arch::kDeepseekV4)
    Fail(ErrorKind::kInvalidArgument, "{}: model_type {} is not deepseek_v4", src, c.model_type);
  if (c.n_shared_experts != 1)
    Fail(ErrorKind::kInvalidArgument, "{}: n_shared_experts {} not supported, expected 1", src, c.n_shared_experts);
  if (c.score_func != "sqrtsoftplus")
    Fail(ErrorKind::kInvalidArgument, "{}: scoring_func {} not supported, expected sqrtsoftplus", src, c.score_func);
  if (c.expert_dtype != "fp4")
    Fail(ErrorKind::kInvalidArgument, "{}: expert_dtype {} not supported, expected fp4", src, c.expert_dtype);
  if (c.weight_block_size != 128)
    Fail(ErrorKind::kInvalidArgument, "{}: quantization_config.weight_block_size {} not supported, expected 128", src,
         c.weight_block_size);
  if (c.dim % 128 || c.q_lora_rank % 128 || c.moe_inter_dim % 128 || c.head_dim % 128 ||
      c.head_dim - c.rope_head_dim <= 0 || (c.head_dim - c.rope_head_dim) % 64 || c.index_head_dim & (c.index_head_dim - 1))
    Fail(ErrorKind::kInvalidArgument,
         "{}: dims not supported (hidden_size, q_lora_rank, moe_intermediate_size, head_dim multiples of 128; "
         "head_dim − qk_rope_head_dim a multiple of 64; index_head_dim a power of two)",
         src);
  if (c.n_mtp_layers > 1)
    Fail(ErrorKind::kInvalidArgument, "{}: num_nextn_predict_layers {} not supported (at most 1)", src,
         c.n_mtp_layers);
  m->store_ = TensorStore::Open(model_dir);
  Binder b(*m->store_);
  m->w_ = std::make_unique<Weights>();
  Weights& W = *m->w_;
  W.embed = b.Bf16Vec("embed.weight", {c.vocab_size, c.dim});
  W.head = b.Bf16W("head.weight", c.vocab_size, c.dim);
  W.norm = b.Bf16Vec("norm.weight", {c.dim});
  W.hc_head = BindHcHead(b, "", c);
  for (int l = 0; l < c.n_layers; ++l) W.blocks.push_back(BindBlock(b, "layers." + std::to_string(l) + ".", l, c));
  for (int s = 0; s < c.n_mtp_layers; ++s)
    W.blocks.push_back(BindBlock(b, "mtp." + std::to_string(s) + ".", c.n_layers + s, c));
  m->ropes_ = std::make_unique<Ropes>();
  m->ropes_->swa = ref::RopeTable(c.rope_head_dim, c.rope_theta, 0, 1.0, c.beta_fast, c.beta_slow);
  m->ropes_->compress = ref::RopeTable(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len, c.rope_factor,
                                       c.beta_fast, c.beta_slow);
  return m;
}

V4State V4Model::NewState(int64_t max_len) const {
  const ModelConfig& c = cfg_;
  V4State st;
  st.max_len = max_len;
  const int nb = c.n_layers + c.n_mtp_layers;
  st.layers.resize(nb);
  for (int l = 0; l < nb; ++l) {
    V4State::Layer& L = st.layers[l];
    L.window.assign(static_cast<size_t>(c.window_size * c.head_dim), 0.0f);
    const int r = c.compress_ratios[l];
    if (r == 0) continue;
    const int coff = r == 4 ? 2 : 1;
    L.ckv.assign(static_cast<size_t>((max_len / r) * c.head_dim), 0.0f);
    L.kv_state.assign(static_cast<size_t>(coff * r * coff * c.head_dim), 0.0f);
    L.score_state.assign(L.kv_state.size(), kNegInf);
    if (r == 4) {
      L.ikeys.assign(static_cast<size_t>((max_len / r) * c.index_head_dim), 0.0f);
      L.ikv_state.assign(static_cast<size_t>(coff * r * coff * c.index_head_dim), 0.0f);
      L.iscore_state.assign(L.ikv_state.size(), kNegInf);
    }
  }
  return st;
}

// ---------------------------------------------------------------------------
// One call (prefill at start 0 or a one-token decode) through a list of blocks.

class Pass {
 public:
  Pass(const V4Model& m, int64_t T, int64_t start, const int32_t* ids)
      : c_(m.cfg_), w_(*m.w_), ropes_(*m.ropes_), T_(T), start_(start), ids_(ids) {}

  // Block.forward: X [T, hc, d] in place.
  void Block(int l, float* X, V4State::Layer& st, V4Debug::Layer* dbg);
  // ParallelHead.forward on the last row: hc_head, norm, FP32 head.
  std::vector<float> Head(const float* X, const HcHeadW& hh, const std::vector<uint16_t>& norm) const;

 private:
  void Attention(int l, const float* x, float* v, V4State::Layer& st, V4Debug::Layer* dbg);
  // Compressor.forward: returns the entries it emits in this call ([n, hd]) and their ids.
  void Compressor(const CompressorW& W, int r, bool rotate, const float* x, std::vector<float>& kv_state,
                  std::vector<float>& score_state, std::vector<float>& cache, int64_t hd);
  // Indexer.forward: per row, the selected compressed positions in top-k order (−1 = absent).
  void Indexer(int l, const float* x, const float* qr, V4State::Layer& st, std::vector<int64_t>* sel, int64_t* K);
  void Moe(int l, const float* x, float* v, V4Debug::Layer* dbg);

  const ModelConfig& c_;
  const Weights& w_;
  const Ropes& ropes_;
  const int64_t T_, start_;
  const int32_t* ids_;
};

// Block.forward: hc_pre → norm → attention → hc_post, hc_pre → norm → MoE → hc_post.
void Pass::Block(int l, float* X, V4State::Layer& st, V4Debug::Layer* dbg) {
  const BlockW& B = w_.blocks[l];
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim, n = T_;
  std::vector<float> pre(n * hc), post(n * hc), comb(n * hc * hc), x(n * d), v(n * d), X2(n * hc * d);
  const std::vector<uint16_t>* norms[2] = {&B.attn_norm, &B.ffn_norm};
  for (int site = 0; site < 2; ++site) {
    HcMixes(X, n, hc, d, B.hc_fn[site].data(), B.hc_base[site].data(), B.hc_scale[site].data(), c_.norm_eps,
            c_.hc_sinkhorn_iters, c_.hc_eps, pre.data(), post.data(), comb.data());
    ref::HcCollapse(X, pre.data(), n, hc, d, x.data());
    ref::RmsNorm(x.data(), n, d, norms[site]->data(), c_.norm_eps, x.data());
    if (site == 0) Attention(l, x.data(), v.data(), st, dbg);
    else Moe(l, x.data(), v.data(), dbg);
    ref::HcExpand(v.data(), X, post.data(), comb.data(), n, hc, d, X2.data());
    std::memcpy(X, X2.data(), X2.size() * sizeof(float));
    if (dbg) {
      dbg->hc_pre[site] = pre;
      dbg->hc_post[site] = post;
      dbg->hc_comb[site] = comb;
      (site == 0 ? dbg->attn_out : dbg->ffn_out) = v;
    }
  }
  if (dbg) dbg->out_streams.assign(X, X + n * hc * d);
}

// Attention.forward.
void Pass::Attention(int l, const float* x, float* v, V4State::Layer& st, V4Debug::Layer* dbg) {
  const AttentionW& A = w_.blocks[l].attn;
  const int64_t n = T_, H = c_.n_heads, D = c_.head_dim, rd = c_.rope_head_dim, win = c_.window_size;
  const int ratio = c_.compress_ratios[l];
  const ref::RopeTable& rope = ropes_.For(ratio);
  // q: q_norm(wq_a(x)) (also the indexer's input), wq_b, the per-head RMS scale in BF16 tensor ops
  // (squares, mean, +eps rounded to BF16; rsqrt in FP32 rounded once), RoPE on the last rd dims.
  std::vector<float> qr(n * c_.q_lora_rank), q(n * H * D), sq(D);
  LinearFp8(x, n, A.wq_a, qr.data());
  ref::RmsNorm(qr.data(), n, c_.q_lora_rank, A.q_norm.data(), c_.norm_eps, qr.data());
  LinearFp8(qr.data(), n, A.wq_b, q.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q.data() + (r * H + h) * D;
      for (int64_t i = 0; i < D; ++i) sq[i] = RoundBf16(qh[i] * qh[i]);
      const float mean = RoundBf16(ref::TorchSum(sq.data(), D) / static_cast<float>(D));
      const float rs = RoundBf16(1.0f / std::sqrt(RoundBf16(mean + c_.norm_eps)));
      for (int64_t i = 0; i < D; ++i) qh[i] = RoundBf16(qh[i] * rs);
      rope.Apply(qh + D - rd, start_ + r, false);
    }
  // Window K (= V): kv_norm(wkv(x)), RoPE, FP8 QDQ in blocks of 64 on the nope dims.
  std::vector<float> kv(n * D);
  LinearFp8(x, n, A.wkv, kv.data());
  ref::RmsNorm(kv.data(), n, D, A.kv_norm.data(), c_.norm_eps, kv.data());
  for (int64_t r = 0; r < n; ++r) {
    rope.Apply(kv.data() + r * D + D - rd, start_ + r, false);
    Fp8QdqInPlace(kv.data() + r * D, D - rd, 64);
  }
  // Compressed branch: the indexer selects (C4), the compressor emits new entries.
  std::vector<int64_t> sel;
  int64_t K = 0;
  if (ratio == 4) {
    Indexer(l, x, qr.data(), st, &sel, &K);
    if (dbg) {  // as Indexer.forward returns them: offset by the window part's length, −1 = absent
      const int64_t offset = start_ == 0 ? n : win;
      dbg->indexer_k = static_cast<int>(K);
      dbg->indexer_topk.resize(sel.size());
      for (size_t i = 0; i < sel.size(); ++i)
        dbg->indexer_topk[i] = sel[i] < 0 ? -1 : static_cast<int32_t>(sel[i] + offset);
    }
  }
  // Window ring (prefill: the last `win` positions, slot = position mod win).
  const bool prefill = start_ == 0;
  if (prefill) {
    for (int64_t i = std::max<int64_t>(0, n - win); i < n; ++i)
      std::memcpy(st.window.data() + (i % win) * D, kv.data() + i * D, D * sizeof(float));
  } else {
    std::memcpy(st.window.data() + (start_ % win) * D, kv.data(), D * sizeof(float));
  }
  if (ratio > 0) Compressor(A.comp, ratio, false, x, st.kv_state, st.score_state, st.ckv, D);
  // Candidate lists (get_window_topk_idxs + compressed part), then sparse attention.
  std::vector<uint16_t> kvb(n * D), ringb(win * D);
  for (int64_t i = 0; i < n * D; ++i) kvb[i] = FloatToBf16(kv[i]);
  for (int64_t i = 0; i < win * D; ++i) ringb[i] = FloatToBf16(st.window[i]);
  const int64_t E_all = (start_ + n) / std::max(ratio, 1);
  std::vector<uint16_t> ckvb(ratio > 0 ? E_all * D : 0);
  for (size_t i = 0; i < ckvb.size(); ++i) ckvb[i] = FloatToBf16(st.ckv[i]);
  std::vector<float> o(n * H * D);
  const float scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
  std::vector<const uint16_t*> rows;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t p = start_ + r;
    rows.clear();
    if (prefill) {
      const int64_t W = std::min(n, win);
      const int64_t first = std::max<int64_t>(0, p - win + 1);
      for (int64_t qp = first; qp <= p; ++qp) rows.push_back(kvb.data() + qp * D);
      rows.resize(W, nullptr);
    } else {
      const int64_t first = std::max<int64_t>(0, p - win + 1);
      for (int64_t qp = first; qp <= p; ++qp) rows.push_back(ringb.data() + (qp % win) * D);
      rows.resize(win, nullptr);
    }
    if (ratio == 128) {
      const int64_t width = prefill ? n / ratio : (p + 1) / ratio;
      const int64_t vis = (p + 1) / ratio;
      for (int64_t j = 0; j < width; ++j) rows.push_back(j < vis ? ckvb.data() + j * D : nullptr);
    } else if (ratio == 4) {
      for (int64_t t = 0; t < K; ++t) {
        const int64_t j = sel[r * K + t];
        rows.push_back(j >= 0 ? ckvb.data() + j * D : nullptr);
      }
    }
    float* orow = o.data() + r * H * D;
    SparseAttention(q.data() + r * H * D, static_cast<int>(H), D, rows.data(), static_cast<int64_t>(rows.size()),
                    A.sink.data(), scale, orow);
    for (int64_t h = 0; h < H; ++h) rope.Apply(orow + h * D + D - rd, p, true);
  }
  // Grouped BF16 wo_a, then FP8 wo_b.
  std::vector<float> z(n * c_.o_groups * c_.o_lora_rank);
  ref::GroupedLinearBf16(o.data(), n, c_.o_groups,
                         {A.wo_a.data(), c_.o_groups * c_.o_lora_rank, H * D / c_.o_groups}, z.data());
  LinearFp8(z.data(), n, A.wo_b, v);
}

// Compressor.forward (model-spec §3.2.4): FP32 a = x·wkvᵀ, g = x·wgateᵀ + ape;
// softmax over each group's slots per channel (overlap: the previous group's
// first halves and this group's second halves), weighted sum, BF16, norm,
// RoPE at r·j, then FP8 QDQ (attention) or Hadamard + FP4 QDQ (indexer).
void Pass::Compressor(const CompressorW& W, int r, bool rotate, const float* x, std::vector<float>& kv_state,
                      std::vector<float>& score_state, std::vector<float>& cache, int64_t hd) {
  const int64_t n = T_, rd = c_.rope_head_dim;
  const bool overlap = r == 4;
  const int coff = overlap ? 2 : 1;
  const int64_t wdt = coff * hd;
  std::vector<float> a(n * wdt), g(n * wdt);
  ref::LinearF32Bf16W(x, n, W.wkv.view(), a.data());
  ref::LinearF32Bf16W(x, n, W.wgate.view(), g.data());
  // Pooling of one entry from 2r (overlap) or r slots: av/gv per slot, per channel.
  auto pool = [&](const std::vector<const float*>& av, const std::vector<const float*>& gv, float* out) {
    const size_t S = av.size();
    std::vector<float> e(S), prod(S);
    for (int64_t ch = 0; ch < hd; ++ch) {
      float mx = gv[0][ch];
      for (size_t t = 1; t < S; ++t) mx = std::max(mx, gv[t][ch]);
      float sum = 0.0f;
      for (size_t t = 0; t < S; ++t) {
        e[t] = ref::SleefExpf(gv[t][ch] - mx);
        sum += e[t];
      }
      for (size_t t = 0; t < S; ++t) prod[t] = av[t][ch] * (e[t] / sum);
      out[ch] = RoundBf16(OuterSum(prod.data(), static_cast<int64_t>(S)));
    }
  };
  std::vector<float> zero(hd, 0.0f), ninf(hd, kNegInf);
  std::vector<int64_t> js;
  std::vector<float> ent;
  if (start_ == 0) {
    const int64_t rem = n % r, cutoff = n - rem, groups = cutoff / r;
    std::vector<float> gs(n * wdt);  // score + ape
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < wdt; ++ch) gs[i * wdt + ch] = g[i * wdt + ch] + W.ape[(i % r) * wdt + ch];
    if (overlap && cutoff >= r)
      for (int64_t t = 0; t < r; ++t) {
        std::memcpy(kv_state.data() + t * wdt, a.data() + (cutoff - r + t) * wdt, wdt * sizeof(float));
        std::memcpy(score_state.data() + t * wdt, gs.data() + (cutoff - r + t) * wdt, wdt * sizeof(float));
      }
    const int64_t off = overlap ? r : 0;
    for (int64_t t = 0; t < rem; ++t) {
      std::memcpy(kv_state.data() + (off + t) * wdt, a.data() + (cutoff + t) * wdt, wdt * sizeof(float));
      std::memcpy(score_state.data() + (off + t) * wdt, gs.data() + (cutoff + t) * wdt, wdt * sizeof(float));
    }
    ent.resize(groups * hd);
    std::vector<const float*> av, gv;
    for (int64_t j = 0; j < groups; ++j) {
      av.clear();
      gv.clear();
      if (overlap) {
        for (int64_t t = 0; t < r; ++t) {
          if (j == 0) {
            av.push_back(zero.data());
            gv.push_back(ninf.data());
          } else {
            av.push_back(a.data() + ((j - 1) * r + t) * wdt);
            gv.push_back(gs.data() + ((j - 1) * r + t) * wdt);
          }
        }
        for (int64_t t = 0; t < r; ++t) {
          av.push_back(a.data() + (j * r + t) * wdt + hd);
          gv.push_back(gs.data() + (j * r + t) * wdt + hd);
        }
      } else {
        for (int64_t t = 0; t < r; ++t) {
          av.push_back(a.data() + (j * r + t) * wdt);
          gv.push_back(gs.data() + (j * r + t) * wdt);
        }
      }
      pool(av, gv, ent.data() + j * hd);
      js.push_back(j);
    }
  } else {
    const int64_t p = start_;
    const int64_t slot = (overlap ? r : 0) + p % r;
    for (int64_t ch = 0; ch < wdt; ++ch) {
      kv_state[slot * wdt + ch] = a[ch];
      score_state[slot * wdt + ch] = g[ch] + W.ape[(p % r) * wdt + ch];
    }
    if ((p + 1) % r != 0) return;
    std::vector<const float*> av, gv;
    if (overlap) {
      for (int64_t t = 0; t < r; ++t) {
        av.push_back(kv_state.data() + t * wdt);
        gv.push_back(score_state.data() + t * wdt);
      }
      for (int64_t t = r; t < 2 * r; ++t) {
        av.push_back(kv_state.data() + t * wdt + hd);
        gv.push_back(score_state.data() + t * wdt + hd);
      }
    } else {
      for (int64_t t = 0; t < r; ++t) {
        av.push_back(kv_state.data() + t * wdt);
        gv.push_back(score_state.data() + t * wdt);
      }
    }
    ent.resize(hd);
    pool(av, gv, ent.data());
    js.push_back(p / r);
    if (overlap) {
      std::memcpy(kv_state.data(), kv_state.data() + r * wdt, r * wdt * sizeof(float));
      std::memcpy(score_state.data(), score_state.data() + r * wdt, r * wdt * sizeof(float));
    }
  }
  const ref::RopeTable& rope = ropes_.For(r);
  for (size_t i = 0; i < js.size(); ++i) {
    float* e = ent.data() + i * hd;
    ref::RmsNorm(e, 1, hd, W.norm.data(), c_.norm_eps, e);
    rope.Apply(e + hd - rd, js[i] * r, false);
    if (rotate) {
      Hadamard(e, hd, static_cast<float>(std::pow(static_cast<double>(hd), -0.5)));
      Fp4QdqUe8m0InPlace(e, hd, 32);
    } else {
      Fp8QdqInPlace(e, hd - rd, 64);
    }
    std::memcpy(cache.data() + js[i] * hd, e, hd * sizeof(float));
  }
}

// Indexer.forward (model-spec §3.2.5).
void Pass::Indexer(int l, const float* x, const float* qr, V4State::Layer& st, std::vector<int64_t>* sel,
                   int64_t* Kout) {
  const AttentionW& A = w_.blocks[l].attn;
  const int64_t n = T_, nh = c_.index_n_heads, ID = c_.index_head_dim, rd = c_.rope_head_dim, d = c_.dim;
  const int r = 4;
  const ref::RopeTable& rope = ropes_.For(r);
  std::vector<float> qI(n * nh * ID);
  LinearFp8(qr, n, A.idx_wq_b, qI.data());
  const float hscale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < nh; ++h) {
      float* qh = qI.data() + (i * nh + h) * ID;
      rope.Apply(qh + ID - rd, start_ + i, false);
      Hadamard(qh, ID, hscale);
      Fp4QdqUe8m0InPlace(qh, ID, 32);
    }
  Compressor(A.idx_comp, r, true, x, st.ikv_state, st.iscore_state, st.ikeys, ID);
  std::vector<float> wts(n * nh);
  ref::LinearBf16(x, n, A.idx_wproj.view(), wts.data());
  const float wscale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5) *
                                          std::pow(static_cast<double>(nh), -0.5));
  for (auto& v : wts) v = RoundBf16(v * wscale);
  const int64_t end = start_ + n, E = end / r;
  const int64_t K = std::min<int64_t>(c_.index_topk, E);
  *Kout = K;
  sel->assign(static_cast<size_t>(n * K), -1);
  if (K == 0) return;
  std::vector<float> score(E);
  std::vector<int64_t> idx(K);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start_ + i, vis = (p + 1) / r;
    const float* qrow = qI.data() + i * nh * ID;
    for (int64_t j = 0; j < E; ++j) {
      float acc = 0.0f;
      for (int64_t h = 0; h < nh; ++h) {
        const float* qh = qrow + h * ID;
        const float* kj = st.ikeys.data() + j * ID;
        float dot = 0.0f;
        for (int64_t c = 0; c < ID; ++c) dot += qh[c] * kj[c];
        acc += RoundBf16(std::max(RoundBf16(dot), 0.0f) * wts[i * nh + h]);
      }
      score[j] = RoundBf16(acc);
      if (start_ == 0 && j >= vis) score[j] = kNegInf;
    }
    StableTopK(score.data(), E, K, idx.data());
    for (int64_t t = 0; t < K; ++t) (*sel)[i * K + t] = (start_ == 0 && idx[t] >= vis) ? -1 : idx[t];
  }
}

// MoE.forward with Gate.forward: sqrt(softplus(x·Wᵀ)) scores; tid2eid (hash
// layers) or top-k of scores + bias (ties by ascending id); weights normalised
// without ε, × route_scale; routed experts summed in increasing id in FP32,
// then the shared expert; BF16.
void Pass::Moe(int l, const float* x, float* v, V4Debug::Layer* dbg) {
  const FfnW& F = w_.blocks[l].ffn;
  const int64_t n = T_, d = c_.dim, I = c_.moe_inter_dim;
  const int k = c_.n_activated_experts, E = c_.n_routed_experts;
  const float lim = c_.swiglu_limit;
  std::vector<int32_t> idx(n * k);
  std::vector<float> wts(n * k), logits(n * E);
  ref::LinearF32Bf16W(x, n, F.gate.view(), logits.data());
  std::vector<float> s(E), sel(E);
  std::vector<int64_t> top(k);
  for (int64_t m = 0; m < n; ++m) {
    const int32_t vec = ref::VectorPathCount(m, n, E, 16);
    for (int e = 0; e < E; ++e) {
      const float lg = logits[m * E + e];
      const float sp = e < vec ? ref::TorchSoftplus(lg) : (lg > 20.0f ? lg : std::log1p(std::exp(lg)));
      s[e] = std::sqrt(sp);
      sel[e] = F.bias.empty() ? s[e] : s[e] + F.bias[e];
    }
    if (!F.tid2eid.empty()) {
      for (int i = 0; i < k; ++i) top[i] = F.tid2eid[static_cast<int64_t>(ids_[m]) * k + i];
    } else {
      StableTopK(sel.data(), E, k, top.data());
    }
    float* wr = wts.data() + m * k;
    for (int i = 0; i < k; ++i) {
      idx[m * k + i] = static_cast<int32_t>(top[i]);
      wr[i] = s[top[i]];
    }
    const float denom = ref::TorchSum(wr, k);
    for (int i = 0; i < k; ++i) wr[i] = wr[i] / denom * c_.route_scale;
  }
  auto swiglu = [&](const float* xin, int64_t m, const float* rw, auto lin1, auto lin3, auto lin2, float* out) {
    std::vector<float> gt(m * I), up(m * I);
    lin1(xin, m, gt.data());
    lin3(xin, m, up.data());
    for (int64_t i = 0; i < m * I; ++i) {
      float u = up[i], g = gt[i];
      if (lim > 0) {
        u = std::min(std::max(u, -lim), lim);
        g = std::min(g, lim);
      }
      float a = ref::TorchSilu(g) * u;
      if (rw) a = rw[i / I] * a;
      gt[i] = RoundBf16(a);
    }
    lin2(gt.data(), m, out);
  };
  std::vector<float> y(n * d, 0.0f);
  for (int e = 0; e < E; ++e) {
    std::vector<int64_t> rows;
    std::vector<float> rw;
    for (int64_t m = 0; m < n; ++m)
      for (int i = 0; i < k; ++i)
        if (idx[m * k + i] == e) {
          rows.push_back(m);
          rw.push_back(wts[m * k + i]);
        }
    if (rows.empty()) continue;
    const int64_t mm = static_cast<int64_t>(rows.size());
    std::vector<float> xin(mm * d), out(mm * d);
    for (int64_t i = 0; i < mm; ++i) std::memcpy(xin.data() + i * d, x + rows[i] * d, d * sizeof(float));
    swiglu(
        xin.data(), mm, rw.data(), [&](const float* a, int64_t M, float* o) { LinearFp4(a, M, F.w1[e], o); },
        [&](const float* a, int64_t M, float* o) { LinearFp4(a, M, F.w3[e], o); },
        [&](const float* a, int64_t M, float* o) { LinearFp4(a, M, F.w2[e], o); }, out.data());
    for (int64_t i = 0; i < mm; ++i)
      for (int64_t c = 0; c < d; ++c) y[rows[i] * d + c] += out[i * d + c];
  }
  std::vector<float> sh(n * d);
  swiglu(
      x, n, nullptr, [&](const float* a, int64_t M, float* o) { LinearFp8(a, M, F.s1, o); },
      [&](const float* a, int64_t M, float* o) { LinearFp8(a, M, F.s3, o); },
      [&](const float* a, int64_t M, float* o) { LinearFp8(a, M, F.s2, o); }, sh.data());
  for (int64_t i = 0; i < n * d; ++i) v[i] = RoundBf16(y[i] + sh[i]);
  if (dbg) {
    dbg->router_indices = idx;
    dbg->router_weights = wts;
  }
}

// ParallelHead.forward on the last row: hc_head (σ by torch.sigmoid), norm, FP32 head.
std::vector<float> Pass::Head(const float* X, const HcHeadW& hh, const std::vector<uint16_t>& norm) const {
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim, flat = hc * d, V = c_.vocab_size;
  const int64_t r = T_ - 1;
  const float* f = X + r * flat;
  std::vector<float> sq(flat);
  for (int64_t i = 0; i < flat; ++i) sq[i] = f[i] * f[i];
  const float rsq = 1.0f / std::sqrt(ref::TorchSum(sq.data(), flat) / static_cast<float>(flat) + c_.norm_eps);
  std::vector<float> pre(hc);
  const int32_t vec = ref::VectorPathCount(r, T_, hc, 16);
  for (int j = 0; j < hc; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < flat; ++i) acc += f[i] * hh.fn[j * flat + i];
    const float mix = acc * rsq;
    pre[j] = ref::TorchSigmoid(mix * hh.scale[0] + hh.base[j], j < vec) + c_.hc_eps;
  }
  std::vector<float> y(d), logits(V);
  ref::HcCollapse(f, pre.data(), 1, hc, d, y.data());
  ref::RmsNorm(y.data(), 1, d, norm.data(), c_.norm_eps, y.data());
  ref::LinearF32Bf16W(y.data(), 1, w_.head.view(), logits.data());
  return logits;
}

// ---------------------------------------------------------------------------

std::vector<float> V4Model::Forward(const int32_t* tokens, int64_t T, V4State* state, std::vector<float>* streams,
                                    V4Debug* debug) {
  const ModelConfig& c = cfg_;
  if (T < 1 || tokens == nullptr) Fail(ErrorKind::kInvalidArgument, "V4 Forward: empty chunk (T = {})", T);
  if (state->len > 0 && T != 1)
    Fail(ErrorKind::kInvalidArgument, "V4 Forward: a call at start_pos {} must be one token (got {})", state->len, T);
  if (state->len + T > state->max_len)
    Fail(ErrorKind::kInvalidArgument, "V4 Forward: {} positions exceed the state's max_len {}", state->len + T,
         state->max_len);
  for (int64_t i = 0; i < T; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      Fail(ErrorKind::kInvalidArgument, "V4 Forward: token {} at position {} outside [0, {})", tokens[i],
           state->len + i, c.vocab_size);
  const int hc = c.hc_mult;
  const int64_t d = c.dim;
  if (state->len == 0) {  // fresh-sequence semantics: compressor carries at their start values
    V4State fresh = NewState(state->max_len);
    const int64_t ml = state->max_len;
    *state = std::move(fresh);
    state->max_len = ml;
  }
  Pass pass(*this, T, state->len, tokens);
  std::vector<float> X(T * hc * d);
  for (int64_t r = 0; r < T; ++r)
    for (int j = 0; j < hc; ++j)
      for (int64_t i = 0; i < d; ++i)
        X[(r * hc + j) * d + i] = Bf16ToFloat(w_->embed[static_cast<int64_t>(tokens[r]) * d + i]);
  if (debug) debug->layers.assign(c.n_layers, {});
  for (int l = 0; l < c.n_layers; ++l) pass.Block(l, X.data(), state->layers[l], debug ? &debug->layers[l] : nullptr);
  if (streams) *streams = X;
  std::vector<float> logits = pass.Head(X.data(), w_->hc_head, w_->norm);
  state->len += T;
  return logits;
}

std::vector<float> V4Model::Mtp(const float* streams, const int32_t* next_ids, int64_t T, int64_t start,
                                V4State* state) {
  const ModelConfig& c = cfg_;
  if (c.n_mtp_layers < 1) Fail(ErrorKind::kInvalidArgument, "V4 Mtp: the model has no MTP block");
  if (T < 1 || (start > 0 && T != 1))
    Fail(ErrorKind::kInvalidArgument, "V4 Mtp: a call at start {} must be one token (got {})", start, T);
  for (int64_t i = 0; i < T; ++i)
    if (next_ids[i] < 0 || next_ids[i] >= c.vocab_size)
      Fail(ErrorKind::kInvalidArgument, "V4 Mtp: token {} outside [0, {})", next_ids[i], c.vocab_size);
  const int l = c.n_layers;
  const BlockW& B = w_->blocks[l];
  const int hc = c.hc_mult;
  const int64_t d = c.dim;
  Pass pass(*this, T, start, next_ids);
  // MTPBlock.forward: e = enorm(embed(ids)); x = hnorm(streams); X = e_proj(e) + h_proj(x) per stream.
  std::vector<float> e(T * d), ep(T * d), xs(T * hc * d), hp(T * hc * d), X(T * hc * d);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t i = 0; i < d; ++i) e[r * d + i] = Bf16ToFloat(w_->embed[static_cast<int64_t>(next_ids[r]) * d + i]);
  ref::RmsNorm(e.data(), T, d, B.enorm.data(), c.norm_eps, e.data());
  ref::RmsNorm(streams, T * hc, d, B.hnorm.data(), c.norm_eps, xs.data());
  LinearFp8(e.data(), T, B.e_proj, ep.data());
  LinearFp8(xs.data(), T * hc, B.h_proj, hp.data());
  for (int64_t r = 0; r < T; ++r)
    for (int j = 0; j < hc; ++j)
      for (int64_t i = 0; i < d; ++i)
        X[(r * hc + j) * d + i] = RoundBf16(ep[r * d + i] + hp[(r * hc + j) * d + i]);
  pass.Block(l, X.data(), state->layers[l], nullptr);
  return pass.Head(X.data(), B.hc_head, B.norm);
}

}  // namespace deepinfer::v4
