// The DeepSeek-V4 forward pass (model.h). Each function reproduces one module
// of the reference model.py (named in its comment); model-spec §3.2 says what
// each computes and §4 where it rounds. The kernel-level operators are in
// model/v4/ops.h (V4's tilelang semantics), the torch-level ones are V4.1's
// (kernels/ref/ref_ops.h), shared because both references run the same torch.
#include "model/v4/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "base/error.h"
#include "base/region_timer.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "model/v4/ops.h"
#include "model/v4/workspace.h"
#include "model/state.h"

namespace deepinfer::v4 {

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();
// A MoE call on at most this many rows runs the shared expert as one task
// beside the routed experts (Pass::Moe).
constexpr int64_t kSharedExpertTaskRows = 8;

// An expert task's scratch, per thread (Pass::Moe): the gathered inputs xin
// [m, d], the SwiGLU halves gt, up and the exps e [m, I]; Reserve makes room
// for `rows`.
struct MoeScratch {
  std::vector<float> xin, gt, up, e;
  void Reserve(int64_t rows, int64_t d, int64_t I) {
    ReserveInSteps(xin, rows * d, 1);
    ReserveInSteps(gt, rows * I, 1);
    ReserveInSteps(up, rows * I, 1);
    ReserveInSteps(e, rows * I, 1);
  }
};
thread_local MoeScratch tl_moe;

// A BF16 weight and its repacking for the fast CPU kernels (kernels/cpu/cpu_ops.h,
// bit-identical to the ref:: operators), made once all weights are bound.
struct Bf16 {
  std::vector<uint16_t> w;
  int64_t out = 0, in = 0;
  cpu::PackedBf16 packed;
  ref::Bf16Weight view() const { return {w.data(), out, in}; }
  void Pack() { packed = cpu::PackBf16(view()); }
};

struct CompressorW {
  int ratio = 0, coff = 1;
  int64_t hd = 0;             // head dim of the entries (attention: head_dim, indexer: index_head_dim)
  std::vector<float> ape;     // [ratio, coff·hd]
  Bf16 wkv, wgate;            // [coff·hd, dim]
  std::vector<uint16_t> norm; // [hd]
};

struct AttentionW {
  PackedFp8Weight wq_a, wq_b, wkv, wo_b;
  Bf16 wo_a;                  // BF16-dequantised wo_a (convert.py), [o_groups·o_lora, H·D/o_groups]
  std::vector<uint16_t> q_norm, kv_norm;
  std::vector<float> sink;
  CompressorW comp;           // ratio > 0
  PackedFp8Weight idx_wq_b;         // ratio 4
  Bf16 idx_wproj;
  CompressorW idx_comp;
};

struct FfnW {
  Bf16 gate;
  std::vector<float> bias;       // learned routing
  std::vector<int32_t> tid2eid;  // hash routing [vocab, topk]
  std::vector<PackedFp4Weight> w1, w2, w3;
  PackedFp8Weight s1, s2, s3;
};

struct HcHeadW {
  std::vector<float> fn, base, scale;
};

struct BlockW {
  std::vector<uint16_t> attn_norm, ffn_norm;
  std::vector<float> hc_fn[2], hc_base[2], hc_scale[2];
  cpu::PackedF32 hc_fn_packed[2];  // hc_fn repacked for the fast HcMixes
  AttentionW attn;
  FfnW ffn;
  // mtp.* only
  PackedFp8Weight e_proj, h_proj;
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
  Bf16 Bf16W(const std::string& name, int64_t out, int64_t in) { return {Bf16Vec(name, {out, in}), out, in, {}}; }
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
  PackedFp8Weight Fp8P(const std::string& pre, int64_t out, int64_t in) { return PackFp8Weight(Fp8(pre, out, in)); }
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
  A.wq_a = b.Fp8P(a + "wq_a", c.q_lora_rank, d);
  A.q_norm = b.Bf16Vec(a + "q_norm.weight", {c.q_lora_rank});
  A.wq_b = b.Fp8P(a + "wq_b", H * D, c.q_lora_rank);
  A.wkv = b.Fp8P(a + "wkv", D, d);
  A.kv_norm = b.Bf16Vec(a + "kv_norm.weight", {D});
  {
    const int64_t out = c.o_groups * c.o_lora_rank, in = H * D / c.o_groups;
    const Fp8Weight wa = b.Fp8(a + "wo_a", out, in);  // convert.py: E4M3 × block scale → BF16 (exact)
    A.wo_a.out = out;
    A.wo_a.in = in;
    A.wo_a.w.resize(static_cast<size_t>(out * in));
    const int64_t nkb = (in + 127) / 128;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        A.wo_a.w[o * in + i] =
            FloatToBf16(E4M3ToFloat(wa.w[o * in + i]) * E8M0ToFloat(wa.scale[(o / 128) * nkb + i / 128]));
  }
  A.wo_b = b.Fp8P(a + "wo_b", d, c.o_groups * c.o_lora_rank);
  A.sink = b.F32(a + "attn_sink", {H});
  if (ratio > 0) A.comp = BindCompressor(b, a + "compressor.", ratio, D, d);
  if (ratio == 4) {
    A.idx_wq_b = b.Fp8P(a + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
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
    F.w1.push_back(PackFp4Weight(b.Fp4(x + "w1", I, d)));
    F.w2.push_back(PackFp4Weight(b.Fp4(x + "w2", d, I)));
    F.w3.push_back(PackFp4Weight(b.Fp4(x + "w3", I, d)));
  }
  F.s1 = b.Fp8P(f + "shared_experts.w1", I, d);
  F.s2 = b.Fp8P(f + "shared_experts.w2", d, I);
  F.s3 = b.Fp8P(f + "shared_experts.w3", I, d);
  if (is_mtp) {
    B.e_proj = b.Fp8P(pre + "e_proj", d, d);
    B.h_proj = b.Fp8P(pre + "h_proj", d, d);
    B.enorm = b.Bf16Vec(pre + "enorm.weight", {d});
    B.hnorm = b.Bf16Vec(pre + "hnorm.weight", {d});
    B.norm = b.Bf16Vec(pre + "norm.weight", {d});
    B.hc_head = BindHcHead(b, pre, c);
  }
  return B;
}

}  // namespace

V4Model::~V4Model() = default;

int64_t V4Model::wo_a_decode_bytes() const {
  int64_t n = 0;
  for (int l = 0; l < cfg_.n_layers; ++l)
    n += static_cast<int64_t>(w_->blocks[static_cast<size_t>(l)].attn.wo_a.packed.decode_bytes());
  return n;
}

std::unique_ptr<V4Model> V4Model::Load(const std::filesystem::path& model_dir, const V4Options& options) {
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
  W.head.Pack();
  const int64_t mix = c.hc_mix_dim(), flat = static_cast<int64_t>(c.hc_mult) * c.dim;
  for (BlockW& B : W.blocks) {
    for (int s = 0; s < 2; ++s) B.hc_fn_packed[s] = cpu::PackF32(B.hc_fn[s].data(), mix, flat);
    B.attn.wo_a.Pack();
    B.ffn.gate.Pack();
    if (B.attn.comp.ratio > 0) {
      B.attn.comp.wkv.Pack();
      B.attn.comp.wgate.Pack();
    }
    if (B.attn.idx_comp.ratio > 0) {
      B.attn.idx_comp.wkv.Pack();
      B.attn.idx_comp.wgate.Pack();
      B.attn.idx_wproj.Pack();
    }
  }
  m->ropes_ = std::make_unique<Ropes>();
  m->ropes_->swa = ref::RopeTable(c.rope_head_dim, c.rope_theta, 0, 1.0, c.beta_fast, c.beta_slow);
  m->ropes_->compress = ref::RopeTable(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len, c.rope_factor,
                                       c.beta_fast, c.beta_slow);
  if (options.reuse_step_workspace) m->ws_ = std::make_unique<StepWorkspace>();
  return m;
}

// ---------------------------------------------------------------------------
// One Forward call: all rows of all sequences layer by layer; row-wise
// operators over every row, attention / compressor / indexer per sequence on
// its own rows and state. Nothing reads another sequence's rows.

namespace {
void ToBf16Row(const float* x, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = FloatToBf16(x[i]);
    std::memcpy(dst + 2 * i, &b, 2);
  }
}
void FromBf16Row(const uint8_t* src, int64_t n, uint16_t* out) { std::memcpy(out, src, static_cast<size_t>(n) * 2); }
}  // namespace

