// deepinfer/model/v4/model.h — the DeepSeek-V4-Flash (`deepseek_v4`) forward
// pass on CPU, read like DeepSeek's V4 inference model.py (model-spec §3.2, §9):
// mHC on every block with hc_head, sliding-window attention with attention
// sink, C4 layers (overlap compressor with APE + lightning indexer: Hadamard
// rotation, FP4 query/keys, top-k) and C128 layers (compressor, every entry
// visible), hash routing through `tid2eid` on the first n_hash_layers and
// learned routing with `gate.bias` after, FP8 128×128-block linears, FP4
// routed experts, and the MTP block `mtp.0`.
//
// Golden-exact against the official reference (tests/unit/v4_golden_test.cc)
// with its stated rules (README_V4.md): compressor state reset at every
// sequence start, BF16 rsqrt of the per-head q norm computed in FP32 and
// rounded once, top-k ties by ascending index.
//
// Calls follow the reference's two modes: a prefill (start_pos 0, any length)
// and a one-token decode (start_pos = the sequence's length so far). All
// per-sequence state lives in a V4State the caller owns (one per sequence):
// window rings, compressed KV, compressor carries, indexer keys, and the MTP
// block's window ring.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "format/safetensors.h"
#include "model/config.h"

namespace deepinfer::v4 {

struct Weights;
struct Ropes;

// One sequence's state (sizes from the config and max_len; model-spec §5.1).
struct V4State {
  int64_t max_len = 0;
  int64_t len = 0;  // positions already processed by the main model
  struct Layer {
    std::vector<float> window;            // [window, head_dim] BF16 values, slot = pos mod window
    std::vector<float> ckv;               // [max_len/ratio, head_dim] compressed KV entries
    std::vector<float> kv_state, score_state;    // [coff·r, coff·head_dim] compressor carry (FP32)
    std::vector<float> ikeys;             // [max_len/4, index_head_dim] indexer keys (C4)
    std::vector<float> ikv_state, iscore_state;  // indexer compressor carry (C4)
  };
  std::vector<Layer> layers;  // n_layers, then the MTP blocks
};

// Per-layer intermediates of one prefill (the golden `debug` layout).
struct V4Debug {
  struct Layer {
    std::vector<float> out_streams, attn_out, ffn_out;  // [T·hc·d], [T·d], [T·d]
    std::vector<float> hc_pre[2], hc_post[2], hc_comb[2];  // attn, ffn sites
    std::vector<int32_t> router_indices;                   // [T·topk]
    std::vector<float> router_weights;
    std::vector<int32_t> indexer_topk;  // [T·k] as Indexer.forward returns in prefill (offset T, −1 absent)
    int indexer_k = 0;
  };
  std::vector<Layer> layers;
};

class V4Model {
 public:
  // Opens MODEL_DIR (config.json model_type deepseek_v4 + safetensors) and
  // binds every tensor. Throws deepinfer::Error naming the file and tensor
  // (missing tensor, wrong dtype or shape) or the unsupported config field.
  static std::unique_ptr<V4Model> Load(const std::filesystem::path& model_dir);
  ~V4Model();

  const ModelConfig& config() const { return cfg_; }

  // A fresh state for sequences of up to max_len positions (compressor
  // carries at their start values: kv 0, score −∞).
  V4State NewState(int64_t max_len) const;

  // Runs tokens[0..T) at positions state->len .. state->len+T−1: a prefill
  // when state->len == 0 (any T ≥ 1) or a one-token decode (T == 1). Returns
  // the last position's logits [vocab] FP32; streams (optional) receives the
  // final residual streams of every row [T, hc, d] (the input of hc_head;
  // what MTP reads). Error(kInvalidArgument): T < 1, T > 1 with len > 0,
  // len + T > max_len, token outside the vocabulary.
  std::vector<float> Forward(const int32_t* tokens, int64_t T, V4State* state, std::vector<float>* streams = nullptr,
                             V4Debug* debug = nullptr);

  // The MTP block mtp.0 (model-spec §3.2.7): streams [T, hc, d] of the main
  // model at positions start .. start+T−1, next_ids[i] = the token after
  // position start+i; drafts the token after next_ids[T−1]. A prefill
  // (start == 0, any T) or a one-token step (T == 1, start = its position);
  // the block's own window ring lives in state->layers[n_layers].
  std::vector<float> Mtp(const float* streams, const int32_t* next_ids, int64_t T, int64_t start, V4State* state);

 private:
  V4Model() = default;
  friend class Pass;
  ModelConfig cfg_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Ropes> ropes_;
};

}  // namespace deepinfer::v4
