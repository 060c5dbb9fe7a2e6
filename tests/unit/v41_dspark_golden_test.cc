// The DSpark drafter (model/v41/dspark.h, model-spec §3.3.6) against
// DeepSeek's reference run on the tiny checkpoint: the `dspark` section of
// the shared golden vectors (tests/data/golden-tiny-v41/dspark.json; prompts
// 4 and 7: prefill + seeding, then four decode steps each followed by a
// draft: drafted ids, per-row top-5 logits with the Markov bias,
// confidences). The main model runs the reference's own layout (whole
// prefill, one token per decode call), whose prefill and decode of these
// prompts are bit-identical to the reference's (v41_golden_test).
//
// Needs DEEPINFER_TINY_DIR (the ctest fixture); skipped without it.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "model/state.h"
#include "model/v41/dspark.h"
#include "model/v41/model.h"

namespace deepinfer::v41 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kData = fs::path(DEEPINFER_TEST_DATA) / "golden-tiny-v41";

const json& Golden() {
  static const json j = [] {
    std::ifstream f(kData / "dspark.json");
    return json::parse(f);
  }();
  return j;
}

int64_t Argmax(const float* v, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[b]) b = i;
  return b;
}

class V41DsparkGolden : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("DEEPINFER_TINY_DIR");
    if (!dir || !*dir) return;
    V41Options opt;
    opt.engram_token_map_file = kData / "engram_token_map.i32";
    model_ = V41Model::Load(dir, opt).release();
    dspark_ = new Dspark(*model_);
  }
  static void TearDownTestSuite() {
    delete dspark_;
    delete model_;
    dspark_ = nullptr;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "DEEPINFER_TINY_DIR is not set (the tiny V4.1 checkpoint)";
  }

  struct Seq {
    StateGeometry geo;
    std::unique_ptr<DenseStateArena> arena;
    std::vector<int32_t> table;
    SequenceStateView view;
  };
  static Seq NewSeq(int64_t max_tokens) {
    Seq s;
    s.geo = model_->geometry(16, false, /*dspark_rings=*/true);
    const int64_t blocks = s.geo.BlocksForTokens(max_tokens);
    s.arena = std::make_unique<DenseStateArena>(s.geo, 1, blocks);
    for (int64_t b = 0; b < blocks; ++b) s.table.push_back(static_cast<int32_t>(b));
    s.view = s.arena->View(0, s.table.data(), blocks);
    return s;
  }
  // One main-model call of `toks` at `start`; returns the last row's logits and fills *hidden.
  static std::vector<float> Main(Seq& s, const std::vector<int32_t>& toks, int64_t start, bool per_row,
                                 std::vector<float>* hidden) {
    hidden->assign(toks.size() * static_cast<size_t>(dspark_->hidden_width()), 0.0f);
    ForwardBatch b;
    b.per_row_layout = per_row;
    ForwardSeq q;
    q.tokens = toks.data();
    q.len = static_cast<int64_t>(toks.size());
    q.start_pos = start;
    q.state = s.view;
    q.dspark_hidden = hidden->data();
    b.seqs.push_back(q);
    ForwardOutput out;
    model_->Forward(b, &out);
    return out.logits;
  }
  static DsparkDraft Draft(Seq& s, const std::vector<float>& hidden, int64_t n, int64_t start, int32_t input,
                           bool logits = false) {
    std::vector<DsparkDraft> out;
    dspark_->Run({{hidden.data(), n, start, s.view, input}}, logits, &out);
    return out[0];
  }

  static V41Model* model_;
  static Dspark* dspark_;
};
V41Model* V41DsparkGolden::model_ = nullptr;
Dspark* V41DsparkGolden::dspark_ = nullptr;

// Drafted ids on every recorded step; top-5 logits and confidences
// bit-identical to the reference's.
TEST_F(V41DsparkGolden, MatchesReferenceDrafts) {
  const int64_t V = model_->config().vocab_size;
  int steps = 0, bit_rows = 0, rows = 0, bit_conf = 0, confs = 0;
  double max_rel = 0;
  for (const auto& [k, recs] : Golden()["dspark"].items()) {
    const std::vector<int32_t> prompt = Golden()["prompts"][k].get<std::vector<int32_t>>();
    Seq s = NewSeq(static_cast<int64_t>(prompt.size()) + 8);
    std::vector<float> hidden;
    std::vector<float> lg = Main(s, prompt, 0, false, &hidden);
    Draft(s, hidden, static_cast<int64_t>(prompt.size()), 0, -1);  // forward_spec(..., 0): seeding only
    int32_t tok = static_cast<int32_t>(Argmax(lg.data(), V));
    for (const json& st : recs) {
      const int64_t pos = st["start_pos"].get<int64_t>();
      ASSERT_EQ(tok, st["input_token"].get<int32_t>()) << "prompt " << k << " pos " << pos;
      lg = Main(s, {tok}, pos, false, &hidden);
      const int32_t main_out = static_cast<int32_t>(Argmax(lg.data(), V));
      ASSERT_EQ(main_out, st["main_argmax"].get<int32_t>()) << "prompt " << k << " pos " << pos;
      const DsparkDraft d = Draft(s, hidden, 1, pos, main_out, true);
      const auto want_ids = st["draft_output_ids"].get<std::vector<int32_t>>();
      ASSERT_EQ(d.ids.size() + 1, want_ids.size());
      EXPECT_EQ(std::vector<int32_t>(want_ids.begin() + 1, want_ids.end()), d.ids)
          << "prompt " << k << " pos " << pos;
      const json& dr = st["draft_rows"];
      for (size_t i = 0; i < d.ids.size(); ++i, ++rows) {
        const auto ids = dr[i]["top_ids"].get<std::vector<int64_t>>();
        const auto vals = dr[i]["top_vals"].get<std::vector<double>>();
        const float* row = d.logits.data() + i * V;
        bool bit = true;
        for (size_t t = 0; t < ids.size(); ++t) {
          const float want = static_cast<float>(vals[t]);
          bit = bit && row[ids[t]] == want;
          max_rel = std::max(max_rel, std::fabs(static_cast<double>(row[ids[t]]) - want) / std::fabs(want));
          EXPECT_NEAR(row[ids[t]], want, 1e-6 * std::fabs(want)) << "prompt " << k << " pos " << pos << " row " << i;
        }
        bit_rows += bit;
        const float want_c = static_cast<float>(st["confidence"][i].get<double>());
        bit_conf += d.confidence[i] == want_c;
        ++confs;
        max_rel = std::max(max_rel, std::fabs(static_cast<double>(d.confidence[i]) - want_c) / std::fabs(want_c));
        EXPECT_NEAR(d.confidence[i], want_c, 1e-6 * std::fabs(want_c)) << "prompt " << k << " pos " << pos;
      }
      tok = main_out;
      ++steps;
    }
  }
  std::printf("DSpark: %d steps; top-5 logits bit-identical on %d/%d rows, confidences on %d/%d; max rel err %.3g\n",
              steps, bit_rows, rows, bit_conf, confs, max_rel);
  EXPECT_EQ(steps, 8);
  EXPECT_EQ(bit_rows, rows);
  EXPECT_EQ(bit_conf, confs);
}

