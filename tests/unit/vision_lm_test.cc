// The language model with image spans (model-spec §3.3.7) against the
// reference's token-wise run of both golden image prompts
// (tests/data/vision/tokenwise_*, from the shared tiny-v41-vision-tokenwise
// vectors): embeddings overridden at span positions, `gate.bias_vl` routing
// and Engram DEAD positions; last-position logits bit-identical, the 8 greedy
// tokens equal. The span embeddings are the golden merged stream, and then our
// own tower's span rows from the golden patches (vision_test checks the tower
// stage by stage).
// Needs DEEPINFER_TINY_VISION_DIR (skipped without it).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/state.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/v41/model.h"
#include "vision/vit.h"

namespace deepinfer::v41 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const fs::path kData = fs::path(DEEPINFER_TEST_DATA);

// The vision checkpoint: DEEPINFER_TINY_VISION_DIR, else DEEPINFER_TINY_DIR + "-vision"
// (ctest's fixture makes both).
std::string VisionDir() {
  if (const char* v = std::getenv("DEEPINFER_TINY_VISION_DIR"); v && *v) return v;
  if (const char* t = std::getenv("DEEPINFER_TINY_DIR"); t && *t) return std::string(t) + "-vision";
  return "";
}

std::vector<float> ReadF32(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

const json& Golden() {
  static const json j = [] {
    std::ifstream f(kData / "vision" / "tokenwise_golden.json");
    return json::parse(f);
  }();
  return j;
}

class VisionLm : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const std::string dir = VisionDir();
    if (dir.empty() || !fs::exists(fs::path(dir) / "model.safetensors")) return;
    V41Options opt;
    opt.engram_token_map_file = kData / "golden-tiny-v41" / "engram_token_map.i32";
    model_ = V41Model::Load(dir, opt).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "no vision checkpoint: set DEEPINFER_TINY_VISION_DIR (or DEEPINFER_TINY_DIR, next to which ctest makes DIR-vision)";
  }

  struct Seq {
    std::unique_ptr<DenseStateArena> arena;
    std::vector<int32_t> table;
    StateGeometry geo;
    SequenceStateView view;
  };
  static Seq NewSeq(int64_t max_tokens) {
    Seq s;
    s.geo = model_->geometry(16);
    const int64_t blocks = s.geo.BlocksForTokens(max_tokens);
    s.arena = std::make_unique<DenseStateArena>(s.geo, 1, blocks);
    for (int64_t b = 0; b < blocks; ++b) s.table.push_back(static_cast<int32_t>(b));
    s.view = s.arena->View(0, s.table.data(), blocks);
    return s;
  }
  // Prompt in chunks of `chunk` with types and embeddings; returns the last logits.
  static std::vector<float> Prefill(Seq& s, const std::vector<int32_t>& ids, const std::vector<int8_t>& types,
                                    const std::vector<float>& embeds, int64_t chunk) {
    ForwardOutput out;
    const int64_t n = static_cast<int64_t>(ids.size()), d = model_->config().dim;
    for (int64_t pos = 0; pos < n; pos += chunk) {
      const int64_t len = std::min(chunk, n - pos);
      ForwardBatch b;
      ForwardSeq q;
      q.tokens = ids.data() + pos;
      q.token_types = types.data() + pos;
      q.embeds = embeds.data() + pos * d;
      q.len = len;
      q.start_pos = pos;
      q.state = s.view;
      q.logits = pos + len == n ? ForwardSeq::Logits::kLast : ForwardSeq::Logits::kNone;
      b.seqs.push_back(q);
      b.per_row_layout = true;
      model_->Forward(b, &out);
    }
    return out.logits;
  }
  static V41Model* model_;
};
V41Model* VisionLm::model_ = nullptr;

int Argmax(const std::vector<float>& v) {
  int best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int>(i);
  return best;
}

