// deepinfer/tools/make_tiny_config.cc — see make_tiny.h: the tiny V4.1 checkpoint's two config
// files (inference/config.json and config.json) as make_tiny_v41.py writes them. Spec:
// shared/golden/TINY_V41_SPEC.md §1 (the configs are data: the default tiny config is written as the
// golden bytes below; any other config is emitted field by field in the same layout).
#include "tools/make_tiny.h"

#include <string>
#include <string_view>

#include "tools/py_json.h"

namespace deepinfer::tiny {
namespace {

constexpr int kBlock = 32;  // FP8 weight blocks 32×32 (as make_tiny.cc)

// ============================================================================
// The golden config files (exact bytes written by make_tiny_v41.py for the
// default tiny config; spec §1 says the configs are data).
// ============================================================================
constexpr std::string_view kGoldenInferenceConfig = R"json({
  "vocab_size": 129280,
  "dim": 64,
  "moe_inter_dim": 64,
  "n_layers": 8,
  "n_mtp_layers": 2,
  "n_heads": 4,
  "head_dim": 128,
  "rope_head_dim": 64,
  "q_lora_rank": 64,
  "o_groups": 2,
  "o_lora_rank": 64,
  "window_size": 16,
  "compress_ratios": [
    0,
    0,
    2,
    2,
    1,
    1,
    1,
    1,
    0,
    0
  ],
  "kv_source_layers": [
    2,
    4
  ],
  "index_source_layers": [
    2,
    4,
    6
  ],
  "candidate_source_layer": 4,
  "candidate_topk_blocks": 4,
  "candidate_block_size": 4,
  "index_n_heads": 2,
  "index_head_dim": 128,
  "index_topk": 8,
  "n_routed_experts": 8,
  "n_activated_experts": 2,
  "n_shared_experts": 1,
  "score_func": "sqrtsoftplus",
  "gate_temp": 1.0,
  "norm_topk_prob": true,
  "route_scale": 1.5,
  "swiglu_limit": 10.0,
  "norm_eps": 1e-20,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-06,
  "rope_theta": 10000,
  "compress_rope_theta": 160000,
  "original_seq_len": 65536,
  "rope_factor": 16,
  "beta_fast": 32,
  "beta_slow": 1,
  "engram_layer_ids": [
    1,
    2
  ],
  "engram_num_embeddings": [
    2132,
    2260
  ],
  "engram_max_ngram_size": 3,
  "engram_vocab_size": 512,
  "engram_n_heads": 2,
  "engram_head_dim": 32,
  "engram_pad_id": 2,
  "engram_compressed_vocab_size": 99092,
  "dspark_block_size": 3,
  "dspark_noise_token_id": 128799,
  "dspark_target_layer_ids": [
    6,
    7
  ],
  "dspark_markov_rank": 16,
  "dspark_n_routed_experts": 4,
  "dspark_n_activated_experts": 2,
  "vision_n_layers": 0,
  "image_token_id": 129264,
  "dtype": "fp8",
  "expert_dtype": "fp4"
}
)json";

constexpr std::string_view kGoldenHfConfig = R"json({
  "architectures": [
    "DeepseekV41ForCausalLM"
  ],
  "model_type": "deepseek_v41",
  "dtype": "bfloat16",
  "bos_token_id": 0,
  "eos_token_id": 1,
  "pad_token_id": 2,
  "image_token_id": 129264,
  "quantization_config": {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "weight_block_size": [
      32,
      32
    ],
    "scale_fmt": "ue8m0",
    "expert_dtype": "fp4"
  },
  "text_config": {
    "model_type": "deepseek_v41_text",
    "vocab_size": 129280,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "moe_intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 64,
    "o_lora_rank": 64,
    "o_groups": 2,
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {
      "rope_type": "yarn",
      "factor": 16,
      "beta_fast": 32,
      "beta_slow": 1,
      "original_max_position_embeddings": 65536
    },
    "tie_word_embeddings": false,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": true,
    "routed_scaling_factor": 1.5,
    "sliding_window": 16,
    "compress_ratios": [
      0,
      0,
      2,
      2,
      1,
      1,
      1,
      1,
      0,
      0
    ],
    "kv_source_layer_ids": [
      2,
      4
    ],
    "index_source_layer_ids": [
      2,
      4,
      6
    ],
    "index_n_heads": 2,
    "index_head_dim": 128,
    "index_topk": 8,
    "candidate_source_layer_id": 4,
    "candidate_topk_blocks": 4,
    "candidate_block_size": 4,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "engram_layer_ids": [
      1,
      2
    ],
    "engram_num_embeddings": [
      2132,
      2260
    ],
    "engram_max_ngram_size": 3,
    "engram_vocab_size": 512,
    "engram_n_heads": 2,
    "engram_head_dim": 32,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 2,
    "dspark_block_size": 3,
    "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [
      6,
      7
    ],
    "dspark_markov_rank": 16,
    "dspark_n_routed_experts": 4,
    "dspark_num_experts_per_tok": 2,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2
  }
}
)json";

}  // namespace

