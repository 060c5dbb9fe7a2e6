// deepinfer/model/v41/model.h — the DeepSeek-V4.1 (`deepseek_v41`) text
// forward pass on CPU: model-spec §3.1, §3.3 (vision §3.3.7 in vision/, the
// DSpark drafter §3.3.6 in v41/dspark.h), §4 and the pitfalls of §9. Golden-exact against DeepSeek's official
// reference (tests/unit/v41_golden_test.cc).
//
// One Forward call runs a batch of sequences, each with a chunk of new tokens
// at its own start position: whole-prompt prefill (start_pos 0), chunked
// prefill (any chunk size ≥ 1, state carried across chunks) and one-token
// decode, mixed freely. All per-sequence state (window rings, compressed KV
// and index keys of the KV-source layers, the ratio-2 compressor carry, the
// Engram look-back) lives in caller-owned memory addressed by
// SequenceStateView (model/state.h); the model keeps no sequence state.
//
// Determinism: every row's arithmetic has a fixed order, so a sequence's
// results do not depend on the other sequences in the call, on the batch size
// or on the thread count. They do depend on how the sequence is chunked, the
// way the reference's do: the indexer's top-k tie-breaking sees the call's
// compressed length (positions up to the chunk end), and the attention list
// layout (window slots first, 64-wide chunks) follows the reference's
// prefill (start_pos 0) or decode layout (see attention.cc).
//
// Numerics (model-spec §4): FP8/FP4 block-scaled linears with the activation
// quantiser of §3.1(b); BF16 rounding points as the reference; FP32 mHC,
// router, head and combine; attention probabilities rounded to BF16 per
// 64-wide chunk of the candidate list; SLEEF exp where torch uses it.
// The index-key publication of a ratio-2 KV source follows the FIXED
// behaviour (golden README finding 1): a Reuse/Reindex layer always scores
// against its own KV source's index keys.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/numerics.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/state.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace deepinfer::v41 {

struct ModelWeights;
class EngramHasher;
struct Tables;
struct StepWorkspace;

struct V41Options {
  // Engram compressed token map (model-spec §3.3.2), one int32 per token id.
  // Required when the config has Engram layers: either the map itself or an
  // int32 little-endian file (the map wins when both are given).
  std::vector<int32_t> engram_token_map;
  std::filesystem::path engram_token_map_file;
  // Debug switch: when non-empty, every Forward call writes the intermediates
  // of its first sequence to DIR/callNNNNN/ in the golden dump layout
  // (WriteDebugDump). The environment variable DEEPINFER_DEBUG_DUMP=DIR does
  // the same when this is empty.
  std::filesystem::path debug_dump_dir;
  // false (default): weights are repacked at load and the linears, router,
  // mHC mixes and sparse attention run the fast CPU kernels
  // (kernels/cpu/cpu_ops.h), which are bit-identical to the scalar reference
  // operators. true: the scalar reference operators only (the test oracle;
  // no extra memory, no load-time repacking).
  bool reference_kernels = false;
  // Expert parallelism (docs/parallel.md): with a communicator of N > 1 ranks
  // this rank binds and packs only its routed experts (contiguous 1/N of
  // them; N must divide n_routed_experts) and reads only its 1/N of each
  // Engram table; every Forward call is then collective (all ranks call it
  // with matching ForwardBatch::exchange). Null or size 1: one process.
  Communicator* comm = nullptr;
  // Context parallelism (--cp N, docs/parallel.md): the communicator of the
  // N ranks that run every row together while each stores only its share of
  // the paged state (views with a PagedSharding, model/state.h). Compressed
  // KV and index keys are written only where they are stored and read back
  // through parallel/context_parallel.h, so every Forward call is collective
  // over it. Null or size 1: no context parallelism.
  Communicator* context_parallel = nullptr;
  // FP8 numerics (--fp8-format; format/numerics.h Fp8Format): kE4M3Ieee runs
  // the Neuron contract — FP8 weights transformed once at load (weights.h),
  // activations and window-KV QAT quantised to a maximum of 224, the
  // compressed-KV E4M3 scales saturating at 240. Load throws
  // Error(kInvalidArgument) naming --fp8-format when the checkpoint has no
  // F8_E4M3 tensor or a scale cannot be raised.
  Fp8Format fp8_format = Fp8Format::kE4M3FN;
  // true (default): the buffers of a Forward call are kept and reused by the
  // next (model/v41/workspace.h), so a steady-state decode step allocates
  // nothing. false: a fresh workspace per call (the eager path; same bits).
  bool reuse_step_workspace = true;
};

