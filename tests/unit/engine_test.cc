// Engine tests over a "canary" model backend: it stores per-position markers
// in every state kind of the paged pool, verifies on every step that it reads
// back exactly its own sequence's rows, and derives its logits from what it
// read. So any cache-addressing, scheduling, preemption or padding bug changes
// the tokens or throws. The real model is tested in its own suites.
#include "deepinfer/engine.h"

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "base/error.h"
#include "engine/backend.h"
#include "canary_backend.h"
#include "logprobs_testing.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

using test_support::CanaryBackend;
using test_support::kNanToken;
using test_support::kVocab;
using test_support::kWindow;
using test_support::Args;

std::vector<GenerateRequest> MakeRequests(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    std::vector<int32_t> ids(1 + rng() % 40);
    for (auto& t : ids) t = 2 + static_cast<int32_t>(rng() % 290);
    r.prompt_token_ids = ids;
    r.params.max_tokens = 1 + static_cast<int64_t>(rng() % 20);
    if (i % 2) {
      r.params.temperature = 0.0;
    } else {
      r.params.temperature = 0.9;
      r.params.seed = 1000 + i;
      r.params.top_p = 0.9;
    }
    if (i % 5 == 0) r.params.logprobs = 3;
    r.request_id = std::to_string(i);
    reqs.push_back(r);
  }
  return reqs;
}

struct RunResult {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::string> finish;
  std::map<std::string, std::vector<float>> logprobs;
  EngineStats stats;
};