class Pass {
 public:
  Pass(const V4Model& m, const std::vector<V4Seq>& seqs, bool per_row, StepWorkspace& ws)
      : c_(m.cfg_), w_(*m.w_), ropes_(*m.ropes_), seqs_(seqs), per_row_(per_row), ws_(ws) {
    info_.clear();
    row_seq_.clear();
    row_pos_.clear();
    row_tok_.clear();
    for (const V4Seq& q : seqs) {
      info_.push_back({R_, q.len, q.start_pos});
      R_ += q.len;
    }
    for (size_t s = 0; s < seqs.size(); ++s)
      for (int64_t i = 0; i < seqs[s].len; ++i) {
        row_seq_.push_back(static_cast<int32_t>(s));
        row_pos_.push_back(seqs[s].start_pos + i);
        row_tok_.push_back(seqs[s].tokens[i]);
      }
  }
  int64_t rows() const { return R_; }

  // Block.forward: X [R, hc, d] in place.
  void Block(int l, float* X, V4Debug::Layer* dbg);
  // ParallelHead.forward on the rows that return logits: hc_head, norm, FP32
  // head; the rows into *out (resized; capacity kept).
  void Head(const float* X, const HcHeadW& hh, const std::vector<uint16_t>& norm, std::vector<float>* out);

 private:
  using Info = StepSeq;
  // The reference's prefill layout for this sequence's chunk (else decode / per-row).
  bool RefPrefill(int s) const { return !per_row_ && info_[s].start == 0; }

  void Attention(int l, const float* x, float* v, V4Debug::Layer* dbg);
  // x·wkvᵀ and x·wgateᵀ of every row of the call into *a, *g [R, coff·hd].
  void CompressorInputs(const CompressorW& W, const float* x, std::vector<float>* a, std::vector<float>* g);
  // One sequence's compressor steps on its rows of a_all, g_all (CompressorInputs).
  void Compressor(int l, int s, const CompressorW& W, bool indexer, const float* a_all, const float* g_all);
  void IndexerInputs(int l, const float* x, const float* qr);
  void Indexer(int l, int s, std::vector<std::vector<int64_t>>* sel, V4Debug::Layer* dbg);
  void Moe(int l, const float* x, float* v, V4Debug::Layer* dbg);

  // State rows (memcpy in and out: the pool's alignment is the caller's business).
  const SequenceStateView& St(int s) const { return seqs_[s].state; }
  uint8_t* Row(int s, StateKind k, int l, int64_t row) const {
    const StateKindGeometry& kg = St(s).geometry->of(k);
    const int region = kg.RegionOf(l);
    DI_CHECK(region >= 0);
    if (k == StateKind::kCompressedKv) {
      const int r = c_.compress_ratios[l];
      const int64_t bs = St(s).geometry->block_size;
      if (kg.regions[region].rows_per_block == 1 && r > bs) row *= r / bs;  // entry j lives in the block of token r·j
    }
    return St(s).Row(k, region, row);
  }

  const ModelConfig& c_;
  const Weights& w_;
  const Ropes& ropes_;
  const std::vector<V4Seq>& seqs_;
  const bool per_row_;
  StepWorkspace& ws_;  // this call's buffers (workspace.h); the layout below lives there
  int64_t R_ = 0;
  std::vector<Info>& info_ = ws_.seq;
  std::vector<int32_t>& row_seq_ = ws_.row_seq;
  std::vector<int64_t>& row_pos_ = ws_.row_pos;
  std::vector<int32_t>& row_tok_ = ws_.row_tok;
};

// Block.forward: hc_pre → norm → attention → hc_post, hc_pre → norm → MoE → hc_post.
void Pass::Block(int l, float* X, V4Debug::Layer* dbg) {
  const BlockW& B = w_.blocks[l];
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim, n = R_;
  std::vector<float>& pre = Zeroed(ws_.pre, n * hc);
  std::vector<float>& post = Zeroed(ws_.post, n * hc);
  std::vector<float>& comb = Zeroed(ws_.comb, n * hc * hc);
  std::vector<float>& x = Zeroed(ws_.x, n * d);
  std::vector<float>& v = Zeroed(ws_.v, n * d);
  std::vector<float>& X2 = Zeroed(ws_.X2, n * hc * d);
  const std::vector<uint16_t>* norms[2] = {&B.attn_norm, &B.ffn_norm};
  const int64_t T0 = info_.empty() ? 0 : info_[0].T;
  for (int site = 0; site < 2; ++site) {
    {
      RegionScope region(Region::kMhc);
      HcMixes(X, n, hc, d, B.hc_fn_packed[site], B.hc_base[site].data(), B.hc_scale[site].data(), c_.norm_eps,
              c_.hc_sinkhorn_iters, c_.hc_eps, pre.data(), post.data(), comb.data());
      cpu::HcCollapse(X, pre.data(), n, hc, d, x.data());
    }
    {
      RegionScope region(Region::kNorm);
      ref::RmsNorm(x.data(), n, d, norms[site]->data(), c_.norm_eps, x.data());
    }
    if (site == 0) Attention(l, x.data(), v.data(), dbg);
    else Moe(l, x.data(), v.data(), dbg);
    {
      RegionScope region(Region::kMhc);
      cpu::HcExpand(v.data(), X, post.data(), comb.data(), n, hc, d, X2.data());
      std::memcpy(X, X2.data(), X2.size() * sizeof(float));
    }
    if (dbg) {
      dbg->hc_pre[site].assign(pre.begin(), pre.begin() + T0 * hc);
      dbg->hc_post[site].assign(post.begin(), post.begin() + T0 * hc);
      dbg->hc_comb[site].assign(comb.begin(), comb.begin() + T0 * hc * hc);
      (site == 0 ? dbg->attn_out : dbg->ffn_out).assign(v.begin(), v.begin() + T0 * d);
    }
  }
  if (dbg) dbg->out_streams.assign(X, X + T0 * hc * d);
}

