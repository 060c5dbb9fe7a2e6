// Speculative decoding on the tiny V4 checkpoint (docs/speculative.md; ctest
// fixture fixture_make_tiny_v4 or $DEEPINFER_TINY_V4_DIR):
//  - the MTP drafter (method "mtp") through the engine: greedy tokens and raw
//    logits bit-identical to speculation off, batched (8 sequences), under a
//    16-token budget and under preemption, the pool empty afterwards, drafts
//    verified every decode step;
//  - n-gram drafts on V4 (logit_bias makes the random model's output loop, so
//    drafts are accepted in part): lossless too, with real partial acceptance;
//  - the drafter contract on the backend (engine/backend.h): the first draft
//    after the prefill is the argmax of the recorded MTP prefill draft
//    (golden mtp/promptNN_mtp_prefill_draft.f32); a verification chunk that
//    crosses a C4 and the C128 group boundary, rolled back to each kept
//    length, leaves every fixed state byte (window rings, MTP ring,
//    compressor carries) and the next draft and logits equal to feeding only
//    the kept tokens one at a time.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cache/cache_pool.h"
#include "deepinfer/engine.h"
#include "engine/backend.h"
#include "engine/v4_backend.h"

namespace deepinfer {
namespace {

std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_V4_DIR");
  return d && *d ? d : DEEPINFER_TINY_V4_FIXTURE;
}

nlohmann::json Golden() {
  std::ifstream f(std::string(DEEPINFER_TEST_DATA) + "/golden-tiny-v4/golden.json");
  return nlohmann::json::parse(f);
}

// The first n English prompts, greedy, raw top-5 logits; loop_bias: three of
// four get logit_bias +100 on three ids (repetitive output for n-gram drafts).
std::vector<GenerateRequest> Requests(size_t n, int64_t extra_tokens, bool loop_bias) {
  std::ifstream in(std::string(DEEPINFER_TEST_DATA) + "/engine/english_prompts.jsonl");
  std::vector<GenerateRequest> reqs;
  std::string line;
  while (reqs.size() < n && std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    GenerateRequest r;
    const int i = static_cast<int>(reqs.size());
    r.prompt = j["prompt"].get<std::string>();
    r.params.temperature = 0;
    r.params.max_tokens = j["max_tokens"].get<int64_t>() + extra_tokens;
    r.params.logprobs = 5;
    r.request_id = std::to_string(i);
    if (loop_bias && i % 4 != 3)
      for (int64_t id : {1000 + 7 * i, 5000 + 13 * i, 20000 + i}) r.params.logit_bias[id] = 100.0;
    reqs.push_back(r);
  }
  return reqs;
}

EngineArgs Args(int max_num_seqs, int64_t budget, const std::string& spec, int64_t num_kv_blocks = 0) {
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

struct Result {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<std::vector<std::pair<int32_t, float>>>> top;
  EngineStats stats;
};

Result RunEngine(const EngineArgs& args, const std::vector<GenerateRequest>& reqs) {
  auto engine = Engine::Open(args);
  for (const auto& r : reqs) engine->Submit(r);
  Result res;
  while (engine->HasUnfinished())
    for (auto& o : engine->Step()) {
      if (!o.finished) continue;
      EXPECT_TRUE(o.error.empty()) << o.error;
      res.tokens[o.request_id] = o.token_ids;
      for (const auto& e : o.logprobs) {
        std::vector<std::pair<int32_t, float>> row;
        for (const auto& t : e.top) row.emplace_back(t.token_id, t.logprob);
        res.top[o.request_id].push_back(row);
      }
    }
  res.stats = engine->Stats();
  EXPECT_EQ(res.stats.num_kv_blocks_used, 0);
  return res;
}

class V4SpeculativeTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(TinyDir() + "/config.json"))
      GTEST_FAIL() << TinyDir() << ": no tiny V4 checkpoint (ctest's fixture makes it; or set DEEPINFER_TINY_V4_DIR)";
  }
};

constexpr const char* kMtp = R"({"method": "mtp", "num_speculative_tokens": 1})";

