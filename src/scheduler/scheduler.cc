#include "scheduler/scheduler.h"

#include <algorithm>
#include <span>

#include "base/error.h"

namespace deepinfer {

const char* SeqFinishReasonName(SeqFinishReason r) {
  switch (r) {
    case SeqFinishReason::kStop: return "stop";
    case SeqFinishReason::kLength: return "length";
    case SeqFinishReason::kAbort: return "abort";
    case SeqFinishReason::kError: return "error";
    case SeqFinishReason::kNone: return "";
  }
  return "";
}

void SchedulerConfig::Validate() const {
  if (max_num_seqs < 1) Fail(ErrorKind::kInvalidArgument, "max_num_seqs must be >= 1, got {}", max_num_seqs);
  if (max_num_batched_tokens < 1)
    Fail(ErrorKind::kInvalidArgument, "max_num_batched_tokens must be >= 1, got {}", max_num_batched_tokens);
  if (max_model_len < 2) Fail(ErrorKind::kInvalidArgument, "max_model_len must be >= 2, got {}", max_model_len);
  if (block_size < 1) Fail(ErrorKind::kInvalidArgument, "block_size must be >= 1, got {}", block_size);
  if (num_kv_blocks < 1) Fail(ErrorKind::kInvalidArgument, "num_kv_blocks must be >= 1, got {}", num_kv_blocks);
  // A bucket above the step's limit would pad every step past it (a step can
  // never hold more than max_num_batched_tokens tokens or max_num_seqs rows).
  struct BucketList {
    const std::vector<int64_t>* v;
    const char* name;
    int64_t limit;
    const char* limit_name;
  };
  for (const BucketList& b : {BucketList{&prefill_token_buckets, "prefill_token_buckets (--prefill-token-buckets)",
                                         max_num_batched_tokens, "max_num_batched_tokens"},
                              BucketList{&decode_batch_buckets, "decode_batch_buckets (--decode-batch-buckets)",
                                         max_num_seqs, "max_num_seqs"}}) {
    for (size_t i = 0; i < b.v->size(); ++i) {
      const int64_t x = (*b.v)[i];
      if (x < 1 || (i > 0 && x <= (*b.v)[i - 1]))
        Fail(ErrorKind::kInvalidArgument, "{} must be positive and strictly increasing, got {} at position {}", b.name,
             x, i);
      if (x > b.limit)
        Fail(ErrorKind::kInvalidArgument, "{}: bucket {} is larger than {} {} (no step can be that large)", b.name, x,
             b.limit_name, b.limit);
    }
  }
  if (prompt_as_decode_max_tokens < 1)
    Fail(ErrorKind::kInvalidArgument, "prompt_as_decode_max_tokens must be >= 1, got {}", prompt_as_decode_max_tokens);
}

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), blocks_((config.Validate(), config.num_kv_blocks), config.max_num_seqs) {}

SeqState& Scheduler::Mut(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) Fail(ErrorKind::kInternal, "unknown request id {}", id);
  return *it->second;
}

const SeqState* Scheduler::Get(uint64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Scheduler::Add(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens, bool cacheable) {
  if (seqs_.count(id)) Fail(ErrorKind::kInternal, "request id {} added twice", id);
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) Fail(ErrorKind::kInvalidArgument, "prompt is empty");
  if (n >= config_.max_model_len)
    Fail(ErrorKind::kInvalidArgument, "prompt has {} tokens; max_model_len is {} (prompt must leave room for at least one output token)",
         n, config_.max_model_len);
  if (max_tokens < 1) Fail(ErrorKind::kInvalidArgument, "max_tokens must be >= 1, got {}", max_tokens);
  max_tokens = std::min(max_tokens, config_.max_model_len - n);
  // The last generated token is never fed back, so the cache holds at most n + max_tokens - 1.
  const int64_t need = BlocksFor(n + max_tokens - 1);
  if (need > config_.num_kv_blocks)
    Fail(ErrorKind::kInvalidArgument,
         "request needs {} KV blocks ({} prompt + {} max output tokens, block_size {}) but the pool has only {}",
         need, n, max_tokens, config_.block_size, config_.num_kv_blocks);
  auto s = std::make_unique<SeqState>();
  s->id = id;
  s->num_prompt_tokens = n;
  s->token_ids = std::move(prompt);
  s->max_tokens = max_tokens;
  s->cacheable = cacheable && config_.enable_prefix_caching;
  seqs_[id] = std::move(s);
  waiting_.push_back(id);
}

