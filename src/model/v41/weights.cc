#include "model/v41/weights.h"

#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "format/numerics.h"

namespace deepinfer::v41 {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

class Binder {
 public:
  Binder(const TensorStore& s, const ModelConfig& c, ModelWeights* out) : store_(s), cfg_(c), out_(out) {}
  bool ieee() const { return out_->fp8_format == Fp8Format::kE4M3Ieee; }

  const TensorView& Expect(const std::string& name, DType dt, const std::vector<int64_t>& shape) const {
    const TensorView& t = store_.Get(name);
    if (t.dtype != dt)
      Fail(ErrorKind::kCorruptData, "tensor {} in {}: expected dtype {}, found {}", name,
           store_.dir().string(), DTypeName(dt), DTypeName(t.dtype));
    if (t.shape != shape)
      Fail(ErrorKind::kCorruptData, "tensor {} in {}: expected shape {}, found {}", name,
           store_.dir().string(), ShapeStr(shape), ShapeStr(t.shape));
    return t;
  }

  Fp8Linear Fp8(const std::string& prefix, int64_t out, int64_t in) const {
    return {Fp8View(prefix, out, in), {}, out_->fp8_format};
  }

  ref::Fp8Weight Fp8View(const std::string& prefix, int64_t out, int64_t in) const {
    const int64_t B = cfg_.weight_block_size;
    const TensorView& w = Expect(prefix + ".weight", DType::kF8E4M3, {out, in});
    const TensorView& s = Expect(prefix + ".scale", DType::kF8E8M0, {(out + B - 1) / B, (in + B - 1) / B});
    if (in % cfg_.act_block_size != 0)
      Fail(ErrorKind::kCorruptData, "tensor {}.weight: in_features {} is not a multiple of the activation block {}",
           prefix, in, cfg_.act_block_size);
    ref::Fp8Weight v{w.data, s.data, out, in, static_cast<int>(B)};
    if (ieee()) {
      v.w = HalvedCopy(w.data, out * in);
      v.scale = RaisedScales(prefix + ".scale", s.data, static_cast<int64_t>(s.nbytes));
      ++out_->ieee_report.tensors;
    }
    return v;
  }

  // e4m3-ieee transform (weights.h): the halved codes / raised scales, owned by the ModelWeights.
  const uint8_t* HalvedCopy(const uint8_t* codes, int64_t n) const {
    std::vector<uint8_t> h(static_cast<size_t>(n));
    out_->ieee_report.inexact += HalveE4M3Codes(codes, n, h.data());
    out_->ieee_report.values += n;
    out_->ieee_bytes.push_back(std::move(h));
    return out_->ieee_bytes.back().data();
  }
  const uint8_t* RaisedScales(const std::string& name, const uint8_t* scale, int64_t n) const {
    std::vector<uint8_t> r(static_cast<size_t>(n));
    CheckRaisable(name, scale, n, r.data());
    out_->ieee_bytes.push_back(std::move(r));
    return out_->ieee_bytes.back().data();
  }
  void CheckRaisable(const std::string& name, const uint8_t* scale, int64_t n, uint8_t* raised) const {
    uint8_t tmp = 0;
    for (int64_t i = 0; i < n; ++i)
      if (!RaiseE8M0ForIeee(scale[i], raised ? raised + i : &tmp))
        Fail(ErrorKind::kInvalidArgument,
             "--fp8-format e4m3-ieee: tensor {} in {}: scale byte {} is 254 (2^127), which cannot be raised by one "
             "(UE8M0 255 is NaN); this checkpoint cannot run in e4m3-ieee mode",
             name, store_.dir().string(), i);
    out_->ieee_report.scales += n;
  }

  Fp4Linear Fp4(const std::string& prefix, int64_t out, int64_t in) const {
    const TensorView& w = Expect(prefix + ".weight", DType::kI8, {out, in / 2});
    const TensorView& s = Expect(prefix + ".scale", DType::kF8E8M0, {out, in / 32});
    return {ref::Fp4Weight{w.data, s.data, out, in}, {}, out_->fp8_format};
  }