// In the engine's per-row layout: seeding in chunks of 3 and batched with
// another sequence gives the same drafts, bit for bit, as one whole seeding
// call alone; so do 1 and 3 threads.
TEST_F(V41DsparkGolden, ChunkedAndBatchedSeedingSameDrafts) {
  const std::vector<int32_t> prompt = Golden()["prompts"]["4"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(prompt.size());
  const int64_t W = dspark_->hidden_width();
  Seq whole = NewSeq(T + 4);
  std::vector<float> hidden;
  Main(whole, prompt, 0, true, &hidden);
  const DsparkDraft want = Draft(whole, hidden, T, 0, 1234, true);
  ASSERT_EQ(static_cast<int>(want.ids.size()), dspark_->block_size());

  Seq chunked = NewSeq(T + 4);
  Seq other = NewSeq(T + 4);
  std::vector<float> other_hidden;
  const std::vector<int32_t> other_prompt(prompt.rbegin(), prompt.rend());
  Main(other, other_prompt, 0, true, &other_hidden);
  DsparkDraft got;
  for (int64_t at = 0; at < T; at += 3) {
    const int64_t n = std::min<int64_t>(3, T - at);
    const std::vector<int32_t> part(prompt.begin() + at, prompt.begin() + at + n);
    Main(chunked, part, at, true, &hidden);
    std::vector<DsparkDraft> out;
    // The other sequence drafts (and reseeds its own rings) in the same call.
    dspark_->Run({{other_hidden.data(), T, 0, other.view, 77},
                  {hidden.data(), n, at, chunked.view, at + n == T ? 1234 : -1}},
                 true, &out);
    if (at + n == T) got = out[1];
  }
  EXPECT_EQ(got.ids, want.ids);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  EXPECT_EQ(0, std::memcmp(got.logits.data(), want.logits.data(), want.logits.size() * 4));
  EXPECT_EQ(0, std::memcmp(got.confidence.data(), want.confidence.data(), want.confidence.size() * 4));
  (void)W;
  // 1 and 3 threads: the same bits (the SIMD targets: DEEPINFER_TARGET=avx2 / scalar runs of this binary).
  const int threads0 = NumThreads();
  for (int threads : {1, 3}) {
    SetNumThreads(threads);
    Seq t = NewSeq(T + 4);
    std::vector<float> h;
    Main(t, prompt, 0, true, &h);
    const DsparkDraft d = Draft(t, h, T, 0, 1234, true);
    EXPECT_EQ(d.ids, want.ids) << threads << " threads";
    EXPECT_EQ(0, std::memcmp(d.logits.data(), want.logits.data(), want.logits.size() * 4)) << threads << " threads";
    EXPECT_EQ(0, std::memcmp(d.confidence.data(), want.confidence.data(), want.confidence.size() * 4));
  }
  SetNumThreads(threads0);
}

TEST_F(V41DsparkGolden, RejectsBadInput) {
  Seq s = NewSeq(8);
  std::vector<float> hidden(static_cast<size_t>(dspark_->hidden_width()), 0.0f);
  std::vector<DsparkDraft> out;
  auto expect_error = [&](const DsparkSeq& q, const std::string& needle) {
    try {
      dspark_->Run({q}, false, &out);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({hidden.data(), 0, 0, s.view, -1}, "0 rows");
  expect_error({nullptr, 1, 0, s.view, -1}, "without main_hidden");
  expect_error({hidden.data(), 1, 0, s.view, static_cast<int32_t>(model_->config().vocab_size)}, "outside");
  const StateGeometry plain = model_->geometry(16);
  DenseStateArena arena(plain, 1, 1);
  const int32_t table[1] = {0};
  expect_error({hidden.data(), 1, 0, arena.View(0, table, 1), -1}, "no DSpark rings");
}

}  // namespace
}  // namespace deepinfer::v41
