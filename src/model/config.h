// deepinfer/model/config.h — typed, validated model configuration.
//
// Read from a Hugging Face model directory's config.json (model-spec §1):
//   * model_type "deepseek_v41" (§1.3): the text fields under "text_config";
//     top-level bos/eos/pad/image_token_id; "quantization_config"
//     {weight_block_size [B, B], expert_dtype, (quant_method "fp8",
//     scale_fmt "ue8m0" checked when present)}; optional "vision_config"
//     (absent → vision off).
//   * model_type "deepseek_v4" (§1.1): every field at the top level;
//     expert_dtype at the top level (current revision) or in
//     quantization_config.
// Every key is explicit: nothing is guessed from layer counts. The only
// defaults are gate_temp (absent → 1.0, as the reference), pad_token_id
// (absent/null → -1) and V4's gate_temp 1.0. Optional keys that only confirm a
// fixed choice are checked when present (hidden_act "silu", topk_method
// "noaux_tc", tie_word_embeddings false). The Engram pad key is
// engram_pad_token_id (release) or engram_pad_id (flat reference name).
//
// Errors (deepinfer::Error, one line, naming the file and the key path):
//   kNotFound      "config.json: missing required key text_config.hidden_size"
//   kCorruptData   bad JSON; "config.json: text_config.hidden_size: expected an
//                  integer, found a string \"64\"" (floats are not integers)
//   kInvalidArgument  value out of range or inconsistent: unknown model_type,
//                  compress_ratios length != n_layers + n_mtp_layers, ratio not
//                  in {0,1,2} (V4.1) / {0,4,128} (V4), MTP ratio != 0, layer
//                  lists out of range or unsorted, a ratio>0 layer with no
//                  preceding KV source of its ratio, a KV source that is not an
//                  index source, candidate source not an index source or
//                  candidate_topk_blocks·candidate_block_size −
//                  (candidate_block_size − 1) < index_topk, an index source
//                  after the candidate source reading another KV cache, Engram
//                  rows != Σ bucket primes, token ids ≥ vocab_size, ...
//
// Field names follow DeepSeek's flat ModelArgs names (inference/config.json);
// the comment after each gives the key it mirrors (HF names are in config.cc).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace deepinfer {

enum class Arch { kDeepseekV4, kDeepseekV41 };
const char* ArchName(Arch a);  // "deepseek_v4" / "deepseek_v41"

// Role of a layer in V4.1's CSA2 scheme (model-spec §1.4, §3.3.4).
enum class CsaMode {
  kSwa,      // compress ratio 0: sliding window only
  kFull,     // KV source and index source (computes compressed KV, index keys, top-k)
  kReuse,    // reads compressed KV of kv_from, top-k of index_from
  kReindex,  // own indexer query over kv_from's index keys, candidate-filtered
  kC4,       // V4: ratio 4 with its own compressor+indexer
  kC128,     // V4: ratio 128, all compressed entries visible
};
const char* CsaModeName(CsaMode m);

// Per-layer schedule derived from the config (one entry per main layer, then
// one per MTP/DSpark block). Layer ids index the compressed/index caches.
//
// V4.1 (model-spec §1.4, §3.3.4): ratio 0 → kSwa. For ratio > 0: kv_from = the
// most recent KV source at or before the layer (same ratio, required);
// index_from = the most recent index source at or before it; mode kFull for a
// KV source (which is always an index source too), kReindex for an index source
// that is not a KV source, kReuse otherwise; candidate_from = the candidate
// source for every index source after it (the reference's `uses_candidates`).
// V4: ratio 4 → kC4 (own compressor + indexer: kv_from = index_from = layer),
// 128 → kC128 (own compressor, no indexer), 0 → kSwa; hash_routed for
// layer < n_hash_layers. MTP/DSpark blocks are always kSwa.
struct LayerSchedule {
  int layer = 0;              // index in layers.* (or n_layers + i for mtp.i)
  bool is_mtp = false;        // mtp.* block
  int compress_ratio = 0;     // 0, 1, 2 (V4.1) or 0, 4, 128 (V4)
  CsaMode mode = CsaMode::kSwa;
  bool kv_source = false;     // computes and owns compressed KV + index keys
  bool index_source = false;  // runs an indexer query (Full or Reindex)
  bool candidate_source = false;
  int kv_from = -1;           // layer whose compressed KV / index keys this layer reads (-1 none)
  int index_from = -1;        // layer whose top-k selection this layer uses (-1 none)
  int candidate_from = -1;    // index sources after the candidate source: the candidate source
                              // whose block mask filters this layer's index scores (-1 none)
  int engram_slot = -1;       // index into engram_layer_ids if Engram runs before this layer
  bool dspark_target = false; // mean-over-streams of this layer's input feeds DSpark
  bool hash_routed = false;   // V4: layer < n_hash_layers (tid2eid routing)
};

struct ModelConfig {
  Arch arch = Arch::kDeepseekV41;
  std::string model_type;          // as written in config.json

  // Sizes.
  int64_t vocab_size = 0;          // vocab_size
  int64_t dim = 0;                 // hidden_size
  int64_t moe_inter_dim = 0;       // moe_intermediate_size
  int n_layers = 0;                // num_hidden_layers
  int n_mtp_layers = 0;            // num_nextn_predict_layers
  int n_heads = 0;                 // num_attention_heads (num_key_value_heads must be 1)
  int64_t head_dim = 0;            // head_dim
  int64_t rope_head_dim = 0;       // qk_rope_head_dim (RoPE on the LAST rope_head_dim dims)
  int64_t q_lora_rank = 0;         // q_lora_rank
  int o_groups = 0;                // o_groups
  int64_t o_lora_rank = 0;         // o_lora_rank
  int64_t window_size = 0;         // sliding_window
  std::vector<int> compress_ratios;// compress_ratios (n_layers + n_mtp_layers entries)