// One sequence's chunk in a Forward call.
struct ForwardSeq {
  const int32_t* tokens = nullptr;  // [len] token ids at positions start_pos .. start_pos+len-1
  int64_t len = 0;                  // ≥ 1
  int64_t start_pos = 0;            // absolute position of tokens[0]; state holds 0 .. start_pos-1
  SequenceStateView state;          // this sequence's state rows (caller-owned)
  // Image spans (model-spec §3.3.7; vision models only). token_types [len]
  // (nullptr = all TEXT): −1 TEXT, 0 IMAGE_START, 1 IMAGE, 2 IMAGE_NEW_LINE,
  // 3 IMAGE_END (vision/image.h). embeds [len, dim] (BF16 values): row i
  // replaces the embedding lookup wherever token_types[i] >= 0; other rows are
  // not read. Positions with a type >= 0 route with `gate.bias_vl` and are
  // DEAD for Engram (no n-gram spans them, gate 0), also for later chunks.
  const int8_t* token_types = nullptr;
  const float* embeds = nullptr;
  enum class Logits { kNone, kLast, kAll } logits = Logits::kLast;
  // Optional (speculative decoding, docs/speculative.md): receives the FP32
  // compressor inputs (a, g) of EVERY row for each ratio-2 KV-source layer,
  // laid out [carry region (StateKind::kCompressorCarry order)][len][2·head_dim]
  // — the values the carry would hold had the chunk ended after that row, so
  // the caller can roll the carry back to any row without recomputing.
  float* carry_capture = nullptr;
  // Optional (the DSpark drafter, model-spec §3.3.6 and v41/dspark.h):
  // receives main_hidden of every row, [len][n_targets·dim] — for each
  // dspark_target_layer_ids layer in ascending order, the mean over the hc
  // streams of that layer's input (after Engram), BF16 values as FP32.
  float* dspark_hidden = nullptr;
};

struct ForwardBatch {
  std::vector<ForwardSeq> seqs;
  // Attention-list and indexer layout.
  //  false (default): the reference's own — a start_pos-0 call is laid out
  //    like the reference's prefill, any other call like its decode, and the
  //    indexer's top-k size follows the call's compressed length; so results
  //    depend on how a sequence is chunked, exactly as the reference's do
  //    (golden prefill parity).
  //  true: every row is computed exactly as the reference's one-token decode
  //    at that row's position would compute it (decode window layout,
  //    k = min(index_topk, ⌊(p+1)/ratio⌋) per row), so a row's result depends
  //    only on the sequence's tokens up to it: identical under any chunking,
  //    batching or preemption-recompute. The serving engine uses this.
  bool per_row_layout = false;
  // With expert parallelism: how this call's rows relate to the other ranks'
  // (parallel/expert_parallel.h). kReplicated: every rank runs the same rows;
  // kGeneral / kStatic: each rank its own rows (data-parallel attention;
  // kStatic requires the same row count on every rank).
  EpExchange exchange = EpExchange::kReplicated;
};

// Per-layer intermediates of ONE sequence (debug switch), in the layout of the
// golden debug dumps (shared golden README: debug/*.f32 and the JSON `debug`).
struct DebugRecord {
  int64_t len = 0, start_pos = 0;
  int hc = 0;
  int64_t dim = 0;
  std::vector<std::vector<float>> out_streams;   // [n_layers][len·hc·dim] block outputs
  std::vector<std::vector<float>> out_pre_mix;   // [n_layers][len·hc] the FFN `pre` each block returns
  std::vector<std::vector<float>> ffn_in_streams;  // [n_layers][len·hc·dim] streams entering the FFN site
  std::map<int, std::vector<float>> engram_out;  // layer → [len·hc·dim] streams after Engram
  std::vector<std::vector<int32_t>> router_indices;  // [n_layers][len·topk]
  std::vector<std::vector<float>> router_weights;    // [n_layers][len·topk]
  int topk = 0;
  // Index-source layer → [len·k] top-k lists in the reference's convention:
  // k = min(index_topk, compressed length), ascending compressed positions
  // plus `offset` (the window part's length: len for a start_pos-0 call, else
  // window_size), −1 = absent.
  std::map<int, std::vector<int32_t>> indexer_topk;
  std::map<int, int> indexer_k;
  std::vector<int64_t> engram_hash_ids;  // [len][n_engram_layers][cols]
  int engram_cols = 0;
};