void Scheduler::SetImageKeys(uint64_t id, std::vector<ImageKey> keys) {
  SeqState& s = Mut(id);
  DI_CHECK(s.block_keys.empty());
  s.image_keys = std::move(keys);
}

void Scheduler::FreeResources(SeqState& s) {
  if (!s.block_table.empty()) blocks_.Free(s.block_table);
  s.block_table.clear();
  if (s.slot >= 0) blocks_.FreeSlot(s.slot);
  s.slot = -1;
}

uint64_t Scheduler::KeyOf(SeqState& s, int64_t b) {
  const int64_t bs = config_.block_size;
  DI_CHECK((b + 1) * bs <= static_cast<int64_t>(s.token_ids.size()));
  while (static_cast<int64_t>(s.block_keys.size()) <= b) {
    const int64_t i = static_cast<int64_t>(s.block_keys.size());
    uint64_t parent = i == 0 ? kRootKey : s.block_keys.back();
    for (const ImageKey& k : s.image_keys)  // an image span's content is part of its blocks' keys
      if (k.begin < (i + 1) * bs && k.end > i * bs)
        parent = BlockManager::BlockKey(parent ^ k.hash, std::span<const int32_t>());
    s.block_keys.push_back(
        BlockManager::BlockKey(parent, std::span<const int32_t>(s.token_ids.data() + i * bs, static_cast<size_t>(bs))));
  }
  return s.block_keys[static_cast<size_t>(b)];
}

void Scheduler::Preempt(SeqState& s) {
  FreeResources(s);
  s.num_computed_tokens = 0;
  s.num_published = 0;
  s.spec_token_ids.clear();
  s.status = RequestStatus::kWaiting;
  ++s.num_preemptions;
  running_.erase(std::remove(running_.begin(), running_.end(), s.id), running_.end());
  waiting_.push_front(s.id);
}

bool Scheduler::Abort(uint64_t id, SeqFinishReason reason) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->status == RequestStatus::kFinished) return false;
  Finish(id, reason);
  return true;
}

void Scheduler::Finish(uint64_t id, SeqFinishReason reason) {
  SeqState& s = Mut(id);
  if (s.status == RequestStatus::kFinished) return;
  FreeResources(s);
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  s.status = RequestStatus::kFinished;
  s.finish_reason = reason;
}

void Scheduler::Release(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  if (it->second->status != RequestStatus::kFinished) Fail(ErrorKind::kInternal, "releasing unfinished request {}", id);
  seqs_.erase(it);
}

bool Scheduler::HasPrefillWork() const {
  if (!waiting_.empty()) return true;
  for (uint64_t id : running_) {
    const SeqState& s = *seqs_.at(id);
    if (static_cast<int64_t>(s.token_ids.size()) - s.num_computed_tokens > config_.prompt_as_decode_max_tokens)
      return true;
  }
  return false;
}

