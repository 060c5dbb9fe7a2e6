// Speculative decoding with V4.1's DSpark drafter (docs/speculative.md
// "Model drafters", model/v41/dspark.h) on the tiny V4.1 checkpoint with the
// real tokenizer (ctest fixture, DEEPINFER_TINY_DIR): with
// {"method": "dspark"} and k = 1, 2 (the tiny drafter has dspark_block_size 3
// and 2 blocks) the English prompts give tokens and raw top-5 logits
// bit-identical to speculation off — batched (--max-num-seqs 8), under a
// 16-token budget and under preemption (a small pool) — and the pool's used
// blocks return to 0; a seeded sampled request is the same alone, batched and
// without speculation. 16 prompts by default; DEEPINFER_SPEC_E2E_FULL=1 runs
// all 64.
#include <cstdlib>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "deepinfer/engine.h"

namespace deepinfer {
namespace {

std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_DIR");
  return d ? d : "";
}
bool Full() {
  const char* f = std::getenv("DEEPINFER_SPEC_E2E_FULL");
  return f && std::string(f) == "1";
}

// The tiny model's weights are random, so the drafter's guesses practically
// never equal the target's greedy choice. Every other request gets logit_bias
// +100 on three ids that the tiny drafter itself proposes in such loops: the
// target then picks among them (its logits decide the order) and drafts are
// accepted now and then, so the verification of kept rows beyond the first
// (1 + accepted) reaches the drafter's ring seeding too. The bias is a
// sampling step: the raw logits compared below are unaffected.
void AddDraftableBias(GenerateRequest* r) {
  for (int64_t id : {120582, 117158, 47612}) r->params.logit_bias[id] = 100.0;
}

std::vector<GenerateRequest> EnglishRequests(size_t n, int64_t extra_tokens) {
  std::ifstream in(std::string(DEEPINFER_TEST_DATA) + "/engine/english_prompts.jsonl");
  std::vector<GenerateRequest> reqs;
  std::string line;
  while (reqs.size() < n && std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    GenerateRequest r;
    r.prompt = j["prompt"].get<std::string>();
    r.params.temperature = 0;
    r.params.max_tokens = j["max_tokens"].get<int64_t>() + extra_tokens;
    r.params.logprobs = 5;  // raw logits of the top 5 (raw_logits mode): compared bit for bit
    r.request_id = std::to_string(reqs.size());
    if (reqs.size() % 2 == 1) AddDraftableBias(&r);
    reqs.push_back(r);
  }
  return reqs;
}

struct Result {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<std::vector<std::pair<int32_t, float>>>> top_logits;
  std::map<std::string, std::string> text;
  EngineStats stats;
};

EngineArgs TinyArgs(int max_num_seqs, int64_t budget, const std::string& spec, int64_t num_kv_blocks = 0) {
  EngineArgs a;
  a.model = TinyDir();
  a.max_num_seqs = max_num_seqs;
  a.max_num_batched_tokens = budget;
  a.max_model_len = 512;
  a.block_size = 16;
  a.num_kv_blocks = num_kv_blocks;
  a.num_threads = 1;
  a.logprobs_mode = LogprobsMode::kRawLogits;
  a.speculative_config = spec;
  return a;
}

Result RunAll(Engine& engine, const std::vector<GenerateRequest>& reqs, bool alone = false) {
  Result res;
  auto drain = [&] {
    while (engine.HasUnfinished()) {
      for (auto& o : engine.Step()) {
        if (!o.finished) continue;
        EXPECT_TRUE(o.error.empty()) << o.error;
        res.tokens[o.request_id] = o.token_ids;
        res.text[o.request_id] = o.text;
        auto& tl = res.top_logits[o.request_id];
        for (const auto& e : o.logprobs) {
          std::vector<std::pair<int32_t, float>> row;
          row.emplace_back(e.chosen.token_id, e.chosen.logprob);
          for (const auto& t : e.top) row.emplace_back(t.token_id, t.logprob);
          tl.push_back(row);
        }
      }
    }
  };
  for (const auto& r : reqs) {
    engine.Submit(r);
    if (alone) drain();
  }
  drain();
  res.stats = engine.Stats();
  EXPECT_EQ(res.stats.num_kv_blocks_used, 0);
  return res;
}

std::string Dspark(int k) { return nlohmann::json{{"method", "dspark"}, {"num_speculative_tokens", k}}.dump(); }

class DsparkSpeculativeTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TinyDir().empty()) GTEST_FAIL() << "DEEPINFER_TINY_DIR is not set (ctest's fixture sets it)";
  }
};

