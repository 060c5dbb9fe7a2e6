// Engine: scheduler → runner (batch metadata on the paged pool) → model →
// sampler → stop handling → incremental outputs. See include/deepinfer/engine.h.
#include "deepinfer/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/error.h"
#include "base/parallel.h"
#include "cache/cache_pool.h"
#include "engine/backend.h"
#include "engine/parallel_runner.h"
#include "engine/speculative.h"
#include "parallel/communicator.h"
#include "scheduler/scheduler.h"
#include "sampling/stop_checker.h"
#include "structured/matcher.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "engine/image_inputs.h"
#include "format/safetensors.h"
#include "vision/vit.h"
#include <deque>

namespace deepinfer {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

struct RequestRecord {
  uint64_t id = 0;
  int shard = 0;  // data-parallel shard (scheduler) that owns the request
  std::string request_id;
  SamplingParams params;
  std::unique_ptr<SamplingState> sampling;
  std::unique_ptr<StopChecker> stop;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<structured::Matcher> matcher;  // structured output, when asked
  int64_t num_prompt_tokens = 0;
  std::optional<int64_t> num_cached_tokens;  // prefix-cache hit at its first admission
  std::vector<int32_t> output_ids;
  std::string text;
  std::vector<LogprobsEntry> logprobs;
  // prompt_logprobs: entries for positions [0, prompt_logprobs.size()) are
  // final (computed once; a recompute after preemption skips them).
  bool wants_prompt_logprobs = false;
  bool prompt_logprobs_emitted = false;
  std::vector<std::optional<LogprobsEntry>> prompt_logprobs;
  bool prompt_logprobs_done() const {
    return static_cast<int64_t>(prompt_logprobs.size()) == num_prompt_tokens;
  }
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_token;
  bool finished = false;
  std::string finish_reason;
  std::string error;
  std::optional<std::variant<std::string, int64_t>> stop_reason;
  RequestImages images;  // image spans of the prompt (docs/vision.md); empty for text
  // Model drafter (backend.h ModelDrafter): the draft it proposed after the
  // last step, valid while the sequence has model_draft_len tokens.
  std::vector<int32_t> model_draft;
  int64_t model_draft_len = -1;
  // Output accumulated since the last Step() return.
  RequestOutput pending;
  bool has_pending = false;
};

// One data-parallel shard: its scheduler and block space. Shard 0's state
// lives in this process's pool; shard i > 0's in rank i's (docs/parallel.md).
struct EngineShard {
  std::unique_ptr<Scheduler> scheduler;
  int64_t requests = 0;     // requests assigned so far
  int64_t dummy_steps = 0;  // steps it ran padding rows only (lockstep)
};

struct Engine::Impl {
  EngineArgs args;
  std::unique_ptr<ModelBackend> backend;
  // The vision tower (vision models), bound at the first image request.
  std::unique_ptr<TensorStore> vision_store;
  std::unique_ptr<vision::VisionTower> vision;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<CachePool> pool;  // this process's pool: shard 0's
  std::vector<EngineShard> shards;
  Scheduler& Sched(const RequestRecord& r) { return *shards[static_cast<size_t>(r.shard)].scheduler; }
  int64_t decode_steps_since_prefill = 0;
  std::optional<std::string> fatal;  // a rank of the parallel job was lost: the engine serves nothing more
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> eos_ids;
  std::map<uint64_t, std::unique_ptr<RequestRecord>> requests;
  uint64_t next_id = 1;
  EngineStats stats;
  std::vector<float> logits;
  std::vector<float> sample_rows;  // sampling rows gathered when a step also returns prompt rows
  std::unique_ptr<structured::TokenVocab> token_vocab;  // built at the first constrained request
  std::vector<uint32_t> mask_words;
  // Speculative decoding (docs/speculative.md).
  SpeculativeConfig spec;
  std::unique_ptr<Proposer> proposer;
  ModelDrafter* drafter = nullptr;  // owned by the backend ("mtp", "dspark")