TEST_F(V4SpeculativeTiny, MtpGreedyEqualsOffBatchedBudgetPreemption) {
  const auto reqs = Requests(16, 4, false);
  const Result off = RunEngine(Args(8, 256, ""), reqs);
  ASSERT_EQ(off.tokens.size(), reqs.size());
  int64_t n_out = 0;
  for (const auto& [id, t] : off.tokens) n_out += static_cast<int64_t>(t.size());
  for (auto [budget, blocks] : {std::pair<int64_t, int64_t>{256, 0}, {16, 0}, {256, 16}}) {
    SCOPED_TRACE("budget " + std::to_string(budget) + " blocks " + std::to_string(blocks));
    const Result on = RunEngine(Args(8, budget, kMtp, blocks), reqs);
    EXPECT_EQ(on.tokens, off.tokens) << "budget " << budget << " blocks " << blocks;
    EXPECT_EQ(on.top, off.top) << "budget " << budget << " blocks " << blocks;  // raw logits, bit for bit
    // Every decode step but the last of each request (no room under max_tokens) verifies one draft; an
    // accepted draft saves a step. A tight budget may trim drafts, and a prompt chunked so that only
    // its last token is left verifies a draft of the first output token with it (one more per request).
    const int64_t R = static_cast<int64_t>(reqs.size());
    const int64_t verified = on.stats.spec_num_drafts + on.stats.spec_num_accepted_tokens;
    EXPECT_GT(on.stats.spec_num_drafts, n_out / 2);
    EXPECT_LE(verified, n_out - R);
    if (budget == 256 && blocks == 0) {
      EXPECT_EQ(verified, n_out - 2 * R);
    }
    EXPECT_EQ(on.stats.spec_num_draft_tokens, on.stats.spec_num_drafts);
    EXPECT_EQ(on.stats.spec_num_accepted_tokens_per_pos.size(), 1u);
    EXPECT_EQ(on.stats.spec_num_accepted_tokens_per_pos[0], on.stats.spec_num_accepted_tokens);
    if (blocks) {
      EXPECT_GT(on.stats.num_preemptions, 0);
    }
  }
}

TEST_F(V4SpeculativeTiny, NgramLosslessWithPartialAcceptance) {
  const auto reqs = Requests(16, 24, true);
  const Result off = RunEngine(Args(8, 256, ""), reqs);
  const char* spec = R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3})";
  for (int64_t blocks : {0, 24}) {
    const Result on = RunEngine(Args(8, blocks ? 64 : 256, spec, blocks), reqs);
    EXPECT_EQ(on.tokens, off.tokens) << "blocks " << blocks;
    EXPECT_EQ(on.top, off.top) << "blocks " << blocks;
    EXPECT_GT(on.stats.spec_num_accepted_tokens, 0);
    EXPECT_LT(on.stats.spec_num_accepted_tokens, on.stats.spec_num_draft_tokens);  // partial acceptance
    EXPECT_GT(on.stats.spec_num_accepted_tokens_per_pos[1], 0);
    if (blocks) {
      EXPECT_GT(on.stats.num_preemptions, 0);
    }
  }
}

TEST_F(V4SpeculativeTiny, MtpRefusedWithKAboveOneAndOnModelsWithoutIt) {
  try {
    Engine::Open(Args(8, 256, R"({"method": "mtp", "num_speculative_tokens": 2})"));
    ADD_FAILURE() << "mtp with k 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--speculative-config"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("num_speculative_tokens must be 1"), std::string::npos) << e.what();
  }
  ModelConfig cfg;
  cfg.model_type = "deepseek_v41";
  cfg.arch = Arch::kDeepseekV41;
  cfg.window_size = 16;
  cfg.n_mtp_layers = 2;
  try {
    ValidateSpeculativeConfig(ParseSpeculativeConfig(kMtp), cfg);
    ADD_FAILURE() << "mtp accepted on deepseek_v41";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek_v4 model with an MTP block"), std::string::npos) << e.what();
  }
}

