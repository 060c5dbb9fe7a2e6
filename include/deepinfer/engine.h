// deepinfer/engine.h — the narrow public API of the inference engine, used by
// the offline CLI (`deepinfer generate`) and the HTTP server. No tensors cross
// this boundary: requests are token ids or text plus sampling parameters;
// results are tokens, text, logprobs and timings.
//
// Threading: an Engine is NOT thread-safe. One thread owns it and calls
// Submit/Abort/Step; a server's HTTP threads talk to that thread through
// queues.
//
// Errors: Open() throws deepinfer::Error for a bad model directory or bad
// engine arguments (the message names the argument, with vLLM's flag name).
// Submit() throws Error(kInvalidArgument) for a bad request (empty prompt,
// prompt + max_tokens over max_model_len, bad sampling parameters such as
// logprobs / prompt_logprobs above max_logprobs (-1, the whole vocabulary,
// counts as vocab_size), token ids out of range); nothing is queued then. A failure while a request runs (e.g.
// NaN logits) finishes that request alone with finish_reason "error" and a
// message in RequestOutput::error; other requests continue.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <variant>
#include <string>
#include <vector>

#include "sampling/sampling_params.h"
#include "sampling/sampler.h"

namespace deepinfer {

class Tokenizer;
class ModelBackend;
namespace structured {
class CompiledGrammar;
}
namespace vision {
struct PreparedImage;
}

// Engine arguments, named as vLLM's (--max-num-seqs → max_num_seqs, ...).
struct EngineArgs {
  std::string model;                       // model directory (config.json, safetensors, tokenizer.json)
  int max_num_seqs = 8;                    // --max-num-seqs
  int64_t max_num_batched_tokens = 512;    // --max-num-batched-tokens
  int64_t max_model_len = 4096;            // --max-model-len
  int64_t block_size = 16;                 // --block-size (tokens per KV block)
  int64_t num_kv_blocks = 0;               // --num-kv-blocks (0 = derive from kv_cache_memory_bytes)
  int64_t kv_cache_memory_bytes = 0;       // --kv-cache-memory (0 = enough for max_num_seqs × max_model_len)
  std::vector<int64_t> prefill_token_buckets;  // --prefill-token-buckets (empty = no padding)
  std::vector<int64_t> decode_batch_buckets;   // --decode-batch-buckets (empty = no padding)
  int64_t prompt_as_decode_max_tokens = 1;     // prompts this short run in decode-shaped steps
  int num_threads = 0;                     // --threads (0 = all cores)
  int64_t max_logprobs = 20;               // --max-logprobs
  LogprobsMode logprobs_mode = LogprobsMode::kRawLogprobs;  // --logprobs-mode
  std::string engram_token_map;            // optional int32 file overriding the map built from tokenizer.json
  bool enable_prefix_caching = true;       // --enable-prefix-caching / --no-enable-prefix-caching (vLLM's default: on)
  // Scale-out over MPI (docs/parallel.md). Run under `mpirun -np N`; every
  // rank gets the same arguments.
  int expert_parallel_size = 1;            // --ep N: routed experts (and Engram rows) split over N ranks
  int data_parallel_size = 1;              // --dp N: attention data-parallel over N ranks (needs --ep N)
  // --cp N: context parallelism, every sequence's paged state (compressed KV,
  // index keys) split over N ranks that run its rows together; the pool
  // flags (--num-kv-blocks, --kv-cache-memory) are per rank and the group
  // holds N times as much. 0 = not given (1, and no start-up capacity check);
  // given (any N >= 1): --max-model-len must fit the group's pool.
  int context_parallel_size = 0;
  int64_t prefill_attempt_interval = 1;    // --prefill-attempt-interval: decode steps between prefill
                                           // attempts while only some DP ranks have prompts
  std::string dp_moe_exchange = "auto";    // --dp-moe-exchange auto|general: decode steps use the static
                                           // path (auto) or the general all-to-all path like prefill
  double distributed_timeout_s = 600;      // --distributed-timeout: a collective waiting this long fails
  // --fp8-format: "e4m3fn" (default, the checkpoint's numerics) or "e4m3-ieee"
  // (the Neuron trn2 contract: FP8 weights rescaled at load, activations and
  // KV QAT quantised to 224; docs/kernels.md). Open() throws
  // Error(kInvalidArgument) naming the flag for another name or for a
  // checkpoint without FP8 weights.
  std::string fp8_format = "e4m3fn";
  // --speculative-config (vLLM's JSON; docs/speculative.md), e.g.
  // {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
  // "prompt_lookup_max": 4}. Empty = off. Open() throws
  // Error(kInvalidArgument) naming the flag for a bad config, a method the
  // model cannot run (dspark without a drafter) or a parallel job.
  std::string speculative_config;
};

struct GenerateRequest {
  // Exactly one of prompt / prompt_token_ids (a prompt string is tokenized
  // with add_special_tokens = true; chat rendering happens before, in the caller).
  std::optional<std::string> prompt;
  std::optional<std::vector<int32_t>> prompt_token_ids;
  SamplingParams params;
  std::string request_id;  // caller's label, used in error messages
  // Structured output (src/structured/constraint.h): when set, every generated
  // token keeps the output inside this grammar (the sampler's token bitmask)
  // and EOS is allowed only where the grammar may end. Needs the tokenizer;
  // not combinable with ignore_eos (Submit throws kInvalidArgument).
  std::shared_ptr<structured::CompiledGrammar> constraint;
  // Images (vision models; docs/vision.md): the i-th image_token_id of the
  // prompt is expanded into images[i]'s span (token types, embeddings from the
  // vision tower, counted in prompt tokens and the KV budget like any token).
  // Decoding and preprocessing (vision::PrepareImage) happen before Submit, on
  // the caller's thread. Submit throws Error(kInvalidArgument) when the count
  // differs from the placeholders, for more than 16 images, for a model
  // without a vision tower, and with --ep/--dp > 1 (not supported yet).
  std::vector<std::shared_ptr<const vision::PreparedImage>> images;
};

// Incremental output of one request after a Step(). When `finished`, the
// whole-request fields are filled too.
struct RequestOutput {
  uint64_t id = 0;
  std::string request_id;
  std::vector<int32_t> new_token_ids;        // tokens generated in this step
  std::string new_text;                      // text safe to emit now (valid UTF-8, stop strings held back)
  std::vector<LogprobsEntry> new_logprobs;   // one per new token, when params.logprobs is set
  bool finished = false;
  std::string finish_reason;                 // "stop" | "length" | "abort" | "error" (when finished)
  std::string error;                         // message when finish_reason == "error"
  std::optional<std::variant<std::string, int64_t>> stop_reason;  // matched stop string or stop token id
  // Whole-request values (set when finished):
  std::vector<int32_t> token_ids;            // all generated tokens
  std::string text;                          // all generated text (after stop handling)
  std::vector<LogprobsEntry> logprobs;
  // prompt_logprobs (vLLM's RequestOutput.prompt_logprobs), when
  // params.prompt_logprobs = N is set: num_prompt_tokens entries, one per
  // prompt position p. [0] is std::nullopt (the first token has no context).
  // [p], p >= 1, is the raw log_softmax of the logits at position p-1 (the row
  // that predicts prompt token p): `chosen` = prompt token p with its logprob
  // and rank, `top` = the N most likely ids (the whole vocabulary for N = -1),
  // descending, ties by lowest id (Sampler::PromptLogprobs). Always raw:
  // independent of --logprobs-mode, temperature, penalties, logit_bias. The
  // values depend only on the prompt (not on the batch, the token budget or
  // preemption); each position is computed once even if the request is
  // preempted and recomputed.
  // Set in the output of the Step() that completed the prompt's entries (at
  // the latest the step of the first generated token) and again in the
  // finished output (whole-request value, like token_ids); empty in every
  // other output, when not asked for, and when the request finished (abort,
  // error) before its prompt was fully processed.
  std::vector<std::optional<LogprobsEntry>> prompt_logprobs;
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;             // prompt tokens taken from the prefix cache (OpenAI's cached_tokens)
  int64_t seed = 0;                          // the seed used (drawn by the engine if none was given)
  double time_to_first_token_s = 0;
  double total_time_s = 0;
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int64_t num_kv_blocks = 0;          // total paged blocks
  int64_t num_kv_blocks_used = 0;     // owned by running requests now
  int64_t peak_kv_blocks_used = 0;
  int64_t kv_cache_bytes = 0;
  int64_t prompt_tokens_total = 0;    // prompt tokens computed (including recomputation)
  int64_t generation_tokens_total = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t num_finished = 0;
  // Data parallelism (one entry per DP rank; one entry without DP):
  std::vector<int64_t> dp_requests;     // requests assigned to each rank
  std::vector<int64_t> dp_dummy_steps;  // steps each rank ran padding rows only
  int64_t num_prefill_steps = 0;        // DP steps voted prefill-shaped
  int64_t num_decode_steps = 0;         // DP steps voted decode-shaped (static MoE path)
  // Prefix caching (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens):
  int64_t prefix_cache_queries = 0;     // prompt tokens of admitted requests looked up
  int64_t prefix_cache_hits = 0;        // of those, found in the cache (not computed)
  int64_t num_cached_blocks = 0;        // published blocks (shared or evictable)
  int64_t num_evictable_blocks = 0;     // cached blocks no request holds (counted free in num_kv_blocks_used)
  bool prefix_caching = false;          // enabled (flag on and the model supports it)
  // Speculative decoding (vLLM's spec_decode_* counters; docs/speculative.md):
  int64_t spec_num_speculative_tokens = 0;  // k of --speculative-config (0 = off)
  int64_t spec_num_drafts = 0;              // verification chunks with >= 1 draft
  int64_t spec_num_draft_tokens = 0;        // draft tokens verified
  int64_t spec_num_accepted_tokens = 0;     // of those, accepted
  std::vector<int64_t> spec_num_accepted_tokens_per_pos;  // [k]: drafts accepted at draft position i
  // Mean tokens per verification chunk: 1 + accepted / drafts (1 when none).
  double spec_mean_accepted_length() const {
    return spec_num_drafts ? 1.0 + static_cast<double>(spec_num_accepted_tokens) / spec_num_drafts : 1.0;
  }
};

class Engine {
 public:
  static std::unique_ptr<Engine> Open(const EngineArgs& args);
  // For tests: an engine over any backend (tokenizer optional).
  static std::unique_ptr<Engine> OpenWithBackend(const EngineArgs& args, std::unique_ptr<ModelBackend> backend,
                                                 std::unique_ptr<Tokenizer> tokenizer);
  ~Engine();

