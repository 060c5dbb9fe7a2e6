// prompt_logprobs on the real model: the tiny V4.1 checkpoint (made by the
// ctest fixture, DEEPINFER_TINY_DIR) with the real tokenizer. Checks vLLM's
// semantics (entry p = raw log_softmax of the logits at position p-1, the
// row that predicts prompt token p; entry 0 null) against the model's
// last-position logits of each prefix run alone, bit for bit, and that the
// entries do not depend on the batch, the token budget or preemption.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepinfer/engine.h"
#include "logprobs_testing.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_DIR");
  return d ? d : "";
}

EngineArgs TinyArgs(int max_num_seqs, int64_t budget, int64_t num_kv_blocks = 0) {
  EngineArgs a;
  a.model = TinyDir();
  a.max_num_seqs = max_num_seqs;
  a.max_num_batched_tokens = budget;
  a.max_model_len = 512;
  a.block_size = 16;
  a.num_kv_blocks = num_kv_blocks;
  a.num_threads = 1;
  a.max_logprobs = -1;  // the oracles ask for the whole vocabulary
  return a;
}

using test_util::PromptLp;
using test_util::SameEntry;
using test_util::SameLp;
using test_util::SamePromptLp;

// Runs the requests to completion; returns the finished outputs by request_id.
std::map<std::string, RequestOutput> RunAll(Engine& engine, const std::vector<GenerateRequest>& reqs, bool alone = false) {
  std::map<std::string, RequestOutput> fin;
  auto drain = [&] {
    while (engine.HasUnfinished())
      for (auto& o : engine.Step())
        if (o.finished) {
          EXPECT_TRUE(o.error.empty()) << o.request_id << ": " << o.error;
          fin[o.request_id] = o;
        }
  };
  for (const auto& r : reqs) {
    engine.Submit(r);
    if (alone) drain();
  }
  drain();
  EXPECT_EQ(engine.Stats().num_kv_blocks_used, 0);
  return fin;
}

// The first generated token's logprobs over the whole vocabulary for prompt
// ids[0..p) alone: the model's logits (or raw logprobs) at position p-1.
LogprobsEntry FirstTokenAllLogprobs(Engine& engine, const std::vector<int32_t>& ids, size_t p) {
  GenerateRequest r;
  r.prompt_token_ids = std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(p));
  r.params.max_tokens = 1;
  r.params.temperature = 0;
  r.params.logprobs = -1;
  r.request_id = "prefix" + std::to_string(p);
  auto fin = RunAll(engine, {r});
  const RequestOutput& o = fin.at(r.request_id);
  EXPECT_EQ(o.logprobs.size(), 1u);
  return o.logprobs.empty() ? LogprobsEntry{} : o.logprobs[0];
}

std::vector<std::string> EnglishPrompts(size_t n) {
  std::ifstream in(std::string(DEEPINFER_TEST_DATA) + "/engine/english_prompts.jsonl");
  std::vector<std::string> out;
  std::string line;
  while (out.size() < n && std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["prompt"].get<std::string>());
  return out;
}

class PromptLogprobsTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TinyDir().empty()) GTEST_FAIL() << "DEEPINFER_TINY_DIR is not set (ctest's fixture sets it)";
  }
};

TEST_F(PromptLogprobsTiny, EqualLogSoftmaxOfEachPrefixAloneBitForBit) {
  auto engine = Engine::Open(TinyArgs(4, 16));  // the prompt runs in chunks of 16
  ASSERT_NE(engine->tokenizer(), nullptr);
  std::vector<int32_t> ids = engine->tokenizer()->Encode(EnglishPrompts(1)[0], /*add_special_tokens=*/true);
  ASSERT_GE(ids.size(), 20u);
  ids.resize(20);
  GenerateRequest r;
  r.prompt_token_ids = ids;
  r.params.prompt_logprobs = 5;
  r.params.max_tokens = 2;
  r.params.temperature = 0.7;  // sampling settings do not touch prompt_logprobs (raw, like vLLM)
  r.params.repetition_penalty = 1.3;
  r.params.seed = 11;
  r.request_id = "r";
  const PromptLp lp = RunAll(*engine, {r}).at("r").prompt_logprobs;
  ASSERT_EQ(lp.size(), ids.size());
  EXPECT_FALSE(lp[0].has_value());

  // Oracle 1: the engine's raw logprobs of the first token after each prefix, whole vocabulary.
  // Oracle 2: the raw logits of the same rows (raw_logits mode), log_softmax computed here.
  EngineArgs la = TinyArgs(1, 256);
  la.logprobs_mode = LogprobsMode::kRawLogits;
  auto logits_engine = Engine::Open(la);
  const int64_t V = engine->vocab_size();
  for (size_t p = 1; p < ids.size(); ++p) {
    ASSERT_TRUE(lp[p].has_value()) << p;
    const LogprobsEntry& e = *lp[p];
    EXPECT_EQ(e.chosen.token_id, ids[p]);
    ASSERT_EQ(e.top.size(), 5u);
    const LogprobsEntry all = FirstTokenAllLogprobs(*engine, ids, p);
    ASSERT_EQ(static_cast<int64_t>(all.top.size()), V);
    const TokenLogprob* want = nullptr;
    for (const TokenLogprob& t : all.top)
      if (t.token_id == ids[p]) want = &t;
    ASSERT_NE(want, nullptr);
    EXPECT_TRUE(SameLp(e.chosen, *want)) << "position " << p << ": " << e.chosen.logprob << " rank " << e.chosen.rank
                                         << " vs " << want->logprob << " rank " << want->rank;
    for (size_t k = 0; k < 5; ++k) EXPECT_TRUE(SameLp(e.top[k], all.top[k])) << "position " << p << " top " << k;

    const LogprobsEntry raw = FirstTokenAllLogprobs(*logits_engine, ids, p);
    ASSERT_EQ(static_cast<int64_t>(raw.top.size()), V);
    std::vector<double> x(static_cast<size_t>(V));
    for (const TokenLogprob& t : raw.top) x[static_cast<size_t>(t.token_id)] = t.logprob;  // raw logits here
    double m = -INFINITY;
    for (double v : x) m = std::max(m, v);
    double sum = 0;
    for (double v : x) sum += std::exp(v - m);
    const double xc = x[static_cast<size_t>(ids[p])];
    EXPECT_NEAR(e.chosen.logprob, (xc - m) - std::log(sum), 2e-5) << "position " << p;
    int64_t above = 0;
    for (double v : x) above += v > xc;
    EXPECT_EQ(e.chosen.rank, above + 1) << "position " << p;
    // The top-5 are the 5 largest logits.
    EXPECT_EQ(e.top[0].token_id, raw.top[0].token_id);
    EXPECT_EQ(e.top[4].token_id, raw.top[4].token_id);
  }
  // Raw logprobs of distinct positions differ (the entries really come from different rows).
  EXPECT_NE(lp[1]->top[0].logprob, lp[2]->top[0].logprob);
}