std::string_view GoldenTinyInferenceConfigJson() { return kGoldenInferenceConfig; }
std::string_view GoldenTinyHfConfigJson() { return kGoldenHfConfig; }

std::string EmitInferenceConfigJson(const TinyConfig& c) {
  PyJson j = PyJson::Obj();
  j.Add("vocab_size", PyJson::Int(c.vocab_size))
      .Add("dim", PyJson::Int(c.dim))
      .Add("moe_inter_dim", PyJson::Int(c.moe_inter_dim))
      .Add("n_layers", PyJson::Int(c.n_layers))
      .Add("n_mtp_layers", PyJson::Int(c.n_mtp_layers))
      .Add("n_heads", PyJson::Int(c.n_heads))
      .Add("head_dim", PyJson::Int(c.head_dim))
      .Add("rope_head_dim", PyJson::Int(c.rope_head_dim))
      .Add("q_lora_rank", PyJson::Int(c.q_lora_rank))
      .Add("o_groups", PyJson::Int(c.o_groups))
      .Add("o_lora_rank", PyJson::Int(c.o_lora_rank))
      .Add("window_size", PyJson::Int(c.window_size))
      .Add("compress_ratios", PyJson::IntList(c.compress_ratios))
      .Add("kv_source_layers", PyJson::IntList(c.kv_source_layers))
      .Add("index_source_layers", PyJson::IntList(c.index_source_layers))
      .Add("candidate_source_layer", PyJson::Int(c.candidate_source_layer))
      .Add("candidate_topk_blocks", PyJson::Int(c.candidate_topk_blocks))
      .Add("candidate_block_size", PyJson::Int(c.candidate_block_size))
      .Add("index_n_heads", PyJson::Int(c.index_n_heads))
      .Add("index_head_dim", PyJson::Int(c.index_head_dim))
      .Add("index_topk", PyJson::Int(c.index_topk))
      .Add("n_routed_experts", PyJson::Int(c.n_routed_experts))
      .Add("n_activated_experts", PyJson::Int(c.n_activated_experts))
      .Add("n_shared_experts", PyJson::Int(c.n_shared_experts))
      .Add("score_func", PyJson::Str(c.score_func))
      .Add("gate_temp", PyJson::Float(c.gate_temp))
      .Add("norm_topk_prob", PyJson::Bool(c.norm_topk_prob))
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
      .Add("engram_layer_ids", PyJson::IntList(c.engram_layer_ids))
      .Add("engram_num_embeddings", PyJson::IntList(c.engram_num_embeddings))
      .Add("engram_max_ngram_size", PyJson::Int(c.engram_max_ngram_size))
      .Add("engram_vocab_size", PyJson::Int(c.engram_vocab_size))
      .Add("engram_n_heads", PyJson::Int(c.engram_n_heads))
      .Add("engram_head_dim", PyJson::Int(c.engram_head_dim))
      .Add("engram_pad_id", PyJson::Int(c.engram_pad_id))
      .Add("engram_compressed_vocab_size", PyJson::Int(c.engram_compressed_vocab_size))
      .Add("dspark_block_size", PyJson::Int(c.dspark_block_size))
      .Add("dspark_noise_token_id", PyJson::Int(c.dspark_noise_token_id))
      .Add("dspark_target_layer_ids", PyJson::IntList(c.dspark_target_layer_ids))
      .Add("dspark_markov_rank", PyJson::Int(c.dspark_markov_rank))
      .Add("dspark_n_routed_experts", PyJson::Int(c.dspark_n_routed_experts))
      .Add("dspark_n_activated_experts", PyJson::Int(c.dspark_n_activated_experts))
      .Add("vision_n_layers", PyJson::Int(c.vision_n_layers));
  if (c.vision_n_layers > 0) {
    j.Add("vision_dim", PyJson::Int(c.vision_dim))
        .Add("vision_n_heads", PyJson::Int(c.vision_n_heads))
        .Add("vision_inter_dim", PyJson::Int(c.vision_inter_dim))
        .Add("vision_patch_size", PyJson::Int(c.vision_patch_size))
        .Add("vision_downsample_ratio", PyJson::Int(c.vision_downsample_ratio))
        .Add("vision_max_n_token", PyJson::Int(c.vision_max_n_token))
        .Add("vision_min_pixels", PyJson::Int(c.vision_min_pixels))
        .Add("vision_max_wh_ratio", PyJson::OptFloat(c.vision_max_wh_ratio))
        .Add("vision_rope_theta", PyJson::Float(c.vision_rope_theta));
  }
  j.Add("image_token_id", PyJson::Int(c.image_token_id))
      .Add("dtype", PyJson::Str(c.dtype))
      .Add("expert_dtype", PyJson::Str(c.expert_dtype));
  return Dump(j);
}

