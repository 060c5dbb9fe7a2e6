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
#include "scheduler/scheduler.h"
#include "sampling/stop_checker.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

struct RequestRecord {
  uint64_t id = 0;
  std::string request_id;
  SamplingParams params;
  std::unique_ptr<SamplingState> sampling;
  std::unique_ptr<StopChecker> stop;
  std::unique_ptr<IncrementalDetokenizer> detok;
  int64_t num_prompt_tokens = 0;
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
  // Output accumulated since the last Step() return.
  RequestOutput pending;
  bool has_pending = false;
};

struct Engine::Impl {
  EngineArgs args;
  std::unique_ptr<ModelBackend> backend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<CachePool> pool;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> eos_ids;
  std::map<uint64_t, std::unique_ptr<RequestRecord>> requests;
  uint64_t next_id = 1;
  EngineStats stats;
  std::vector<float> logits;
  std::vector<float> sample_rows;  // sampling rows gathered when a step also returns prompt rows

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
void ComputePromptLogprobs(Engine::Impl& m, const StepPlan& plan, const std::vector<BackendSeq>& seqs,
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
      const SeqState* st = m.scheduler->Get(q.id);
      const int64_t row = row0[k.seq] + (k.entry - 1 - q.start);
      entries[static_cast<size_t>(t)] = m.sampler->PromptLogprobs(
          std::span<const float>(m.logits.data() + row * vocab, static_cast<size_t>(vocab)),
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
  if (args.max_num_seqs < 1) Fail(ErrorKind::kInvalidArgument, "--max-num-seqs must be >= 1, got {}", args.max_num_seqs);
  if (args.max_model_len < 2) Fail(ErrorKind::kInvalidArgument, "--max-model-len must be >= 2, got {}", args.max_model_len);
  if (args.block_size < 1) Fail(ErrorKind::kInvalidArgument, "--block-size must be >= 1, got {}", args.block_size);
  StateGeometry geometry = impl->backend->Geometry(args.block_size);
  const int64_t blocks_per_seq = (args.max_model_len + args.block_size - 1) / args.block_size;
  int64_t num_blocks = args.num_kv_blocks;
  if (num_blocks <= 0) {
    if (args.kv_cache_memory_bytes > 0) {
      num_blocks = CachePool::BlocksThatFit(geometry, args.kv_cache_memory_bytes, args.max_num_seqs);
      if (num_blocks < 1)
        Fail(ErrorKind::kInvalidArgument, "--kv-cache-memory {} bytes is too small: the fixed per-sequence state alone needs {} bytes",
             args.kv_cache_memory_bytes, CachePool::BytesFor(geometry, 1, args.max_num_seqs));
    } else {
      num_blocks = blocks_per_seq * args.max_num_seqs;
    }
  }
  SchedulerConfig sc;
  sc.max_num_seqs = args.max_num_seqs;
  sc.max_num_batched_tokens = args.max_num_batched_tokens;
  sc.max_model_len = args.max_model_len;
  sc.block_size = args.block_size;
  sc.num_kv_blocks = num_blocks;
  sc.prefill_token_buckets = args.prefill_token_buckets;
  sc.decode_batch_buckets = args.decode_batch_buckets;
  sc.prompt_as_decode_max_tokens = args.prompt_as_decode_max_tokens;
  impl->scheduler = std::make_unique<Scheduler>(sc);
  impl->pool = std::make_unique<CachePool>(geometry, num_blocks, args.max_num_seqs);
  impl->eos_ids = {static_cast<int32_t>(cfg.eos_token_id)};
  SamplerConfig samp;
  samp.vocab_size = impl->backend->vocab_size();
  samp.eos_token_ids = impl->eos_ids;
  samp.logprobs_mode = args.logprobs_mode;
  impl->sampler = std::make_unique<Sampler>(samp);
  impl->stats.num_kv_blocks = num_blocks;
  impl->stats.kv_cache_bytes = impl->pool->total_bytes();
  spdlog::debug("engine: {} KV blocks of {} tokens, {} slots, {} bytes of cache", num_blocks, args.block_size,
                args.max_num_seqs, impl->pool->total_bytes());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const EngineArgs& Engine::args() const { return impl_->args; }
const Tokenizer* Engine::tokenizer() const { return impl_->tokenizer.get(); }
int64_t Engine::vocab_size() const { return impl_->backend->vocab_size(); }
const std::string& Engine::model_type() const { return impl_->backend->config().model_type; }
bool Engine::HasUnfinished() const {
  if (impl_->scheduler->has_unfinished()) return true;
  for (const auto& [id, r] : impl_->requests)
    if (r->has_pending) return true;
  return false;
}

EngineStats Engine::Stats() const {
  EngineStats s = impl_->stats;
  s.num_running = impl_->scheduler->num_running();
  s.num_waiting = impl_->scheduler->num_waiting();
  s.num_kv_blocks_used = impl_->scheduler->blocks().num_used_blocks();
  s.peak_kv_blocks_used = impl_->scheduler->blocks().peak_used_blocks();
  return s;
}

uint64_t Engine::Submit(const GenerateRequest& req) {
  Impl& m = *impl_;
  const std::string label = req.request_id.empty() ? std::string("request") : "request " + req.request_id;
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
  const int64_t max_tokens = req.params.max_tokens.value_or(m.args.max_model_len - n);
  m.scheduler->Add(rec->id, std::move(ids), max_tokens);  // throws before anything is recorded
  m.requests[rec->id] = std::move(rec);
  return m.next_id++;
}

void Engine::Abort(uint64_t id) {
  Impl& m = *impl_;
  auto it = m.requests.find(id);
  if (it == m.requests.end() || it->second->finished) return;
  m.scheduler->Abort(id, SeqFinishReason::kAbort);
  m.FinishRecord(*it->second, "abort");
}

std::vector<RequestOutput> Engine::Step() {
  Impl& m = *impl_;
  StepPlan plan = m.scheduler->Schedule();
  m.stats.num_preemptions += static_cast<int64_t>(plan.preempted.size());
  if (!plan.empty()) {
    ++m.stats.num_steps;
    // Batch metadata: one BackendSeq per scheduled chunk, then padding rows on the scratch block/slot.
    std::vector<BackendSeq> seqs;
    seqs.reserve(plan.seqs.size() + plan.num_padding_seqs + 1);
    for (const ScheduledSeq& q : plan.seqs) {
      const SeqState* st = m.scheduler->Get(q.id);
      if (q.fresh_slot) m.pool->ResetSlot(st->slot);
      BackendSeq b;
      b.tokens = st->token_ids.data() + q.start;
      b.len = q.len;
      b.start_pos = q.start;
      b.state = m.pool->View(st->slot, st->block_table.data(), static_cast<int64_t>(st->block_table.size()));
      b.want_logits = q.sample;
      b.all_logits = NeedsPromptRows(*m.requests.at(q.id), q);
      seqs.push_back(b);
      if (q.start < st->num_prompt_tokens) m.stats.prompt_tokens_total += std::min(q.start + q.len, st->num_prompt_tokens) - q.start;
    }
    static const std::vector<int32_t> kPadTokens(1, 0);
    std::vector<int32_t> pad_tokens;
    const int32_t scratch_slot = m.scheduler->blocks().scratch_slot();
    if (plan.num_padding_tokens > 0) {
      pad_tokens.assign(plan.num_padding_tokens, 0);
      const int64_t nb = (plan.num_padding_tokens + m.args.block_size - 1) / m.args.block_size;
      BackendSeq b;
      b.tokens = pad_tokens.data();
      b.len = plan.num_padding_tokens;
      b.state = m.pool->View(scratch_slot, m.pool->ScratchTable(nb), nb);
      seqs.push_back(b);
    }
    for (int i = 0; i < plan.num_padding_seqs; ++i) {
      BackendSeq b;
      b.tokens = kPadTokens.data();
      b.len = 1;
      b.state = m.pool->View(scratch_slot, m.pool->ScratchTable(1), 1);
      seqs.push_back(b);
    }
    std::vector<int32_t> sampled(plan.seqs.size(), -1);
    std::vector<std::optional<std::string>> row_error(plan.seqs.size());
    const int64_t vocab = m.backend->vocab_size();
    // Logits row layout (backend.h): len rows for an all_logits seq, one for a sampling seq.
    std::vector<int64_t> row0(plan.seqs.size(), -1);
    int64_t num_rows = 0;
    bool any_all_logits = false;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      if (seqs[i].all_logits) {
        row0[i] = num_rows;
        num_rows += seqs[i].len;
        any_all_logits = true;
      } else if (seqs[i].want_logits) {
        row0[i] = num_rows;
        num_rows += 1;
      }
    }
    try {
      m.backend->Forward(seqs, &m.logits);
      if (static_cast<int64_t>(m.logits.size()) != num_rows * vocab)
        Fail(ErrorKind::kInternal, "the backend returned {} logits, expected {} rows x vocab {}", m.logits.size(),
             num_rows, vocab);
    } catch (const Error& e) {
      // The model failed for the whole batch: fail every request in it, keep the engine alive.
      for (size_t i = 0; i < plan.seqs.size(); ++i) row_error[i] = std::string("model forward failed: ") + e.what();
    }
    if (any_all_logits) ComputePromptLogprobs(m, plan, seqs, row0, &row_error);
    // Sample every row that wants a token.
    std::vector<const SamplingState*> states;
    std::vector<size_t> rows;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      if (!plan.seqs[i].sample || row_error[i]) continue;
      states.push_back(m.requests.at(plan.seqs[i].id)->sampling.get());
      rows.push_back(i);
    }
    std::vector<SampleOutcome> outcomes;
    if (!states.empty()) {
      if (!any_all_logits) {
        // One logits row per sampling seq, in plan order.
        outcomes = m.sampler->SampleBatch(m.logits.data(), vocab, states);
      } else {
        // Prompt rows are interleaved: gather each sampling seq's last row.
        m.sample_rows.resize(rows.size() * static_cast<size_t>(vocab));
        for (size_t k = 0; k < rows.size(); ++k) {
          const size_t i = rows[k];
          const int64_t row = row0[i] + (seqs[i].all_logits ? seqs[i].len - 1 : 0);
          std::copy_n(m.logits.data() + row * vocab, vocab, m.sample_rows.data() + k * vocab);
        }
        outcomes = m.sampler->SampleBatch(m.sample_rows.data(), vocab, states);
      }
    }
    for (size_t k = 0; k < rows.size(); ++k) {
      if (outcomes[k].ok()) sampled[rows[k]] = outcomes[k].result.token_id;
      else row_error[rows[k]] = outcomes[k].error->what();
    }
    // Failed rows: finish those requests only (before Update, so no token is appended).
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      if (!row_error[i]) continue;
      RequestRecord& r = *m.requests.at(plan.seqs[i].id);
      m.scheduler->Finish(r.id, SeqFinishReason::kError);
      m.FinishRecord(r, "error", *row_error[i]);
    }
    m.scheduler->Update(plan, sampled);
    // prompt_logprobs complete: report them once, now (again in the finished output).
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      if (row_error[i]) continue;
      RequestRecord& r = *m.requests.at(plan.seqs[i].id);
      if (r.finished || !r.wants_prompt_logprobs || r.prompt_logprobs_emitted || !r.prompt_logprobs_done()) continue;
      m.Pending(r).prompt_logprobs = r.prompt_logprobs;
      r.prompt_logprobs_emitted = true;
    }
    const auto now = Clock::now();
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t i = rows[k];
      if (row_error[i]) continue;
      RequestRecord& r = *m.requests.at(plan.seqs[i].id);
      if (r.finished) continue;
      const int32_t tok = sampled[i];
      r.sampling->Accept(tok);
      r.output_ids.push_back(tok);
      ++m.stats.generation_tokens_total;
      if (!r.first_token) r.first_token = now;
      RequestOutput& o = m.Pending(r);
      o.new_token_ids.push_back(tok);
      if (outcomes[k].result.logprobs) {
        o.new_logprobs.push_back(*outcomes[k].result.logprobs);
        r.logprobs.push_back(*outcomes[k].result.logprobs);
      }
      const SeqState* st = m.scheduler->Get(r.id);
      const TokenStop ts = CheckTokenStop(r.params, m.eos_ids, tok, static_cast<int64_t>(r.output_ids.size()),
                                          static_cast<int64_t>(st->token_ids.size()), m.args.max_model_len);
      // Text: the stop token itself (EOS or a stop_token_ids entry) is not shown.
      if (r.detok && ts.reason != FinishReason::kStop) {
        StopUpdate up = r.stop->Append(r.detok->Push(tok), static_cast<int64_t>(r.output_ids.size()));
        m.EmitText(r, up.text);
        if (up.stopped) {
          r.stop_reason = r.params.stop[up.stop_index];
          m.scheduler->Finish(r.id, SeqFinishReason::kStop);
          m.FinishRecord(r, "stop");
          continue;
        }
      }
      if (ts.reason == FinishReason::kStop) {
        if (ts.stop_token_id) r.stop_reason = static_cast<int64_t>(*ts.stop_token_id);
        m.scheduler->Finish(r.id, SeqFinishReason::kStop);
        m.FinishRecord(r, "stop");
      } else if (ts.reason == FinishReason::kLength || st->status == RequestStatus::kFinished) {
        m.scheduler->Finish(r.id, SeqFinishReason::kLength);
        m.FinishRecord(r, "length");
      }
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
      m.scheduler->Release(r.id);
      it = m.requests.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace deepinfer
