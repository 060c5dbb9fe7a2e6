// deepinfer/scheduler/scheduler.h — continuous batching with chunked prefill,
// token-bucket padding, prompt-as-decode, and recompute preemption.
// Pure logic on plain structs (no tensors, no model): the engine asks for a
// StepPlan, runs it, then reports sampled tokens with Update().
//
// Policy (vLLM v1 style, one unified token budget per step):
//  1. Running requests, oldest first, each get min(remaining, budget) tokens:
//     a decode needs 1, an unfinished prefill its next chunk. If the pool has
//     too few free blocks, the NEWEST running request is preempted (its blocks
//     and slot are freed, its computed count reset to 0, and it goes to the
//     front of the waiting queue to be recomputed later) until the allocation
//     fits; a request never corrupts or loses another's state.
//  2. If nothing was preempted in this step, waiting requests are admitted in
//     FIFO order while the budget, max_num_seqs, a free slot and enough free
//     blocks allow.
//  A chunk that reaches the end of the request's known tokens samples a token.
//  Padding: if a step contains a prefill chunk longer than
//  prompt_as_decode_max_tokens, its total token count is padded up to the
//  smallest prefill_token_buckets entry >= it (no padding above the largest
//  bucket); otherwise the step is decode-shaped and its sequence count is
//  padded to the smallest decode_batch_buckets entry >= it. Padding rows belong
//  to no request and write only to the scratch block/slot.
//  Lifecycle: waiting → running → finished (stop | length) or aborted (abort).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/block_manager.h"

namespace deepinfer {

struct SchedulerConfig {
  int max_num_seqs = 8;                  // --max-num-seqs
  int64_t max_num_batched_tokens = 512;  // --max-num-batched-tokens (per-step token budget)
  int64_t max_model_len = 4096;          // --max-model-len (prompt + output tokens)
  int64_t block_size = 16;               // --block-size (tokens per paged block)
  int64_t num_kv_blocks = 0;             // --num-kv-blocks
  std::vector<int64_t> prefill_token_buckets;  // sorted ascending; empty = no padding
  std::vector<int64_t> decode_batch_buckets;   // sorted ascending; empty = no padding
  int64_t prompt_as_decode_max_tokens = 1;     // prompts this short run in decode-shaped steps
  bool enable_prefix_caching = false;          // --enable-prefix-caching (docs/engine.md "Prefix caching")
  // Throws Error(kInvalidArgument) naming the bad field.
  void Validate() const;
};

enum class RequestStatus { kWaiting, kRunning, kFinished };
enum class SeqFinishReason { kNone, kStop, kLength, kAbort, kError };
const char* SeqFinishReasonName(SeqFinishReason r);  // "stop", "length", "abort", "error", ""

// An image span of a prompt (docs/vision.md): positions [begin, end) and the
// image's content hash, mixed into the prefix-cache key of every block that
// overlaps the span, so blocks of different images are never shared.
struct ImageKey {
  int64_t begin = 0, end = 0;
  uint64_t hash = 0;
};

// Scheduler-side view of one request.
struct SeqState {
  uint64_t id = 0;
  int64_t num_prompt_tokens = 0;
  std::vector<int32_t> token_ids;   // prompt + generated
  int64_t max_tokens = 0;           // cap on generated tokens (already clipped to max_model_len)
  int64_t num_computed_tokens = 0;  // tokens whose state is in the cache
  int32_t slot = -1;                // fixed-state slot while running
  std::vector<int32_t> block_table; // paged blocks while running
  RequestStatus status = RequestStatus::kWaiting;
  SeqFinishReason finish_reason = SeqFinishReason::kNone;
  int num_preemptions = 0;
  // Prefix caching.
  bool cacheable = true;              // may take and publish shared blocks
  std::vector<uint64_t> block_keys;   // keys of the full blocks of token_ids so far (chained)
  std::vector<ImageKey> image_keys;   // image spans of the prompt (their content enters the keys)
  int64_t num_published = 0;          // leading blocks of block_table that are published (or were hits)
  int64_t num_cached_tokens = 0;      // tokens taken from the cache at the last admission
  // Speculative decoding (docs/speculative.md): draft ids for the positions
  // after token_ids.back(), set by the engine before Schedule(); consumed
  // (cleared) by the next Schedule().
  std::vector<int32_t> spec_token_ids;
  int64_t num_output_tokens() const { return static_cast<int64_t>(token_ids.size()) - num_prompt_tokens; }
};

// One sequence's part of a step.
struct ScheduledSeq {
  uint64_t id = 0;
  int64_t start = 0;        // first position of the chunk (== num_computed_tokens)
  int64_t len = 0;          // tokens in the chunk (>= 1)
  bool sample = false;      // the chunk ends at the last known token: sample one
  bool fresh_slot = false;  // slot newly assigned this step (its fixed state is stale)
  // Prefix-cache hit: positions [0, restore_prefix) are in shared blocks
  // (start == restore_prefix); the fixed state is rebuilt from them first.
  int64_t restore_prefix = 0;
  // Speculative decoding: the chunk is [last token, drafts...] with
  // num_draft = len - 1 drafts (positions start+1 ...); the drafts are in
  // `draft`. Every row samples (sample is true).
  int64_t num_draft = 0;
  std::vector<int32_t> draft;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  int64_t num_tokens = 0;          // sum of seqs[i].len
  int64_t num_padding_tokens = 0;  // extra padding tokens (prefill-shaped steps)
  int num_padding_seqs = 0;        // extra 1-token padding rows (decode-shaped steps)
  bool decode_shaped = false;
  std::vector<uint64_t> preempted;  // requests preempted while planning this step
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  // Queues a request. prompt must be non-empty and at most max_model_len tokens,
  // and the whole request must fit in the pool, else Error(kInvalidArgument)
  // naming both numbers. max_tokens is clipped so prompt + output <= max_model_len.
  // cacheable = false: never takes or publishes shared blocks (a request that
  // needs every prompt row's logits, e.g. prompt_logprobs).
  void Add(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens, bool cacheable = true);
  // The image spans of request `id` (call right after Add, before any Step).
  void SetImageKeys(uint64_t id, std::vector<ImageKey> keys);
  // Aborts a waiting or running request (frees its blocks at once). Unknown or
  // finished ids are ignored. Returns true if something was aborted.
  bool Abort(uint64_t id, SeqFinishReason reason = SeqFinishReason::kAbort);