std::string EmitHfConfigJson(const TinyConfig& c) {
  PyJson rope = PyJson::Obj();
  rope.Add("rope_type", PyJson::Str("yarn"))
      .Add("factor", PyJson::Int(c.rope_factor))
      .Add("beta_fast", PyJson::Int(c.beta_fast))
      .Add("beta_slow", PyJson::Int(c.beta_slow))
      .Add("original_max_position_embeddings", PyJson::Int(c.original_seq_len));
  PyJson t = PyJson::Obj();
  t.Add("model_type", PyJson::Str("deepseek_v41_text"))
      .Add("vocab_size", PyJson::Int(c.vocab_size))
      .Add("hidden_size", PyJson::Int(c.dim))
      .Add("num_hidden_layers", PyJson::Int(c.n_layers))
      .Add("moe_intermediate_size", PyJson::Int(c.moe_inter_dim))
      .Add("num_attention_heads", PyJson::Int(c.n_heads))
      .Add("num_key_value_heads", PyJson::Int(1))
      .Add("head_dim", PyJson::Int(c.head_dim))
      .Add("qk_rope_head_dim", PyJson::Int(c.rope_head_dim))
      .Add("q_lora_rank", PyJson::Int(c.q_lora_rank))
      .Add("o_lora_rank", PyJson::Int(c.o_lora_rank))
      .Add("o_groups", PyJson::Int(c.o_groups))
      .Add("hidden_act", PyJson::Str("silu"))
      .Add("swiglu_limit", PyJson::Float(c.swiglu_limit))
      .Add("rms_norm_eps", PyJson::Float(c.norm_eps))
      .Add("max_position_embeddings", PyJson::Int(1048576))
      .Add("rope_theta", PyJson::Int(c.rope_theta))
      .Add("compress_rope_theta", PyJson::Int(c.compress_rope_theta))
      .Add("rope_scaling", std::move(rope))
      .Add("tie_word_embeddings", PyJson::Bool(false))
      .Add("n_routed_experts", PyJson::Int(c.n_routed_experts))
      .Add("num_experts_per_tok", PyJson::Int(c.n_activated_experts))
      .Add("n_shared_experts", PyJson::Int(c.n_shared_experts))
      .Add("scoring_func", PyJson::Str(c.score_func))
      .Add("topk_method", PyJson::Str("noaux_tc"))
      .Add("norm_topk_prob", PyJson::Bool(c.norm_topk_prob))
      .Add("routed_scaling_factor", PyJson::Float(c.route_scale))
      .Add("sliding_window", PyJson::Int(c.window_size))
      .Add("compress_ratios", PyJson::IntList(c.compress_ratios))
      .Add("kv_source_layer_ids", PyJson::IntList(c.kv_source_layers))
      .Add("index_source_layer_ids", PyJson::IntList(c.index_source_layers))
      .Add("index_n_heads", PyJson::Int(c.index_n_heads))
      .Add("index_head_dim", PyJson::Int(c.index_head_dim))
      .Add("index_topk", PyJson::Int(c.index_topk))
      .Add("candidate_source_layer_id", PyJson::Int(c.candidate_source_layer))
      .Add("candidate_topk_blocks", PyJson::Int(c.candidate_topk_blocks))
      .Add("candidate_block_size", PyJson::Int(c.candidate_block_size))
      .Add("hc_mult", PyJson::Int(c.hc_mult))
      .Add("hc_sinkhorn_iters", PyJson::Int(c.hc_sinkhorn_iters))
      .Add("hc_eps", PyJson::Float(c.hc_eps))
      .Add("engram_layer_ids", PyJson::IntList(c.engram_layer_ids))
      .Add("engram_num_embeddings", PyJson::IntList(c.engram_num_embeddings))
      .Add("engram_max_ngram_size", PyJson::Int(c.engram_max_ngram_size))
      .Add("engram_vocab_size", PyJson::Int(c.engram_vocab_size))
      .Add("engram_n_heads", PyJson::Int(c.engram_n_heads))
      .Add("engram_head_dim", PyJson::Int(c.engram_head_dim))
      .Add("engram_pad_token_id", PyJson::Int(c.engram_pad_id))
      .Add("engram_compressed_vocab_size", PyJson::Int(c.engram_compressed_vocab_size))
      .Add("num_nextn_predict_layers", PyJson::Int(c.n_mtp_layers))
      .Add("dspark_block_size", PyJson::Int(c.dspark_block_size))
      .Add("dspark_noise_token_id", PyJson::Int(c.dspark_noise_token_id))
      .Add("dspark_target_layer_ids", PyJson::IntList(c.dspark_target_layer_ids))
      .Add("dspark_markov_rank", PyJson::Int(c.dspark_markov_rank))
      .Add("dspark_n_routed_experts", PyJson::Int(c.dspark_n_routed_experts))
      .Add("dspark_num_experts_per_tok", PyJson::Int(c.dspark_n_activated_experts))
      .Add("bos_token_id", PyJson::Int(0))
      .Add("eos_token_id", PyJson::Int(1))
      .Add("pad_token_id", PyJson::Int(2));
  PyJson q = PyJson::Obj();
  q.Add("quant_method", PyJson::Str("fp8"))
      .Add("activation_scheme", PyJson::Str("dynamic"))
      .Add("weight_block_size", PyJson::IntList(std::vector<int>{kBlock, kBlock}))
      .Add("scale_fmt", PyJson::Str("ue8m0"))
      .Add("expert_dtype", PyJson::Str("fp4"));
  PyJson arch;
  arch.type = PyJson::kArr;
  arch.arr.push_back(PyJson::Str("DeepseekV41ForCausalLM"));
  PyJson j = PyJson::Obj();
  j.Add("architectures", std::move(arch))
      .Add("model_type", PyJson::Str("deepseek_v41"))
      .Add("dtype", PyJson::Str("bfloat16"))
      .Add("bos_token_id", PyJson::Int(0))
      .Add("eos_token_id", PyJson::Int(1))
      .Add("pad_token_id", PyJson::Int(2))
      .Add("image_token_id", PyJson::Int(c.image_token_id))
      .Add("quantization_config", std::move(q))
      .Add("text_config", std::move(t));
  if (c.vision_n_layers > 0) {
    // HF-style key names as in make_tiny_v41_vision.py (a guess of the release's names).
    PyJson v = PyJson::Obj();
    v.Add("num_hidden_layers", PyJson::Int(c.vision_n_layers))
        .Add("hidden_size", PyJson::Int(c.vision_dim))
        .Add("num_attention_heads", PyJson::Int(c.vision_n_heads))
        .Add("intermediate_size", PyJson::Int(c.vision_inter_dim))
        .Add("patch_size", PyJson::Int(c.vision_patch_size))
        .Add("downsample_ratio", PyJson::Int(c.vision_downsample_ratio))
        .Add("max_n_token", PyJson::Int(c.vision_max_n_token))
        .Add("min_pixels", PyJson::Int(c.vision_min_pixels))
        .Add("max_wh_ratio", PyJson::OptFloat(c.vision_max_wh_ratio))
        .Add("rope_theta", PyJson::Float(c.vision_rope_theta));
    j.Add("vision_config", std::move(v));
  }
  return Dump(j);
}

std::string InferenceConfigJson(const TinyConfig& c) {
  if (c == TinyConfig{}) return std::string(kGoldenInferenceConfig);
  return EmitInferenceConfigJson(c);
}

std::string HfConfigJson(const TinyConfig& c) {
  if (c == TinyConfig{}) return std::string(kGoldenHfConfig);
  return EmitHfConfigJson(c);
}

}  // namespace deepinfer::tiny
