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
// One Forward call runs a batch of sequences, each a chunk of new tokens at
// its own start position (prefill, chunked prefill, decode, mixed). All
// per-sequence state (window rings, compressed KV, indexer keys, compressor
// carries, the MTP block's ring) lives in caller-owned memory addressed by
// SequenceStateView with the geometry StateGeometry::FromConfig declares for
// the config (model/state.h), so the engine's pool, admission and max-length
// sizing stay generic. The model keeps no sequence state.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "format/safetensors.h"
#include "model/config.h"
#include "model/state.h"

namespace deepinfer::v4 {

struct Weights;
struct Ropes;
struct StepWorkspace;

// Load-time options.
struct V4Options {
  // true (default): the buffers of a Forward / Mtp call are kept and reused by
  // the next (model/v4/workspace.h), so a steady-state decode step through
  // ForwardInto / MtpInto allocates nothing. false: a fresh workspace per call
  // (the eager path; same bits).
  bool reuse_step_workspace = true;
};

// A self-contained state for one sequence of up to max_len positions (the
// golden tests; the engine keeps its sequences in its CachePool instead): a
// one-slot DenseStateArena with the model's geometry (block size 128).
struct V4State {
  StateGeometry geometry;
  std::unique_ptr<DenseStateArena> arena;
  std::vector<int32_t> block_table;
  int64_t max_len = 0;
  int64_t len = 0;  // positions already processed by the main model
  SequenceStateView view() const { return arena->View(0, block_table.data(), static_cast<int64_t>(block_table.size())); }
};

// One sequence's chunk in a Forward call.
struct V4Seq {
  const int32_t* tokens = nullptr;  // [len] ids at positions start_pos .. start_pos+len−1
  int64_t len = 0;
  int64_t start_pos = 0;            // the state holds positions 0 .. start_pos−1
  SequenceStateView state;          // rows in the model's geometry (V4Model::Geometry)
  bool want_logits = false;         // logits of the chunk's last row
  bool all_logits = false;          // logits of every row (len rows)
  // Optional (speculative decoding, docs/speculative.md): receives every row's
  // compressor inputs, FP32, laid out [carry region (StateKind::kCompressorCarry
  // order)][len][rows_per_pos][row_bytes / 4] with rows_per_pos = 4 on C4 layers
  // (attention kv, attention score, indexer kv, indexer score) and 2 on C128
  // layers (kv, score); a kv row is x·wkvᵀ, a score row x·wgateᵀ + ape[p mod r],
  // coff·hd floats each (the rest of the row unused). V4Model::RollbackCarry
  // replays them. Size: V4Model::CarryCaptureFloats.
  float* carry_capture = nullptr;
};

// Per-layer intermediates of sequence 0 of a call (the golden `debug` layout).
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
  static std::unique_ptr<V4Model> Load(const std::filesystem::path& model_dir, const V4Options& options = {});
  ~V4Model();

  const ModelConfig& config() const { return cfg_; }
  // The bytes a batch-1 decode step streams for the main layers' wo_a (its
  // 8-bit decode copy, cpu::PackedBf16::w8, where the packing made one).
  int64_t wo_a_decode_bytes() const;

  // State geometry for paged blocks of `block_size` tokens (model/state.h
  // StateGeometry::FromConfig, V4 branch). Error(kInvalidArgument) when the
  // block size does not fit the compress ratios.
  StateGeometry Geometry(int64_t block_size) const { return StateGeometry::FromConfig(cfg_, block_size); }