TEST_F(DsparkSpeculativeTiny, GreedyIsBitIdenticalToSpeculationOff) {
  const size_t n = Full() ? 64 : 16;
  const auto reqs = EnglishRequests(n, /*extra_tokens=*/8);
  ASSERT_EQ(reqs.size(), n);
  Result off;
  {
    auto e = Engine::Open(TinyArgs(8, 256, ""));
    off = RunAll(*e, reqs);
  }
  ASSERT_EQ(off.tokens.size(), n);
  const int64_t small = Full() ? 20 : 12;  // a pool that preempts (the 64 include a 195-token prompt)
  struct Case {
    int k;
    int64_t budget, blocks;
    const char* what;
  };
  const Case cases[] = {
      {1, 256, 0, "k=1 batched"}, {1, 16, 0, "k=1 budget 16"}, {1, 256, small, "k=1 preemption"},
      {2, 256, 0, "k=2 batched"}, {2, 16, 0, "k=2 budget 16"}, {2, 256, small, "k=2 preemption"},
  };
  for (const Case& c : cases) {
    auto e = Engine::Open(TinyArgs(8, c.budget, Dspark(c.k), c.blocks));
    const Result on = RunAll(*e, reqs);
    EXPECT_EQ(on.tokens, off.tokens) << c.what;
    EXPECT_EQ(on.top_logits, off.top_logits) << c.what;  // chosen + top-5 raw logits, bit for bit
    EXPECT_EQ(on.text, off.text) << c.what;
    const EngineStats& s = on.stats;
    EXPECT_EQ(s.num_kv_blocks_used, 0) << c.what;
    // Decode steps verify drafts of up to k tokens (fewer only near max_tokens).
    EXPECT_GT(s.spec_num_drafts, static_cast<int64_t>(n)) << c.what;
    EXPECT_LE(s.spec_num_draft_tokens, s.spec_num_drafts * c.k) << c.what;
    if (c.k > 1) {
      EXPECT_GT(s.spec_num_draft_tokens, s.spec_num_drafts) << c.what;
    }
    EXPECT_GT(s.spec_num_accepted_tokens, 0) << c.what;
    EXPECT_LT(s.spec_num_accepted_tokens, s.spec_num_draft_tokens) << c.what;
    ASSERT_EQ(s.spec_num_accepted_tokens_per_pos.size(), static_cast<size_t>(c.k));
    if (c.blocks > 0) {
      EXPECT_GT(s.num_preemptions, 0) << c.what;
    }
    std::printf("[ %s ] drafts %lld, draft tokens %lld, accepted %lld (per position:", c.what,
                static_cast<long long>(s.spec_num_drafts), static_cast<long long>(s.spec_num_draft_tokens),
                static_cast<long long>(s.spec_num_accepted_tokens));
    for (int64_t a : s.spec_num_accepted_tokens_per_pos) std::printf(" %lld", static_cast<long long>(a));
    std::printf("), mean accepted length %.3f, preemptions %lld, steps %lld vs %lld\n", s.spec_mean_accepted_length(),
                static_cast<long long>(s.num_preemptions), static_cast<long long>(s.num_steps),
                static_cast<long long>(off.stats.num_steps));
  }
}

TEST_F(DsparkSpeculativeTiny, SeededSampledRequestSameAloneBatchedAndWithoutSpeculation) {
  std::vector<GenerateRequest> reqs = EnglishRequests(8, 6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].params.temperature = 0.8;
    reqs[i].params.top_p = 0.9;
    reqs[i].params.seed = static_cast<int64_t>(100 + i);
  }
  Result off, alone, batched;
  {
    auto e = Engine::Open(TinyArgs(8, 256, ""));
    off = RunAll(*e, reqs);
  }
  {
    auto e = Engine::Open(TinyArgs(8, 256, Dspark(2)));
    alone = RunAll(*e, reqs, /*alone=*/true);
    EXPECT_GT(alone.stats.spec_num_drafts, 0);
  }
  {
    auto e = Engine::Open(TinyArgs(8, 16, Dspark(2), /*num_kv_blocks=*/12));
    batched = RunAll(*e, reqs);
    EXPECT_GT(batched.stats.spec_num_drafts, 0);
  }
  EXPECT_EQ(alone.tokens, off.tokens);
  EXPECT_EQ(alone.top_logits, off.top_logits);
  EXPECT_EQ(batched.tokens, alone.tokens);
  EXPECT_EQ(batched.top_logits, alone.top_logits);
}

}  // namespace
}  // namespace deepinfer