  RequestOutput& Pending(RequestRecord& r) {
    if (!r.has_pending) {
      r.pending = RequestOutput{};
      r.pending.id = r.id;
      r.pending.request_id = r.request_id;
      r.has_pending = true;
    }
    return r.pending;
  }
  void EmitText(RequestRecord& r, const std::string& s) {
    if (s.empty()) return;
    r.text += s;
    Pending(r).new_text += s;
  }
  void FinishRecord(RequestRecord& r, const std::string& reason, const std::string& error = {}) {
    if (r.finished) return;
    if (r.stop && !r.stop->stopped()) {
      // Bytes the detokenizer still holds (an incomplete character) and text the
      // stop checker held back can no longer become a stop string: release them.
      if (r.detok) {
        const std::string tail = r.detok->Flush();
        if (!tail.empty()) {
          StopUpdate up = r.stop->Append(tail, static_cast<int64_t>(r.output_ids.size()));
          EmitText(r, up.text);
          if (up.stopped && up.stop_index >= 0) r.stop_reason = r.params.stop[up.stop_index];
        }
      }
      if (!r.stop->stopped()) EmitText(r, r.stop->Flush());
    }
    r.finished = true;
    r.finish_reason = reason;
    r.error = error;
    RequestOutput& o = Pending(r);
    o.finished = true;
    o.finish_reason = reason;
    o.error = error;
    o.stop_reason = r.stop_reason;
    o.token_ids = r.output_ids;
    o.text = r.text;
    o.logprobs = r.logprobs;
    if (r.wants_prompt_logprobs && r.prompt_logprobs_done()) o.prompt_logprobs = r.prompt_logprobs;
    o.num_prompt_tokens = r.num_prompt_tokens;
    o.num_cached_tokens = r.num_cached_tokens.value_or(0);
    o.seed = r.sampling ? r.sampling->seed() : 0;
    const auto now = Clock::now();
    o.total_time_s = Seconds(r.arrival, now);
    o.time_to_first_token_s = r.first_token ? Seconds(r.arrival, *r.first_token) : o.total_time_s;
    ++stats.num_finished;
  }
};

namespace {

// The prompt positions whose prompt_logprobs entries a chunk's rows give and
// that are still missing: the row at position q predicts prompt token q+1, so
// the chunk [start, start+len) covers entries [start+1, start+len] ∩ [1, P);
// entries [0, done) exist already (a recompute after preemption skips them).
struct PromptRowRange {
  int64_t first_entry = 0, end_entry = 0;  // entries [first_entry, end_entry)
  bool empty() const { return first_entry >= end_entry; }
};

PromptRowRange PromptRows(const RequestRecord& r, const ScheduledSeq& q) {
  if (!r.wants_prompt_logprobs) return {};
  const int64_t done = static_cast<int64_t>(r.prompt_logprobs.size());
  return {std::max(q.start + 1, done), std::min(q.start + q.len + 1, r.num_prompt_tokens)};
}

bool NeedsPromptRows(const RequestRecord& r, const ScheduledSeq& q) { return !PromptRows(r, q).empty(); }

// Converts this step's prompt rows into prompt_logprobs entries right away (the
// rows are not kept): entries are appended to each request in position order;
// a failure (NaN logits) fails that request only.
void ComputePromptLogprobs(Engine::Impl& m, const Scheduler& sched, const std::vector<float>& logits,
                           const StepPlan& plan, const std::vector<BackendSeq>& seqs,
                           const std::vector<int64_t>& row0, std::vector<std::optional<std::string>>* row_error) {
  struct Task {
    size_t seq;
    int64_t entry;  // prompt position p; computed from the row at position p-1
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!seqs[i].all_logits || (*row_error)[i]) continue;
    const PromptRowRange pr = PromptRows(*m.requests.at(plan.seqs[i].id), plan.seqs[i]);
    for (int64_t p = pr.first_entry; p < pr.end_entry; ++p) tasks.push_back({i, p});
  }
  const int64_t vocab = m.backend->vocab_size();
  const int64_t n = static_cast<int64_t>(tasks.size());
  std::vector<LogprobsEntry> entries(tasks.size());
  std::vector<std::optional<std::string>> errors(tasks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < n; ++t) {
    const Task& k = tasks[static_cast<size_t>(t)];
    const ScheduledSeq& q = plan.seqs[k.seq];
    try {
      const RequestRecord& r = *m.requests.at(q.id);
      const SeqState* st = sched.Get(q.id);
      const int64_t row = row0[k.seq] + (k.entry - 1 - q.start);
      entries[static_cast<size_t>(t)] = m.sampler->PromptLogprobs(
          std::span<const float>(logits.data() + row * vocab, static_cast<size_t>(vocab)),
          st->token_ids[static_cast<size_t>(k.entry)], *r.params.prompt_logprobs);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(t)] = fmt::format("prompt_logprobs at prompt position {}: {}", k.entry, e.what());
    }
  }
  for (size_t t = 0; t < tasks.size(); ++t) {
    const size_t i = tasks[t].seq;
    if ((*row_error)[i]) continue;
    if (errors[t]) {
      (*row_error)[i] = *errors[t];
      continue;
    }
    RequestRecord& r = *m.requests.at(plan.seqs[i].id);
    DI_CHECK(static_cast<int64_t>(r.prompt_logprobs.size()) == tasks[t].entry);
    r.prompt_logprobs.emplace_back(std::move(entries[t]));
  }
}

}  // namespace

