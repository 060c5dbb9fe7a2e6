// Prefix caching (docs/engine.md "Prefix caching"): a cache hit restores every
// state kind and equals a cold run bit for bit, on the tiny V4.1 checkpoint
// with the real tokenizer (DEEPINFER_TINY_DIR); plus a randomised test of the
// scheduler and block manager with sharing (no tensors).
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepinfer/engine.h"
#include "scheduler/scheduler.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_DIR");
  return d ? d : "";
}

EngineArgs Args(bool caching, int64_t block_size = 16, int max_seqs = 8, int64_t blocks = 0) {
  EngineArgs a;
  a.model = TinyDir();
  a.max_num_seqs = max_seqs;
  a.max_num_batched_tokens = 256;
  a.max_model_len = 1024;
  a.block_size = block_size;
  a.num_kv_blocks = blocks;
  a.num_threads = 1;
  a.logprobs_mode = LogprobsMode::kRawLogits;
  a.enable_prefix_caching = caching;
  return a;
}

struct Out {
  std::vector<int32_t> tokens;
  std::vector<std::vector<std::pair<int32_t, float>>> top;  // raw logits of the top 5 per step
  int64_t cached = 0;
  std::string finish;
};

GenerateRequest Req(std::vector<int32_t> ids, int64_t max_tokens, const std::string& id, double temperature = 0) {
  GenerateRequest r;
  r.prompt_token_ids = std::move(ids);
  r.params.max_tokens = max_tokens;
  r.params.temperature = temperature;
  if (temperature > 0) r.params.seed = 1234;
  r.params.logprobs = 5;
  r.request_id = id;
  return r;
}

std::map<std::string, Out> RunReqs(Engine& e, const std::vector<GenerateRequest>& reqs) {
  for (const auto& r : reqs) e.Submit(r);
  std::map<std::string, Out> res;
  while (e.HasUnfinished())
    for (auto& o : e.Step()) {
      if (!o.finished) continue;
      EXPECT_TRUE(o.error.empty()) << o.error;
      Out& x = res[o.request_id];
      x.tokens = o.token_ids;
      x.cached = o.num_cached_tokens;
      x.finish = o.finish_reason;
      for (const auto& lp : o.logprobs) {
        std::vector<std::pair<int32_t, float>> row;
        for (const auto& t : lp.top) row.emplace_back(t.token_id, t.logprob);
        x.top.push_back(row);
      }
    }
  return res;
}

std::vector<int32_t> LongText(const Tokenizer& tok) {
  std::ifstream in(std::string(DEEPINFER_TEST_DATA) + "/engine/english_prompts.jsonl");
  std::string line, text;
  while (std::getline(in, line)) text += nlohmann::json::parse(line)["prompt"].get<std::string>() + " ";
  return tok.Encode(text, true);
}

void ExpectSame(const Out& hit, const Out& cold, const std::string& what) {
  EXPECT_EQ(hit.tokens, cold.tokens) << what;
  EXPECT_EQ(hit.top, cold.top) << what;
  EXPECT_EQ(hit.finish, cold.finish) << what;
}

class PrefixCacheTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TinyDir().empty()) GTEST_SKIP() << "DEEPINFER_TINY_DIR not set (the ctest fixture makes it)";
    tok_ = std::make_unique<Tokenizer>(Tokenizer::Load(TinyDir()));
    text_ = LongText(*tok_);
    ASSERT_GT(text_.size(), 900u);
  }
  std::vector<int32_t> Slice(size_t from, size_t n) const {
    return std::vector<int32_t>(text_.begin() + static_cast<std::ptrdiff_t>(from),
                                text_.begin() + static_cast<std::ptrdiff_t>(from + n));
  }
  std::unique_ptr<Tokenizer> tok_;
  std::vector<int32_t> text_;
};

