// Speculative decoding (docs/speculative.md) on the tiny V4.1 checkpoint with
// the real tokenizer (ctest fixture, DEEPINFER_TINY_DIR): the n-gram
// proposer's drafts verified in one forward must give tokens and logprobs
// bit-identical to speculation off — batched, under a 16-token budget and
// under preemption — with real acceptance (the tiny model's greedy output
// loops), every state kind rolled back after partial acceptance (window ring
// of 16 wraps, ratio-2 compressor carry, compressed KV, Engram look-back) and
// the pool empty afterwards. Sampled requests: identical per seed with and
// without speculation, alone and batched, and the first three tokens over
// 400 seeds pass a chi-square homogeneity test against speculation off.
// Plus: the flag's parsing and validation, the n-gram proposer, the
// scheduler's budget and block accounting of draft rows.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "deepinfer/engine.h"
#include "engine/speculative.h"
#include "scheduler/scheduler.h"

namespace deepinfer {
namespace {

std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_DIR");
  return d ? d : "";
}

// The 64 English prompts, greedy, with longer outputs than engine_tiny_test.
// The tiny model has random weights and its greedy output practically never
// repeats a token, so n-gram drafts would never be accepted: three of every
// four requests get logit_bias +100 on 3 or 4 token ids, which confines their
// output to those ids in an order the model's logits decide — repetitive
// text with real, partial n-gram acceptance at every draft position. The
// bias is a sampling step: the raw logits compared below are unaffected.
void AddLoopBias(GenerateRequest* r, int i) {
  const int64_t ids[4] = {1000 + 7 * i, 5000 + 13 * i, 20000 + i, 60000 + 3 * i};
  for (int k = 0; k < 3 + i % 2; ++k) r->params.logit_bias[ids[k]] = 100.0;
}

std::vector<GenerateRequest> EnglishRequests(int64_t extra_tokens) {
  std::ifstream in(std::string(DEEPINFER_TEST_DATA) + "/engine/english_prompts.jsonl");
  std::vector<GenerateRequest> reqs;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    GenerateRequest r;
    r.prompt = j["prompt"].get<std::string>();
    r.params.temperature = 0;
    r.params.max_tokens = j["max_tokens"].get<int64_t>() + extra_tokens;
    r.params.logprobs = 5;  // raw logits of the top 5 (raw_logits mode): compared bit for bit
    r.request_id = std::to_string(reqs.size());
    if (reqs.size() % 4 != 3) AddLoopBias(&r, static_cast<int>(reqs.size()));
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
        if (!o.logprobs.empty()) {
          EXPECT_EQ(o.logprobs.size(), o.token_ids.size());
        }
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

class SpeculativeTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TinyDir().empty()) GTEST_FAIL() << "DEEPINFER_TINY_DIR is not set (ctest's fixture sets it)";
  }
};

std::string Ngram(int k, int lo, int hi) {
  return nlohmann::json{{"method", "ngram"}, {"num_speculative_tokens", k}, {"prompt_lookup_min", lo},
                        {"prompt_lookup_max", hi}}
      .dump();
}