// Attention.forward.
void Pass::Attention(int l, const float* x, float* v, V4Debug::Layer* dbg) {
  RegionScope region(Region::kAttention);
  const AttentionW& A = w_.blocks[l].attn;
  const int64_t n = R_, H = c_.n_heads, D = c_.head_dim, rd = c_.rope_head_dim, win = c_.window_size;
  const int ratio = c_.compress_ratios[l];
  const ref::RopeTable& rope = ropes_.For(ratio);
  // q: q_norm(wq_a(x)) (also the indexer's input), wq_b, the per-head RMS scale in BF16 tensor ops
  // (squares, mean, +eps rounded to BF16; rsqrt in FP32 rounded once), RoPE on the last rd dims.
  std::vector<float>& qr = Zeroed(ws_.qr, n * c_.q_lora_rank);
  std::vector<float>& q = Zeroed(ws_.q, n * H * D);
  LinearFp8(x, n, A.wq_a, qr.data());
  ref::RmsNorm(qr.data(), n, c_.q_lora_rank, A.q_norm.data(), c_.norm_eps, qr.data());
  LinearFp8(qr.data(), n, A.wq_b, q.data());
  std::optional<RegionScope> core(std::in_place, Region::kAttnCore);
#pragma omp parallel for schedule(static) if(n > 1 && n * H * D >= (int64_t{1} << 16))
  for (int64_t r = 0; r < n; ++r) {
    thread_local std::vector<float> sq_tl;
    float* sq = Zeroed(sq_tl, D).data();
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q.data() + (r * H + h) * D;
      for (int64_t i = 0; i < D; ++i) sq[i] = RoundBf16(qh[i] * qh[i]);
      const float mean = RoundBf16(ref::TorchSum(sq, D) / static_cast<float>(D));
      const float rs = RoundBf16(1.0f / std::sqrt(RoundBf16(mean + c_.norm_eps)));
      for (int64_t i = 0; i < D; ++i) qh[i] = RoundBf16(qh[i] * rs);
      rope.Apply(qh + D - rd, row_pos_[r], false);
    }
  }
  // Window K (= V): kv_norm(wkv(x)), RoPE, FP8 QDQ in blocks of 64 on the nope dims.
  core.reset();
  std::vector<float>& kv = Zeroed(ws_.kv, n * D);
  LinearFp8(x, n, A.wkv, kv.data());
  ref::RmsNorm(kv.data(), n, D, A.kv_norm.data(), c_.norm_eps, kv.data());
  core.emplace(Region::kAttnCore);
  std::vector<uint16_t>& kvb = Zeroed(ws_.kvb, n * D);
#pragma omp parallel for schedule(static) if(n > 1 && n * D >= (int64_t{1} << 16))
  for (int64_t r = 0; r < n; ++r) {
    rope.Apply(kv.data() + r * D + D - rd, row_pos_[r], false);
    cpu::Fp8QdqRows(kv.data() + r * D, 1, D - rd, 64);
    for (int64_t i = r * D; i < (r + 1) * D; ++i) kvb[i] = FloatToBf16(kv[i]);
  }
  core.reset();
  // Compressed branch per sequence: the indexer selects (C4), the compressor emits entries.
  // The row-wise projections of both run once over all rows of the call (each
  // output row depends only on its input row), the rest per sequence.
  const int S = static_cast<int>(seqs_.size());
  if (ratio > 0) {
    RegionScope cr(Region::kCompressor);
    CompressorInputs(A.comp, x, &ws_.cmp_a, &ws_.cmp_g);
  }
  if (ratio == 4) IndexerInputs(l, x, qr.data());
  // Row r's C4 selection is sel[r] (Indexer fills it); the rows keep their capacity.
  std::vector<std::vector<int64_t>>& sel = ws_.sel;
  if (static_cast<int64_t>(sel.size()) < n) sel.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) sel[r].clear();
  for (int s = 0; s < S; ++s) {
    if (ratio == 4) Indexer(l, s, &sel, s == 0 ? dbg : nullptr);
    if (ratio > 0) Compressor(l, s, A.comp, false, ws_.cmp_a.data(), ws_.cmp_g.data());
  }
  // Sparse attention with sink over the candidate list (get_window_topk_idxs + compressed part).
  core.emplace(Region::kAttnCore);
  std::vector<float>& o = Zeroed(ws_.o, n * H * D);
  const float scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
  // Per sequence: the ring positions before its chunk (ring [S, win, D]) and
  // the compressed entries visible to the chunk (ckv from ckv_off[s]).
  std::vector<uint16_t>& ring = ws_.ring;
  std::vector<uint16_t>& ckv = ws_.ckv;
  std::vector<int64_t>& ckv_off = ws_.ckv_off;
  ckv_off.resize(static_cast<size_t>(S) + 1);
  ckv_off[0] = 0;
  for (int s = 0; s < S; ++s) ckv_off[s + 1] = ckv_off[s] + (ratio > 0 ? (info_[s].start + info_[s].T) / ratio : 0);
  ReserveInSteps(ring, S * win * D, win * D);
  ring.resize(static_cast<size_t>(S * win * D));  // the rows read below are written first
  ReserveInSteps(ckv, ckv_off[S] * D, kGrowPositions * D);
  ckv.resize(static_cast<size_t>(ckv_off[S] * D));
  for (int s = 0; s < S; ++s) {
    const Info& qi = info_[s];
    uint16_t* rs = ring.data() + s * win * D;
    for (int64_t p = std::max<int64_t>(0, qi.start - win); p < qi.start; ++p)
      FromBf16Row(Row(s, StateKind::kWindow, l, p % win), D, rs + (p % win) * D);
    for (int64_t j = 0; j < ckv_off[s + 1] - ckv_off[s]; ++j)
      FromBf16Row(Row(s, StateKind::kCompressedKv, l, j), D, ckv.data() + (ckv_off[s] + j) * D);
  }
  // One query row: its candidate list (the window, then the C128 width or the
  // C4 selection), the attention, RoPE back. Rows run in parallel, one per
  // thread, dealt round-robin (a fixed assignment: every thread's scratch is
  // sized in the first step); a single row splits its heads over the team
  // (SparseAttention).
  auto attend_row = [&](int64_t r) {
    thread_local std::vector<const uint16_t*> rows;
    const int s = row_seq_[r];
    const Info& qi = info_[s];
    const bool pre = RefPrefill(s);
    const int64_t p = row_pos_[r];
    const uint16_t* rs = ring.data() + s * win * D;
    const uint16_t* cs = ckv.data() + ckv_off[s] * D;
    ReserveInSteps(rows, win + (ratio == 128 ? (qi.start + qi.T) / ratio : ratio == 4 ? c_.index_topk : 0),
                   kGrowPositions);
    rows.clear();
    const int64_t first = std::max<int64_t>(0, p - win + 1);
    for (int64_t qp = first; qp <= p; ++qp)
      rows.push_back(qp >= qi.start ? kvb.data() + (qi.row0 + qp - qi.start) * D : rs + (qp % win) * D);
    rows.resize(pre ? std::min(qi.T, win) : win, nullptr);
    if (ratio == 128) {
      const int64_t vis = (p + 1) / ratio, width = pre ? qi.T / ratio : vis;
      for (int64_t j = 0; j < width; ++j) rows.push_back(j < vis ? cs + j * D : nullptr);
    } else if (ratio == 4) {
      for (int64_t j : sel[r]) rows.push_back(j >= 0 ? cs + j * D : nullptr);
    }
    float* orow = o.data() + r * H * D;
    SparseAttention(q.data() + r * H * D, static_cast<int>(H), D, rows.data(), static_cast<int64_t>(rows.size()),
                    A.sink.data(), scale, orow);
    rope.ApplyHeads(orow + D - rd, H, D, p, true);
  };
  if (n == 1) {
    attend_row(0);
  } else {
#pragma omp parallel for schedule(static, 1)
    for (int64_t r = 0; r < n; ++r) attend_row(r);
  }
  // Window ring: each chunk's last `win` positions into slot p mod win.
  for (int s = 0; s < S; ++s) {
    const Info& qi = info_[s];
    for (int64_t i = std::max<int64_t>(0, qi.T - win); i < qi.T; ++i)
      ToBf16Row(kv.data() + (qi.row0 + i) * D, D, Row(s, StateKind::kWindow, l, (qi.start + i) % win));
  }
  core.reset();
  // Grouped BF16 wo_a, then FP8 wo_b.
  std::vector<float>& z = Zeroed(ws_.z, n * c_.o_groups * c_.o_lora_rank);
  cpu::GroupedLinearBf16(o.data(), n, c_.o_groups, A.wo_a.packed, z.data());
  LinearFp8(z.data(), n, A.wo_b, v);
}