RunResult RunEngine(const EngineArgs& args, const std::vector<GenerateRequest>& reqs, bool one_at_a_time = false) {
  auto engine = Engine::OpenWithBackend(args, std::make_unique<CanaryBackend>(), nullptr);
  RunResult res;
  auto drain = [&] {
    while (engine->HasUnfinished()) {
      for (auto& o : engine->Step()) {
        auto& toks = res.tokens[o.request_id];
        toks.insert(toks.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        for (auto& lp : o.new_logprobs) res.logprobs[o.request_id].push_back(lp.chosen.logprob);
        if (o.finished) {
          res.finish[o.request_id] = o.finish_reason;
          EXPECT_EQ(o.token_ids, toks);
        }
      }
    }
  };
  for (const auto& r : reqs) {
    engine->Submit(r);
    if (one_at_a_time) drain();
  }
  drain();
  res.stats = engine->Stats();
  EXPECT_EQ(res.stats.num_kv_blocks_used, 0);
  EXPECT_EQ(res.stats.num_running, 0);
  return res;
}

TEST(Engine, BatchedEqualsAloneForEveryRequest) {
  auto reqs = MakeRequests(24, 7);
  RunResult alone = RunEngine(Args(1, 512), reqs, /*one_at_a_time=*/true);
  RunResult batched = RunEngine(Args(8, 512), reqs);
  EXPECT_EQ(batched.tokens, alone.tokens);
  EXPECT_EQ(batched.finish, alone.finish);
  EXPECT_EQ(batched.logprobs, alone.logprobs);
  int total = 0;
  for (auto& [id, t] : alone.tokens) total += static_cast<int>(t.size());
  EXPECT_GT(total, 100);
}

TEST(Engine, TokenBudgetsGiveIdenticalTokens) {
  auto reqs = MakeRequests(16, 11);
  RunResult ref = RunEngine(Args(8, 256), reqs);
  for (int64_t budget : {3, 16, 64}) {
    RunResult r = RunEngine(Args(8, budget), reqs);
    EXPECT_EQ(r.tokens, ref.tokens) << "budget " << budget;
  }
}

TEST(Engine, SmallPoolPreemptsAndCompletesEverything) {
  auto reqs = MakeRequests(16, 13);
  RunResult ref = RunEngine(Args(8, 256), reqs);
  RunResult small = RunEngine(Args(8, 256, /*blocks=*/16), reqs);  // each request needs up to 15 blocks
  EXPECT_EQ(small.tokens, ref.tokens);
  EXPECT_GT(small.stats.num_preemptions, 0);
  EXPECT_LE(small.stats.peak_kv_blocks_used, 16);
  EXPECT_EQ(small.stats.num_kv_blocks_used, 0);
}

TEST(Engine, PaddingRowsNeverTouchRealState) {
  auto reqs = MakeRequests(12, 17);
  RunResult ref = RunEngine(Args(4, 64), reqs);
  EngineArgs a = Args(4, 64);
  a.prefill_token_buckets = {8, 32, 64};
  a.decode_batch_buckets = {2, 4};
  a.prompt_as_decode_max_tokens = 2;
  RunResult padded = RunEngine(a, reqs);
  EXPECT_EQ(padded.tokens, ref.tokens);
}

TEST(Engine, BadRequestsAreRejectedAndTheEngineGoesOn) {
  auto engine = Engine::OpenWithBackend(Args(4, 64), std::make_unique<CanaryBackend>(), nullptr);
  GenerateRequest empty;
  empty.prompt_token_ids = std::vector<int32_t>{};
  EXPECT_THROW(engine->Submit(empty), Error);
  GenerateRequest too_long;
  too_long.prompt_token_ids = std::vector<int32_t>(120, 5);
  too_long.params.max_tokens = 20;
  try {
    engine->Submit(too_long);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds max_model_len 128"), std::string::npos) << e.what();
  }
  GenerateRequest bad_id;
  bad_id.prompt_token_ids = std::vector<int32_t>{5, 300};
  EXPECT_THROW(engine->Submit(bad_id), Error);
  GenerateRequest bad_param;
  bad_param.prompt_token_ids = std::vector<int32_t>{5};
  bad_param.params.top_p = 1.5;
  EXPECT_THROW(engine->Submit(bad_param), Error);
  GenerateRequest text;
  text.prompt = "hello";
  EXPECT_THROW(engine->Submit(text), Error);  // no tokenizer in this engine
  GenerateRequest ok;
  ok.prompt_token_ids = std::vector<int32_t>{5, 6, 7};
  ok.params.max_tokens = 4;
  ok.params.temperature = 0;
  engine->Submit(ok);
  int n = 0;
  while (engine->HasUnfinished())
    for (auto& o : engine->Step()) n += static_cast<int>(o.new_token_ids.size());
  EXPECT_GE(n, 1);
}

TEST(Engine, NanLogitsFailOneRequestOnly) {
  auto reqs = MakeRequests(6, 19);
  RunResult ref = RunEngine(Args(8, 256), reqs);
  GenerateRequest poison;
  poison.prompt_token_ids = std::vector<int32_t>{5, kNanToken, 6};
  poison.request_id = "poison";
  auto with = reqs;
  with.insert(with.begin() + 3, poison);
  RunResult r = RunEngine(Args(8, 256), with);
  EXPECT_EQ(r.finish["poison"], "error");
  r.tokens.erase("poison");
  r.finish.erase("poison");
  EXPECT_EQ(r.tokens, ref.tokens);
}

TEST(Engine, AbortFreesBlocksAtOnce) {
  auto engine = Engine::OpenWithBackend(Args(4, 64), std::make_unique<CanaryBackend>(), nullptr);
  GenerateRequest r;
  r.prompt_token_ids = std::vector<int32_t>(30, 9);
  r.params.max_tokens = 50;
  r.params.ignore_eos = true;
  const uint64_t id = engine->Submit(r);
  engine->Step();
  engine->Step();
  EXPECT_GT(engine->Stats().num_kv_blocks_used, 0);
  engine->Abort(id);
  EXPECT_EQ(engine->Stats().num_kv_blocks_used, 0);
  auto outs = engine->Step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(outs[0].finished);
  EXPECT_EQ(outs[0].finish_reason, "abort");
  EXPECT_FALSE(engine->HasUnfinished());
}

// ---------------------------------------------------------------------------
// prompt_logprobs

using test_util::PromptLp;
using test_util::SameEntry;
using test_util::SamePromptLp;

struct PlpRun {
  std::map<std::string, PromptLp> plp;           // from the finished output
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, int> num_incremental;    // unfinished outputs that carried prompt_logprobs
  int64_t all_logits_rows = 0;
  EngineStats stats;
};

// Runs the requests; checks on the way that prompt_logprobs are reported once
// before (or with) the first token, and again, equal, in the finished output.
PlpRun RunPlp(const EngineArgs& args, const std::vector<GenerateRequest>& reqs, bool one_at_a_time = false) {
  auto backend = std::make_unique<CanaryBackend>();
  CanaryBackend* canary = backend.get();
  auto engine = Engine::OpenWithBackend(args, std::move(backend), nullptr);
  PlpRun res;
  std::map<std::string, PromptLp> first;
  std::map<std::string, bool> wants;
  for (const auto& r : reqs) wants[r.request_id] = r.params.prompt_logprobs.has_value();
  auto drain = [&] {
    while (engine->HasUnfinished()) {
      for (auto& o : engine->Step()) {
        auto& toks = res.tokens[o.request_id];
        if (wants.at(o.request_id) && !o.new_token_ids.empty() && toks.empty()) {
          // the first token comes with or after prompt_logprobs
          EXPECT_TRUE(first.count(o.request_id) || !o.prompt_logprobs.empty()) << o.request_id;
        }
        if (!wants.at(o.request_id)) {
          EXPECT_TRUE(o.prompt_logprobs.empty());
        }
        toks.insert(toks.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (!o.prompt_logprobs.empty()) {
          if (!o.finished) {
            ++res.num_incremental[o.request_id];
            EXPECT_FALSE(first.count(o.request_id)) << "reported twice: " << o.request_id;
          }
          if (!first.count(o.request_id)) first[o.request_id] = o.prompt_logprobs;
        }
        if (o.finished) {
          EXPECT_EQ(o.finish_reason == "error", !o.error.empty());
          res.plp[o.request_id] = o.prompt_logprobs;
          if (first.count(o.request_id)) {
            EXPECT_TRUE(SamePromptLp(first[o.request_id], o.prompt_logprobs));
          }
        }
      }
    }
  };
  for (const auto& r : reqs) {
    engine->Submit(r);
    if (one_at_a_time) drain();
  }
  drain();
  res.all_logits_rows = canary->num_all_logits_rows;
  res.stats = engine->Stats();
  EXPECT_EQ(res.stats.num_kv_blocks_used, 0);
  return res;
}

std::vector<GenerateRequest> PlpRequests(int n, uint32_t seed) {
  auto reqs = MakeRequests(n, seed);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 4 == 3) continue;  // some requests without prompt_logprobs in the same batches
    reqs[i].params.prompt_logprobs = static_cast<int64_t>(i % 3 == 0 ? 0 : 1 + i % 5);
  }
  return reqs;
}