TEST_F(SpeculativeTiny, NgramGreedyIsBitIdenticalToSpeculationOff) {
  const auto reqs = EnglishRequests(/*extra_tokens=*/8);
  ASSERT_EQ(reqs.size(), 64u);
  Result off;
  {
    auto e = Engine::Open(TinyArgs(8, 256, ""));
    off = RunAll(*e, reqs);
  }
  ASSERT_EQ(off.tokens.size(), 64u);
  EXPECT_EQ(off.stats.spec_num_drafts, 0);
  struct Case {
    int k, lo, hi;
    int64_t budget, blocks;
    const char* what;
  };
  const Case cases[] = {
      {2, 1, 3, 256, 0, "k=2 batched"},   {2, 1, 3, 16, 0, "k=2 budget 16"}, {2, 1, 3, 256, 20, "k=2 preemption"},
      {4, 2, 4, 256, 0, "k=4 batched"},   {4, 2, 4, 16, 0, "k=4 budget 16"}, {4, 2, 4, 256, 20, "k=4 preemption"},
  };
  for (const Case& c : cases) {
    auto e = Engine::Open(TinyArgs(8, c.budget, Ngram(c.k, c.lo, c.hi), c.blocks));
    const Result on = RunAll(*e, reqs);
    EXPECT_EQ(on.tokens, off.tokens) << c.what;
    EXPECT_EQ(on.top_logits, off.top_logits) << c.what;  // chosen + top-5 raw logits, bit for bit
    EXPECT_EQ(on.text, off.text) << c.what;
    const EngineStats& s = on.stats;
    EXPECT_EQ(s.num_kv_blocks_used, 0) << c.what;
    // Real acceptance, also of the later draft positions, and partial acceptance (rollback) happened.
    EXPECT_GT(s.spec_num_drafts, 100) << c.what;
    EXPECT_GT(s.spec_num_accepted_tokens, 50) << c.what;
    EXPECT_LT(s.spec_num_accepted_tokens, s.spec_num_draft_tokens) << c.what;
    ASSERT_EQ(s.spec_num_accepted_tokens_per_pos.size(), static_cast<size_t>(c.k));
    EXPECT_GT(s.spec_num_accepted_tokens_per_pos[static_cast<size_t>(c.k - 1)], 0) << c.what;
    int64_t sum = 0;
    for (size_t i = 0; i < s.spec_num_accepted_tokens_per_pos.size(); ++i) {
      sum += s.spec_num_accepted_tokens_per_pos[i];
      if (i > 0) {
        EXPECT_LE(s.spec_num_accepted_tokens_per_pos[i], s.spec_num_accepted_tokens_per_pos[i - 1]);
      }
    }
    EXPECT_EQ(sum, s.spec_num_accepted_tokens);
    EXPECT_GT(s.spec_mean_accepted_length(), 1.0);
    // Same budget and pool as the run without speculation: fewer forward steps.
    if (c.budget == 256 && c.blocks == 0) {
      EXPECT_LT(s.num_steps, off.stats.num_steps) << c.what;
    }
    if (c.blocks > 0) {
      EXPECT_GT(s.num_preemptions, 0) << c.what;
    }
    std::printf("[ %s ] drafts %lld, draft tokens %lld, accepted %lld, mean accepted length %.3f, steps %lld vs %lld\n",
                c.what, static_cast<long long>(s.spec_num_drafts), static_cast<long long>(s.spec_num_draft_tokens),
                static_cast<long long>(s.spec_num_accepted_tokens), s.spec_mean_accepted_length(),
                static_cast<long long>(s.num_steps), static_cast<long long>(off.stats.num_steps));
  }
}

// A prompt whose continuation the n-gram proposer can draft from the first
// output token on: the biased ids (AddLoopBias(0)) repeated.
GenerateRequest RepeatPrompt(int64_t seed, int64_t max_tokens) {
  GenerateRequest r;
  std::vector<int32_t> ids;
  for (int i = 0; i < 8; ++i) ids.insert(ids.end(), {1000, 5000, 20000, 1000, 20000});
  r.prompt_token_ids = ids;
  r.params.temperature = 1.0;
  r.params.seed = seed;
  r.params.max_tokens = max_tokens;
  r.params.logprobs = 2;
  r.request_id = "seed" + std::to_string(seed);
  AddLoopBias(&r, 0);  // temperature 1 over 3 biased ids: random, repetitive, draftable
  return r;
}

TEST_F(SpeculativeTiny, SampledRequestsSameTokensAloneBatchedAndWithoutSpeculation) {
  std::vector<GenerateRequest> reqs;
  for (int64_t s = 0; s < 8; ++s) reqs.push_back(RepeatPrompt(1000 + s, 12));
  for (auto& r : EnglishRequests(6)) {
    if (reqs.size() >= 16) break;
    r.params.temperature = 0.8;
    r.params.top_p = 0.9;
    r.params.seed = static_cast<int64_t>(reqs.size());
    reqs.push_back(r);
  }
  Result off, alone, batched;
  {
    auto e = Engine::Open(TinyArgs(8, 256, ""));
    off = RunAll(*e, reqs);
  }
  {
    auto e = Engine::Open(TinyArgs(8, 256, Ngram(3, 1, 3)));
    alone = RunAll(*e, reqs, /*alone=*/true);
  }
  {
    auto e = Engine::Open(TinyArgs(8, 16, Ngram(3, 1, 3), /*num_kv_blocks=*/12));
    batched = RunAll(*e, reqs);
    EXPECT_GT(batched.stats.spec_num_accepted_tokens, 0);
  }
  EXPECT_EQ(alone.tokens, off.tokens);
  EXPECT_EQ(alone.top_logits, off.top_logits);
  EXPECT_EQ(batched.tokens, alone.tokens);
  EXPECT_EQ(batched.top_logits, alone.top_logits);
  EXPECT_GT(alone.stats.spec_num_drafts, 0);
}