// Compressor.forward (model-spec §3.2.4), one token at a time as the
// reference's decode does (the prefill's batched form computes the same
// values): a = x·wkvᵀ, g = x·wgateᵀ + ape[p mod r] (FP32) into the carry;
// when token r·j + r − 1 is in, entry j pools per channel the softmax over
// the group's slots (overlap: the previous group's first halves and this
// group's second halves), BF16, norm, RoPE at r·j, then FP8 QDQ (attention)
// or Hadamard + FP4 QDQ (indexer). After an emission the consumed slots are
// cleared to (0, −∞), so the carry equals the reference prefill's. A chunk at
// start_pos 0 starts from the fresh carry (kv 0, score −∞).
void Pass::CompressorInputs(const CompressorW& W, const float* x, std::vector<float>* a, std::vector<float>* g) {
  const int64_t wdt = W.coff * W.hd;
  Zeroed(*a, R_ * wdt);
  Zeroed(*g, R_ * wdt);
  cpu::LinearF32Bf16W(x, R_, W.wkv.packed, a->data());
  cpu::LinearF32Bf16W(x, R_, W.wgate.packed, g->data());
}

void Pass::Compressor(int l, int s, const CompressorW& W, bool indexer, const float* a_all, const float* g_all) {
  RegionScope region(Region::kCompressor);
  const Info& qi = info_[s];
  const int r = W.ratio, coff = W.coff;
  const int64_t hd = W.hd, wdt = coff * hd, rd = c_.rope_head_dim, nslot = coff * r;
  const float* a = a_all + qi.row0 * wdt;  // this sequence's rows of x·wkvᵀ and x·wgateᵀ
  const float* g = g_all + qi.row0 * wdt;
  // Carry rows: kv then score, nslot rows of wdt floats each (attention rows first, the indexer's after them).
  const int64_t base = indexer ? 2 * nslot : 0;
  std::vector<float>& kvs = Zeroed(ws_.cmp_kvs, nslot * wdt);
  std::vector<float>& scs = Zeroed(ws_.cmp_scs, nslot * wdt);
  if (qi.start == 0) {
    std::fill(kvs.begin(), kvs.end(), 0.0f);
    std::fill(scs.begin(), scs.end(), kNegInf);
  } else {
    for (int64_t t = 0; t < nslot; ++t) {
      std::memcpy(kvs.data() + t * wdt, Row(s, StateKind::kCompressorCarry, l, base + t), wdt * 4);
      std::memcpy(scs.data() + t * wdt, Row(s, StateKind::kCompressorCarry, l, base + nslot + t), wdt * 4);
    }
  }
  const ref::RopeTable& rope = ropes_.For(r);
  // Speculative capture (V4Seq::carry_capture): this compressor's kv and score rows of every row.
  float* cap = seqs_[s].carry_capture;
  int64_t cap_rowf = 0, cap_rpp = 0;
  if (cap) {
    const StateKindGeometry& cg = St(s).geometry->of(StateKind::kCompressorCarry);
    const int region = cg.RegionOf(l);
    for (int ri = 0; ri < region; ++ri) {
      const int rr = c_.compress_ratios[cg.regions[ri].layer];
      cap += qi.T * (cg.regions[ri].rows_per_block / ((rr == 4 ? 2 : 1) * rr)) * (cg.regions[ri].row_bytes / 4);
    }
    cap_rowf = cg.regions[region].row_bytes / 4;
    cap_rpp = cg.regions[region].rows_per_block / nslot;
  }
  std::vector<float>& e = Zeroed(ws_.cmp_e, nslot);
  std::vector<float>& prod = Zeroed(ws_.cmp_prod, nslot);
  std::vector<float>& ent = Zeroed(ws_.cmp_ent, hd);
  for (int64_t i = 0; i < qi.T; ++i) {
    const int64_t p = qi.start + i;
    const int64_t slot = (coff == 2 ? r : 0) + p % r;
    for (int64_t ch = 0; ch < wdt; ++ch) {
      kvs[slot * wdt + ch] = a[i * wdt + ch];
      scs[slot * wdt + ch] = g[i * wdt + ch] + W.ape[(p % r) * wdt + ch];
    }
    if (cap) {
      float* dst = cap + (i * cap_rpp + (indexer ? 2 : 0)) * cap_rowf;
      std::memcpy(dst, kvs.data() + slot * wdt, wdt * 4);
      std::memcpy(dst + cap_rowf, scs.data() + slot * wdt, wdt * 4);
    }
    if ((p + 1) % r != 0) continue;
    // Slots: overlap → rows 0..r−1 first halves, rows r..2r−1 second halves; else rows 0..r−1.
    for (int64_t ch = 0; ch < hd; ++ch) {
      auto kvat = [&](int64_t t) { return coff == 2 ? kvs[t * wdt + (t < r ? 0 : hd) + ch] : kvs[t * wdt + ch]; };
      auto scat = [&](int64_t t) { return coff == 2 ? scs[t * wdt + (t < r ? 0 : hd) + ch] : scs[t * wdt + ch]; };
      float mx = scat(0);
      for (int64_t t = 1; t < nslot; ++t) mx = std::max(mx, scat(t));
      float sum = 0.0f;
      for (int64_t t = 0; t < nslot; ++t) {
        e[t] = ref::SleefExpf(scat(t) - mx);
        sum += e[t];
      }
      for (int64_t t = 0; t < nslot; ++t) prod[t] = kvat(t) * (e[t] / sum);
      ent[ch] = RoundBf16(OuterSum(prod.data(), nslot));
    }
    if (coff == 2) {
      std::memcpy(kvs.data(), kvs.data() + r * wdt, r * wdt * 4);
      std::memcpy(scs.data(), scs.data() + r * wdt, r * wdt * 4);
    }
    std::fill(kvs.begin() + (nslot - r) * wdt, kvs.end(), 0.0f);
    std::fill(scs.begin() + (nslot - r) * wdt, scs.end(), kNegInf);
    const int64_t j = p / r;
    ref::RmsNorm(ent.data(), 1, hd, W.norm.data(), c_.norm_eps, ent.data());
    rope.Apply(ent.data() + hd - rd, j * r, false);
    if (indexer) {
      Hadamard(ent.data(), hd, static_cast<float>(std::pow(static_cast<double>(hd), -0.5)));
      cpu::Fp4QdqUe8m0Rows(ent.data(), 1, hd, 32);
      ToBf16Row(ent.data(), hd, Row(s, StateKind::kIndexKey, l, j));
    } else {
      cpu::Fp8QdqRows(ent.data(), 1, hd - rd, 64);
      ToBf16Row(ent.data(), hd, Row(s, StateKind::kCompressedKv, l, j));
    }
  }
  for (int64_t t = 0; t < nslot; ++t) {
    std::memcpy(Row(s, StateKind::kCompressorCarry, l, base + t), kvs.data() + t * wdt, wdt * 4);
    std::memcpy(Row(s, StateKind::kCompressorCarry, l, base + nslot + t), scs.data() + t * wdt, wdt * 4);
  }
}