  Bf16Tensor Bf16(const std::string& name, int64_t rows, int64_t cols /* -1: vector */) const {
    std::vector<int64_t> shape = cols < 0 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols};
    const TensorView& t = Expect(name, DType::kBF16, shape);
    Bf16Tensor r;
    r.rows = cols < 0 ? 1 : rows;
    r.cols = cols < 0 ? rows : cols;
    if (reinterpret_cast<uintptr_t>(t.data) % alignof(uint16_t) == 0) {
      r.data = reinterpret_cast<const uint16_t*>(t.data);
    } else {
      r.own.resize(t.nbytes / 2);
      std::memcpy(r.own.data(), t.data, t.nbytes);
      r.data = r.own.data();
    }
    return r;
  }

  F32Tensor F32(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorView& t = Expect(name, DType::kF32, shape);
    F32Tensor r;
    r.v.resize(t.nbytes / 4);
    std::memcpy(r.v.data(), t.data, t.nbytes);
    return r;
  }

  // wo_a: E4M3 × block scale → BF16 (convert.py semantics).
  Bf16Tensor DequantBf16(const std::string& prefix, int64_t out, int64_t in) const {
    ref::Fp8Weight q = Fp8View(prefix, out, in);
    Bf16Tensor r;
    r.rows = out;
    r.cols = in;
    r.own.resize(static_cast<size_t>(out * in));
    const int64_t B = q.block, sc = (in + B - 1) / B;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        r.own[o * in + i] =
            FloatToBf16(E4M3ToFloat(q.w[o * in + i]) * E8M0ToFloat(q.scale[(o / B) * sc + i / B]));
    r.data = r.own.data();
    if (ieee()) out_->ieee_bytes.resize(out_->ieee_bytes.size() - 2);  // the transformed codes and scales: used up
    return r;
  }

 private:
  const TensorStore& store_;
  const ModelConfig& cfg_;
  ModelWeights* out_;
};

