// deepinfer/engine/backend.h — what the engine needs from a model: one call
// that runs a batch of sequence chunks on caller-owned state and returns the
// logits of the rows that sample. Implemented by the V4.1 model adapter and, in
// tests, by a fake model that exercises the cache addressing.
#pragma once

#include <cstdint>
#include <vector>

#include "base/error.h"
#include "engine/speculative.h"
#include "model/config.h"
#include "model/state.h"

namespace deepinfer {

// One sequence's chunk in a forward call.
struct BackendSeq {
  const int32_t* tokens = nullptr;  // [len] token ids of this chunk (positions start_pos ...)
  // Image spans (docs/vision.md; nullptr = all TEXT): token types [len] and
  // embeddings [len, dim] for the positions with a type >= 0 (v41::ForwardSeq).
  const int8_t* token_types = nullptr;
  const float* embeds = nullptr;
  int64_t len = 0;
  int64_t start_pos = 0;            // absolute position of tokens[0]
  SequenceStateView state;          // where this sequence's state rows live
  bool want_logits = false;         // return logits of the chunk's last token
  bool all_logits = false;          // return logits of EVERY token of the chunk (len rows; the
                                    // last is the want_logits row); used for prompt_logprobs
  bool reset_state = false;         // the slot was newly assigned: its fixed-kind state rows are
                                    // zeroed before the call. The engine zeroes its own pool; a
                                    // parallel backend tells the ranks that hold replicas.
  // Prefix-cache hit (start_pos == restore_prefix > 0): after the reset, the
  // fixed state is rebuilt from the shared blocks (RestoreFixedState, with the
  // raw ids of the positions just before restore_prefix). The engine does it
  // in its own pool; a parallel backend tells the other ranks.
  int64_t restore_prefix = 0;
  const int32_t* restore_tokens = nullptr;
  int64_t num_restore_tokens = 0;
  // Speculative decoding: receives the compressor inputs of every row for
  // rollback (v41::ForwardSeq::carry_capture's layout). Null: not wanted.
  // Only single-process backends support it (the engine refuses speculation
  // otherwise).
  float* carry_capture = nullptr;
};

// Number of logits rows a chunk returns (backend.h's layout).
inline int64_t LogitsRows(const BackendSeq& s) { return s.all_logits ? s.len : s.want_logits ? 1 : 0; }

// Model-based drafting (docs/speculative.md "Model drafters"): one sequence's
// rows of the LAST Forward call that the drafter consumes.
struct DraftSeq {
  int forward_index = -1;              // index of the sequence's chunk in the last Forward's seqs
  int64_t kept = 0;                    // rows kept: positions start_pos .. start_pos+kept−1 of that chunk,
                                       // 1 <= kept <= len (a verification chunk: 1 + accepted drafts)
  const int32_t* next_tokens = nullptr;  // [kept] the sequence's token at position+1 of each kept row
                                         // (prompt ids, accepted drafts, the step's sampled token)
  SequenceStateView state;             // the sequence's state (its slot and block table now)
  int max_drafts = 0;                  // 0: advance the drafter's state only; >= 1: also propose up
                                       // to this many ids for the positions after next_tokens[kept−1]
};

// A drafter that runs on the target model's hidden states (V4's MTP block
// mtp.0, V4.1's DSpark). The backend that returns one from EnableDrafter keeps
// what the drafter reads (e.g. the final residual streams [rows, hc, dim] FP32)
// for every row of every later Forward call, until the next Forward.
//
// When the engine calls Draft: once after every step's Forward, after
// sampling, acceptance and the target's rollback, for every sequence of the
// step that is still running, with the rows the sequence keeps — every row of
// a prefill chunk (sampling or not), the one row of a plain decode, and the
// last token's row plus the accepted drafts' rows of a verification chunk
// (rows of rejected drafts are never passed, so the drafter's own state, e.g.
// MTP's window ring, is only ever written for kept positions and needs no
// rollback of its own). Preemption recomputes the sequence from position 0
// and the drafter sees every recomputed row again. Prefix caching is off
// while a model drafter is active (rows of a cache hit never reach Draft).
class ModelDrafter {
 public:
  virtual ~ModelDrafter() = default;
  // Writes one proposal per seqs entry, in order: for max_drafts >= 1 up to
  // max_drafts ids (q empty: deterministic drafts) for the positions after
  // the last kept row's next token; for max_drafts 0 nothing. Proposals must
  // be a pure function of the sequence's tokens (alone == batched, chunked
  // == whole, preempted == not). Throws deepinfer::Error for the whole call
  // (the engine fails the step's requests with it).
  virtual void Draft(const std::vector<DraftSeq>& seqs, std::vector<DraftProposal>* out) = 0;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  virtual const ModelConfig& config() const = 0;
  virtual int64_t vocab_size() const = 0;
  // State geometry for a paged block of `block_size` tokens.
  virtual StateGeometry Geometry(int64_t block_size) const = 0;
  // Prefix caching (docs/engine.md): a backend that supports it returns true
  // and a geometry with the paged window history (model/state.h).
  virtual bool supports_prefix_caching() const { return false; }
  virtual StateGeometry CachingGeometry(int64_t block_size) const { return Geometry(block_size); }
  // Speculative decoding (docs/speculative.md): a backend that supports it
  // honours BackendSeq::carry_capture (the compressor-carry rows the rollback
  // of rejected drafts rebuilds from); the engine refuses --speculative-config
  // on any other.
  virtual bool supports_speculative_rollback() const { return false; }
  // Floats of carry capture a verification chunk of `len` rows needs in a
  // pool of geometry `g` (default: V4.1's layout, v41::ForwardSeq::carry_capture,
  // [carry region][len][row_bytes / 4]).
  virtual int64_t CarryCaptureFloats(const StateGeometry& g, int64_t len) const {
    int64_t n = 0;
    for (const auto& r : g.of(StateKind::kCompressorCarry).regions) n += len * r.row_bytes / 4;
    return n;
  }
  // Puts the fixed state back as if only positions [snap.start, end) of the
  // verification chunk had been fed (model/state.h RollbackFixedState, the
  // default; a model with another carry layout overrides it). capture: the
  // chunk's carry capture; lookback: the raw ids before `end`, oldest first.
  virtual void RollbackSpeculative(const SequenceStateView& view, const FixedStateSnapshot& snap, int64_t end,
                                   const float* capture, const int32_t* lookback, int64_t num_lookback) {
    RollbackFixedState(view, snap, end, capture, lookback, num_lookback);
  }
  // The model-based drafter of a validated config's method ("mtp", "dspark"),
  // activated for the backend's lifetime (Forward keeps its inputs from now
  // on), or nullptr when this backend has none for that method. Called once,
  // by Engine::OpenWithBackend; the drafter is owned by the backend.
  virtual ModelDrafter* EnableDrafter(const SpeculativeConfig& spec) {
    (void)spec;
    return nullptr;
  }
  // Runs all chunks. `logits` receives, for the seqs in order, FP32 rows of
  // vocab_size(): `len` rows (positions start_pos .. start_pos+len-1) for a
  // seq with all_logits, else one row (its last token) for a seq with
  // want_logits, else none. A row's values must not depend on the other
  // sequences in the call, nor on all_logits, nor on how the sequence is
  // chunked. Throws deepinfer::Error on failure.
  virtual void Forward(const std::vector<BackendSeq>& seqs, std::vector<float>* logits) = 0;