StepPlan Scheduler::Schedule(bool allow_prefill) {
  StepPlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  // 1. Running requests, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SeqState& s = Mut(running_[i]);
    const int64_t total = static_cast<int64_t>(s.token_ids.size());
    int64_t len = std::min(total - s.num_computed_tokens, budget);
    if (len <= 0) { ++i; continue; }
    // Speculative decoding: a decode with drafts feeds them too (budget permitting).
    std::vector<int32_t> draft;
    draft.swap(s.spec_token_ids);
    if (total - s.num_computed_tokens == 1 && !draft.empty()) {
      draft.resize(static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(draft.size()), budget - 1)));
      len = 1 + static_cast<int64_t>(draft.size());
    } else {
      draft.clear();
    }
    if (!allow_prefill && total - s.num_computed_tokens > config_.prompt_as_decode_max_tokens) { ++i; continue; }
    const int64_t extra = BlocksFor(s.num_computed_tokens + len) - static_cast<int64_t>(s.block_table.size());
    bool self_preempted = false;
    while (extra > blocks_.num_free_blocks()) {
      SeqState& victim = Mut(running_.back());
      const bool is_self = victim.id == s.id;
      plan.preempted.push_back(victim.id);
      // A victim already planned in this step cannot be one: we go oldest → newest and
      // only later (newer) requests are behind i.
      Preempt(victim);
      if (is_self) { self_preempted = true; break; }
    }
    if (self_preempted) break;
    if (extra > 0) {
      auto got = blocks_.Allocate(extra);
      DI_CHECK(got.has_value());
      s.block_table.insert(s.block_table.end(), got->begin(), got->end());
    }
    ScheduledSeq q;
    q.id = s.id;
    q.start = s.num_computed_tokens;
    q.len = len;
    q.sample = s.num_computed_tokens + len - static_cast<int64_t>(draft.size()) == total;
    q.num_draft = static_cast<int64_t>(draft.size());
    q.draft = std::move(draft);
    plan.seqs.push_back(q);
    budget -= len;
    ++i;
  }
  // 2. Admit waiting requests (not in a step that had to preempt).
  while (allow_prefill && plan.preempted.empty() && budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    SeqState& s = Mut(waiting_.front());
    const int64_t total = static_cast<int64_t>(s.token_ids.size());
    // Prefix cache: the longest run of leading full blocks already published,
    // leaving at least the last known token to compute (it gives the logits).
    std::vector<int32_t> hits;
    int64_t evictable_hits = 0;
    if (s.cacheable) {
      const int64_t bs = config_.block_size;
      for (int64_t b = 0; b < (total - 1) / bs; ++b) {
        const auto blk = blocks_.Lookup(KeyOf(s, b), ParentKeyOf(s, b),
                                        std::span<const int32_t>(s.token_ids.data() + b * bs, static_cast<size_t>(bs)));
        if (!blk) break;
        hits.push_back(*blk);
        evictable_hits += blocks_.is_evictable(*blk);
      }
    }
    const int64_t hit = static_cast<int64_t>(hits.size()) * config_.block_size;
    const int64_t len = std::min(total - hit, budget);
    const int64_t need = BlocksFor(hit + len) - static_cast<int64_t>(hits.size());
    if (blocks_.num_free_slots() == 0 || need + evictable_hits > blocks_.num_free_blocks()) break;
    for (int32_t b : hits) blocks_.Acquire(b);
    auto got = blocks_.Allocate(need);
    DI_CHECK(got.has_value());
    auto slot = blocks_.AllocateSlot();
    DI_CHECK(slot.has_value());
    s.block_table = std::move(hits);
    s.block_table.insert(s.block_table.end(), got->begin(), got->end());
    s.slot = *slot;
    s.num_computed_tokens = hit;
    s.num_published = hit / config_.block_size;
    s.num_cached_tokens = hit;
    if (s.cacheable) {
      prefix_cache_queries_ += total;
      prefix_cache_hits_ += hit;
    }
    s.status = RequestStatus::kRunning;
    waiting_.pop_front();
    running_.push_back(s.id);
    ScheduledSeq q;
    q.id = s.id;
    q.start = hit;
    q.len = len;
    q.sample = hit + len == total;
    q.fresh_slot = true;
    q.restore_prefix = hit;
    plan.seqs.push_back(q);
    budget -= len;
  }
  // 3. Shape and padding.
  int64_t max_len = 0;
  for (const auto& q : plan.seqs) {
    plan.num_tokens += q.len;
    max_len = std::max(max_len, q.len);
  }
  plan.decode_shaped = !plan.seqs.empty() && max_len <= config_.prompt_as_decode_max_tokens;
  if (!plan.seqs.empty()) {
    if (plan.decode_shaped) {
      const int64_t n = static_cast<int64_t>(plan.seqs.size());
      for (int64_t b : config_.decode_batch_buckets)
        if (b >= n) { plan.num_padding_seqs = static_cast<int>(b - n); break; }
    } else {
      for (int64_t b : config_.prefill_token_buckets)
        if (b >= plan.num_tokens) { plan.num_padding_tokens = b - plan.num_tokens; break; }
    }
  }
  return plan;
}

void Scheduler::SetSpecTokens(uint64_t id, std::vector<int32_t> draft) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  SeqState& s = *it->second;
  if (s.status != RequestStatus::kRunning ||
      static_cast<int64_t>(s.token_ids.size()) - s.num_computed_tokens != 1)
    return;
  s.spec_token_ids = std::move(draft);
}

void Scheduler::Update(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  if (sampled.size() != plan.seqs.size())
    Fail(ErrorKind::kInternal, "Update: {} sampled tokens for {} planned sequences", sampled.size(), plan.seqs.size());
  std::vector<std::vector<int32_t>> tokens(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i)
    if (plan.seqs[i].sample) tokens[i].push_back(sampled[i]);
  UpdateTokens(plan, tokens);
}