// One block's tensors under `p` ("layers.L." or "mtp.i."): mHC, attention
// (compressor/indexer by the schedule), the MoE with E routed experts (this
// rank's share bound) and Engram.
void BindLayer(const Binder& b, const ModelConfig& c, const std::string& p, const LayerSchedule& s, int64_t E,
               int shard_size, int shard_rank, ModelWeights* w, LayerWeights* out) {
  const int64_t d = c.dim, H = c.n_heads, D = c.head_dim, hc = c.hc_mult;
  const int64_t mix = c.hc_mix_dim();
  LayerWeights& L = *out;
  L.attn_norm = b.Bf16(p + "attn_norm.weight", d, -1);
  L.ffn_norm = b.Bf16(p + "ffn_norm.weight", d, -1);
  L.hc_attn_fn = b.F32(p + "hc_attn_fn", {mix, hc * d});
  L.hc_attn_base = b.F32(p + "hc_attn_base", {mix});
  L.hc_attn_scale = b.F32(p + "hc_attn_scale", {3});
  L.hc_ffn_fn = b.F32(p + "hc_ffn_fn", {mix, hc * d});
  L.hc_ffn_base = b.F32(p + "hc_ffn_base", {mix});
  L.hc_ffn_scale = b.F32(p + "hc_ffn_scale", {3});

  AttentionWeights& A = L.attn;
  A.wq_a = b.Fp8(p + "attn.wq_a", c.q_lora_rank, d);
  A.q_norm = b.Bf16(p + "attn.q_norm.weight", c.q_lora_rank, -1);
  A.wq_b = b.Fp8(p + "attn.wq_b", H * D, c.q_lora_rank);
  A.wkv = b.Fp8(p + "attn.wkv", D, d);
  A.kv_norm = b.Bf16(p + "attn.kv_norm.weight", D, -1);
  A.wo_a = b.DequantBf16(p + "attn.wo_a", c.o_groups * c.o_lora_rank, H * D / c.o_groups);
  A.wo_b = b.Fp8(p + "attn.wo_b", d, c.o_groups * c.o_lora_rank);
  A.attn_sink = b.F32(p + "attn.attn_sink", {H});
  if (s.kv_source) {
    A.has_compressor = true;
    A.compressor_wkv = b.Bf16(p + "attn.compressor.wkv.weight", D, d);
    if (s.compress_ratio > 1) A.compressor_wgate = b.Bf16(p + "attn.compressor.wgate.weight", D, d);
    A.compressor_norm = b.Bf16(p + "attn.compressor.norm.weight", D, -1);
    A.indexer_wk = b.Bf16(p + "attn.indexer.wk.weight", c.index_head_dim, D);
    A.indexer_k_norm = b.Bf16(p + "attn.indexer.k_norm.weight", c.index_head_dim, -1);
  }
  if (s.index_source) {
    A.has_indexer_query = true;
    A.indexer_wq_b = b.Fp8(p + "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    A.indexer_weights_proj = b.Bf16(p + "attn.indexer.weights_proj.weight", c.index_n_heads, d);
  }

  MoeWeights& F = L.ffn;
  const int64_t I = c.moe_inter_dim;
  F.gate = b.Bf16(p + "ffn.gate.weight", E, d);
  F.bias = b.F32(p + "ffn.gate.bias", {E});
  if (c.vision_n_layers > 0) F.bias_vl = b.F32(p + "ffn.gate.bias_vl", {E});
  F.experts.resize(E);
  const int64_t per_rank = E / shard_size;
  for (int64_t e = shard_rank * per_rank; e < (shard_rank + 1) * per_rank; ++e) {
    const std::string q = fmt::format("{}ffn.experts.{}.", p, e);
    F.experts[e].bound = true;
    F.experts[e].w1 = b.Fp4(q + "w1", I, d);
    F.experts[e].w3 = b.Fp4(q + "w3", I, d);
    F.experts[e].w2 = b.Fp4(q + "w2", d, I);
    // E2M1 codes (two per byte) + one UE8M0 scale per 32 weights.
    w->bytes.routed_experts += 3 * (I * d / 2 + I * d / 32);
  }
  F.shared_w1 = b.Fp8(p + "ffn.shared_experts.w1", I, d);
  F.shared_w3 = b.Fp8(p + "ffn.shared_experts.w3", I, d);
  F.shared_w2 = b.Fp8(p + "ffn.shared_experts.w2", d, I);

  if (s.engram_slot >= 0) {
    L.has_engram = true;
    EngramWeights& G = L.engram;
    const int64_t hd = c.engram_head_dim;
    G.rows = c.engram_num_embeddings[s.engram_slot];
    if (hd % 32 != 0)
      Fail(ErrorKind::kInvalidArgument, "engram_head_dim {} is not a multiple of 32", hd);
    G.table = b.Expect(p + "engram.embed.weight", DType::kF8E4M3, {G.rows, hd}).data;
    G.table_scale = b.Expect(p + "engram.embed.scale", DType::kF8E8M0, {G.rows, hd / 32}).data;
    G.row_begin = G.rows * shard_rank / shard_size;
    G.row_end = G.rows * (shard_rank + 1) / shard_size;
    w->bytes.engram_rows += (G.row_end - G.row_begin) * (hd + hd / 32);
    // Read at random rows every step: mapped now, not one fault per new row.
    PrefaultMapped(G.table + G.row_begin * hd, static_cast<size_t>((G.row_end - G.row_begin) * hd));
    PrefaultMapped(G.table_scale + G.row_begin * (hd / 32), static_cast<size_t>((G.row_end - G.row_begin) * (hd / 32)));
    if (b.ieee()) {  // transformed on lookup (weights.h); this rank's rows' scales are checked here
      G.halve_codes = true;
      b.CheckRaisable(p + "engram.embed.scale", G.table_scale + G.row_begin * (hd / 32),
                      (G.row_end - G.row_begin) * (hd / 32), nullptr);
      ++w->ieee_report.tensors;
    }
    const int64_t cols = static_cast<int64_t>(c.engram_max_ngram_size - 1) * c.engram_n_heads * hd;
    G.wkv = b.Fp8(p + "engram.wkv", (hc + 1) * d, cols);
    Bf16Tensor qw = b.Bf16(p + "engram.q_weight", hc, d);
    Bf16Tensor kw = b.Bf16(p + "engram.k_weight", hc, d);
    G.qk.v.resize(static_cast<size_t>(hc * d));
    for (int64_t i = 0; i < hc * d; ++i) G.qk.v[i] = Bf16ToFloat(qw.data[i]) * Bf16ToFloat(kw.data[i]);
  }
}

}  // namespace

