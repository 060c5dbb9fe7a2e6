// deepinfer/tools/make_tiny_v4.cc — see make_tiny_v4.h. Spec: docs/golden/TINY_V4_SPEC.md.
#include "tools/make_tiny_v4.h"

#include "base/error.h"
#include "tools/py_json.h"

namespace deepinfer::tiny {
namespace {

// Roles (TINY_V4_SPEC.md §2): (center, amp).
constexpr double kNormC = 1.0, kNormA = 0.125;
constexpr double kBiasA = 0.125;
constexpr double kSinkA = 0.5, kApeA = 0.5;
constexpr double kExpertUpA = 0.5, kExpertDownA = 0.03125;

class V4Planner {
 public:
  explicit V4Planner(const TinyV4Config& c) : c_(c) {}
  std::vector<PlannedTensor> items;

  void Add(std::string name, TinyKind kind, std::vector<int64_t> shape) {
    const double amp = LinearAmp(shape.back());
    items.push_back({std::move(name), kind, std::move(shape), 0.0, amp});
  }
  void Add(std::string name, TinyKind kind, std::vector<int64_t> shape, double center, double amp) {
    items.push_back({std::move(name), kind, std::move(shape), center, amp});
  }
  void Norm(std::string name, int64_t dim) { Add(std::move(name), TinyKind::kBf16, {dim}, kNormC, kNormA); }

  // compressor_plan(): overlap (ratio 4) doubles the width.
  void Compressor(const std::string& pre, int ratio, int64_t head_dim) {
    const int64_t coff = ratio == 4 ? 2 : 1;
    Add(pre + "ape", TinyKind::kF32, {ratio, coff * head_dim}, 0.0, kApeA);
    Add(pre + "wkv.weight", TinyKind::kBf16, {coff * head_dim, c_.dim});
    Add(pre + "wgate.weight", TinyKind::kBf16, {coff * head_dim, c_.dim});
    Norm(pre + "norm.weight", head_dim);
  }

  // block_plan().
  void Block(const std::string& pre, int layer_id) {
    const TinyV4Config& c = c_;
    const int64_t d = c.dim, hd = c.head_dim, nh = c.n_heads, hc = c.hc_mult;
    const int64_t mix = (2 + hc) * hc;
    const int ratio = c.compress_ratios[layer_id];
    Norm(pre + "attn_norm.weight", d);
    Norm(pre + "ffn_norm.weight", d);
    for (const char* site : {"attn", "ffn"}) {
      Add(pre + "hc_" + site + "_fn", TinyKind::kF32, {mix, hc * d});
      Add(pre + "hc_" + site + "_base", TinyKind::kF32, {mix}, 0.0, kBiasA);
      Add(pre + "hc_" + site + "_scale", TinyKind::kF32, {3}, kNormC, kNormA);
    }
    const std::string a = pre + "attn.";
    Add(a + "wq_a.weight", TinyKind::kFp8Block128, {c.q_lora_rank, d});
    Norm(a + "q_norm.weight", c.q_lora_rank);
    Add(a + "wq_b.weight", TinyKind::kFp8Block128, {nh * hd, c.q_lora_rank});
    Add(a + "wkv.weight", TinyKind::kFp8Block128, {hd, d});
    Norm(a + "kv_norm.weight", hd);
    Add(a + "wo_a.weight", TinyKind::kFp8Block128, {c.o_groups * c.o_lora_rank, nh * hd / c.o_groups});
    Add(a + "wo_b.weight", TinyKind::kFp8Block128, {d, c.o_groups * c.o_lora_rank});
    Add(a + "attn_sink", TinyKind::kF32, {nh}, 0.0, kSinkA);
    if (ratio) Compressor(a + "compressor.", ratio, hd);
    if (ratio == 4) {
      Add(a + "indexer.wq_b.weight", TinyKind::kFp8Block128, {c.index_n_heads * c.index_head_dim, c.q_lora_rank});
      Add(a + "indexer.weights_proj.weight", TinyKind::kBf16, {c.index_n_heads, d});
      Compressor(a + "indexer.compressor.", ratio, c.index_head_dim);
    }
    const std::string f = pre + "ffn.";
    const int n_exp = c.n_routed_experts;
    Add(f + "gate.weight", TinyKind::kBf16, {n_exp, d});
    if (layer_id < c.n_hash_layers) {
      items.push_back({f + "gate.tid2eid", TinyKind::kTid2eid, {c.vocab_size, c.n_activated_experts}, 0.0, 0.0,
                       n_exp});
    } else {
      Add(f + "gate.bias", TinyKind::kF32, {n_exp}, 0.0, kBiasA);
    }
    const int64_t inter = c.moe_inter_dim;
    for (int e = 0; e < n_exp; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      Add(x + "w1.weight", TinyKind::kFp4Rows, {inter, d}, 0.0, kExpertUpA);
      Add(x + "w2.weight", TinyKind::kFp4Rows, {d, inter}, 0.0, kExpertDownA);
      Add(x + "w3.weight", TinyKind::kFp4Rows, {inter, d}, 0.0, kExpertUpA);
    }
    Add(f + "shared_experts.w1.weight", TinyKind::kFp8Block128, {inter, d}, 0.0, kExpertUpA);
    Add(f + "shared_experts.w2.weight", TinyKind::kFp8Block128, {d, inter}, 0.0, kExpertDownA);
    Add(f + "shared_experts.w3.weight", TinyKind::kFp8Block128, {inter, d}, 0.0, kExpertUpA);
  }