TEST_F(VisionLm, TokenwiseLogitsBitIdenticalAndGreedyTokensEqual) {
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    const json& P = Golden()["prompts"][k];
    const std::vector<int32_t> ids = P["prompt"].get<std::vector<int32_t>>();
    std::vector<int8_t> types;
    for (int t : P["token_types"].get<std::vector<int>>()) types.push_back(static_cast<int8_t>(t));
    const std::vector<float> merged = ReadF32(kData / "vision" / ("case" + std::to_string(k) + "_merged_embed.f32"));
    ASSERT_EQ(merged.size(), ids.size() * 64);
    const std::vector<float> want = ReadF32(kData / "vision" / ("tokenwise_case" + std::to_string(k) + "_last.f32"));
    for (int64_t chunk : {int64_t{19}, int64_t{1}, int64_t{5}}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      Seq s = NewSeq(64);
      std::vector<float> lg = Prefill(s, ids, types, merged, chunk);
      ASSERT_EQ(lg.size(), want.size());
      int64_t diff = 0;
      for (size_t i = 0; i < lg.size(); ++i) diff += std::memcmp(&lg[i], &want[i], 4) != 0;
      EXPECT_EQ(diff, 0) << "logits differing from the token-wise golden";
      // Greedy: g0 = argmax, then 8 one-token decode calls (TEXT positions).
      std::vector<int> gen = {Argmax(lg)};
      for (int j = 0; j < 8; ++j) {
        const int32_t tok = gen.back();
        ForwardBatch b;
        ForwardSeq q;
        q.tokens = &tok;
        q.len = 1;
        q.start_pos = static_cast<int64_t>(ids.size()) + j;
        q.state = s.view;
        b.seqs.push_back(q);
        b.per_row_layout = true;
        ForwardOutput out;
        model_->Forward(b, &out);
        gen.push_back(Argmax(out.logits));
      }
      EXPECT_EQ(gen, P["generated"].get<std::vector<int>>());
    }
  }
}

// The whole image path from the golden patches: our ViT, aligner and span assembly give the span
// rows, the language model the token-wise golden's last-position logits, bit for bit.
TEST_F(VisionLm, OwnTowerSpanGivesTokenwiseGoldenLogits) {
  const std::string dir = VisionDir();
  const std::unique_ptr<TensorStore> store = TensorStore::Open(dir);
  const ModelConfig cfg = ModelConfig::Load(dir);
  const std::unique_ptr<vision::VisionTower> tower = vision::VisionTower::Bind(*store, cfg);
  const int grid[2][2] = {{6, 9}, {5, 8}};
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    const json& P = Golden()["prompts"][k];
    const std::vector<int32_t> ids = P["prompt"].get<std::vector<int32_t>>();
    std::vector<int8_t> types;
    for (int t : P["token_types"].get<std::vector<int>>()) types.push_back(static_cast<int8_t>(t));
    const std::string c = "case" + std::to_string(k) + "_";
    std::vector<float> embeds = ReadF32(kData / "vision" / (c + "merged_embed.f32"));
    const std::vector<float> patches = ReadF32(kData / "vision" / (c + "patches.f32"));
    const std::vector<float> span = tower->SpanEmbeddings(patches.data(), grid[k][0], grid[k][1], 2, 3);
    ASSERT_EQ(span.size(), 10u * 64);
    std::copy(span.begin(), span.end(), embeds.begin() + 2 * 64);  // positions 2..11: the image span
    const std::vector<float> want = ReadF32(kData / "vision" / ("tokenwise_case" + std::to_string(k) + "_last.f32"));
    Seq s = NewSeq(64);
    const std::vector<float> lg = Prefill(s, ids, types, embeds, 19);
    ASSERT_EQ(lg.size(), want.size());
    int64_t diff = 0;
    for (size_t i = 0; i < lg.size(); ++i) diff += std::memcmp(&lg[i], &want[i], 4) != 0;
    EXPECT_EQ(diff, 0) << "logits differing from the token-wise golden";
    EXPECT_EQ(Argmax(lg), P["generated"][0].get<int>());
  }
}

// The counterfactuals: without token types (plain `bias`, Engram not masked)
// the logits change; an image type without embeddings is refused.
TEST_F(VisionLm, TokenTypesMatterAndAreValidated) {
  const json& P = Golden()["prompts"][0];
  const std::vector<int32_t> ids = P["prompt"].get<std::vector<int32_t>>();
  std::vector<int8_t> types;
  for (int t : P["token_types"].get<std::vector<int>>()) types.push_back(static_cast<int8_t>(t));
  const std::vector<float> merged = ReadF32(kData / "vision" / "case0_merged_embed.f32");
  Seq a = NewSeq(64);
  const std::vector<float> with = Prefill(a, ids, types, merged, 19);
  std::vector<int8_t> text(types.size(), -1);
  Seq b = NewSeq(64);
  const std::vector<float> without = Prefill(b, ids, text, merged, 19);
  EXPECT_NE(Argmax(with), Argmax(without));
  Seq c = NewSeq(64);
  ForwardBatch fb;
  ForwardSeq q;
  q.tokens = ids.data();
  q.token_types = types.data();
  q.len = static_cast<int64_t>(ids.size());
  q.state = c.view;
  fb.seqs.push_back(q);
  ForwardOutput out;
  try {
    model_->Forward(fb, &out);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("image position"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::v41