void ValidateEngineArgs(const EngineArgs& args) {
  if (args.max_num_seqs < 1) Fail(ErrorKind::kInvalidArgument, "--max-num-seqs must be >= 1, got {}", args.max_num_seqs);
  if (args.max_model_len < 2) Fail(ErrorKind::kInvalidArgument, "--max-model-len must be >= 2, got {}", args.max_model_len);
  if (args.block_size < 1) Fail(ErrorKind::kInvalidArgument, "--block-size must be >= 1, got {}", args.block_size);
  if (args.max_num_batched_tokens < 1)
    Fail(ErrorKind::kInvalidArgument, "--max-num-batched-tokens must be >= 1, got {}", args.max_num_batched_tokens);
  if (args.num_kv_blocks < 0) Fail(ErrorKind::kInvalidArgument, "--num-kv-blocks must be >= 0, got {}", args.num_kv_blocks);
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::OpenWithBackend(const EngineArgs& args, std::unique_ptr<ModelBackend> backend,
                                                std::unique_ptr<Tokenizer> tokenizer) {
  auto impl = std::make_unique<Impl>();
  impl->args = args;
  impl->backend = std::move(backend);
  impl->tokenizer = std::move(tokenizer);
  if (args.num_threads != 0) SetNumThreads(args.num_threads);
  const ModelConfig& cfg = impl->backend->config();
  ValidateEngineArgs(args);
  impl->spec = ParseSpeculativeConfig(args.speculative_config);
  // A model drafter sees every kept row of its sequence (backend.h ModelDrafter): no prefix-cache hits.
  const bool caching =
      args.enable_prefix_caching && impl->backend->supports_prefix_caching() && !impl->spec.model_drafter();
  StateGeometry geometry =
      caching ? impl->backend->CachingGeometry(args.block_size) : impl->backend->Geometry(args.block_size);
  const int64_t num_blocks = KvBlocksFor(args, geometry);
  SchedulerConfig sc;
  sc.max_num_seqs = args.max_num_seqs;
  sc.max_num_batched_tokens = args.max_num_batched_tokens;
  sc.max_model_len = args.max_model_len;
  sc.block_size = args.block_size;
  const int cp = impl->backend->context_parallel_size();  // the pool flags are per CP rank
  sc.num_kv_blocks = num_blocks * cp;
  sc.prefill_token_buckets = args.prefill_token_buckets;
  sc.decode_batch_buckets = args.decode_batch_buckets;
  sc.prompt_as_decode_max_tokens = args.prompt_as_decode_max_tokens;
  sc.enable_prefix_caching = caching;
  impl->stats.prefix_caching = caching;
  const int dp = impl->backend->data_parallel_size();
  if (dp < 1) Fail(ErrorKind::kInternal, "backend data_parallel_size {} < 1", dp);
  impl->shards.resize(static_cast<size_t>(dp));
  for (EngineShard& sh : impl->shards) sh.scheduler = std::make_unique<Scheduler>(sc);
  impl->pool = std::make_unique<CachePool>(geometry, num_blocks, args.max_num_seqs, cp, 0);
  impl->eos_ids = {static_cast<int32_t>(cfg.eos_token_id)};
  SamplerConfig samp;
  samp.vocab_size = impl->backend->vocab_size();
  samp.eos_token_ids = impl->eos_ids;
  samp.logprobs_mode = args.logprobs_mode;
  impl->sampler = std::make_unique<Sampler>(samp);
  impl->stats.num_kv_blocks = sc.num_kv_blocks;
  impl->stats.kv_cache_bytes = impl->pool->total_bytes();
  if (impl->spec.enabled()) {
    ValidateSpeculativeConfig(impl->spec, cfg);
    if (dp > 1 || args.expert_parallel_size > 1)
      Fail(ErrorKind::kInvalidArgument,
           "--speculative-config cannot be combined with a parallel job (--ep {} --dp {}): the rollback of rejected "
           "drafts runs in this process's pool only",
           args.expert_parallel_size, dp);
    if (impl->backend->context_parallel_size() > 1)
      Fail(ErrorKind::kInvalidArgument,
           "--speculative-config cannot be combined with --cp {}: the draft and rollback steps are not "
           "context-parallel",
           impl->backend->context_parallel_size());
    if (!impl->backend->supports_speculative_rollback())
      Fail(ErrorKind::kInvalidArgument,
           "--speculative-config is not supported for model_type {} yet (its state rollback after rejected drafts "
           "is not implemented)",
           cfg.model_type);
    if (impl->spec.model_drafter()) {
      impl->drafter = impl->backend->EnableDrafter(impl->spec);
      if (!impl->drafter)
        Fail(ErrorKind::kInvalidArgument,
             "--speculative-config: method \"{}\" has no drafter in this backend for model_type {}; use \"ngram\"",
             impl->spec.method, cfg.model_type);
    } else {
      impl->proposer = MakeProposer(impl->spec);
    }
    impl->stats.spec_num_speculative_tokens = impl->spec.num_speculative_tokens;
    impl->stats.spec_num_accepted_tokens_per_pos.assign(static_cast<size_t>(impl->spec.num_speculative_tokens), 0);
  }
  spdlog::debug("engine: {} KV blocks of {} tokens, {} slots, {} bytes of cache", num_blocks, args.block_size,
                args.max_num_seqs, impl->pool->total_bytes());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const EngineArgs& Engine::args() const { return impl_->args; }
const Tokenizer* Engine::tokenizer() const { return impl_->tokenizer.get(); }
int64_t Engine::vocab_size() const { return impl_->backend->vocab_size(); }
const std::string& Engine::model_type() const { return impl_->backend->config().model_type; }
bool Engine::HasUnfinished() const {
  for (const EngineShard& sh : impl_->shards)
    if (sh.scheduler->has_unfinished()) return true;
  for (const auto& [id, r] : impl_->requests)
    if (r->has_pending) return true;
  return false;
}

EngineStats Engine::Stats() const {
  EngineStats s = impl_->stats;
  s.num_kv_blocks = 0;
  for (const EngineShard& sh : impl_->shards) {
    s.num_running += sh.scheduler->num_running();
    s.num_waiting += sh.scheduler->num_waiting();
    s.num_kv_blocks += sh.scheduler->blocks().num_blocks();
    s.num_kv_blocks_used += sh.scheduler->blocks().num_used_blocks();
    s.peak_kv_blocks_used += sh.scheduler->blocks().peak_used_blocks();
    s.dp_requests.push_back(sh.requests);
    s.dp_dummy_steps.push_back(sh.dummy_steps);
    s.prefix_cache_queries += sh.scheduler->prefix_cache_queries();
    s.prefix_cache_hits += sh.scheduler->prefix_cache_hits();
    s.num_cached_blocks += sh.scheduler->blocks().num_cached_blocks();
    s.num_evictable_blocks += sh.scheduler->blocks().num_evictable_blocks();
  }
  return s;
}

const std::optional<std::string>& Engine::fatal_error() const { return impl_->fatal; }

void Engine::CheckPeers() {
  if (impl_->fatal) return;
  try {
    impl_->backend->CheckPeers();
  } catch (const RankLostError& e) {
    impl_->fatal = e.what();
    spdlog::error("parallel job lost a rank: {}", e.what());
  }
}

uint64_t Engine::Submit(const GenerateRequest& req) {
  Impl& m = *impl_;
  const std::string label = req.request_id.empty() ? std::string("request") : "request " + req.request_id;
  if (m.fatal) Fail(ErrorKind::kUnavailable, "{}: the engine is down: {}", label, *m.fatal);
  if (req.prompt.has_value() == req.prompt_token_ids.has_value())
    Fail(ErrorKind::kInvalidArgument, "{}: give exactly one of prompt and prompt_token_ids", label);
  std::vector<int32_t> ids;
  if (req.prompt) {
    if (!m.tokenizer)
      Fail(ErrorKind::kInvalidArgument, "{}: a text prompt needs tokenizer.json in the model directory; pass prompt_token_ids",
           label);
    if (req.prompt->empty()) Fail(ErrorKind::kInvalidArgument, "{}: prompt is empty", label);
    ids = m.tokenizer->Encode(*req.prompt, /*add_special_tokens=*/true);
  } else {
    ids = *req.prompt_token_ids;
  }
  const int64_t vocab = m.backend->vocab_size();
  if (ids.empty()) Fail(ErrorKind::kInvalidArgument, "{}: prompt is empty", label);
  RequestImages images;
  if (!req.images.empty()) {
    if (m.args.expert_parallel_size > 1 || m.shards.size() > 1 || m.backend->context_parallel_size() > 1)
      Fail(ErrorKind::kInvalidArgument, "{}: images are not supported with --ep/--dp/--cp > 1 yet", label);
    if (!m.backend->config().vision_enabled())
      Fail(ErrorKind::kInvalidArgument, "{}: the model has no vision tower (vision_config); it cannot take images",
           label);
    if (!m.vision) {
      m.vision_store = TensorStore::Open(m.args.model);
      m.vision = vision::VisionTower::Bind(*m.vision_store, m.backend->config());
    }
    images = ExpandImages(*m.vision, m.backend->config(), &ids, req.images, label);
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      Fail(ErrorKind::kInvalidArgument, "{}: prompt_token_ids[{}] = {} is outside the vocabulary [0, {})", label, i, ids[i],
           vocab);
  SamplingLimits limits;
  limits.vocab_size = vocab;
  limits.max_logprobs = m.args.max_logprobs;
  req.params.Validate(limits);
  const int64_t n = static_cast<int64_t>(ids.size());
  if (req.params.max_tokens && n + *req.params.max_tokens > m.args.max_model_len)
    Fail(ErrorKind::kInvalidArgument,
         "{}: prompt ({} tokens) + max_tokens ({}) = {} exceeds max_model_len {}", label, n, *req.params.max_tokens,
         n + *req.params.max_tokens, m.args.max_model_len);
  auto rec = std::make_unique<RequestRecord>();
  rec->id = m.next_id;
  rec->request_id = req.request_id;
  rec->params = req.params;
  rec->num_prompt_tokens = n;
  rec->images = std::move(images);
  if (req.params.prompt_logprobs) {
    rec->wants_prompt_logprobs = true;
    rec->prompt_logprobs.reserve(static_cast<size_t>(n));
    rec->prompt_logprobs.emplace_back();  // position 0: no context
  }
  rec->arrival = Clock::now();
  const int64_t seed = ResolveSeed(req.params);
  rec->sampling = std::make_unique<SamplingState>(req.params, seed, vocab, ids, req.request_id);
  rec->stop = std::make_unique<StopChecker>(req.params);
  if (m.tokenizer) {
    rec->detok = std::make_unique<IncrementalDetokenizer>(*m.tokenizer, /*skip_special_tokens=*/true);
    // A partial character at the end of the prompt spans at most its last 4 tokens.
    const size_t tail = std::min<size_t>(ids.size(), 4);
    rec->detok->Prime(std::span<const int32_t>(ids.data() + ids.size() - tail, tail));
  }
  if (req.constraint) {
    if (!m.tokenizer) Fail(ErrorKind::kInvalidArgument, "{}: structured output needs tokenizer.json in the model directory", label);
    if (req.params.ignore_eos)
      Fail(ErrorKind::kInvalidArgument, "{}: ignore_eos cannot be combined with a structured-output constraint", label);
    if (!m.token_vocab) m.token_vocab = std::make_unique<structured::TokenVocab>(*m.tokenizer, vocab, m.eos_ids);
    rec->matcher = std::make_unique<structured::Matcher>(req.constraint, m.token_vocab.get());
  }
  const int64_t max_tokens = req.params.max_tokens.value_or(m.args.max_model_len - n);
  // Data parallelism: the least-loaded shard (fewest running + waiting; ties: lowest index).
  int best = 0;
  for (int i = 1; i < static_cast<int>(m.shards.size()); ++i) {
    const Scheduler& a = *m.shards[static_cast<size_t>(i)].scheduler;
    const Scheduler& b = *m.shards[static_cast<size_t>(best)].scheduler;
    if (a.num_running() + a.num_waiting() < b.num_running() + b.num_waiting()) best = i;
  }
  rec->shard = best;
  // prompt_logprobs needs every prompt row's logits: such a request bypasses the prefix cache.
  m.Sched(*rec).Add(rec->id, std::move(ids), max_tokens, /*cacheable=*/!req.params.prompt_logprobs);  // throws first
  if (!rec->images.empty()) m.Sched(*rec).SetImageKeys(rec->id, rec->images.keys);
  ++m.shards[static_cast<size_t>(best)].requests;
  m.requests[rec->id] = std::move(rec);
  return m.next_id++;
}

void Engine::Abort(uint64_t id) {
  Impl& m = *impl_;
  auto it = m.requests.find(id);
  if (it == m.requests.end() || it->second->finished) return;
  m.Sched(*it->second).Abort(id, SeqFinishReason::kAbort);
  m.FinishRecord(*it->second, "abort");
}

namespace {

// One shard's part of a step: its plan and the batch metadata of its chunks.
struct ShardStep {
  StepPlan plan;
  std::vector<BackendSeq> seqs;   // plan.seqs in order, then padding rows
  std::vector<int32_t> pad_tokens;
  std::vector<int32_t> scratch;   // block table of padding rows: the scratch block
  std::vector<int64_t> row0;      // per plan seq: first logits row, -1 if none
  int64_t num_rows = 0;
  bool any_all_logits = false;
  std::vector<std::optional<std::string>> row_error;
  // Image chunks: per plan seq, the chunk's token types / embeddings and the
  // masked Engram look-back of a restore (deques: stable addresses).
  std::deque<std::vector<int8_t>> image_types;
  std::deque<std::vector<float>> image_embeds;
  std::deque<std::vector<int32_t>> restore_ids;
  // Speculative chunks (per plan seq; empty for the others): the fed tokens
  // [last, drafts...], the fixed state they overwrite and the carry capture.
  std::vector<std::vector<int32_t>> spec_tokens;
  std::vector<FixedStateSnapshot> spec_snapshot;
  std::vector<std::vector<float>> spec_carry;
};

// Batch metadata of a shard's plan (shard 0 addresses this process's pool;
// another shard's views carry only slot and block ids, for its rank).
void BuildShardStep(Engine::Impl& m, int shard, ShardStep* st, int64_t pad_seqs_to) {
  Scheduler& sched = *m.shards[static_cast<size_t>(shard)].scheduler;
  const StepPlan& plan = st->plan;
  const bool local = shard == 0;
  auto view = [&](int32_t slot, const int32_t* table, int64_t nb) {
    if (local) return m.pool->View(slot, table, nb);
    SequenceStateView v;
    v.slot = slot;
    v.block_table = table;
    v.num_blocks = nb;
    return v;
  };
  st->seqs.reserve(plan.seqs.size() + static_cast<size_t>(std::max<int64_t>(pad_seqs_to, plan.num_padding_seqs)) + 1);
  st->spec_tokens.assign(plan.seqs.size(), {});
  st->spec_snapshot.assign(plan.seqs.size(), {});
  st->spec_carry.assign(plan.seqs.size(), {});
  for (size_t qi = 0; qi < plan.seqs.size(); ++qi) {
    const ScheduledSeq& q = plan.seqs[qi];
    const SeqState* ss = sched.Get(q.id);
    BackendSeq b;
    if (q.restore_prefix > 0) {
      b.restore_prefix = q.restore_prefix;
      b.num_restore_tokens = std::min<int64_t>(q.restore_prefix, 16);
      b.restore_tokens = ss->token_ids.data() + q.restore_prefix - b.num_restore_tokens;
      const RequestImages& im = m.requests.at(q.id)->images;
      if (!im.empty()) {  // image positions are DEAD for Engram
        st->restore_ids.emplace_back(b.restore_tokens, b.restore_tokens + b.num_restore_tokens);
        im.MaskLookback(q.restore_prefix - b.num_restore_tokens, b.num_restore_tokens, st->restore_ids.back().data());
        b.restore_tokens = st->restore_ids.back().data();
      }
    }
    if (q.fresh_slot) {
      RequestRecord& rr = *m.requests.at(q.id);
      if (!rr.num_cached_tokens) rr.num_cached_tokens = q.restore_prefix;
    }
    if (q.fresh_slot && local) {
      m.pool->ResetSlot(ss->slot);
      if (q.restore_prefix > 0)
        RestoreFixedState(m.pool->View(ss->slot, ss->block_table.data(), static_cast<int64_t>(ss->block_table.size())),
                          b.restore_prefix, b.restore_tokens, b.num_restore_tokens);
    }
    b.tokens = ss->token_ids.data() + q.start;
    b.len = q.len;
    b.start_pos = q.start;
    b.state = view(ss->slot, ss->block_table.data(), static_cast<int64_t>(ss->block_table.size()));
    b.want_logits = q.sample;
    b.all_logits = NeedsPromptRows(*m.requests.at(q.id), q);
    b.reset_state = q.fresh_slot;
    {
      const RequestImages& im = m.requests.at(q.id)->images;
      std::vector<int8_t> types;
      std::vector<float> rows;
      if (!im.empty() && im.Chunk(q.start, q.len, &types, &rows)) {
        st->image_types.push_back(std::move(types));
        st->image_embeds.push_back(std::move(rows));
        b.token_types = st->image_types.back().data();
        b.embeds = st->image_embeds.back().data();
      }
    }
    if (q.num_draft > 0) {
      // Speculative verification: every row gives logits; the fixed state it
      // overwrites is saved for the rollback of rejected drafts.
      DI_CHECK(local && q.sample && !q.fresh_slot);
      std::vector<int32_t>& toks = st->spec_tokens[qi];
      toks.assign(1, ss->token_ids[static_cast<size_t>(q.start)]);
      toks.insert(toks.end(), q.draft.begin(), q.draft.end());
      b.tokens = toks.data();
      b.all_logits = true;
      SnapshotFixedState(b.state, q.start, q.len, &st->spec_snapshot[qi]);
      const StateKindGeometry& carry = m.pool->geometry().of(StateKind::kCompressorCarry);
      const int64_t floats = carry.regions.empty() ? 0 : m.backend->CarryCaptureFloats(m.pool->geometry(), q.len);
      st->spec_carry[qi].assign(static_cast<size_t>(floats), 0.0f);
      if (floats > 0) b.carry_capture = st->spec_carry[qi].data();
    }
    st->seqs.push_back(b);
    if (q.start < ss->num_prompt_tokens)
      m.stats.prompt_tokens_total += std::min(q.start + q.len, ss->num_prompt_tokens) - q.start;
  }
  // Padding rows (bucket padding, or lockstep rows of an idle shard) write only to the scratch block/slot.
  const int32_t scratch_slot = sched.blocks().scratch_slot();
  const int64_t pad_seqs = std::max<int64_t>(plan.num_padding_seqs, pad_seqs_to - static_cast<int64_t>(plan.seqs.size()));
  const int64_t nb_tokens = plan.num_padding_tokens > 0 ? (plan.num_padding_tokens + m.args.block_size - 1) / m.args.block_size : 0;
  st->scratch.assign(static_cast<size_t>(std::max<int64_t>(nb_tokens, 1)), sched.blocks().scratch_block());
  st->pad_tokens.assign(static_cast<size_t>(std::max<int64_t>(plan.num_padding_tokens, 1)), 0);
  if (plan.num_padding_tokens > 0) {
    BackendSeq b;
    b.tokens = st->pad_tokens.data();
    b.len = plan.num_padding_tokens;
    b.state = view(scratch_slot, st->scratch.data(), nb_tokens);
    st->seqs.push_back(b);
  }
  for (int64_t i = 0; i < pad_seqs; ++i) {
    BackendSeq b;
    b.tokens = st->pad_tokens.data();
    b.len = 1;
    b.state = view(scratch_slot, st->scratch.data(), 1);
    st->seqs.push_back(b);
  }
  st->row0.assign(plan.seqs.size(), -1);
  st->row_error.assign(plan.seqs.size(), std::nullopt);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const int64_t n = LogitsRows(st->seqs[i]);
    if (n > 0) st->row0[i] = st->num_rows;
    st->num_rows += n;
    if (st->seqs[i].all_logits) st->any_all_logits = true;
  }
}

// Model drafter (backend.h ModelDrafter): after the step's acceptance and
// rollback, every still-running sequence of the step hands its kept rows to
// the drafter; a sequence left with exactly one uncomputed token (about to
// decode, no structured-output constraint) gets a draft for the next step.
void RunDrafter(Engine::Impl& m, Scheduler& sched, const ShardStep& st,
                const std::vector<std::vector<int32_t>>& produced) {
  const StepPlan& plan = st.plan;
  std::vector<DraftSeq> dseqs;
  std::vector<RequestRecord*> recs;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& q = plan.seqs[i];
    if (st.row_error[i]) continue;
    RequestRecord& r = *m.requests.at(q.id);
    const SeqState* ss = sched.Get(q.id);
    if (r.finished || !ss || ss->status != RequestStatus::kRunning) continue;
    DraftSeq d;
    d.forward_index = static_cast<int>(i);
    d.kept = q.num_draft > 0 ? static_cast<int64_t>(produced[i].size()) : q.len;
    const int64_t n_tok = static_cast<int64_t>(ss->token_ids.size());
    if (d.kept < 1 || q.start + d.kept >= n_tok) continue;  // every kept row's next token must exist
    d.next_tokens = ss->token_ids.data() + q.start + 1;
    d.state = m.pool->View(ss->slot, ss->block_table.data(), static_cast<int64_t>(ss->block_table.size()));
    const bool decode_next = q.start + d.kept + 1 == n_tok && !r.matcher;
    const int64_t room =
        std::min<int64_t>(m.spec.num_speculative_tokens, ss->max_tokens - ss->num_output_tokens() - 1);
    d.max_drafts = decode_next && room >= 1 ? static_cast<int>(room) : 0;
    r.model_draft.clear();
    r.model_draft_len = -1;
    dseqs.push_back(d);
    recs.push_back(&r);
  }
  if (dseqs.empty()) return;
  std::vector<DraftProposal> props;
  try {
    m.drafter->Draft(dseqs, &props);
    if (props.size() != dseqs.size())
      Fail(ErrorKind::kInternal, "the drafter returned {} proposals for {} sequences", props.size(), dseqs.size());
  } catch (const Error& e) {
    for (RequestRecord* r : recs) {
      sched.Finish(r->id, SeqFinishReason::kError);
      m.FinishRecord(*r, "error", std::string("speculative drafter failed: ") + e.what());
    }
    return;
  }
  for (size_t k = 0; k < dseqs.size(); ++k) {
    if (dseqs[k].max_drafts < 1) continue;
    RequestRecord& r = *recs[k];
    r.model_draft = std::move(props[k].ids);
    if (static_cast<int64_t>(r.model_draft.size()) > dseqs[k].max_drafts)
      r.model_draft.resize(static_cast<size_t>(dseqs[k].max_drafts));
    r.model_draft_len = static_cast<int64_t>(sched.Get(r.id)->token_ids.size());
  }
}

// Sampling, stop handling and outputs of one shard after the forward.
void FinishShardStep(Engine::Impl& m, Scheduler& sched, ShardStep& st, std::vector<float>& logits) {
  const StepPlan& plan = st.plan;
  const std::vector<BackendSeq>& seqs = st.seqs;
  auto& row_error = st.row_error;
  std::vector<int32_t> sampled(plan.seqs.size(), -1);
  const int64_t vocab = m.backend->vocab_size();
  if (st.any_all_logits) ComputePromptLogprobs(m, sched, logits, plan, seqs, st.row0, &row_error);
  // Structured output: each constrained row's mask, from its own matcher only (batch-invariant).
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    RequestRecord& r = *m.requests.at(plan.seqs[i].id);
    if (!plan.seqs[i].sample || row_error[i] || !r.matcher) continue;
    try {
      m.mask_words.resize(static_cast<size_t>(m.token_vocab->num_words()));
      r.matcher->FillMask(m.mask_words);
      r.sampling->SetTokenBitmask(m.mask_words);
    } catch (const std::exception& e) {  // Error (too ambiguous / deep), bad_alloc: this request only
      row_error[i] = std::string("structured output: ") + e.what();
    }
  }
  // Sample every row that wants a token. A speculative chunk samples each of
  // its rows j with the request's state as if drafts 0 .. j−1 had been
  // accepted (output position + j, the same draw as without speculation).
  struct RowTask {
    size_t seq;
    int64_t row;   // logits row
    int64_t draft; // index of the draft row within its chunk (0 = the last real token's row)
  };
  std::vector<RowTask> tasks;
  std::vector<std::vector<SamplingState>> spec_states(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& q = plan.seqs[i];
    if (!q.sample || row_error[i]) continue;
    if (q.num_draft == 0) {
      const int64_t row = st.row0[i] + (seqs[i].all_logits ? seqs[i].len - 1 : 0);
      tasks.push_back({i, row, 0});
      continue;
    }
    const SamplingState& base = *m.requests.at(q.id)->sampling;
    spec_states[i].reserve(static_cast<size_t>(q.num_draft + 1));
    spec_states[i].push_back(base);
    for (int64_t j = 0; j <= q.num_draft; ++j) {
      if (j > 0) {
        spec_states[i].push_back(spec_states[i].back());
        spec_states[i].back().Accept(q.draft[static_cast<size_t>(j - 1)]);
      }
      tasks.push_back({i, st.row0[i] + j, j});
    }
  }
  std::vector<const SamplingState*> states;
  for (const RowTask& t : tasks) {
    const ScheduledSeq& q = plan.seqs[t.seq];
    states.push_back(q.num_draft > 0 ? &spec_states[t.seq][static_cast<size_t>(t.draft)]
                                     : m.requests.at(q.id)->sampling.get());
  }
  std::vector<SampleOutcome> outcomes;
  if (!states.empty()) {
    bool contiguous = !st.any_all_logits;  // one logits row per sampling seq, in plan order
    if (contiguous) {
      for (size_t k = 0; k < tasks.size(); ++k) contiguous &= tasks[k].row == static_cast<int64_t>(k);
    }
    if (contiguous) {
      outcomes = m.sampler->SampleBatch(logits.data(), vocab, states);
    } else {
      m.sample_rows.resize(tasks.size() * static_cast<size_t>(vocab));
      for (size_t k = 0; k < tasks.size(); ++k)
        std::copy_n(logits.data() + tasks[k].row * vocab, vocab, m.sample_rows.data() + k * vocab);
      outcomes = m.sampler->SampleBatch(m.sample_rows.data(), vocab, states);
    }
  }
  // Per seq: the tokens it produced (speculative: accepted drafts left to
  // right while they equal the row's sampled token, then that row's token)
  // and the outcome of each (for logprobs).
  std::vector<std::vector<int32_t>> produced(plan.seqs.size());
  std::vector<std::vector<size_t>> produced_outcome(plan.seqs.size());
  for (size_t k = 0; k < tasks.size();) {
    const size_t i = tasks[k].seq;
    const ScheduledSeq& q = plan.seqs[i];
    size_t end = k;
    while (end < tasks.size() && tasks[end].seq == i) ++end;
    for (size_t t = k; t < end; ++t) {
      if (!outcomes[t].ok()) {  // a row that is reached and fails fails the request
        row_error[i] = outcomes[t].error->what();
        break;
      }
      const int32_t tok = outcomes[t].result.token_id;
      produced[i].push_back(tok);
      produced_outcome[i].push_back(t);
      const int64_t j = tasks[t].draft;
      if (j >= q.num_draft || tok != q.draft[static_cast<size_t>(j)]) break;
    }
    if (!row_error[i]) {
      sampled[i] = produced[i].back();
      const SeqState* ss = sched.Get(q.id);
      // Never past max_tokens (the engine caps the drafts; this only guards).
      const int64_t room = ss->max_tokens - ss->num_output_tokens();
      if (static_cast<int64_t>(produced[i].size()) > room) {
        produced[i].resize(static_cast<size_t>(std::max<int64_t>(room, 1)));
        produced_outcome[i].resize(produced[i].size());
      }
      if (q.num_draft > 0) {
        const int64_t acc = static_cast<int64_t>(produced[i].size()) - 1;
        ++m.stats.spec_num_drafts;
        m.stats.spec_num_draft_tokens += q.num_draft;
        m.stats.spec_num_accepted_tokens += acc;
        for (int64_t j = 0; j < acc; ++j) ++m.stats.spec_num_accepted_tokens_per_pos[static_cast<size_t>(j)];
      }
    } else {
      produced[i].clear();
      produced_outcome[i].clear();
    }
    k = end;
  }
  // Failed rows: finish those requests only (before Update, so no token is appended).
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!row_error[i]) continue;
    RequestRecord& r = *m.requests.at(plan.seqs[i].id);
    sched.Finish(r.id, SeqFinishReason::kError);
    m.FinishRecord(r, "error", *row_error[i]);
  }
  sched.UpdateTokens(plan, produced);
  // Rollback of rejected drafts: the fixed state as if only the kept
  // positions had been fed (paged rows of rejected positions are never read).
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& q = plan.seqs[i];
    if (q.num_draft == 0 || row_error[i]) continue;
    const SeqState* ss = sched.Get(q.id);
    if (!ss || ss->status != RequestStatus::kRunning) continue;
    const int64_t end = q.start + static_cast<int64_t>(produced[i].size());
    if (end == q.start + q.len) continue;  // everything accepted: the state is already right
    const int64_t nlook = std::min<int64_t>(end, 16);
    m.backend->RollbackSpeculative(seqs[i].state, st.spec_snapshot[i], end,
                                   st.spec_carry[i].empty() ? nullptr : st.spec_carry[i].data(),
                                   ss->token_ids.data() + end - nlook, nlook);
  }
  // prompt_logprobs complete: report them once, now (again in the finished output).
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (row_error[i]) continue;
    RequestRecord& r = *m.requests.at(plan.seqs[i].id);
    if (r.finished || !r.wants_prompt_logprobs || r.prompt_logprobs_emitted || !r.prompt_logprobs_done()) continue;
    m.Pending(r).prompt_logprobs = r.prompt_logprobs;
    r.prompt_logprobs_emitted = true;
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (row_error[i] || produced[i].empty()) continue;
    RequestRecord& r = *m.requests.at(plan.seqs[i].id);
    const SeqState* ss = sched.Get(r.id);
    const size_t n_new = produced[i].size();
    for (size_t j = 0; j < n_new; ++j) {
      if (r.finished) break;
      const int32_t tok = produced[i][j];
      const SampleOutcome& outcome = outcomes[produced_outcome[i][j]];
      const bool last = j + 1 == n_new;
      r.sampling->Accept(tok);
      if (r.matcher && !r.matcher->AcceptToken(tok)) {
        sched.Finish(r.id, SeqFinishReason::kError);
        m.FinishRecord(r, "error", fmt::format("structured output: token {} does not continue the constraint", tok));
        break;
      }
      r.output_ids.push_back(tok);
      ++m.stats.generation_tokens_total;
      if (!r.first_token) r.first_token = now;
      RequestOutput& o = m.Pending(r);
      o.new_token_ids.push_back(tok);
      if (outcome.result.logprobs) {
        o.new_logprobs.push_back(*outcome.result.logprobs);
        r.logprobs.push_back(*outcome.result.logprobs);
      }
      // The sequence length as it was after this token (later accepted tokens are in token_ids already).
      const int64_t seq_len = static_cast<int64_t>(ss->token_ids.size()) - static_cast<int64_t>(n_new - 1 - j);
      const TokenStop ts = CheckTokenStop(r.params, m.eos_ids, tok, static_cast<int64_t>(r.output_ids.size()), seq_len,
                                          m.args.max_model_len);
      // Text: the stop token itself (EOS or a stop_token_ids entry) is not shown.
      if (r.detok && ts.reason != FinishReason::kStop) {
        StopUpdate up = r.stop->Append(r.detok->Push(tok), static_cast<int64_t>(r.output_ids.size()));
        m.EmitText(r, up.text);
        if (up.stopped) {
          r.stop_reason = r.params.stop[up.stop_index];
          sched.Finish(r.id, SeqFinishReason::kStop);
          m.FinishRecord(r, "stop");
          break;
        }
      }
      if (ts.reason == FinishReason::kStop) {
        if (ts.stop_token_id) r.stop_reason = static_cast<int64_t>(*ts.stop_token_id);
        sched.Finish(r.id, SeqFinishReason::kStop);
        m.FinishRecord(r, "stop");
      } else if (ts.reason == FinishReason::kLength || (last && ss->status == RequestStatus::kFinished)) {
        sched.Finish(r.id, SeqFinishReason::kLength);
        m.FinishRecord(r, "length");
      }
    }
  }
  if (m.drafter) RunDrafter(m, sched, st, produced);
}