// Indexer.forward (model-spec §3.2.5): per row the selected compressed
// positions; reference prefill layout: min(topk, E) entries over all E of the
// chunk, invisible ones −1; per-row layout: min(topk, visible) entries.
// The indexer's row-wise parts over all rows of the call: the queries
// (wq_b, RoPE, Hadamard, FP4 QDQ), its compressor's projections and the head
// weights (weights_proj, scaled, BF16).
void Pass::IndexerInputs(int l, const float* x, const float* qr) {
  RegionScope region(Region::kIndexer);
  const AttentionW& A = w_.blocks[l].attn;
  const int64_t n = R_, nh = c_.index_n_heads, ID = c_.index_head_dim, rd = c_.rope_head_dim;
  const ref::RopeTable& rope = ropes_.For(4);
  std::vector<float>& qI = Zeroed(ws_.idx_q, n * nh * ID);
  LinearFp8(qr, n, A.idx_wq_b, qI.data());
  const float hscale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5));
#pragma omp parallel for schedule(static) if(n > 1 && n * nh * ID >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < nh; ++h) {
      float* qh = qI.data() + (i * nh + h) * ID;
      rope.Apply(qh + ID - rd, row_pos_[i], false);
      Hadamard(qh, ID, hscale);
      cpu::Fp4QdqUe8m0Rows(qh, 1, ID, 32);
    }
  {
    RegionScope cr(Region::kCompressor);
    CompressorInputs(A.idx_comp, x, &ws_.idx_cmp_a, &ws_.idx_cmp_g);
  }
  std::vector<float>& wts = Zeroed(ws_.idx_w, n * nh);
  cpu::LinearBf16(x, n, A.idx_wproj.packed, wts.data());
  const float wscale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5) *
                                          std::pow(static_cast<double>(nh), -0.5));
  for (auto& w : wts) w = RoundBf16(w * wscale);
}

void Pass::Indexer(int l, int s, std::vector<std::vector<int64_t>>* sel, V4Debug::Layer* dbg) {
  RegionScope region(Region::kIndexer);
  const AttentionW& A = w_.blocks[l].attn;
  const Info& qi = info_[s];
  const int64_t n = qi.T, nh = c_.index_n_heads, ID = c_.index_head_dim;
  const int r = 4;
  // This sequence's rows of the queries and head weights (IndexerInputs).
  const float* qI = ws_.idx_q.data() + qi.row0 * nh * ID;
  const float* wts = ws_.idx_w.data() + qi.row0 * nh;
  Compressor(l, s, A.idx_comp, true, ws_.idx_cmp_a.data(), ws_.idx_cmp_g.data());
  const int64_t E = (qi.start + n) / r;
  ReserveInSteps(ws_.idx_keys, E * ID, kGrowPositions * ID);
  std::vector<float>& keys = Zeroed(ws_.idx_keys, E * ID);
  std::vector<uint16_t>& kb = Zeroed(ws_.idx_kb, ID);
  for (int64_t j = 0; j < E; ++j) {
    FromBf16Row(Row(s, StateKind::kIndexKey, l, j), ID, kb.data());
    for (int64_t c = 0; c < ID; ++c) keys[j * ID + c] = Bf16ToFloat(kb[c]);
  }
  const bool pre = RefPrefill(s);
  const int64_t Kpre = std::min<int64_t>(c_.index_topk, E);
  ReserveInSteps(ws_.idx_score, E, kGrowPositions);
  std::vector<float>& score = Zeroed(ws_.idx_score, E);
  ReserveInSteps(ws_.idx_top, c_.index_topk, 1);
  std::vector<int64_t>& idx = Zeroed(ws_.idx_top, std::max<int64_t>(Kpre, 1));
  if (dbg) {
    dbg->indexer_k = static_cast<int>(Kpre);
    dbg->indexer_topk.assign(static_cast<size_t>(n * Kpre), -1);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = qi.start + i, vis = (p + 1) / r;
    const int64_t Er = pre ? E : vis;
    const int64_t K = std::min<int64_t>(c_.index_topk, Er);
    std::vector<int64_t>& out = (*sel)[qi.row0 + i];
    out.clear();
    ReserveInSteps(out, c_.index_topk, 1);
    if (K == 0) continue;
    const float* qrow = qI + i * nh * ID;
    IndexerScores(qrow, wts + i * nh, static_cast<int>(nh), ID, keys.data(), std::min(vis, Er), score.data());
    for (int64_t j = vis; j < Er; ++j) score[j] = kNegInf;
    StableTopK(score.data(), Er, K, idx.data());
    for (int64_t t = 0; t < K; ++t) out.push_back(idx[t] < vis ? idx[t] : -1);
    if (dbg && pre)  // as Indexer.forward returns them: offset by the chunk length, −1 = absent
      for (int64_t t = 0; t < K; ++t)
        dbg->indexer_topk[i * Kpre + t] = out[t] < 0 ? -1 : static_cast<int32_t>(out[t] + n);
  }
}