// The oracle: prompt[0..p) alone, max_tokens 1, raw logprobs of the whole
// vocabulary for the first generated token = the logits at position p-1.
LogprobsEntry PrefixOracle(const std::vector<int32_t>& prompt, int64_t p, int64_t num_top) {
  EngineArgs a = Args(1, 512);
  a.max_logprobs = -1;
  auto engine = Engine::OpenWithBackend(a, std::make_unique<CanaryBackend>(), nullptr);
  GenerateRequest r;
  r.prompt_token_ids = std::vector<int32_t>(prompt.begin(), prompt.begin() + p);
  r.params.max_tokens = 1;
  r.params.temperature = 0;
  r.params.logprobs = -1;
  engine->Submit(r);
  std::optional<LogprobsEntry> all;
  while (engine->HasUnfinished())
    for (auto& o : engine->Step())
      if (o.finished && !o.logprobs.empty()) all = o.logprobs[0];
  if (!all) ADD_FAILURE() << "no logprobs for prefix " << p;
  LogprobsEntry e;
  if (!all) return e;
  EXPECT_EQ(static_cast<int64_t>(all->top.size()), kVocab);
  for (const TokenLogprob& t : all->top)
    if (t.token_id == prompt[static_cast<size_t>(p)]) e.chosen = t;
  EXPECT_EQ(e.chosen.token_id, prompt[static_cast<size_t>(p)]);
  const int64_t n = num_top < 0 ? kVocab : num_top;
  e.top.assign(all->top.begin(), all->top.begin() + n);
  return e;
}