// The drafter contract driven by hand, as the engine drives it.
class Driver {
 public:
  explicit Driver(int slots) : backend_(OpenV4Backend(TinyDir())) {
    SpeculativeConfig spec = ParseSpeculativeConfig(kMtp);
    drafter_ = backend_->EnableDrafter(spec);
    geo_ = backend_->Geometry(16);
    pool_ = std::make_unique<CachePool>(geo_, 40, slots);
    tables_.resize(static_cast<size_t>(slots));
    for (int s = 0; s < slots; ++s)
      for (int b = 0; b < 20; ++b) tables_[s].push_back(s * 20 + b);
  }
  ModelDrafter* drafter() const { return drafter_; }
  ModelBackend& backend() { return *backend_; }
  void Reset(int slot) { pool_->ResetSlot(slot); }
  SequenceStateView View(int slot) const { return pool_->View(slot, tables_[slot].data(), 20); }
  // Feeds tokens[start, start+len) of `ids` (all rows' logits); keeps `kept` rows
  // (rollback of the rest); the drafter then sees the kept rows. Returns the draft.
  int32_t Step(int slot, const std::vector<int32_t>& ids, int64_t start, int64_t len, int64_t kept,
               std::vector<float>* logits) {
    BackendSeq b;
    b.tokens = ids.data() + start;
    b.len = len;
    b.start_pos = start;
    b.state = View(slot);
    b.want_logits = true;
    b.all_logits = len > 1 && start > 0;
    std::vector<float> cap;
    FixedStateSnapshot snap;
    if (kept < len) {
      SnapshotFixedState(b.state, start, len, &snap);
      cap.assign(static_cast<size_t>(backend_->CarryCaptureFloats(geo_, len)), 0.0f);
      b.carry_capture = cap.data();
    }
    backend_->Forward({b}, logits);
    if (kept < len) backend_->RollbackSpeculative(b.state, snap, start + kept, cap.data(), nullptr, 0);
    DraftSeq d;
    d.forward_index = 0;
    d.kept = kept;
    d.next_tokens = ids.data() + start + 1;
    d.state = b.state;
    d.max_drafts = 1;
    std::vector<DraftProposal> props;
    drafter_->Draft({d}, &props);
    EXPECT_EQ(props.size(), 1u);
    EXPECT_EQ(props[0].ids.size(), 1u);
    return props.empty() || props[0].ids.empty() ? -1 : props[0].ids[0];
  }
  // The slot's fixed-kind bytes (window rings incl. MTP's, compressor carries).
  std::vector<uint8_t> Fixed(int slot) const {
    std::vector<uint8_t> out;
    const SequenceStateView v = View(slot);
    for (StateKind k : {StateKind::kWindow, StateKind::kCompressorCarry}) {
      const auto& regs = geo_.of(k).regions;
      for (size_t r = 0; r < regs.size(); ++r) {
        const uint8_t* p = v.Row(k, static_cast<int>(r), 0);
        out.insert(out.end(), p, p + regs[r].block_bytes());
      }
    }
    return out;
  }

 private:
  std::unique_ptr<ModelBackend> backend_;
  ModelDrafter* drafter_ = nullptr;
  StateGeometry geo_;
  std::unique_ptr<CachePool> pool_;
  std::vector<std::vector<int32_t>> tables_;
};

int32_t Argmax(const float* x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return static_cast<int32_t>(b);
}

TEST_F(V4SpeculativeTiny, FirstDraftAfterPrefillIsTheGoldenMtpDraftArgmax) {
  const nlohmann::json g = Golden();
  Driver drv(1);
  ASSERT_NE(drv.drafter(), nullptr);
  const int64_t V = drv.backend().vocab_size();
  for (const auto& [key, M] : g["mtp"].items()) {
    const int idx = M["prompt_index"].get<int>();
    std::vector<int32_t> ids = g["prompts"][idx]["prompt"].get<std::vector<int32_t>>();
    const int64_t T = static_cast<int64_t>(ids.size());
    // The recorded draft logits after the prefill: their argmax.
    const std::string file = std::string(DEEPINFER_TEST_DATA) + "/golden-tiny-v4/" +
                             M["steps"][0]["draft_file"].get<std::string>();
    std::ifstream in(file, std::ios::binary);
    std::vector<float> rec(static_cast<size_t>(V));
    in.read(reinterpret_cast<char*>(rec.data()), V * 4);
    ASSERT_TRUE(in) << file;
    ASSERT_EQ(Argmax(rec.data(), V), M["steps"][0]["draft"]["argmax"].get<int32_t>());
    std::vector<float> logits;
    // The engine's prefill step: the prompt chunk, then the drafter on every row with the sampled token appended.
    ids.push_back(0);
    BackendSeq b;
    b.tokens = ids.data();
    b.len = T;
    b.state = drv.View(0);
    b.want_logits = true;
    drv.backend().Forward({b}, &logits);
    ids[T] = Argmax(logits.data(), V);
    EXPECT_EQ(ids[T], M["greedy_tokens"][0].get<int32_t>()) << "prompt " << idx;
    DraftSeq d;
    d.forward_index = 0;
    d.kept = T;
    d.next_tokens = ids.data() + 1;
    d.state = b.state;
    d.max_drafts = 1;
    std::vector<DraftProposal> props;
    drv.drafter()->Draft({d}, &props);
    ASSERT_EQ(props.size(), 1u);
    ASSERT_EQ(props[0].ids.size(), 1u);
    EXPECT_EQ(props[0].ids[0], Argmax(rec.data(), V)) << "prompt " << idx;
  }
}