  void HcHead(const std::string& pre) {
    const int64_t hc = c_.hc_mult, d = c_.dim;
    Add(pre + "hc_head_fn", TinyKind::kF32, {hc, hc * d});
    Add(pre + "hc_head_base", TinyKind::kF32, {hc}, 0.0, kBiasA);
    Add(pre + "hc_head_scale", TinyKind::kF32, {1}, kNormC, kNormA);
  }

  // full_plan().
  void Full() {
    const TinyV4Config& c = c_;
    const int64_t d = c.dim, v = c.vocab_size;
    Add("embed.weight", TinyKind::kBf16, {v, d}, 0.0, 1.0);
    Add("head.weight", TinyKind::kBf16, {v, d}, 0.0, 0.5);
    Norm("norm.weight", d);
    HcHead("");
    for (int i = 0; i < c.n_layers; ++i) Block("layers." + std::to_string(i) + ".", i);
    for (int s = 0; s < c.n_mtp_layers; ++s) {
      const std::string pre = "mtp." + std::to_string(s) + ".";
      Block(pre, c.n_layers + s);
      Add(pre + "e_proj.weight", TinyKind::kFp8Block128, {d, d});
      Add(pre + "h_proj.weight", TinyKind::kFp8Block128, {d, d});
      Norm(pre + "enorm.weight", d);
      Norm(pre + "hnorm.weight", d);
      Norm(pre + "norm.weight", d);
      HcHead(pre);
    }
  }