  // Runs a batch of chunks. Every row is computed in one of two layouts:
  //  per_row_layout = true (the serving engine): each row exactly as the
  //    reference's one-token decode at its position computes it, so a row
  //    depends only on its sequence's tokens up to it — identical under any
  //    chunking, batching or preemption;
  //  false: a start_pos-0 chunk as the reference's prefill of that chunk
  //    (golden parity of the list widths and vectorised-path choices), any
  //    other chunk as per_row_layout.
  // A sequence whose start_pos is 0 starts fresh (compressor carries reset to
  // kv 0 / score −∞, README_V4 finding 1). Returns logits rows [rows, vocab]
  // FP32 in sequence order (LogitsRows of backend.h). streams (optional):
  // the final residual streams [total rows, hc, d] (the input of hc_head, what
  // MTP reads); debug (optional): sequence 0's intermediates.
  // Error(kInvalidArgument) naming the sequence: empty chunk, negative
  // start_pos, token outside the vocabulary, state view without the model's
  // geometry or too few blocks.
  std::vector<float> Forward(const std::vector<V4Seq>& seqs, bool per_row_layout, std::vector<float>* streams = nullptr,
                             V4Debug* debug = nullptr);
  // As Forward, the logits rows into *logits (resized to rows · vocab; its
  // capacity and that of *streams are kept, so a decode step at a batch size
  // already seen makes no heap allocation, V4Options::reuse_step_workspace).
  // The same bits as Forward.
  void ForwardInto(const std::vector<V4Seq>& seqs, bool per_row_layout, std::vector<float>* logits,
                   std::vector<float>* streams = nullptr, V4Debug* debug = nullptr);

  // The MTP block mtp.0 (model-spec §3.2.7) on a batch: seqs[s].tokens are the
  // next ids (the token after each position), streams [total rows, hc, d] the
  // main model's final streams at those positions; its window ring is the
  // state's region of layer n_layers. Returns the draft logits rows as Forward.
  std::vector<float> Mtp(const std::vector<V4Seq>& seqs, const float* streams, bool per_row_layout);
  // As Mtp, the draft logits rows into *logits (capacity kept, as ForwardInto).
  void MtpInto(const std::vector<V4Seq>& seqs, const float* streams, bool per_row_layout, std::vector<float>* logits);

  // Speculative rollback (docs/speculative.md; rollback.cc). Floats of
  // V4Seq::carry_capture for a chunk of `len` rows in geometry `g`.
  int64_t CarryCaptureFloats(const StateGeometry& g, int64_t len) const;
  // Rebuilds every main-model compressor carry (layers < n_layers) as if only
  // positions [start, end) of a chunk [start, start+len) had been fed: the
  // carry slot rows as they were before the chunk (`snapshot_carry`, the
  // FixedStateSnapshot::carry layout: each carry region's whole slot rows),
  // then Compressor.forward's slot updates for positions start .. end−1 from
  // the chunk's capture (no entry is emitted again: the paged rows of kept
  // positions are already right). Error(kInternal) when end is outside
  // (start, start+len] or the snapshot has the wrong size.
  void RollbackCarry(const SequenceStateView& v, const std::vector<uint8_t>& snapshot_carry, int64_t start,
                     int64_t len, int64_t end, const float* capture) const;

  // Golden-test conveniences on a V4State (prefill when state->len == 0, else
  // one token; per the reference's layout): logits of the last position.
  V4State NewState(int64_t max_len) const;
  std::vector<float> Forward(const int32_t* tokens, int64_t T, V4State* state, std::vector<float>* streams = nullptr,
                             V4Debug* debug = nullptr);
  std::vector<float> Mtp(const float* streams, const int32_t* next_ids, int64_t T, int64_t start, V4State* state);

  // State rows of layer l as floats (tests, debugging): the window ring
  // [window, head_dim]; the first n compressed entries [n, head_dim]; the first
  // n indexer keys [n, index_head_dim]; a compressor carry [coff·r, coff·hd]
  // (indexer: the indexer compressor's; score: the score rows, else kv).
  std::vector<float> WindowRows(const SequenceStateView& v, int l) const;
  std::vector<float> CompressedRows(const SequenceStateView& v, int l, int64_t n) const;
  std::vector<float> IndexKeyRows(const SequenceStateView& v, int l, int64_t n) const;
  std::vector<float> CarryRows(const SequenceStateView& v, int l, bool indexer, bool score) const;

 private:
  V4Model() = default;
  void Validate(const std::vector<V4Seq>& seqs, int n_window_layers) const;
  friend class Pass;
  ModelConfig cfg_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Ropes> ropes_;
  // The step workspace reused by Forward / Mtp calls (V4Options::reuse_step_workspace;
  // null: a fresh one per call) and whether a call is using it now.
  std::unique_ptr<StepWorkspace> ws_;
  std::atomic<bool> ws_busy_{false};
};

}  // namespace deepinfer::v4
