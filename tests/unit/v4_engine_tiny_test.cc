// The serving core on the tiny V4 checkpoint (make-tiny --arch deepseek_v4,
// ctest fixture fixture_make_tiny_v4, or $DEEPINFER_TINY_V4_DIR) with the real tokenizer and the English
// prompts of tests/data/engine/english_prompts.jsonl: batched == alone with
// bit-identical raw logits, token budgets 16/64/256 and a pool small enough to
// preempt give identical tokens and logits, the pool is empty afterwards; and
// chunked prefill (chunks 1, 3, 16, 64, 128) == the whole prompt == the
// golden reference (model level, the engine's per-row layout, block size 16).
// CI runs the first 16 prompts; DEEPINFER_V4_ENGINE_FULL=1 runs all 64.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cache/cache_pool.h"
#include "deepinfer/engine.h"
#include "model/v4/model.h"
#include "sha256_testing.h"

namespace deepinfer {
namespace {

// $DEEPINFER_TINY_V4_DIR, else the checkpoint of the ctest fixture (fixture_make_tiny_v4).
std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_V4_DIR");
  return d && *d ? d : DEEPINFER_TINY_V4_FIXTURE;
}

std::vector<GenerateRequest> EnglishRequests() {
  const char* full = std::getenv("DEEPINFER_V4_ENGINE_FULL");
  const size_t n = full && std::string(full) == "1" ? 64 : 16;
  std::ifstream in(std::string(DEEPINFER_TEST_DATA) + "/engine/english_prompts.jsonl");
  std::vector<GenerateRequest> reqs;
  std::string line;
  while (reqs.size() < n && std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    GenerateRequest r;
    r.prompt = j["prompt"].get<std::string>();
    r.params.temperature = 0;
    r.params.max_tokens = j["max_tokens"].get<int64_t>();
    r.params.logprobs = 5;  // raw logits of the top 5 (raw_logits mode): compared bit for bit
    r.request_id = std::to_string(reqs.size());
    reqs.push_back(r);
  }
  return reqs;
}

struct Result {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<std::vector<std::pair<int32_t, float>>>> top_logits;
  EngineStats stats;
};

EngineArgs Args(int max_num_seqs, int64_t budget, int64_t num_kv_blocks = 0) {
  EngineArgs a;
  a.model = TinyDir();
  a.max_num_seqs = max_num_seqs;
  a.max_num_batched_tokens = budget;
  a.max_model_len = 512;
  a.block_size = 16;
  a.num_kv_blocks = num_kv_blocks;
  a.num_threads = 1;
  a.logprobs_mode = LogprobsMode::kRawLogits;
  return a;
}

Result RunAll(Engine& engine, const std::vector<GenerateRequest>& reqs, bool alone) {
  Result res;
  auto drain = [&] {
    while (engine.HasUnfinished()) {
      for (auto& o : engine.Step()) {
        if (!o.finished) continue;
        EXPECT_TRUE(o.error.empty()) << o.error;
        res.tokens[o.request_id] = o.token_ids;
        auto& tl = res.top_logits[o.request_id];
        for (const auto& e : o.logprobs) {
          std::vector<std::pair<int32_t, float>> row;
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

class V4EngineTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(TinyDir() + "/config.json"))
      GTEST_FAIL() << TinyDir() << ": no tiny V4 checkpoint (ctest's fixture makes it; or set DEEPINFER_TINY_V4_DIR)";
  }
};

TEST_F(V4EngineTiny, EnglishPromptsBatchedEqualAloneBudgetsPreemption) {
  const auto reqs = EnglishRequests();
  Result alone;
  {
    auto e = Engine::Open(Args(1, 256));
    ASSERT_NE(e->tokenizer(), nullptr);
    alone = RunAll(*e, reqs, /*alone=*/true);
  }
  ASSERT_EQ(alone.tokens.size(), reqs.size());
  int64_t n = 0;
  for (auto& [id, t] : alone.tokens) n += static_cast<int64_t>(t.size());
  EXPECT_GT(n, 5 * static_cast<int64_t>(reqs.size()));
  for (int64_t budget : {16, 64, 256}) {
    auto e = Engine::Open(Args(8, budget));
    Result r = RunAll(*e, reqs, false);
    EXPECT_EQ(r.tokens, alone.tokens) << "max_num_batched_tokens " << budget;
    EXPECT_EQ(r.top_logits, alone.top_logits) << "max_num_batched_tokens " << budget;  // raw logits, bit for bit
  }
  // A pool too small for all running requests at once: preemption, same tokens, empty pool after.
  {
    auto e = Engine::Open(Args(8, 256, /*num_kv_blocks=*/16));
    Result r = RunAll(*e, reqs, false);
    EXPECT_EQ(r.tokens, alone.tokens);
    EXPECT_EQ(r.top_logits, alone.top_logits);
    EXPECT_GT(r.stats.num_preemptions, 0);
    EXPECT_LE(r.stats.peak_kv_blocks_used, 16);
  }
}

// Chunked prefill at the model level in the engine's layout: the 129-token
// golden debug prompt (a full C128 group, selective C4 indexer) in chunks of
// 1, 3, 16, 64, 128 gives every row's final residual streams (the head's
// input) and the last logits bit-identical to the whole prompt, whose last
// logits equal the reference prefill.
TEST_F(V4EngineTiny, ChunkedPrefillEqualsWholeAndGolden) {
  std::ifstream f(std::string(DEEPINFER_TEST_DATA) + "/golden-tiny-v4/golden.json");
  const nlohmann::json g = nlohmann::json::parse(f);
  const std::vector<int32_t> ids = g["prompts"][6]["prompt"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(ids.size());
  auto model = v4::V4Model::Load(TinyDir());
  const StateGeometry geo = model->Geometry(16);
  CachePool pool(geo, geo.BlocksForTokens(T) + 1, 1);
  std::vector<int32_t> table(static_cast<size_t>(geo.BlocksForTokens(T)));
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  // Per chunk size: every row's final residual streams (what the head reads) and the last row's logits.
  auto run = [&](int64_t chunk, std::vector<float>* last) {
    pool.ResetSlot(0);
    std::vector<float> all, streams;
    for (int64_t s = 0; s < T; s += chunk) {
      const int64_t len = std::min(chunk, T - s);
      v4::V4Seq q{ids.data() + s, len, s, pool.View(0, table.data(), static_cast<int64_t>(table.size())),
                  s + len == T, false};
      *last = model->Forward({q}, /*per_row_layout=*/true, &streams);
      all.insert(all.end(), streams.begin(), streams.end());
    }
    return all;
  };
  std::vector<float> whole_last, last;
  const std::vector<float> whole = run(T, &whole_last);
  const int64_t V = model->config().vocab_size;
  ASSERT_EQ(static_cast<int64_t>(whole_last.size()), V);
  EXPECT_EQ(testing::Sha256Hex(whole_last.data(), V * 4),
            g["prompts"][6]["prefill"]["sha256_f32le"].get<std::string>());
  for (int64_t chunk : {1, 3, 16, 64, 128}) {
    const std::vector<float> c = run(chunk, &last);
    EXPECT_TRUE(c == whole) << "chunk " << chunk << ": streams of some row differ";
    EXPECT_TRUE(last == whole_last) << "chunk " << chunk << ": last logits differ";
  }
}

}  // namespace
}  // namespace deepinfer