// A shared prefix of L tokens, then different suffixes: ends inside a block,
// exactly at a block boundary, inside and at a window boundary (window 16 = one
// block of 16, two of 8), on odd positions (ratio-2 layers); greedy and sampled.
TEST_F(PrefixCacheTiny, SharedPrefixEndingAnywhereHitEqualsCold) {
  for (int64_t bs : {int64_t{16}, int64_t{8}}) {
    auto cold = Engine::Open(Args(false, bs));
    auto hot = Engine::Open(Args(true, bs));
    ASSERT_TRUE(hot->Stats().prefix_caching);
    ASSERT_FALSE(cold->Stats().prefix_caching);
    int64_t expected_hits = 0;
    for (int64_t L : {1, 7, 8, 15, 16, 17, 23, 24, 31, 32, 33, 47, 64, 65, 100, 128, 129, 255, 300}) {
      std::vector<int32_t> prefix = Slice(0, static_cast<size_t>(L));
      std::vector<int32_t> a = prefix, b = prefix;
      const std::vector<int32_t> sa = Slice(500, 9), sb = Slice(600 + static_cast<size_t>(L % 50), 9);
      a.insert(a.end(), sa.begin(), sa.end());
      b.insert(b.end(), sb.begin(), sb.end());
      const double temp = L % 2 ? 0.8 : 0.0;
      const std::string tag = "bs " + std::to_string(bs) + " L " + std::to_string(L);
      RunReqs(*hot, {Req(a, 6, "a", temp)});  // publishes the prefix blocks
      const auto h = RunReqs(*hot, {Req(b, 6, "b", temp)}).at("b");
      const auto c = RunReqs(*cold, {Req(b, 6, "b", temp)}).at("b");
      // The hit covers the shared full blocks (at least the last token is computed).
      const int64_t want = (std::min<int64_t>(L, static_cast<int64_t>(b.size()) - 1) / bs) * bs;
      EXPECT_EQ(h.cached, want) << tag;
      EXPECT_EQ(c.cached, 0) << tag;
      expected_hits += want;
      ExpectSame(h, c, tag);
      // The same prompt again: everything but its last token is a hit.
      const auto again = RunReqs(*hot, {Req(b, 6, "b2", temp)}).at("b2");
      EXPECT_EQ(again.cached, ((static_cast<int64_t>(b.size()) - 1) / bs) * bs) << tag;
      expected_hits += again.cached;
      ExpectSame(again, c, tag + " (whole prompt cached)");
    }
    const EngineStats s = hot->Stats();
    EXPECT_GE(s.prefix_cache_hits, expected_hits);
    EXPECT_GT(s.prefix_cache_queries, s.prefix_cache_hits);
    EXPECT_EQ(s.num_kv_blocks_used, 0);
    EXPECT_GT(s.num_cached_blocks, 0);
    EXPECT_EQ(s.num_evictable_blocks, s.num_cached_blocks);  // nothing holds them any more
  }
}

// The 64 English prompts, twice: the second pass hits the first's blocks and
// equals the cold run; a chat that grows turn by turn hits its earlier turns.
TEST_F(PrefixCacheTiny, EnglishPromptsAndGrowingChatEqualCold) {
  std::ifstream in(std::string(DEEPINFER_TEST_DATA) + "/engine/english_prompts.jsonl");
  std::vector<GenerateRequest> reqs;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    reqs.push_back(Req(tok_->Encode(j["prompt"].get<std::string>(), true), j["max_tokens"].get<int64_t>(),
                       std::to_string(reqs.size())));
  }
  auto cold = Engine::Open(Args(false));
  auto hot = Engine::Open(Args(true));
  const auto c = RunReqs(*cold, reqs);
  const auto first = RunReqs(*hot, reqs);
  const auto second = RunReqs(*hot, reqs);
  int64_t hits = 0;
  for (const auto& [id, o] : c) {
    ExpectSame(first.at(id), o, "first pass " + id);
    ExpectSame(second.at(id), o, "second pass " + id);
    hits += second.at(id).cached;
  }
  EXPECT_GT(hits, 3000);  // 4310 prompt tokens, less each prompt's partial last block

  // A conversation: each turn is the previous prompt + the answer + a new user message.
  ChatOptions chat;
  chat.encoding = ChatEncodingForModelType(hot->model_type());
  chat.add_generation_prompt = true;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are a helpful assistant. Answer in one short line."}});
  for (int turn = 0; turn < 5; ++turn) {
    messages.push_back({{"role", "user"}, {"content", "Tell me about topic number " + std::to_string(turn) +
                                                          " from the corpus, please, in detail."}});
    const std::vector<int32_t> ids = EncodeChat(*tok_, messages, chat);
    const std::string id = "turn" + std::to_string(turn);
    const auto h = RunReqs(*hot, {Req(ids, 12, id)}).at(id);
    const auto k = RunReqs(*cold, {Req(ids, 12, id)}).at(id);
    ExpectSame(h, k, id);
    if (turn > 0) {
      EXPECT_GE(h.cached, 16) << id;
    }
    messages.push_back({{"role", "assistant"}, {"content", tok_->Decode(h.tokens, true)}});
  }
}