// Verification chunk [x0, x1, x2, x3] at positions 126..129 of a 126-token
// prompt (position 127 completes a C4 group and the first C128 group), kept
// 1..4 rows: state, draft and the following logits equal the sequential run.
TEST_F(V4SpeculativeTiny, RollbackToEachKeptLengthEqualsFeedingOnlyKeptTokens) {
  const nlohmann::json g = Golden();
  std::vector<int32_t> ids = g["prompts"][6]["prompt"].get<std::vector<int32_t>>();
  ids.resize(126);
  const int64_t P = 126, n_steps = 6;
  Driver drv(2);
  const int64_t V = drv.backend().vocab_size();
  // Reference (slot 0): prefill, then one token at a time (greedy), recording drafts, logits, fixed bytes.
  std::vector<float> logits;
  ids.push_back(0);
  std::vector<int32_t> ref_draft;
  std::vector<std::vector<float>> ref_logits;
  std::vector<std::vector<uint8_t>> ref_fixed;
  {
    BackendSeq b;
    b.tokens = ids.data();
    b.len = P;
    b.state = drv.View(0);
    b.want_logits = true;
    drv.backend().Forward({b}, &logits);
    ids[P] = Argmax(logits.data(), V);
    DraftSeq d{0, P, ids.data() + 1, b.state, 1};
    std::vector<DraftProposal> props;
    drv.drafter()->Draft({d}, &props);
    ref_draft.push_back(props.at(0).ids.at(0));
    ref_fixed.push_back(drv.Fixed(0));
  }
  for (int64_t s = 0; s < n_steps; ++s) {
    ids.push_back(0);
    // One decode row at position P + s; its next token is the greedy one.
    BackendSeq b;
    b.tokens = ids.data() + P + s;
    b.len = 1;
    b.start_pos = P + s;
    b.state = drv.View(0);
    b.want_logits = true;
    drv.backend().Forward({b}, &logits);
    ref_logits.push_back(logits);
    ids[P + s + 1] = Argmax(logits.data(), V);
    DraftSeq d{0, 1, ids.data() + P + s + 1, b.state, 1};
    std::vector<DraftProposal> props;
    drv.drafter()->Draft({d}, &props);
    ref_draft.push_back(props.at(0).ids.at(0));
    ref_fixed.push_back(drv.Fixed(0));
  }
  for (int64_t kept = 1; kept <= 4; ++kept) {
    SCOPED_TRACE("kept " + std::to_string(kept));
    // Slot 1: fresh prefill, the 4-row chunk kept to `kept` rows, then single rows.
    drv.Reset(1);
    const int32_t d0 = drv.Step(1, ids, 0, P, P, &logits);
    EXPECT_EQ(d0, ref_draft[0]);
    EXPECT_EQ(drv.Fixed(1), ref_fixed[0]);
    const int32_t dk = drv.Step(1, ids, P, 4, kept, &logits);
    for (int64_t j = 0; j < kept; ++j)  // the kept rows' logits equal the single-row ones
      EXPECT_TRUE(std::equal(ref_logits[j].begin(), ref_logits[j].end(), logits.begin() + j * V)) << "row " << j;
    EXPECT_EQ(dk, ref_draft[kept]);
    EXPECT_TRUE(drv.Fixed(1) == ref_fixed[kept]) << "fixed state after the rollback";
    for (int64_t s = kept; s < n_steps; ++s) {
      const int32_t d = drv.Step(1, ids, P + s, 1, 1, &logits);
      EXPECT_TRUE(logits == ref_logits[s]) << "step " << s;
      EXPECT_EQ(d, ref_draft[s + 1]) << "step " << s;
    }
    EXPECT_TRUE(drv.Fixed(1) == ref_fixed[n_steps]);
  }
}

}  // namespace
}  // namespace deepinfer