TEST(EnginePromptLogprobs, EqualRawLogprobsOfEachPrefixAlone) {
  std::mt19937 rng(23);
  for (int64_t num_top : {0, 3, -1}) {
    GenerateRequest r;
    std::vector<int32_t> prompt(9);
    for (auto& t : prompt) t = 2 + static_cast<int32_t>(rng() % 290);
    r.prompt_token_ids = prompt;
    r.params.max_tokens = 3;
    r.params.temperature = 0.8;  // sampling settings do not touch prompt_logprobs (raw)
    r.params.repetition_penalty = 1.7;
    r.params.logit_bias = {{static_cast<int64_t>(prompt[1]), 30.0}};
    r.params.seed = 5;
    r.params.prompt_logprobs = num_top;
    r.request_id = "r";
    EngineArgs a = Args(4, 4);  // chunks of 4 tokens
    a.max_logprobs = -1;
    a.logprobs_mode = LogprobsMode::kProcessedLogprobs;  // ignored by prompt_logprobs
    PlpRun run = RunPlp(a, {r});
    const PromptLp& lp = run.plp.at("r");
    ASSERT_EQ(lp.size(), prompt.size());
    EXPECT_FALSE(lp[0].has_value());
    for (int64_t p = 1; p < static_cast<int64_t>(prompt.size()); ++p) {
      ASSERT_TRUE(lp[p].has_value()) << p;
      const LogprobsEntry want = PrefixOracle(prompt, p, num_top);
      EXPECT_TRUE(SameEntry(*lp[p], want)) << "position " << p << " num_top " << num_top;
      EXPECT_EQ(lp[p]->chosen.token_id, prompt[p]);
      EXPECT_LT(lp[p]->chosen.logprob, 0.0f);
      EXPECT_GE(lp[p]->chosen.rank, 1);
    }
  }
}

TEST(EnginePromptLogprobs, InvariantUnderBatchingBudgetsAndPreemption) {
  const auto reqs = PlpRequests(16, 29);
  PlpRun alone = RunPlp(Args(1, 512), reqs, /*one_at_a_time=*/true);
  int64_t want_rows = 0;
  for (const auto& r : reqs) {
    const size_t P = r.prompt_token_ids->size();
    const PromptLp& lp = alone.plp.at(r.request_id);
    if (!r.params.prompt_logprobs) {
      EXPECT_TRUE(lp.empty());
      continue;
    }
    if (P >= 2) want_rows += static_cast<int64_t>(P);  // one whole-prompt chunk each: P rows
    ASSERT_EQ(lp.size(), P) << r.request_id;
    EXPECT_FALSE(lp[0].has_value());
    for (size_t p = 1; p < P; ++p) {
      ASSERT_TRUE(lp[p].has_value());
      EXPECT_EQ(lp[p]->chosen.token_id, (*r.prompt_token_ids)[p]);
      EXPECT_EQ(static_cast<int64_t>(lp[p]->top.size()), *r.params.prompt_logprobs);
    }
  }
  EXPECT_EQ(alone.all_logits_rows, want_rows);  // only requests with prompt_logprobs ask for every row
  auto check = [&](const PlpRun& run, const std::string& what) {
    EXPECT_EQ(run.tokens, alone.tokens) << what;
    for (const auto& r : reqs)
      EXPECT_TRUE(SamePromptLp(run.plp.at(r.request_id), alone.plp.at(r.request_id))) << what << " " << r.request_id;
  };
  check(RunPlp(Args(8, 512), reqs), "batched");
  for (int64_t budget : {3, 16, 64}) check(RunPlp(Args(8, budget), reqs), "budget " + std::to_string(budget));
  PlpRun small = RunPlp(Args(8, 256, /*blocks=*/16), reqs);
  EXPECT_GT(small.stats.num_preemptions, 0);
  check(small, "preemption");
  // Whole prompts fit one chunk, so a request is only preempted after its entries exist: the
  // recompute does not ask for prompt rows again.
  EXPECT_EQ(small.all_logits_rows, want_rows);
  // Chunked prefill + preemption mid-prompt: recomputed rows are skipped, still one entry per position.
  PlpRun chunked = RunPlp(Args(8, 8, /*blocks=*/16), reqs);
  EXPECT_GT(chunked.stats.num_preemptions, 0);
  check(chunked, "preemption, budget 8");
}