// Chi-square homogeneity test (df = categories − 1) of two count tables.
double ChiSquare(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b, int* df) {
  std::map<int32_t, std::pair<int, int>> t;
  for (auto& [k, v] : a) t[k].first += v;
  for (auto& [k, v] : b) t[k].second += v;
  double na = 0, nb = 0;
  for (auto& [k, v] : t) na += v.first, nb += v.second;
  double x = 0;
  for (auto& [k, v] : t) {
    const double tot = v.first + v.second;
    const double ea = tot * na / (na + nb), eb = tot * nb / (na + nb);
    x += (v.first - ea) * (v.first - ea) / ea + (v.second - eb) * (v.second - eb) / eb;
  }
  *df = static_cast<int>(t.size()) - 1;
  return x;
}

TEST_F(SpeculativeTiny, FirstThreeSampledTokensOver400SeedsMatchSpeculationOff) {
  std::vector<GenerateRequest> reqs;
  for (int64_t s = 0; s < 400; ++s) {
    GenerateRequest r = RepeatPrompt(s, 3);
    r.params.logprobs.reset();
    reqs.push_back(r);
  }
  // Speculation off vs on, 400 seeds each in both runs (same seeds: the
  // sampled path is per-seed identical, so the tables agree exactly; the
  // test checks the distribution statement the issue makes, at p = 0.001).
  Result off, on;
  {
    auto e = Engine::Open(TinyArgs(8, 256, ""));
    off = RunAll(*e, reqs);
  }
  {
    auto e = Engine::Open(TinyArgs(8, 256, Ngram(2, 1, 3)));
    on = RunAll(*e, reqs);
    EXPECT_GT(on.stats.spec_num_drafts, 0);
  }
  EXPECT_EQ(on.tokens, off.tokens);
  for (int pos = 0; pos < 3; ++pos) {
    std::map<int32_t, int> a, b;
    for (auto& [id, t] : off.tokens) a[t.at(static_cast<size_t>(pos))]++;
    for (auto& [id, t] : on.tokens) b[t.at(static_cast<size_t>(pos))]++;
    int df = 0;
    const double x = ChiSquare(a, b, &df);
    EXPECT_GE(df, 1) << "position " << pos << ": the tiny model should not be deterministic at temperature 1";
    // Critical value of chi-square at p = 0.001 (Wilson–Hilferty approximation).
    const double z = 3.090232, h = 2.0 / (9.0 * std::max(df, 1));
    const double crit = std::max(df, 1) * std::pow(1 - h + z * std::sqrt(h), 3);
    EXPECT_LT(x, crit) << "position " << pos << " df " << df;
  }
}

TEST(SpeculativeConfig, ParsesVllmJsonAndNamesTheFlagOnErrors) {
  SpeculativeConfig c = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 4,
                                                  "prompt_lookup_min": 2, "prompt_lookup_max": 5})");
  EXPECT_EQ(c.method, "ngram");
  EXPECT_EQ(c.num_speculative_tokens, 4);
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  c = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})");
  EXPECT_EQ(c.prompt_lookup_min, 3);
  EXPECT_FALSE(ParseSpeculativeConfig("").enabled());
  c = ParseSpeculativeConfig(R"({"method": "dspark", "num_speculative_tokens": 2})");
  EXPECT_EQ(c.method, "dspark");
  for (const char* bad : {"{", "[]", R"({"num_speculative_tokens": 2})", R"({"method": "eagle", "num_speculative_tokens": 2})",
                          R"({"method": "ngram"})", R"({"method": "ngram", "num_speculative_tokens": 0})",
                          R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2})",
                          R"({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"})",
                          R"({"method": "ngram", "num_speculative_tokens": "2"})",
                          R"({"method": "dspark", "num_speculative_tokens": 2, "prompt_lookup_min": 1})"}) {
    try {
      ParseSpeculativeConfig(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--speculative-config"), std::string::npos) << e.what();
    }
  }
}

TEST(SpeculativeConfig, ValidationAgainstTheModel) {
  ModelConfig cfg;
  cfg.model_type = "deepseek_v41";
  cfg.window_size = 16;
  SpeculativeConfig c = ParseSpeculativeConfig(R"({"method": "dspark", "num_speculative_tokens": 2})");
  try {  // no drafter
    ValidateSpeculativeConfig(c, cfg);
    ADD_FAILURE() << "dspark accepted without a drafter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--speculative-config"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("drafter"), std::string::npos) << e.what();
  }
  cfg.n_mtp_layers = 2;
  cfg.dspark_block_size = 3;
  ValidateSpeculativeConfig(c, cfg);
  c.num_speculative_tokens = 3;  // > dspark_block_size - 1
  EXPECT_THROW(ValidateSpeculativeConfig(c, cfg), Error);
  c = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 16})");
  EXPECT_THROW(ValidateSpeculativeConfig(c, cfg), Error);  // 17 rows > window 16
  c.num_speculative_tokens = 15;
  ValidateSpeculativeConfig(c, cfg);
}