void Scheduler::UpdateTokens(const StepPlan& plan, const std::vector<std::vector<int32_t>>& tokens) {
  if (tokens.size() != plan.seqs.size())
    Fail(ErrorKind::kInternal, "Update: {} token lists for {} planned sequences", tokens.size(), plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& q = plan.seqs[i];
    auto it = seqs_.find(q.id);
    if (it == seqs_.end()) continue;
    SeqState& s = *it->second;
    if (s.status != RequestStatus::kRunning) continue;  // finished/aborted meanwhile
    const int64_t n_new = static_cast<int64_t>(tokens[i].size());
    if (q.num_draft > 0) {
      if (n_new < 1 || n_new > q.num_draft + 1)
        Fail(ErrorKind::kInternal, "Update: request {} produced {} tokens from {} drafts", q.id, n_new, q.num_draft);
      // Positions of rejected drafts are not computed; their blocks go back.
      s.num_computed_tokens = q.start + n_new;
      const int64_t keep = std::max<int64_t>(BlocksFor(s.num_computed_tokens), s.num_published);
      if (static_cast<int64_t>(s.block_table.size()) > keep) {
        std::vector<int32_t> extra(s.block_table.begin() + keep, s.block_table.end());
        blocks_.Free(extra);
        s.block_table.resize(static_cast<size_t>(keep));
      }
    } else {
      s.num_computed_tokens = q.start + q.len;
    }
    // The new tokens first (accepted drafts are computed positions: publishing needs their ids).
    if (q.sample)
      for (int32_t t : tokens[i]) {
        if (s.num_output_tokens() >= s.max_tokens) break;
        s.token_ids.push_back(t);
      }
    // Blocks the forward just completed are final: publish them for sharing.
    if (s.cacheable) {
      const int64_t bs = config_.block_size;
      while ((s.num_published + 1) * bs <= s.num_computed_tokens &&
             s.num_published < static_cast<int64_t>(s.block_table.size())) {
        const int64_t b = s.num_published;
        blocks_.Publish(s.block_table[static_cast<size_t>(b)], KeyOf(s, b), ParentKeyOf(s, b),
                        std::span<const int32_t>(s.token_ids.data() + b * bs, static_cast<size_t>(bs)));
        ++s.num_published;
      }
    }
    if (!q.sample) continue;
    if (s.num_output_tokens() >= s.max_tokens) Finish(s.id, SeqFinishReason::kLength);
  }
}

void Scheduler::CheckInvariants() const {
  blocks_.CheckInvariants();
  std::map<int32_t, int> owners;  // block → running requests holding it
  int slots = 0;
  for (const auto& [id, s] : seqs_) {
    if (s->status == RequestStatus::kRunning) {
      if (s->slot < 0) Fail(ErrorKind::kInternal, "running request {} has no slot", id);
      if (static_cast<int64_t>(s->block_table.size()) < BlocksFor(s->num_computed_tokens))
        Fail(ErrorKind::kInternal, "request {} has {} blocks for {} computed tokens", id, s->block_table.size(),
             s->num_computed_tokens);
      for (int32_t b : s->block_table) owners[b] += 1;
      ++slots;
    } else if (!s->block_table.empty() || s->slot >= 0) {
      Fail(ErrorKind::kInternal, "request {} holds blocks or a slot while not running", id);
    }
  }
  if (static_cast<int64_t>(owners.size()) != blocks_.num_used_blocks())
    Fail(ErrorKind::kInternal, "requests own {} blocks but the pool has {} in use", owners.size(),
         blocks_.num_used_blocks());
  for (const auto& [b, n] : owners)
    if (blocks_.refcount(b) != n)
      Fail(ErrorKind::kInternal, "block {} is held by {} requests but has refcount {}", b, n, blocks_.refcount(b));
  if (slots != blocks_.num_used_slots())
    Fail(ErrorKind::kInternal, "requests own {} slots but the pool has {} in use", slots, blocks_.num_used_slots());
  if (static_cast<int>(running_.size()) > config_.max_num_seqs)
    Fail(ErrorKind::kInternal, "{} running requests exceed max_num_seqs {}", running_.size(), config_.max_num_seqs);
}

}  // namespace deepinfer