std::unique_ptr<ModelWeights> ModelWeights::Bind(const TensorStore& store, const ModelConfig& c, int shard_size,
                                                int shard_rank, Fp8Format fp8_format) {
  if (c.arch != Arch::kDeepseekV41)
    Fail(ErrorKind::kInvalidArgument, "{}: model_type {} is not deepseek_v41", store.dir().string(), c.model_type);
  if (c.expert_dtype != "fp4")
    Fail(ErrorKind::kInvalidArgument, "{}: expert_dtype {} not supported, expected fp4", store.dir().string(),
         c.expert_dtype);
  if (c.weight_block_size != 32 || c.act_block_size != 32)
    Fail(ErrorKind::kInvalidArgument, "{}: weight_block_size {} not supported, expected 32 (V4.1)",
         store.dir().string(), c.weight_block_size);
  auto w = std::make_unique<ModelWeights>();
  w->fp8_format = fp8_format;
  Binder b(store, c, w.get());
  const int64_t d = c.dim;
  w->embed = b.Bf16("embed.weight", c.vocab_size, d);
  PrefaultMapped(w->embed.data, static_cast<size_t>(c.vocab_size * d) * 2);  // a row per token, at random
  w->head = b.Bf16("head.weight", c.vocab_size, d);
  w->norm = b.Bf16("norm.weight", d, -1);
  w->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l)
    BindLayer(b, c, fmt::format("layers.{}.", l), c.layers[l], c.n_routed_experts, shard_size, shard_rank, w.get(),
              &w->layers[l]);
  // Everything that is neither a routed expert nor an Engram table is replicated on every rank.
  int64_t all_experts = 0, all_engram = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    all_experts += c.n_routed_experts * 3 * (c.moe_inter_dim * d / 2 + c.moe_inter_dim * d / 32);
    if (w->layers[l].has_engram) all_engram += w->layers[l].engram.rows * (c.engram_head_dim + c.engram_head_dim / 32);
  }
  w->bytes.other = static_cast<int64_t>(store.total_bytes()) - all_experts - all_engram;
  return w;
}