// DSpark's k is capped by the drafter's block (dspark_block_size 3 here):
// k = 3 is a start-up error naming the flag and the limit (the drafter
// itself: dspark_speculative_tiny_test.cc).
TEST_F(SpeculativeTiny, DsparkKBeyondTheBlockIsAStartupErrorNamingTheFlag) {
  try {
    Engine::Open(TinyArgs(8, 256, R"({"method": "dspark", "num_speculative_tokens": 3})"));
    ADD_FAILURE() << "dspark k=3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--speculative-config"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dspark_block_size"), std::string::npos) << e.what();
  }
}

TEST(NgramProposer, MostRecentLongestMatch) {
  const NgramProposer p(1, 3);
  const std::vector<int32_t> t = {5, 6, 7, 8, 1, 2, 3, 9, 1, 2, 3, 4, 0, 1, 2, 3};
  // Longest n = 3: "1 2 3" occurs at 8 (most recent) and 4: drafts follow the one at 8.
  EXPECT_EQ(p.Propose(t, 3).ids, (std::vector<int32_t>{4, 0, 1}));
  EXPECT_EQ(p.Propose(t, 1).ids, (std::vector<int32_t>{4}));
  // Near the end: fewer drafts than asked.
  EXPECT_EQ(p.Propose(std::vector<int32_t>{1, 2, 1}, 4).ids, (std::vector<int32_t>{2, 1}));
  // No match of any length.
  EXPECT_TRUE(p.Propose(std::vector<int32_t>{1, 2, 3}, 4).ids.empty());
  EXPECT_TRUE(p.Propose(std::vector<int32_t>{7}, 4).ids.empty());
  // Minimum length 2: a single repeated token is not enough.
  const NgramProposer p2(2, 2);
  EXPECT_TRUE(p2.Propose(std::vector<int32_t>{4, 9, 8, 9}, 2).ids.empty());
  EXPECT_EQ(p2.Propose(std::vector<int32_t>{4, 9, 8, 4, 9}, 2).ids, (std::vector<int32_t>{8, 4}));
}

TEST(SpeculativeScheduler, DraftRowsCountInTheBudgetAndRejectedBlocksGoBack) {
  SchedulerConfig sc;
  sc.max_num_seqs = 2;
  sc.max_num_batched_tokens = 4;
  sc.max_model_len = 64;
  sc.block_size = 4;
  sc.num_kv_blocks = 16;
  Scheduler s(sc);
  s.Add(1, {1, 2, 3}, 20);
  StepPlan p = s.Schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  s.Update(p, std::vector<int32_t>{7});  // prefill done: 3 computed, token 7 known
  s.SetSpecTokens(1, {8, 9, 10, 11, 12});
  p = s.Schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].start, 3);
  EXPECT_EQ(p.seqs[0].len, 4);  // budget 4: the last token + 3 drafts
  EXPECT_EQ(p.seqs[0].num_draft, 3);
  EXPECT_EQ(p.seqs[0].draft, (std::vector<int32_t>{8, 9, 10}));
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(s.Get(1)->block_table.size(), 2u);  // positions 0..6
  // One draft accepted, then the correction 5: positions 3, 4 computed.
  s.UpdateTokens(p, std::vector<std::vector<int32_t>>{{8, 5}});
  const SeqState* st = s.Get(1);
  EXPECT_EQ(st->num_computed_tokens, 5);
  EXPECT_EQ(st->token_ids, (std::vector<int32_t>{1, 2, 3, 7, 8, 5}));
  EXPECT_EQ(st->block_table.size(), 2u);
  s.CheckInvariants();
  // All rejected: positions 0..5 computed, the block grown for 6..8 goes back.
  s.SetSpecTokens(1, {1, 1, 1});
  p = s.Schedule();
  EXPECT_EQ(p.seqs[0].len, 4);
  EXPECT_EQ(s.Get(1)->block_table.size(), 3u);  // up to position 8
  s.UpdateTokens(p, std::vector<std::vector<int32_t>>{{6}});
  EXPECT_EQ(s.Get(1)->num_computed_tokens, 6);
  EXPECT_EQ(s.Get(1)->block_table.size(), 2u);
  EXPECT_EQ(s.blocks().num_used_blocks(), 2);
  s.CheckInvariants();
  // Drafts are ignored for a request that is not decoding, and cleared by the schedule.
  s.Add(2, {4, 4, 4, 4, 4, 4}, 4);
  s.SetSpecTokens(2, {1, 2});
  p = s.Schedule();
  for (const auto& q : p.seqs) EXPECT_EQ(q.num_draft, 0);
  s.CheckInvariants();
}

}  // namespace
}  // namespace deepinfer