// Speculative decoding: drafts for every running request about to decode
// (not structured-output requests, whose rows need their own masks), capped
// so that the accepted tokens never pass max_tokens.
void ProposeDrafts(Engine::Impl& m, Scheduler& sched) {
  for (const auto& [id, r] : m.requests) {
    if (r->finished || r->matcher) continue;
    const SeqState* ss = sched.Get(id);
    if (!ss || ss->status != RequestStatus::kRunning ||
        static_cast<int64_t>(ss->token_ids.size()) - ss->num_computed_tokens != 1)
      continue;
    const int64_t room = std::min<int64_t>(m.spec.num_speculative_tokens, ss->max_tokens - ss->num_output_tokens() - 1);
    std::vector<int32_t> draft;
    if (room >= 1 && m.drafter) {
      // The drafter's proposal after the step that computed everything but the last token.
      if (r->model_draft_len == static_cast<int64_t>(ss->token_ids.size())) draft = r->model_draft;
    } else if (room >= 1) {
      DraftProposal p = m.proposer->Propose(ss->token_ids, static_cast<int>(room));
      draft = std::move(p.ids);
      if (static_cast<int64_t>(draft.size()) > room) draft.resize(static_cast<size_t>(room));
    }
    sched.SetSpecTokens(id, std::move(draft));
  }
}

}  // namespace