TEST(EnginePromptLogprobs, NoneAskedNoPromptRows) {
  auto reqs = MakeRequests(8, 31);
  PlpRun run = RunPlp(Args(4, 16), reqs);
  EXPECT_EQ(run.all_logits_rows, 0);
  for (auto& [id, lp] : run.plp) EXPECT_TRUE(lp.empty()) << id;
}

TEST(EnginePromptLogprobs, OneTokenPromptMaxTokensOneAndBadValues) {
  GenerateRequest one;
  one.prompt_token_ids = std::vector<int32_t>{42};
  one.params.prompt_logprobs = 5;
  one.params.max_tokens = 1;
  one.request_id = "one";
  GenerateRequest two = one;
  two.prompt_token_ids = std::vector<int32_t>{42, 43};
  two.request_id = "two";
  PlpRun run = RunPlp(Args(4, 64), {one, two});
  ASSERT_EQ(run.plp.at("one").size(), 1u);
  EXPECT_FALSE(run.plp.at("one")[0].has_value());
  ASSERT_EQ(run.plp.at("two").size(), 2u);
  ASSERT_TRUE(run.plp.at("two")[1].has_value());
  EXPECT_TRUE(SameEntry(*run.plp.at("two")[1], PrefixOracle({42, 43}, 1, 5)));
  EXPECT_EQ(run.tokens.at("two").size(), 1u);

  auto engine = Engine::OpenWithBackend(Args(4, 64), std::make_unique<CanaryBackend>(), nullptr);
  auto expect_error = [&](GenerateRequest r, const std::string& needle) {
    try {
      engine->Submit(r);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  GenerateRequest bad = two;
  bad.params.prompt_logprobs = 50;  // above max_logprobs 20
  expect_error(bad, "prompt_logprobs must be in [0, 20]");
  bad.params.prompt_logprobs = -2;
  expect_error(bad, "prompt_logprobs must be -1 (whole vocabulary) or >= 0, got -2");
  bad.params.prompt_logprobs = -1;  // the whole vocabulary (300) is above max_logprobs 20
  expect_error(bad, "prompt_logprobs must be in [0, 20]");
  bad.params.prompt_logprobs = 1;
  bad.params.max_tokens = 0;  // vLLM: max_tokens must be at least 1
  expect_error(bad, "max_tokens");
  EXPECT_FALSE(engine->HasUnfinished());
}

TEST(EnginePromptLogprobs, NanInPromptRowsFailsThatRequestOnly) {
  auto reqs = PlpRequests(6, 37);
  PlpRun ref = RunPlp(Args(8, 256), reqs);
  GenerateRequest poison;
  // kNanToken at position 2: the canary's rows of that chunk from position 2 on are NaN.
  poison.prompt_token_ids = std::vector<int32_t>{5, 6, kNanToken, 7, 8, 9, 10, 11};
  poison.params.prompt_logprobs = 2;
  poison.request_id = "poison";
  auto with = reqs;
  with.insert(with.begin() + 2, poison);
  auto engine = Engine::OpenWithBackend(Args(8, 4), std::make_unique<CanaryBackend>(), nullptr);
  for (const auto& r : with) engine->Submit(r);
  std::map<std::string, RequestOutput> fin;
  while (engine->HasUnfinished())
    for (auto& o : engine->Step())
      if (o.finished) fin[o.request_id] = o;
  EXPECT_EQ(fin.at("poison").finish_reason, "error");
  EXPECT_NE(fin.at("poison").error.find("prompt_logprobs at prompt position 3"), std::string::npos)
      << fin.at("poison").error;
  EXPECT_TRUE(fin.at("poison").prompt_logprobs.empty());
  for (const auto& r : reqs) {
    EXPECT_EQ(fin.at(r.request_id).token_ids, ref.tokens.at(r.request_id));
    EXPECT_TRUE(SamePromptLp(fin.at(r.request_id).prompt_logprobs, ref.plp.at(r.request_id)));
  }
}

}  // namespace
}  // namespace deepinfer