// MoE.forward with Gate.forward: sqrt(softplus(x·Wᵀ)) scores; tid2eid (hash
// layers) or top-k of scores + bias (ties by ascending id); weights normalised
// without ε, × route_scale; routed experts summed in increasing id in FP32,
// then the shared expert; BF16.
void Pass::Moe(int l, const float* x, float* v, V4Debug::Layer* dbg) {
  RegionScope region(Region::kMoe);
  const FfnW& F = w_.blocks[l].ffn;
  const int64_t n = R_, d = c_.dim, I = c_.moe_inter_dim;
  const int k = c_.n_activated_experts, E = c_.n_routed_experts;
  const float lim = c_.swiglu_limit;
  std::vector<int32_t>& idx = Zeroed(ws_.moe_idx, n * k);
  std::vector<float>& wts = Zeroed(ws_.moe_w, n * k);
  std::vector<float>& logits = Zeroed(ws_.moe_logits, n * E);
  std::optional<RegionScope> router(std::in_place, Region::kRouter);
  cpu::LinearF32Bf16W(x, n, F.gate.packed, logits.data());
  std::vector<float>& s = Zeroed(ws_.moe_s, E);
  std::vector<float>& sel = Zeroed(ws_.moe_sel, E);
  std::vector<int64_t>& top = Zeroed(ws_.moe_top, k);
  for (int64_t m = 0; m < n; ++m) {
    // torch's softplus over the call's [T, E] scores: which elements take the vectorised path.
    const int sq = row_seq_[m];
    const int64_t i = m - info_[sq].row0;
    const int32_t vec =
        RefPrefill(sq) ? ref::VectorPathCount(i, info_[sq].T, E, 16) : ref::VectorPathCount(0, 1, E, 16);
    for (int e = 0; e < E; ++e) {
      const float lg = logits[m * E + e];
      const float sp = e < vec ? ref::TorchSoftplus(lg) : (lg > 20.0f ? lg : std::log1p(std::exp(lg)));
      s[e] = std::sqrt(sp);
      sel[e] = F.bias.empty() ? s[e] : s[e] + F.bias[e];
    }
    if (!F.tid2eid.empty()) {
      for (int t = 0; t < k; ++t) top[t] = F.tid2eid[static_cast<int64_t>(row_tok_[m]) * k + t];
    } else {
      StableTopK(sel.data(), E, k, top.data());
    }
    float* wr = wts.data() + m * k;
    for (int t = 0; t < k; ++t) {
      idx[m * k + t] = static_cast<int32_t>(top[t]);
      wr[t] = s[top[t]];
    }
    const float denom = ref::TorchSum(wr, k);
    for (int t = 0; t < k; ++t) wr[t] = wr[t] / denom * c_.route_scale;
  }
  router.reset();
  // SwiGLU expert on m rows: out = w2(bf16(rw · silu(min(w1 x, lim)) · clamp(w3 x, ±lim))).
  // Scratch per thread: the experts run in parallel below.
  auto swiglu = [&](const float* xin, int64_t m, const float* rw, auto lin1, auto lin3, auto lin2, float* out) {
    std::vector<float>& gt = Zeroed(tl_moe.gt, m * I);
    std::vector<float>& up = Zeroed(tl_moe.up, m * I);
    lin1(xin, m, gt.data());
    lin3(xin, m, up.data());
    // silu(g)·u as ref::TorchSilu: g / (1 + SleefExpf(−g)); the clamps and
    // products by cpu::SwiGluClamp / SwiGluAct, the exps of the whole block by
    // cpu::SleefExpfRow (all bit-identical to the scalar loops).
    float* e = Zeroed(tl_moe.e, m * I).data();
    cpu::SwiGluClamp(gt.data(), up.data(), e, m * I, lim);
    cpu::SleefExpfRow(e, m * I, e);
    for (int64_t r = 0; r < m; ++r)
      cpu::SwiGluAct(gt.data() + r * I, up.data() + r * I, e + r * I, I, rw ? rw + r : nullptr);
    lin2(gt.data(), m, out);
  };
  // Expert e's rows (ascending row, then route slot), with their route
  // weights: rows[beg[e] .. beg[e+1]) — a stable counting sort of the routes.
  std::vector<int64_t>& beg = ws_.moe_beg;
  std::vector<int64_t>& rows = ws_.moe_rows;
  std::vector<float>& rw = ws_.moe_rw;
  std::vector<int32_t>& active = ws_.moe_active;
  Zeroed(beg, E + 1);
  for (int64_t i = 0; i < n * k; ++i) ++beg[idx[i] + 1];
  for (int e = 0; e < E; ++e) beg[e + 1] += beg[e];
  Zeroed(rows, n * k);
  Zeroed(rw, n * k);
  {
    std::vector<int64_t>& fill = Zeroed(ws_.moe_fill, E);
    for (int64_t m = 0; m < n; ++m)
      for (int t = 0; t < k; ++t) {
        const int e = idx[m * k + t];
        const int64_t at = beg[e] + fill[e]++;
        rows[at] = m;
        rw[at] = wts[m * k + t];
      }
  }
  active.clear();
  ReserveInSteps(active, E, E);
  for (int e = 0; e < E; ++e)
    if (beg[e + 1] > beg[e]) active.push_back(e);
  // Every routed expert's output rows [n·k, d] in the same order, then the
  // shared expert's [n, d]. The experts run in parallel (one per thread, each
  // on its own rows; the linears inside stay on that thread); on a few rows
  // the shared expert is one more task (first: the largest), on many rows it
  // runs after them with its linears split over the team.
  std::vector<float>& out = Zeroed(ws_.moe_out, n * k * d);
  std::vector<float>& sh = Zeroed(ws_.moe_sh, n * d);
  auto shared = [&] {
    swiglu(
        x, n, nullptr, [&](const float* a, int64_t M, float* o) { LinearFp8(a, M, F.s1, o); },
        [&](const float* a, int64_t M, float* o) { LinearFp8(a, M, F.s3, o); },
        [&](const float* a, int64_t M, float* o) { LinearFp8(a, M, F.s2, o); }, sh.data());
  };
  auto routed = [&](int e) {
    const int64_t mm = beg[e + 1] - beg[e];
    std::vector<float>& xin = Zeroed(tl_moe.xin, mm * d);
    for (int64_t i = 0; i < mm; ++i) std::memcpy(xin.data() + i * d, x + rows[beg[e] + i] * d, d * sizeof(float));
    swiglu(
        xin.data(), mm, rw.data() + beg[e], [&](const float* a, int64_t M, float* o) { LinearFp4(a, M, F.w1[e], o); },
        [&](const float* a, int64_t M, float* o) { LinearFp4(a, M, F.w3[e], o); },
        [&](const float* a, int64_t M, float* o) { LinearFp4(a, M, F.w2[e], o); }, out.data() + beg[e] * d);
  };
  const bool shared_task = n <= kSharedExpertTaskRows;
  const int64_t tasks = static_cast<int64_t>(active.size()) + (shared_task ? 1 : 0);
  // Every thread first sizes its scratch for any task of this call (up to
  // max(n, 8) rows of width d or I), so which thread takes which task (dynamic)
  // never makes a later step allocate.
  const int64_t res_rows = std::max<int64_t>(n, kSharedExpertTaskRows), res_k = std::max(d, I);
#pragma omp parallel if(tasks > 1)
  {
    tl_moe.Reserve(res_rows, d, I);
    ReserveLinearScratch(res_rows, res_k);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      if (shared_task && t == 0) shared();
      else routed(active[t - (shared_task ? 1 : 0)]);
    }
  }
  if (!shared_task) shared();
  // Routed experts summed in increasing id (each expert's rows in order), FP32; + shared; BF16.
  std::vector<float>& y = Zeroed(ws_.moe_y, n * d);
  for (int e : active)
    for (int64_t i = beg[e]; i < beg[e + 1]; ++i) {
      float* yr = y.data() + rows[i] * d;
      const float* orow = out.data() + i * d;
      for (int64_t c = 0; c < d; ++c) yr[c] += orow[c];
    }
  for (int64_t i = 0; i < n * d; ++i) v[i] = RoundBf16(y[i] + sh[i]);
  if (dbg) {
    const int64_t T0 = info_[0].T;
    dbg->router_indices.assign(idx.begin(), idx.begin() + T0 * k);
    dbg->router_weights.assign(wts.begin(), wts.begin() + T0 * k);
  }
}