  // Data parallelism (docs/parallel.md): the number of shards whose batches
  // one step runs together (1 = none). With D > 1 the engine keeps one
  // scheduler and block space per shard and calls ForwardShards every step
  // with D batches (an idle shard gets padding rows), each addressed in its
  // own rank's pool; `decode_step` says every batch is decode-shaped and
  // padded to the same number of one-token rows. logits[i] receives batch
  // i's rows in Forward's layout. Same row-independence rule as Forward.
  virtual int data_parallel_size() const { return 1; }
  // Context parallelism (docs/parallel.md): the ranks that split every
  // sequence's paged blocks (1 = none). With C > 1 the engine's scheduler
  // hands out C × (blocks per rank) global block ids and its own pool holds
  // rank 0's share (cache/cache_pool.h).
  virtual int context_parallel_size() const { return 1; }
  // Parallel backends: throws RankLostError when a rank is gone (called by
  // an idle engine loop; a step notices by itself).
  virtual void CheckPeers() {}
  virtual void ForwardShards(const std::vector<std::vector<BackendSeq>>& shards, bool decode_step,
                             std::vector<std::vector<float>>* logits) {
    DI_CHECK(shards.size() == 1 && logits->size() == 1);
    Forward(shards[0], &(*logits)[0]);
  }
};

}  // namespace deepinfer