  // Plans one step. allow_prefill = false (a data-parallel decode step, see
  // docs/parallel.md) plans only running requests whose next chunk is at most
  // prompt_as_decode_max_tokens long and admits nothing, so the step is
  // decode-shaped; requests it skips keep their place.
  StepPlan Schedule(bool allow_prefill = true);
  // Work a prefill-shaped step would do: a waiting request, or a running one
  // whose next chunk is longer than prompt_as_decode_max_tokens.
  bool HasPrefillWork() const;
  // Reports the step's results: `sampled[i]` is the token for plan.seqs[i] when
  // it sampled (ignored otherwise). Marks length-finished requests and frees
  // their resources. Requests that should stop for other reasons (EOS, stop
  // strings) are finished by the caller with Finish().
  void Update(const StepPlan& plan, const std::vector<int32_t>& sampled);
  // The general form (speculative decoding; Update is UpdateTokens with 0 or
  // 1 token per seq): `tokens[i]` are the tokens plan.seqs[i] produced
  // (empty: none; a chunk with drafts: the accepted drafts then the token
  // sampled after them, 1 .. num_draft + 1 tokens). A
  // sequence with drafts keeps start + tokens[i].size() computed positions
  // (the rejected drafts' positions are not computed) and gives back the
  // blocks grown for them. Tokens past max_tokens are dropped.
  void UpdateTokens(const StepPlan& plan, const std::vector<std::vector<int32_t>>& tokens);
  // Speculative decoding: drafts for the next Schedule() of a running request
  // whose only uncomputed token is its last (a decode). Ignored otherwise.
  // Schedule() feeds as many as the token budget allows.
  void SetSpecTokens(uint64_t id, std::vector<int32_t> draft);
  void Finish(uint64_t id, SeqFinishReason reason);

  const SeqState* Get(uint64_t id) const;
  // Finished requests are kept until Release(id).
  void Release(uint64_t id);

  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
  const BlockManager& blocks() const { return blocks_; }
  // Prefix caching (vLLM's prefix_cache_queries / prefix_cache_hits): tokens
  // of admitted requests looked up, and of those found in the cache.
  int64_t prefix_cache_queries() const { return prefix_cache_queries_; }
  int64_t prefix_cache_hits() const { return prefix_cache_hits_; }
  const SchedulerConfig& config() const { return config_; }
  // Throws Error(kInternal) if the block manager and the requests disagree.
  void CheckInvariants() const;

 private:
  SeqState& Mut(uint64_t id);
  void Preempt(SeqState& s);
  void FreeResources(SeqState& s);
  int64_t BlocksFor(int64_t tokens) const { return (tokens + config_.block_size - 1) / config_.block_size; }
  // Key of full block b of s.token_ids (and its parent's), computing the chain as needed.
  uint64_t KeyOf(SeqState& s, int64_t b);
  uint64_t ParentKeyOf(SeqState& s, int64_t b) { return b == 0 ? kRootKey : KeyOf(s, b - 1); }
  static constexpr uint64_t kRootKey = 0x6465657069666572ull;
  int64_t prefix_cache_queries_ = 0, prefix_cache_hits_ = 0;

  SchedulerConfig config_;
  BlockManager blocks_;
  std::map<uint64_t, std::unique_ptr<SeqState>> seqs_;
  std::vector<uint64_t> running_;  // admission order (oldest first)
  std::deque<uint64_t> waiting_;
};

}  // namespace deepinfer