// ParallelHead.forward: hc_head (σ by torch.sigmoid), norm, FP32 head, for the
// rows that return logits (backend.h LogitsRows order).
void Pass::Head(const float* X, const HcHeadW& hh, const std::vector<uint16_t>& norm, std::vector<float>* out) {
  RegionScope region(Region::kHead);
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim, flat = hc * d, V = c_.vocab_size;
  auto first_row = [](const V4Seq& q) { return q.all_logits ? 0 : q.want_logits ? q.len - 1 : q.len; };
  int64_t m = 0;
  for (const V4Seq& q : seqs_) m += q.len - first_row(q);
  out->resize(static_cast<size_t>(m * V));  // every row is written below
  std::vector<float>& sq = Zeroed(ws_.head_sq, flat);
  std::vector<float>& pre = Zeroed(ws_.head_pre, hc);
  std::vector<float>& y = Zeroed(ws_.head_y, m * d);
  // Per row the collapse and the norm into y; then one head call over all m
  // rows (each output row depends only on its own input row).
  int64_t row = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const V4Seq& q = seqs_[s];
    for (int64_t i = first_row(q); i < q.len; ++i, ++row) {
      const float* f = X + (info_[s].row0 + i) * flat;
      for (int64_t t = 0; t < flat; ++t) sq[t] = f[t] * f[t];
      const float rsq = 1.0f / std::sqrt(ref::TorchSum(sq.data(), flat) / static_cast<float>(flat) + c_.norm_eps);
      const int32_t vec = RefPrefill(static_cast<int>(s)) ? ref::VectorPathCount(i, q.len, hc, 16)
                                                          : ref::VectorPathCount(0, 1, hc, 16);
      for (int j = 0; j < hc; ++j) {
        float acc = 0.0f;
        for (int64_t t = 0; t < flat; ++t) acc += f[t] * hh.fn[j * flat + t];
        const float mix = acc * rsq;
        pre[j] = ref::TorchSigmoid(mix * hh.scale[0] + hh.base[j], j < vec) + c_.hc_eps;
      }
      float* yr = y.data() + row * d;
      ref::HcCollapse(f, pre.data(), 1, hc, d, yr);
      ref::RmsNorm(yr, 1, d, norm.data(), c_.norm_eps, yr);
    }
  }
  if (m > 0) cpu::LinearF32Bf16W(y.data(), m, w_.head.packed, out->data());
}

// ---------------------------------------------------------------------------

void V4Model::Validate(const std::vector<V4Seq>& seqs, int n_window_layers) const {
  const ModelConfig& c = cfg_;
  if (seqs.empty()) Fail(ErrorKind::kInvalidArgument, "V4 Forward: empty batch");
  for (size_t s = 0; s < seqs.size(); ++s) {
    const V4Seq& q = seqs[s];
    if (q.len < 1 || q.tokens == nullptr)
      Fail(ErrorKind::kInvalidArgument, "V4 Forward: sequence {} has an empty chunk (len {})", s, q.len);
    if (q.start_pos < 0)
      Fail(ErrorKind::kInvalidArgument, "V4 Forward: sequence {} has negative start_pos {}", s, q.start_pos);
    if (q.state.pools == nullptr || q.state.geometry == nullptr || q.state.slot < 0)
      Fail(ErrorKind::kInvalidArgument, "V4 Forward: sequence {} has no state view (pools/geometry/slot)", s);
    const StateGeometry& g = *q.state.geometry;
    const auto& wr = g.of(StateKind::kWindow).regions;
    if (static_cast<int>(wr.size()) < n_window_layers || wr[0].row_bytes != c.head_dim * 2 ||
        wr[0].rows_per_block != c.window_size)
      Fail(ErrorKind::kInvalidArgument,
           "V4 Forward: sequence {}: state geometry does not match the model (build it with V4Model::Geometry)", s);
    const int64_t need = g.BlocksForTokens(q.start_pos + q.len);
    if (!g.of(StateKind::kCompressedKv).regions.empty() &&
        (q.state.block_table == nullptr || q.state.num_blocks < need))
      Fail(ErrorKind::kInvalidArgument,
           "V4 Forward: sequence {}: block table has {} blocks, expected at least {} for {} tokens", s,
           q.state.num_blocks, need, q.start_pos + q.len);
    for (int64_t i = 0; i < q.len; ++i)
      if (q.tokens[i] < 0 || q.tokens[i] >= c.vocab_size)
        Fail(ErrorKind::kInvalidArgument, "V4 Forward: sequence {} token {} at position {} outside [0, {})", s,
             q.tokens[i], q.start_pos + i, c.vocab_size);
  }
}

namespace {
// The model's step workspace for one call unless another call holds it (then
// a fresh one, as with reuse_step_workspace = false); released at scope end.
class WorkspaceLease {
 public:
  WorkspaceLease(const std::unique_ptr<StepWorkspace>& ws, std::atomic<bool>& busy)
      : busy_(ws && !busy.exchange(true, std::memory_order_acquire) ? &busy : nullptr) {
    if (!busy_) fresh_.emplace();
    ws_ = busy_ ? ws.get() : &*fresh_;
  }
  ~WorkspaceLease() {
    if (busy_) busy_->store(false, std::memory_order_release);
  }
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;
  StepWorkspace& ws() { return *ws_; }

 private:
  std::atomic<bool>* busy_;
  std::optional<StepWorkspace> fresh_;
  StepWorkspace* ws_ = nullptr;
};
}  // namespace

std::vector<float> V4Model::Forward(const std::vector<V4Seq>& seqs, bool per_row_layout, std::vector<float>* streams,
                                    V4Debug* debug) {
  std::vector<float> logits;
  ForwardInto(seqs, per_row_layout, &logits, streams, debug);
  return logits;
}

void V4Model::ForwardInto(const std::vector<V4Seq>& seqs, bool per_row_layout, std::vector<float>* logits,
                          std::vector<float>* streams, V4Debug* debug) {
  const ModelConfig& c = cfg_;
  Validate(seqs, c.n_layers);
  WorkspaceLease lease(ws_, ws_busy_);
  StepWorkspace& ws = lease.ws();
  Pass pass(*this, seqs, per_row_layout, ws);
  const int hc = c.hc_mult;
  const int64_t d = c.dim, R = pass.rows();
  std::vector<float>& X = Zeroed(ws.X, R * hc * d);
  int64_t r = 0;
  for (const V4Seq& q : seqs)
    for (int64_t i = 0; i < q.len; ++i, ++r)
      for (int j = 0; j < hc; ++j)
        for (int64_t t = 0; t < d; ++t)
          X[(r * hc + j) * d + t] = Bf16ToFloat(w_->embed[static_cast<int64_t>(q.tokens[i]) * d + t]);
  if (debug) debug->layers.assign(c.n_layers, {});
  for (int l = 0; l < c.n_layers; ++l) pass.Block(l, X.data(), debug ? &debug->layers[l] : nullptr);
  if (streams) streams->assign(X.begin(), X.end());
  pass.Head(X.data(), w_->hc_head, w_->norm, logits);
}