// Many requests with a common 128-token prefix in the same step: none reads a
// block before it is written (blocks are published after the step), all equal
// their cold results; a later wave hits.
TEST_F(PrefixCacheTiny, ConcurrentCommonPrefixAndSmallPool) {
  std::vector<GenerateRequest> wave;
  const std::vector<int32_t> prefix = Slice(10, 128);
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> ids = prefix;
    const std::vector<int32_t> tail = Slice(300 + 17 * static_cast<size_t>(i), 5 + static_cast<size_t>(i));
    ids.insert(ids.end(), tail.begin(), tail.end());
    wave.push_back(Req(ids, 8, "w" + std::to_string(i), i % 3 ? 0.0 : 1.0));
  }
  auto cold = Engine::Open(Args(false, 16, 12));
  const auto c = RunReqs(*cold, wave);
  for (int64_t blocks : {int64_t{0}, int64_t{24}}) {  // 24 blocks: eviction and preemption
    auto hot = Engine::Open(Args(true, 16, 12, blocks));
    const auto w1 = RunReqs(*hot, wave);
    const auto w2 = RunReqs(*hot, wave);
    int64_t hits2 = 0;
    for (const auto& [id, o] : c) {
      ExpectSame(w1.at(id), o, "wave 1 " + id + " blocks " + std::to_string(blocks));
      ExpectSame(w2.at(id), o, "wave 2 " + id + " blocks " + std::to_string(blocks));
      hits2 += w2.at(id).cached;
    }
    EXPECT_GT(hits2, 0);
    const EngineStats s = hot->Stats();
    EXPECT_EQ(s.num_kv_blocks_used, 0);
    if (blocks > 0) {
      EXPECT_GT(s.num_preemptions, 0) << "24 blocks should force preemption";
    }
  }
}

// prompt_logprobs requests bypass the cache (they need every prompt row).
TEST_F(PrefixCacheTiny, PromptLogprobsBypassTheCache) {
  auto hot = Engine::Open(Args(true));
  const std::vector<int32_t> ids = Slice(0, 70);
  RunReqs(*hot, {Req(ids, 2, "warm")});
  GenerateRequest r = Req(ids, 2, "pl");
  r.params.prompt_logprobs = 1;
  const auto o = RunReqs(*hot, {r}).at("pl");
  EXPECT_EQ(o.cached, 0);
}

// Random admit / grow / share / finish / preempt / abort / evict on the
// scheduler with prefix caching, invariants checked after every operation.
TEST(PrefixCacheScheduler, RandomisedSharingKeepsInvariants) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    SchedulerConfig c;
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = 24;
    c.max_model_len = 96;
    c.block_size = 4;
    c.num_kv_blocks = 40;
    c.enable_prefix_caching = true;
    Scheduler s(c);
    // Prompts drawn from a few shared stems so that blocks are shared.
    std::vector<std::vector<int32_t>> stems(3);
    for (auto& st : stems)
      for (int i = 0; i < 40; ++i) st.push_back(static_cast<int32_t>(rng() % 5));
    uint64_t next = 1;
    std::vector<uint64_t> live;
    int64_t hits = 0;
    for (int op = 0; op < 400; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 3 && live.size() < 12) {
        const auto& st = stems[rng() % stems.size()];
        std::vector<int32_t> p(st.begin(), st.begin() + 1 + rng() % 39);
        if (rng() % 3 == 0) p.push_back(static_cast<int32_t>(rng() % 5));
        s.Add(next, p, 1 + rng() % 30, rng() % 8 != 0);
        live.push_back(next++);
      } else if (kind < 8) {
        StepPlan plan = s.Schedule(rng() % 4 != 0);
        for (const auto& q : plan.seqs) {
          const SeqState* st = s.Get(q.id);
          ASSERT_TRUE(st);
          ASSERT_EQ(q.start, q.restore_prefix > 0 ? q.restore_prefix : q.start);
          if (q.restore_prefix > 0) {
            ASSERT_TRUE(q.fresh_slot);
            ASSERT_EQ(q.restore_prefix % c.block_size, 0);
            ASSERT_LT(q.restore_prefix, static_cast<int64_t>(st->token_ids.size()));
            // Shared blocks are published and held by this request too.
            for (int64_t b = 0; b < q.restore_prefix / c.block_size; ++b)
              ASSERT_TRUE(s.blocks().is_published(st->block_table[static_cast<size_t>(b)]));
            hits += q.restore_prefix;
          }
        }
        std::vector<int32_t> sampled(plan.seqs.size());
        for (auto& t : sampled) t = static_cast<int32_t>(rng() % 5);
        s.Update(plan, sampled);
      } else if (kind == 8 && !live.empty()) {
        const size_t i = rng() % live.size();
        s.Abort(live[i]);
      } else if (!live.empty()) {
        const size_t i = rng() % live.size();
        const SeqState* st = s.Get(live[i]);
        if (st && st->status == RequestStatus::kRunning) s.Finish(live[i], SeqFinishReason::kStop);
      }
      // Forget finished requests.
      for (size_t i = 0; i < live.size();) {
        const SeqState* st = s.Get(live[i]);
        if (st && st->status == RequestStatus::kFinished) {
          s.Release(live[i]);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      ASSERT_NO_THROW(s.CheckInvariants()) << "seed " << seed << " op " << op;
    }
    for (uint64_t id : live) s.Abort(id);
    for (uint64_t id : live) s.Release(id);
    s.CheckInvariants();
    EXPECT_EQ(s.blocks().num_used_blocks(), 0);
    EXPECT_GT(hits, 0) << "seed " << seed;
    EXPECT_GT(s.blocks().num_cached_blocks(), 0);
  }
}

}  // namespace
}  // namespace deepinfer