namespace {

// The fast kernels' layouts (PackForCpu); each returns the bytes allocated.
struct Packer {
  size_t bytes = 0;
  size_t wo_a_decode = 0;  // the layers' wo_a: PackedBf16::decode_bytes
  void Fp8(Fp8Linear& l) {
    l.packed = std::make_unique<cpu::PackedFp8>(cpu::PackFp8(l.w));
    bytes += l.packed->bytes();
  }
  void Fp4(Fp4Linear& l) {
    l.packed = std::make_unique<cpu::PackedFp4>(cpu::PackFp4(l.w));
    bytes += l.packed->bytes();
  }
  // The gate/up pair [w1; w3] as one packed weight (ExpertWeights::w13);
  // the separate packed forms are dropped when the merge is made.
  template <class L, class P>
  void Merge(L& w1, L& w3, std::unique_ptr<P>* w13) {
    if (!w1.packed || !w3.packed || w1.act_format != w3.act_format) return;
    *w13 = cpu::ConcatPackedRows(*w1.packed, *w3.packed);
    if (!*w13) return;
    bytes += (*w13)->bytes();
    bytes -= w1.packed->bytes() + w3.packed->bytes();
    w1.packed.reset();
    w3.packed.reset();
  }
  void Bf16(Bf16Tensor& t) {
    if (t.data == nullptr) return;
    t.packed = std::make_unique<cpu::PackedBf16>(cpu::PackBf16(t.weight()));
    bytes += t.packed->bytes();
  }
  void F32(F32Tensor& t, int64_t out, int64_t in) {
    t.packed = std::make_unique<cpu::PackedF32>(cpu::PackF32(t.data(), out, in));
    bytes += t.packed->bytes();
  }
  void Layer(LayerWeights& L) {
    const int64_t mix = static_cast<int64_t>(L.hc_attn_base.v.size());
    F32(L.hc_attn_fn, mix, static_cast<int64_t>(L.hc_attn_fn.v.size()) / mix);
    F32(L.hc_ffn_fn, mix, static_cast<int64_t>(L.hc_ffn_fn.v.size()) / mix);
    AttentionWeights& A = L.attn;
    Fp8(A.wq_a);
    Fp8(A.wq_b);
    Fp8(A.wkv);
    Fp8(A.wo_b);
    Bf16(A.wo_a);
    if (A.wo_a.packed) wo_a_decode += A.wo_a.packed->decode_bytes();
    if (A.has_compressor) {
      Bf16(A.compressor_wkv);
      Bf16(A.compressor_wgate);
      Bf16(A.indexer_wk);
    }
    if (A.has_indexer_query) {
      Fp8(A.indexer_wq_b);
      Bf16(A.indexer_weights_proj);
    }
    MoeWeights& F = L.ffn;
    Bf16(F.gate);
    for (ExpertWeights& e : F.experts) {
      if (!e.bound) continue;
      Fp4(e.w1);
      Fp4(e.w3);
      Merge(e.w1, e.w3, &e.w13);
      Fp4(e.w2);
    }
    Fp8(F.shared_w1);
    Fp8(F.shared_w3);
    Merge(F.shared_w1, F.shared_w3, &F.shared_w13);
    Fp8(F.shared_w2);
    if (L.has_engram) Fp8(L.engram.wkv);
  }
};

}  // namespace

size_t ModelWeights::PackForCpu() {
  Packer pk;
  pk.Bf16(head);
  for (LayerWeights& L : layers) pk.Layer(L);
  wo_a_decode_bytes = static_cast<int64_t>(pk.wo_a_decode);
  packed_for_cpu = true;
  return pk.bytes;
}

void ModelWeights::BindDspark(const TensorStore& store, const ModelConfig& c) {
  if (has_dspark) return;
  if (c.n_mtp_layers < 1 || c.dspark_block_size < 1)
    Fail(ErrorKind::kInvalidArgument,
         "{}: the model has no DSpark drafter (num_nextn_predict_layers {}, dspark_block_size {})",
         store.dir().string(), c.n_mtp_layers, c.dspark_block_size);
  Binder b(store, c, this);
  const int64_t d = c.dim, R = c.dspark_markov_rank;
  const int last = c.n_mtp_layers - 1;
  dspark.blocks.resize(static_cast<size_t>(c.n_mtp_layers));
  for (int i = 0; i < c.n_mtp_layers; ++i)
    BindLayer(b, c, fmt::format("mtp.{}.", i), c.layers[c.n_layers + i], c.dspark_n_routed_experts, 1, 0, this,
              &dspark.blocks[i]);
  const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  dspark.main_proj = b.Fp8("mtp.0.main_proj", d, nt * d);
  dspark.main_norm = b.Bf16("mtp.0.main_norm.weight", d, -1);
  const std::string p = fmt::format("mtp.{}.", last);
  dspark.norm = b.Bf16(p + "norm.weight", d, -1);
  dspark.markov_embed = b.Bf16(p + "markov_head.embed.weight", c.vocab_size, R);
  PrefaultMapped(dspark.markov_embed.data, static_cast<size_t>(c.vocab_size * R) * 2);  // a row per drafted token
  dspark.markov_head = b.Bf16(p + "markov_head.head.weight", c.vocab_size, R);
  dspark.confidence_proj = b.Bf16(p + "confidence_head.proj.weight", 1, d + R);
  if (packed_for_cpu) {
    Packer pk;
    for (LayerWeights& L : dspark.blocks) pk.Layer(L);
    pk.Fp8(dspark.main_proj);
    pk.Bf16(dspark.markov_head);
    pk.Bf16(dspark.confidence_proj);
  }
  has_dspark = true;
}

}  // namespace deepinfer::v41