std::vector<float> V4Model::Mtp(const std::vector<V4Seq>& seqs, const float* streams, bool per_row_layout) {
  std::vector<float> logits;
  MtpInto(seqs, streams, per_row_layout, &logits);
  return logits;
}

void V4Model::MtpInto(const std::vector<V4Seq>& seqs, const float* streams, bool per_row_layout,
                      std::vector<float>* logits) {
  const ModelConfig& c = cfg_;
  if (c.n_mtp_layers < 1)
    Fail(ErrorKind::kInvalidArgument, "V4 Mtp: the model has no MTP block (num_nextn_predict_layers 0)");
  Validate(seqs, c.n_layers + 1);
  const int l = c.n_layers;
  const BlockW& B = w_->blocks[l];
  const int hc = c.hc_mult;
  WorkspaceLease lease(ws_, ws_busy_);
  StepWorkspace& ws = lease.ws();
  Pass pass(*this, seqs, per_row_layout, ws);
  const int64_t d = c.dim, R = pass.rows();
  // MTPBlock.forward: e = enorm(embed(ids)); x = hnorm(streams); X = e_proj(e) + h_proj(x) per stream.
  std::vector<float>& e = Zeroed(ws.mtp_e, R * d);
  std::vector<float>& ep = Zeroed(ws.mtp_ep, R * d);
  std::vector<float>& xs = Zeroed(ws.mtp_xs, R * hc * d);
  std::vector<float>& hp = Zeroed(ws.mtp_hp, R * hc * d);
  std::vector<float>& X = Zeroed(ws.X, R * hc * d);
  int64_t r = 0;
  for (const V4Seq& q : seqs)
    for (int64_t i = 0; i < q.len; ++i, ++r)
      for (int64_t t = 0; t < d; ++t) e[r * d + t] = Bf16ToFloat(w_->embed[static_cast<int64_t>(q.tokens[i]) * d + t]);
  ref::RmsNorm(e.data(), R, d, B.enorm.data(), c.norm_eps, e.data());
  ref::RmsNorm(streams, R * hc, d, B.hnorm.data(), c.norm_eps, xs.data());
  LinearFp8(e.data(), R, B.e_proj, ep.data());
  LinearFp8(xs.data(), R * hc, B.h_proj, hp.data());
  for (int64_t q = 0; q < R; ++q)
    for (int j = 0; j < hc; ++j)
      for (int64_t t = 0; t < d; ++t) X[(q * hc + j) * d + t] = RoundBf16(ep[q * d + t] + hp[(q * hc + j) * d + t]);
  pass.Block(l, X.data(), nullptr);
  pass.Head(X.data(), B.hc_head, B.norm, logits);
}

// ---------------------------------------------------------------------------
// V4State conveniences (golden tests).

V4State V4Model::NewState(int64_t max_len) const {
  V4State st;
  st.geometry = Geometry(128);
  st.max_len = max_len;
  const int64_t blocks = st.geometry.BlocksForTokens(max_len);
  st.arena = std::make_unique<DenseStateArena>(st.geometry, 1, blocks);
  st.block_table.resize(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) st.block_table[b] = static_cast<int32_t>(b);
  return st;
}

std::vector<float> V4Model::Forward(const int32_t* tokens, int64_t T, V4State* state, std::vector<float>* streams,
                                    V4Debug* debug) {
  if (state->len > 0 && T != 1)
    Fail(ErrorKind::kInvalidArgument, "V4 Forward: a call at start_pos {} must be one token (got {})", state->len, T);
  if (state->len + T > state->max_len)
    Fail(ErrorKind::kInvalidArgument, "V4 Forward: {} positions exceed the state's max_len {}", state->len + T,
         state->max_len);
  V4Seq q{tokens, T, state->len, state->view(), true, false};
  std::vector<float> logits = Forward(std::vector<V4Seq>{q}, false, streams, debug);
  state->len += T;
  return logits;
}

std::vector<float> V4Model::Mtp(const float* streams, const int32_t* next_ids, int64_t T, int64_t start,
                                V4State* state) {
  if (start > 0 && T != 1)
    Fail(ErrorKind::kInvalidArgument, "V4 Mtp: a call at start {} must be one token (got {})", start, T);
  V4Seq q{next_ids, T, start, state->view(), true, false};
  return Mtp(std::vector<V4Seq>{q}, streams, false);
}

std::vector<float> V4Model::WindowRows(const SequenceStateView& v, int l) const {
  const int64_t D = cfg_.head_dim, win = cfg_.window_size;
  std::vector<float> out(win * D);
  std::vector<uint16_t> b(D);
  const int region = v.geometry->of(StateKind::kWindow).RegionOf(l);
  for (int64_t s = 0; s < win; ++s) {
    FromBf16Row(v.Row(StateKind::kWindow, region, s), D, b.data());
    for (int64_t c = 0; c < D; ++c) out[s * D + c] = Bf16ToFloat(b[c]);
  }
  return out;
}

std::vector<float> V4Model::CompressedRows(const SequenceStateView& v, int l, int64_t n) const {
  const int64_t D = cfg_.head_dim, bs = v.geometry->block_size;
  const int r = cfg_.compress_ratios[l];
  const StateKindGeometry& kg = v.geometry->of(StateKind::kCompressedKv);
  const int region = kg.RegionOf(l);
  std::vector<float> out(n * D);
  std::vector<uint16_t> b(D);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = kg.regions[region].rows_per_block == 1 && r > bs ? j * (r / bs) : j;
    FromBf16Row(v.Row(StateKind::kCompressedKv, region, row), D, b.data());
    for (int64_t c = 0; c < D; ++c) out[j * D + c] = Bf16ToFloat(b[c]);
  }
  return out;
}

std::vector<float> V4Model::IndexKeyRows(const SequenceStateView& v, int l, int64_t n) const {
  const int64_t ID = cfg_.index_head_dim;
  const int region = v.geometry->of(StateKind::kIndexKey).RegionOf(l);
  std::vector<float> out(n * ID);
  std::vector<uint16_t> b(ID);
  for (int64_t j = 0; j < n; ++j) {
    FromBf16Row(v.Row(StateKind::kIndexKey, region, j), ID, b.data());
    for (int64_t c = 0; c < ID; ++c) out[j * ID + c] = Bf16ToFloat(b[c]);
  }
  return out;
}

std::vector<float> V4Model::CarryRows(const SequenceStateView& v, int l, bool indexer, bool score) const {
  const int r = cfg_.compress_ratios[l];
  const int coff = r == 4 ? 2 : 1;
  const int64_t hd = indexer ? cfg_.index_head_dim : cfg_.head_dim, wdt = coff * hd, nslot = coff * r;
  const int region = v.geometry->of(StateKind::kCompressorCarry).RegionOf(l);
  const int64_t base = (indexer ? 2 * nslot : 0) + (score ? nslot : 0);
  std::vector<float> out(nslot * wdt);
  for (int64_t t = 0; t < nslot; ++t)
    std::memcpy(out.data() + t * wdt, v.Row(StateKind::kCompressorCarry, region, base + t), wdt * 4);
  return out;
}

}  // namespace deepinfer::v4