 private:
  const TinyV4Config& c_;
};

#define BAD(...) Fail(ErrorKind::kInvalidArgument, __VA_ARGS__)

}  // namespace

TinyV4Config V4PresetConfig(TinyPreset p) {
  TinyV4Config c;
  switch (p) {
    case TinyPreset::kTiny: return c;
    case TinyPreset::kLarge:
      c.dim = 1024; c.moe_inter_dim = 512; c.n_layers = 16; c.n_hash_layers = 3; c.n_heads = 16;
      c.head_dim = 512; c.q_lora_rank = 512; c.o_groups = 8; c.o_lora_rank = 512; c.window_size = 128;
      c.index_n_heads = 16; c.index_topk = 512; c.n_routed_experts = 128; c.n_activated_experts = 6;
      // The release's pattern: two SWA layers, then C4 / C128 alternating; MTP ratio 0.
      c.compress_ratios.assign(c.n_layers + c.n_mtp_layers, 0);
      for (int i = 2; i < c.n_layers; ++i) c.compress_ratios[i] = i % 2 == 0 ? 4 : 128;
      return c;
    default: break;
  }
  BAD("make-tiny --arch deepseek_v4: --preset {} is not available (tiny or large)", PresetName(p));
}

void ValidateV4Config(const TinyV4Config& c) {
  auto mult = [&](const char* what, int64_t v, int64_t m) {
    if (v <= 0 || v % m != 0) BAD("invalid tiny V4 config: {} = {} must be a positive multiple of {}", what, v, m);
  };
  if (c.vocab_size <= 0) BAD("invalid tiny V4 config: vocab_size = {}", c.vocab_size);
  if (c.n_layers < 1 || c.n_mtp_layers < 0)
    BAD("invalid tiny V4 config: n_layers {} must be >= 1, n_mtp_layers {} >= 0", c.n_layers, c.n_mtp_layers);
  if (c.n_heads < 1 || c.o_groups < 1 || c.hc_mult < 1 || c.index_n_heads < 1)
    BAD("invalid tiny V4 config: n_heads, o_groups, hc_mult, index_n_heads must be >= 1");
  mult("dim", c.dim, 128);
  mult("moe_inter_dim", c.moe_inter_dim, 128);
  mult("q_lora_rank", c.q_lora_rank, 128);
  mult("head_dim", c.head_dim, 128);
  mult("index_head_dim", c.index_head_dim, 128);
  mult("o_groups * o_lora_rank", c.o_groups * c.o_lora_rank, 128);
  if ((c.n_heads * c.head_dim) % c.o_groups != 0)
    BAD("invalid tiny V4 config: n_heads * head_dim = {} not divisible by o_groups = {}", c.n_heads * c.head_dim,
        c.o_groups);
  mult("n_heads * head_dim / o_groups", c.n_heads * c.head_dim / c.o_groups, 128);
  if (c.rope_head_dim <= 0 || c.rope_head_dim % 2 != 0 || c.rope_head_dim > c.head_dim ||
      c.rope_head_dim > c.index_head_dim)
    BAD("invalid tiny V4 config: rope_head_dim = {} must be even and <= head_dim and index_head_dim",
        c.rope_head_dim);
  if (c.n_shared_experts != 1)
    BAD("invalid tiny V4 config: n_shared_experts = {} (the generator writes exactly 1)", c.n_shared_experts);
  if (c.n_routed_experts < 2 || c.n_activated_experts < 1 || c.n_activated_experts > c.n_routed_experts)
    BAD("invalid tiny V4 config: n_activated_experts = {} must be in [1, n_routed_experts = {}] (>= 2 experts)",
        c.n_activated_experts, c.n_routed_experts);
  if (c.n_hash_layers < 0 || c.n_hash_layers > c.n_layers)
    BAD("invalid tiny V4 config: n_hash_layers = {} outside [0, n_layers = {}]", c.n_hash_layers, c.n_layers);
  if (c.dtype != "fp8" || c.expert_dtype != "fp4" || c.scale_fmt != "ue8m0")
    BAD("invalid tiny V4 config: dtype/expert_dtype/scale_fmt must be fp8/fp4/ue8m0");
  if (static_cast<int>(c.compress_ratios.size()) != c.n_layers + c.n_mtp_layers)
    BAD("invalid tiny V4 config: compress_ratios has {} entries, expected n_layers + n_mtp_layers = {}",
        c.compress_ratios.size(), c.n_layers + c.n_mtp_layers);
  for (int i = 0; i < c.n_layers + c.n_mtp_layers; ++i) {
    const int r = c.compress_ratios[i];
    if (r != 0 && r != 4 && r != 128) BAD("invalid tiny V4 config: compress_ratios[{}] = {}, expected 0, 4 or 128", i, r);
    if (i >= c.n_layers && r != 0) BAD("invalid tiny V4 config: compress_ratios[{}] = {} on an MTP block, expected 0", i, r);
  }
  if (c.window_size < 1 || c.index_topk < 1) BAD("invalid tiny V4 config: window_size and index_topk must be >= 1");
}

std::vector<PlannedTensor> PlanV4Tensors(const TinyV4Config& c) {
  V4Planner p(c);
  p.Full();
  return std::move(p.items);
}

std::string V4InferenceConfigJson(const TinyV4Config& c) {
  PyJson j = PyJson::Obj();
  j.Add("vocab_size", PyJson::Int(c.vocab_size))
      .Add("dim", PyJson::Int(c.dim))
      .Add("moe_inter_dim", PyJson::Int(c.moe_inter_dim))
      .Add("n_layers", PyJson::Int(c.n_layers))
      .Add("n_hash_layers", PyJson::Int(c.n_hash_layers))
      .Add("n_mtp_layers", PyJson::Int(c.n_mtp_layers))
      .Add("n_heads", PyJson::Int(c.n_heads))
      .Add("head_dim", PyJson::Int(c.head_dim))
      .Add("rope_head_dim", PyJson::Int(c.rope_head_dim))
      .Add("q_lora_rank", PyJson::Int(c.q_lora_rank))
      .Add("o_groups", PyJson::Int(c.o_groups))
      .Add("o_lora_rank", PyJson::Int(c.o_lora_rank))
      .Add("window_size", PyJson::Int(c.window_size))
      .Add("compress_ratios", PyJson::IntList(c.compress_ratios))
      .Add("index_n_heads", PyJson::Int(c.index_n_heads))
      .Add("index_head_dim", PyJson::Int(c.index_head_dim))
      .Add("index_topk", PyJson::Int(c.index_topk))
      .Add("n_routed_experts", PyJson::Int(c.n_routed_experts))
      .Add("n_activated_experts", PyJson::Int(c.n_activated_experts))
      .Add("n_shared_experts", PyJson::Int(c.n_shared_experts))
      .Add("score_func", PyJson::Str(c.score_func))
      .Add("route_scale", PyJson::Float(c.route_scale))
      .Add("swiglu_limit", PyJson::Float(c.swiglu_limit))
      .Add("norm_eps", PyJson::Float(c.norm_eps))
      .Add("hc_mult", PyJson::Int(c.hc_mult))
      .Add("hc_sinkhorn_iters", PyJson::Int(c.hc_sinkhorn_iters))
      .Add("hc_eps", PyJson::Float(c.hc_eps))
      .Add("rope_theta", PyJson::Int(c.rope_theta))
      .Add("compress_rope_theta", PyJson::Int(c.compress_rope_theta))
      .Add("original_seq_len", PyJson::Int(c.original_seq_len))
      .Add("rope_factor", PyJson::Int(c.rope_factor))
      .Add("beta_fast", PyJson::Int(c.beta_fast))
      .Add("beta_slow", PyJson::Int(c.beta_slow))
      .Add("dtype", PyJson::Str(c.dtype))
      .Add("scale_fmt", PyJson::Str(c.scale_fmt))
      .Add("expert_dtype", PyJson::Str(c.expert_dtype));
  return Dump(j);
}

std::string V4HfConfigJson(const TinyV4Config& c) {
  PyJson arch;
  arch.type = PyJson::kArr;
  arch.arr.push_back(PyJson::Str("DeepseekV4ForCausalLM"));
  PyJson q = PyJson::Obj();
  q.Add("activation_scheme", PyJson::Str("dynamic"))
      .Add("fmt", PyJson::Str("e4m3"))
      .Add("quant_method", PyJson::Str("fp8"))
      .Add("scale_fmt", PyJson::Str(c.scale_fmt))
      .Add("weight_block_size", PyJson::IntList(std::vector<int>{128, 128}));
  PyJson rope = PyJson::Obj();
  rope.Add("beta_fast", PyJson::Int(c.beta_fast))
      .Add("beta_slow", PyJson::Int(c.beta_slow))
      .Add("factor", PyJson::Int(c.rope_factor))
      .Add("original_max_position_embeddings", PyJson::Int(c.original_seq_len))
      .Add("type", PyJson::Str("yarn"));
  PyJson j = PyJson::Obj();
  j.Add("architectures", std::move(arch))
      .Add("attention_bias", PyJson::Bool(false))
      .Add("attention_dropout", PyJson::Float(0.0))
      .Add("bos_token_id", PyJson::Int(0))
      .Add("eos_token_id", PyJson::Int(1))
      .Add("hc_eps", PyJson::Float(c.hc_eps))
      .Add("hc_mult", PyJson::Int(c.hc_mult))
      .Add("hc_sinkhorn_iters", PyJson::Int(c.hc_sinkhorn_iters))
      .Add("head_dim", PyJson::Int(c.head_dim))
      .Add("hidden_act", PyJson::Str("silu"))
      .Add("hidden_size", PyJson::Int(c.dim))
      .Add("index_head_dim", PyJson::Int(c.index_head_dim))
      .Add("index_n_heads", PyJson::Int(c.index_n_heads))
      .Add("index_topk", PyJson::Int(c.index_topk))
      .Add("initializer_range", PyJson::Float(0.02))
      .Add("max_position_embeddings", PyJson::Int(1048576))
      .Add("model_type", PyJson::Str("deepseek_v4"))
      .Add("moe_intermediate_size", PyJson::Int(c.moe_inter_dim))
      .Add("n_routed_experts", PyJson::Int(c.n_routed_experts))
      .Add("n_shared_experts", PyJson::Int(c.n_shared_experts))
      .Add("norm_topk_prob", PyJson::Bool(true))
      .Add("num_attention_heads", PyJson::Int(c.n_heads))
      .Add("num_experts_per_tok", PyJson::Int(c.n_activated_experts))
      .Add("num_hidden_layers", PyJson::Int(c.n_layers))
      .Add("num_hash_layers", PyJson::Int(c.n_hash_layers))
      .Add("num_key_value_heads", PyJson::Int(1))
      .Add("num_nextn_predict_layers", PyJson::Int(c.n_mtp_layers))
      .Add("o_groups", PyJson::Int(c.o_groups))
      .Add("o_lora_rank", PyJson::Int(c.o_lora_rank))
      .Add("q_lora_rank", PyJson::Int(c.q_lora_rank))
      .Add("qk_rope_head_dim", PyJson::Int(c.rope_head_dim))
      .Add("quantization_config", std::move(q))
      .Add("rms_norm_eps", PyJson::Float(c.norm_eps))
      .Add("rope_scaling", std::move(rope))
      .Add("rope_theta", PyJson::Int(c.rope_theta))
      .Add("routed_scaling_factor", PyJson::Float(c.route_scale))
      .Add("scoring_func", PyJson::Str(c.score_func))
      .Add("sliding_window", PyJson::Int(c.window_size))
      .Add("swiglu_limit", PyJson::Float(c.swiglu_limit))
      .Add("tie_word_embeddings", PyJson::Bool(false))
      .Add("topk_method", PyJson::Str("noaux_tc"))
      .Add("torch_dtype", PyJson::Str("bfloat16"))
      .Add("transformers_version", PyJson::Str("4.57.1"))
      .Add("use_cache", PyJson::Bool(true))
      .Add("vocab_size", PyJson::Int(c.vocab_size))
      .Add("compress_rope_theta", PyJson::Int(c.compress_rope_theta))
      .Add("compress_ratios", PyJson::IntList(c.compress_ratios))
      .Add("expert_dtype", PyJson::Str(c.expert_dtype));
  return Dump(j);
}

std::string V4TensorListTsv(const TinyV4Config& c) { return PlanListTsv(PlanV4Tensors(c)); }

WriteResult WriteTinyV4Checkpoint(const TinyV4Config& c, const std::filesystem::path& out_dir,
                                  const WriteOptions& opts) {
  ValidateV4Config(c);
  return WritePlannedCheckpoint(PlanV4Tensors(c), V4HfConfigJson(c), V4InferenceConfigJson(c), c.vocab_size,
                                out_dir, opts);
}

}  // namespace deepinfer::tiny