  // CSA2 (V4.1).
  std::vector<int> kv_source_layers;     // kv_source_layer_ids
  std::vector<int> index_source_layers;  // index_source_layer_ids
  int candidate_source_layer = -1;       // candidate_source_layer_id
  int candidate_topk_blocks = 0;         // candidate_topk_blocks
  int candidate_block_size = 0;          // candidate_block_size
  int index_n_heads = 0;                 // index_n_heads
  int64_t index_head_dim = 0;            // index_head_dim
  int index_topk = 0;                    // index_topk

  // MoE.
  int n_routed_experts = 0;        // n_routed_experts
  int n_activated_experts = 0;     // num_experts_per_tok
  int n_shared_experts = 0;        // n_shared_experts
  std::string score_func;          // scoring_func ("sqrtsoftplus")
  float gate_temp = 1.0f;          // (absent → 1.0, as the reference defaults)
  bool norm_topk_prob = true;      // norm_topk_prob
  float route_scale = 1.0f;        // routed_scaling_factor
  float swiglu_limit = 0.0f;       // swiglu_limit
  int n_hash_layers = 0;           // V4: num_hash_layers

  // Norms and hyper-connections.
  float norm_eps = 1e-6f;          // rms_norm_eps
  int hc_mult = 4;                 // hc_mult
  int hc_sinkhorn_iters = 20;      // hc_sinkhorn_iters
  float hc_eps = 1e-6f;            // hc_eps

  // RoPE / YaRN.
  double rope_theta = 10000;           // rope_theta
  double compress_rope_theta = 160000; // compress_rope_theta
  int64_t original_seq_len = 0;        // rope_scaling.original_max_position_embeddings
  double rope_factor = 1;              // rope_scaling.factor
  double beta_fast = 32, beta_slow = 1;// rope_scaling.beta_fast / beta_slow
  int64_t max_position_embeddings = 0; // max_position_embeddings

  // Engram (V4.1).
  std::vector<int> engram_layer_ids;          // engram_layer_ids
  std::vector<int64_t> engram_num_embeddings; // engram_num_embeddings (table rows per layer)
  int engram_max_ngram_size = 0;              // engram_max_ngram_size
  int64_t engram_vocab_size = 0;              // engram_vocab_size
  int engram_n_heads = 0;                     // engram_n_heads
  int64_t engram_head_dim = 0;                // engram_head_dim
  int engram_pad_id = 2;                      // engram_pad_token_id
  int64_t engram_compressed_vocab_size = 0;   // engram_compressed_vocab_size
  // Derived (model-spec §3.3.2): bucket primes of each Engram layer, flattened
  // in (n = 2..max_ngram, head) order; Σ engram_primes[k] == engram_num_embeddings[k]
  // is checked at load.
  std::vector<std::vector<int64_t>> engram_primes;

  // DSpark (V4.1).
  int dspark_block_size = 0;                  // dspark_block_size
  int64_t dspark_noise_token_id = -1;         // dspark_noise_token_id
  std::vector<int> dspark_target_layer_ids;   // dspark_target_layer_ids
  int64_t dspark_markov_rank = 0;             // dspark_markov_rank
  int dspark_n_routed_experts = 0;            // dspark_n_routed_experts
  int dspark_n_activated_experts = 0;         // dspark_num_experts_per_tok

  // Vision (V4.1); 0 layers = off. Read from the optional "vision_config"
  // object (keys num_hidden_layers, hidden_size, num_attention_heads,
  // intermediate_size, patch_size, downsample_ratio; optional max_n_token,
  // min_pixels, max_wh_ratio (null = none), rope_theta with the release's
  // defaults below); absent → off.
  int vision_n_layers = 0;
  int64_t vision_dim = 0;
  int vision_n_heads = 0;
  int64_t vision_inter_dim = 0;
  int vision_patch_size = 0;
  int vision_downsample_ratio = 0;
  int64_t vision_max_n_token = 0;         // span length cap (tokens per image)
  int64_t vision_min_pixels = 0;          // smaller images are upscaled in the plan
  double vision_max_wh_ratio = 0;         // 0: null (no width clamp)
  double vision_rope_theta = 10000.0;
  bool vision_enabled() const { return vision_n_layers > 0; }
  int64_t image_token_id = -1;

  // Quantisation (quantization_config).
  int weight_block_size = 0;       // weight_block_size[0] (32 for V4.1, 128 for V4)
  int act_block_size = 0;          // activation quant block = weight_block_size
  std::string expert_dtype;        // "fp4" or "fp8"

  // Special tokens (pad_token_id is optional: -1 when absent or null).
  int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = -1;

  // Derived schedule: n_layers + n_mtp_layers entries.
  std::vector<LayerSchedule> layers;

  // Reads MODEL_DIR/config.json. Throws Error naming the file and key on any
  // missing/ill-typed key, bad JSON, unknown model_type, or an inconsistent
  // schedule (e.g. a Reuse layer with no preceding KV source).
  static ModelConfig Load(const std::filesystem::path& model_dir);
  // Same, from JSON text; `source` names it in error messages.
  static ModelConfig FromJsonText(const std::string& text, const std::string& source);

  // Number of mixes per mHC site: (2 + hc_mult) * hc_mult.
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
};

}  // namespace deepinfer