// Writes `rec` under dir/ as the golden layout: layerN_out_streams.f32,
// layerN_out_pre_mix.f32, layerN_engram_out.f32 (float32 LE) and debug.json
// (router indices/weights, indexer top-k, Engram hash ids). Throws on I/O error.
void WriteDebugDump(const DebugRecord& rec, const std::filesystem::path& dir);

struct ForwardOutput {
  int64_t vocab = 0;
  std::vector<float> logits;     // [rows, vocab] FP32, rows in sequence order
  std::vector<int32_t> row_seq;  // per logits row: index into ForwardBatch::seqs
  std::vector<int64_t> row_pos;  // per logits row: absolute position it predicts from
};

class V41Model {
 public:
  // Opens MODEL_DIR (config.json + safetensors), binds the weights and the
  // Engram data. Throws deepinfer::Error (config/tensor errors name the file
  // and tensor; missing token map → kInvalidArgument).
  static std::unique_ptr<V41Model> Load(const std::filesystem::path& model_dir, const V41Options& options);
  ~V41Model();

  const ModelConfig& config() const { return cfg_; }
  // State geometry for a paged block of `block_size` tokens (model/state.h).
  // window_history: with the paged window history prefix caching needs.
  // dspark_rings: with the DSpark drafter's rings (v41/dspark.h).
  StateGeometry geometry(int64_t block_size, bool window_history = false, bool dspark_rings = false) const {
    return StateGeometry::FromConfig(cfg_, block_size, window_history, dspark_rings);
  }

  // Runs the batch. Validates first (Error kInvalidArgument naming the
  // sequence: empty chunk, negative start_pos, token id outside the
  // vocabulary or the Engram map, missing state view, block table too short
  // for start_pos+len tokens) and then computes without throwing. State rows
  // of positions start_pos .. start_pos+len−1 are written.
  void Forward(const ForwardBatch& batch, ForwardOutput* out);
  // The checks Forward does first, alone (throws the same errors). Parallel
  // runners validate on every rank and agree before the collective Forward.
  void Validate(const ForwardBatch& batch);

  // This rank's share of the routed experts and the bytes it holds.
  const ExpertShard& expert_shard() const { return shard_; }
  struct WeightBytes {
    int64_t routed_experts = 0;  // quantised routed-expert bytes bound on this rank
    int64_t engram_rows = 0;     // Engram table bytes this rank owns
    int64_t replicated = 0;      // every other checkpoint byte (each rank has them)
    int64_t packed = 0;          // bytes allocated by the load-time repacking
    int64_t wo_a_decode = 0;     // bytes a batch-1 decode step streams for wo_a (all layers; 0: no repacking)
  };
  const WeightBytes& weight_bytes() const { return weight_bytes_; }

  // Debug switch: when set, the next Forward calls record sequence `seq` of
  // the batch into *rec (nullptr turns it off). Costs a copy per layer.
  void SetDebug(DebugRecord* rec, int seq = 0) { debug_ = rec; debug_seq_ = seq; }

 private:
  V41Model() = default;
  ModelConfig cfg_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<ModelWeights> w_;
  std::unique_ptr<EngramHasher> engram_;
  std::unique_ptr<Tables> tables_;
  // The step workspace reused by Forward calls (V41Options::reuse_step_workspace;
  // null: a fresh one per call) and whether a call is using it now.
  std::unique_ptr<StepWorkspace> ws_;
  std::atomic<bool> ws_busy_{false};
  Communicator* comm_ = nullptr;  // null or size 1: one process
  Communicator* cp_comm_ = nullptr;  // context parallelism (V41Options::context_parallel)
  ExpertShard shard_;
  WeightBytes weight_bytes_;
  DebugRecord* debug_ = nullptr;
  int debug_seq_ = 0;
  std::filesystem::path debug_dump_dir_;
  int64_t debug_calls_ = 0;
  friend class ForwardPass;
  friend class Dspark;
};

}  // namespace deepinfer::v41