std::vector<RequestOutput> Engine::Step() {
  Impl& m = *impl_;
  const int D = static_cast<int>(m.shards.size());
  if (!m.fatal) {
    // Data-parallel lockstep (docs/parallel.md): every shard runs every step;
    // the step is prefill-shaped when some shard has prefill work and either
    // no shard is only decoding or --prefill-attempt-interval decode steps
    // have passed; otherwise it is a decode step for all.
    bool allow_prefill = true;
    if (D > 1) {
      bool any_prefill = false, some_decode_only = false;
      for (const EngineShard& sh : m.shards) {
        const bool p = sh.scheduler->HasPrefillWork();
        any_prefill |= p;
        if (!p && sh.scheduler->num_running() > 0) some_decode_only = true;
      }
      allow_prefill = any_prefill && (!some_decode_only || m.decode_steps_since_prefill >= m.args.prefill_attempt_interval);
    }
    std::vector<ShardStep> steps(static_cast<size_t>(D));
    bool any_work = false;
    if (m.proposer || m.drafter) ProposeDrafts(m, *m.shards[0].scheduler);  // D == 1 (checked at Open)
    for (int i = 0; i < D; ++i) {
      steps[i].plan = m.shards[i].scheduler->Schedule(allow_prefill);
      m.stats.num_preemptions += static_cast<int64_t>(steps[i].plan.preempted.size());
      any_work |= !steps[i].plan.empty();
    }
    if (any_work) {
      ++m.stats.num_steps;
      bool decode_step = true;
      int64_t width = 0;  // rows per shard in a decode step (the largest padded batch)
      for (const ShardStep& st : steps) {
        if (st.plan.empty()) continue;
        // The static exchange needs exactly one row per sequence on every
        // rank: a decode-shaped step whose chunks are longer (short prompts
        // under --prompt-as-decode-max-tokens) takes the general path.
        decode_step &= st.plan.decode_shaped;
        for (const ScheduledSeq& q : st.plan.seqs) decode_step &= q.len == 1;
        decode_step &= st.plan.num_padding_tokens == 0;
        width = std::max<int64_t>(width, static_cast<int64_t>(st.plan.seqs.size()) + st.plan.num_padding_seqs);
      }
      if (D > 1) {
        if (decode_step) {
          ++m.stats.num_decode_steps;
          ++m.decode_steps_since_prefill;
        } else {
          ++m.stats.num_prefill_steps;
          m.decode_steps_since_prefill = 0;
        }
      }
      for (int i = 0; i < D; ++i) {
        if (steps[i].plan.empty()) ++m.shards[i].dummy_steps;
        // An idle shard runs padding rows so that every collective of the step matches.
        const int64_t pad_to = D == 1 ? 0 : decode_step ? width : steps[i].plan.empty() ? 1 : 0;
        BuildShardStep(m, i, &steps[i], pad_to);
      }
      std::vector<std::vector<BackendSeq>> batches(static_cast<size_t>(D));
      for (int i = 0; i < D; ++i) batches[i] = steps[i].seqs;
      std::vector<std::vector<float>> logits(static_cast<size_t>(D));
      if (D == 1) logits[0].swap(m.logits);
      const int64_t vocab = m.backend->vocab_size();
      std::optional<std::string> batch_error;
      try {
        m.backend->ForwardShards(batches, decode_step, &logits);
        for (int i = 0; i < D; ++i)
          if (static_cast<int64_t>(logits[i].size()) != steps[i].num_rows * vocab)
            Fail(ErrorKind::kInternal, "the backend returned {} logits for shard {}, expected {} rows x vocab {}",
                 logits[i].size(), i, steps[i].num_rows, vocab);
      } catch (const RankLostError& e) {
        // A rank is gone: nothing can run any more. Fail everything, refuse new requests.
        m.fatal = e.what();
        spdlog::error("parallel job lost a rank: {}", e.what());
        batch_error = std::string("the parallel job lost a rank: ") + e.what();
      } catch (const Error& e) {
        // The model failed for the whole batch: fail every request in it, keep the engine alive.
        batch_error = std::string("model forward failed: ") + e.what();
      }
      for (int i = 0; i < D; ++i) {
        if (batch_error)
          for (auto& err : steps[i].row_error) err = *batch_error;
        FinishShardStep(m, *m.shards[i].scheduler, steps[i], logits[i]);
      }
      if (D == 1) logits[0].swap(m.logits);
    }
  }
  if (m.fatal) {
    // Everything still queued or running fails with the reason.
    for (auto& [id, r] : m.requests) {
      if (r->finished) continue;
      m.Sched(*r).Abort(id, SeqFinishReason::kError);
      m.FinishRecord(*r, "error", "the parallel job lost a rank: " + *m.fatal);
    }
  }
  // Collect pending outputs; forget finished requests once reported.
  std::vector<RequestOutput> out;
  for (auto it = m.requests.begin(); it != m.requests.end();) {
    RequestRecord& r = *it->second;
    if (r.has_pending) {
      out.push_back(std::move(r.pending));
      r.has_pending = false;
    }
    if (r.finished) {
      m.Sched(r).Release(r.id);
      it = m.requests.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace deepinfer