TEST_F(PromptLogprobsTiny, SameEntriesWhateverBatchBudgetOrPreemption) {
  const auto prompts = EnglishPrompts(12);
  std::vector<GenerateRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.prompt = prompts[i];
    r.params.temperature = 0;
    r.params.max_tokens = 4 + static_cast<int64_t>(i % 3);
    if (i % 3 != 2) r.params.prompt_logprobs = static_cast<int64_t>(i % 4);  // others: none, in the same batches
    r.request_id = std::to_string(i);
    reqs.push_back(r);
  }
  std::map<std::string, RequestOutput> alone;
  {
    auto e = Engine::Open(TinyArgs(1, 256));
    alone = RunAll(*e, reqs, /*alone=*/true);
  }
  int num_chunked = 0;
  for (const auto& r : reqs) {
    const RequestOutput& o = alone.at(r.request_id);
    if (!r.params.prompt_logprobs) {
      EXPECT_TRUE(o.prompt_logprobs.empty());
      continue;
    }
    ASSERT_EQ(static_cast<int64_t>(o.prompt_logprobs.size()), o.num_prompt_tokens) << r.request_id;
    num_chunked += o.num_prompt_tokens > 16;  // longer than the smallest budget: chunked below
    EXPECT_FALSE(o.prompt_logprobs[0].has_value());
    for (size_t p = 1; p < o.prompt_logprobs.size(); ++p) {
      ASSERT_TRUE(o.prompt_logprobs[p].has_value());
      EXPECT_EQ(static_cast<int64_t>(o.prompt_logprobs[p]->top.size()), *r.params.prompt_logprobs);
      EXPECT_TRUE(std::isfinite(o.prompt_logprobs[p]->chosen.logprob));
      EXPECT_LE(o.prompt_logprobs[p]->chosen.logprob, 0.0f);
    }
  }
  EXPECT_GE(num_chunked, 5);
  auto check = [&](const std::map<std::string, RequestOutput>& got, const std::string& what) {
    for (const auto& r : reqs) {
      EXPECT_EQ(got.at(r.request_id).token_ids, alone.at(r.request_id).token_ids) << what << " " << r.request_id;
      EXPECT_TRUE(SamePromptLp(got.at(r.request_id).prompt_logprobs, alone.at(r.request_id).prompt_logprobs))
          << what << " " << r.request_id;
    }
  };
  for (int64_t budget : {16, 64, 256}) {
    auto e = Engine::Open(TinyArgs(8, budget));
    check(RunAll(*e, reqs), "batched, max_num_batched_tokens " + std::to_string(budget));
  }
  {
    // A pool too small for the running requests (8 blocks = 128 tokens; the longest request needs
    // 126): recompute preemption, also in the middle of prompts at budget 16.
    auto e = Engine::Open(TinyArgs(8, 16, /*num_kv_blocks=*/8));
    check(RunAll(*e, reqs), "preemption");
    EXPECT_GT(e->Stats().num_preemptions, 0);
  }
}

TEST_F(PromptLogprobsTiny, MaxTokensOneAndZero) {
  auto engine = Engine::Open(TinyArgs(2, 64));
  GenerateRequest r;
  r.prompt = "The quick brown fox jumps over the lazy dog";
  r.params.prompt_logprobs = 0;
  r.params.max_tokens = 1;
  r.request_id = "one";
  const RequestOutput o = RunAll(*engine, {r}).at("one");
  EXPECT_EQ(o.token_ids.size(), 1u);
  ASSERT_EQ(static_cast<int64_t>(o.prompt_logprobs.size()), o.num_prompt_tokens);
  for (size_t p = 1; p < o.prompt_logprobs.size(); ++p) {
    ASSERT_TRUE(o.prompt_logprobs[p].has_value());
    EXPECT_TRUE(o.prompt_logprobs[p]->top.empty());  // prompt_logprobs 0: only the prompt token itself
    EXPECT_GE(o.prompt_logprobs[p]->chosen.rank, 1);
  }
  r.params.max_tokens = 0;  // vLLM: max_tokens must be at least 1
  try {
    engine->Submit(r);
    ADD_FAILURE() << "max_tokens 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