  uint64_t Submit(const GenerateRequest& request);
  // Aborts a waiting or running request; its blocks are freed at once and the
  // next Step() reports it finished with "abort". Unknown ids are ignored.
  void Abort(uint64_t id);
  // Runs one scheduler step (if there is work) and returns the outputs that
  // changed: new tokens, and every request that finished (including aborts
  // and errors since the last call).
  std::vector<RequestOutput> Step();
  bool HasUnfinished() const;
  EngineStats Stats() const;
  const EngineArgs& args() const;
  const Tokenizer* tokenizer() const;  // nullptr if the model directory has none
  int64_t vocab_size() const;
  const std::string& model_type() const;  // config.json model_type, e.g. "deepseek_v41"
  // Set when a rank of the parallel job was lost: every request failed with
  // finish_reason "error" and Submit throws Error(kUnavailable) (HTTP 503).
  const std::optional<std::string>& fatal_error() const;
  // Parallel jobs: checks that every rank is still there (an idle engine runs
  // no step that would notice); a lost rank sets fatal_error(). Cheap.
  void CheckPeers();

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Parallel jobs (docs/parallel.md). Under `mpirun -np N` rank 0 is the
// leader: Engine::Open there returns an engine whose steps run on every rank.
// The other ranks call RunFollower with the same arguments: it loads this
// rank's share of the model, then runs the leader's steps until the leader
// stops (returns 0) or a rank is lost (logs the error naming the rank and
// returns 1). Open / RunFollower throw Error(kInvalidArgument) for
// unsupported combinations, naming the flags (--ep / --dp and the rank count).
bool IsFollowerRank();  // this process is rank > 0 of an MPI job
int RunFollower(const EngineArgs& args);
// Weight bytes this rank holds (for the start-up log and the benchmark).
struct RankWeightBytes {
  int64_t routed_experts = 0, engram_rows = 0, replicated = 0, packed = 0;
};

}  // namespace deepinfer
