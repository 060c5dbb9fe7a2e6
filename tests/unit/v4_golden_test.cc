// Golden tests of the DeepSeek-V4 forward pass (model/v4/model.h) on the tiny
// V4 checkpoint (make-tiny --arch deepseek_v4) against the official reference's
// vectors (tests/data/golden-tiny-v4, copied from shared/golden/vectors/tiny-v4;
// README_V4.md): prefill last-position logits of the 10 prompts bit-identical;
// the 129-token debug prompt's per-layer streams, sub-layer outputs, mHC
// pre/post/comb, window ring, compressed KV, compressor carries, indexer keys,
// router choices and indexer top-k lists identical; greedy decode equal to
// `generated` with every step's logits bit-identical (sha256 of the vector);
// MTP drafts (prefill draft vectors and the recorded steps) bit-identical.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/v4/model.h"
#include "sha256_testing.h"

namespace deepinfer::v4 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kData = fs::path(DEEPINFER_TEST_DATA) / "golden-tiny-v4";

std::vector<float> ReadF32(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  f.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

const json& Golden() {
  static const json j = [] {
    std::ifstream f(kData / "golden.json");
    return json::parse(f);
  }();
  return j;
}

std::vector<int32_t> PromptIds(int k) { return Golden()["prompts"][k]["prompt"].get<std::vector<int32_t>>(); }

std::string Sha(const std::vector<float>& v) { return testing::Sha256Hex(v.data(), v.size() * sizeof(float)); }

int64_t Argmax(const std::vector<float>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? m : INFINITY;
}

// Number of elements differing in bits, and the first one.
std::string DiffReport(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  int64_t n = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++n;
    }
  if (n == 0) return "";
  return std::to_string(n) + " differ, first at " + std::to_string(first) + ": " + std::to_string(got[first]) +
         " vs " + std::to_string(want[first]) + ", max |d| " + std::to_string(MaxAbsDiff(got, want));
}

class V4Golden : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const char* env = std::getenv("DEEPINFER_TINY_V4_DIR");  // else the ctest fixture's checkpoint
    model_ = V4Model::Load(env && *env ? env : DEEPINFER_TINY_V4_FIXTURE).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static V4Model* model_;
};
V4Model* V4Golden::model_ = nullptr;

TEST_F(V4Golden, PrefillLastLogitsBitIdentical) {
  for (int k = 0; k < 10; ++k) {
    const std::vector<int32_t> ids = PromptIds(k);
    V4State st = model_->NewState(1024);
    const std::vector<float> got = model_->Forward(ids.data(), static_cast<int64_t>(ids.size()), &st);
    char name[64];
    std::snprintf(name, sizeof name, "prompt%02d_prefill_last.f32", k);
    const std::vector<float> want = ReadF32(kData / "prefill_last" / name);
    EXPECT_EQ(DiffReport(got, want), "") << "prompt " << k << " (" << ids.size() << " tokens)";
    EXPECT_EQ(Sha(got), Golden()["prompts"][k]["prefill"]["sha256_f32le"].get<std::string>()) << "prompt " << k;
    std::printf("prompt %d (%zu tokens): max |d| %g, argmax %lld\n", k, ids.size(), MaxAbsDiff(got, want),
                static_cast<long long>(Argmax(got)));
  }
}

TEST_F(V4Golden, DebugPromptLayerByLayer) {
  const json& D = Golden()["debug"];
  const int k = D["prompt_index"].get<int>();
  const std::vector<int32_t> ids = PromptIds(k);
  const int64_t T = static_cast<int64_t>(ids.size());
  ASSERT_EQ(T, 129);
  V4State st = model_->NewState(1024);
  V4Debug dbg;
  model_->Forward(ids.data(), T, &st, nullptr, &dbg);
  const ModelConfig& c = model_->config();
  for (int l = 0; l < c.n_layers; ++l) {
    const json& L = D["layers"][std::to_string(l)];
    const V4Debug::Layer& G = dbg.layers[l];
    auto file = [&](const json& e) { return ReadF32(kData / e["file"].get<std::string>()); };
    const std::string at = "layer " + std::to_string(l) + " ";
    EXPECT_EQ(DiffReport(G.hc_pre[0], file(L["hc_attn"]["pre"])), "") << at << "hc_attn pre";
    EXPECT_EQ(DiffReport(G.hc_post[0], file(L["hc_attn"]["post"])), "") << at << "hc_attn post";
    EXPECT_EQ(DiffReport(G.hc_comb[0], file(L["hc_attn"]["comb"])), "") << at << "hc_attn comb";
    EXPECT_EQ(DiffReport(G.attn_out, file(L["attn_out"])), "") << at << "attn_out";
    EXPECT_EQ(DiffReport(G.hc_pre[1], file(L["hc_ffn"]["pre"])), "") << at << "hc_ffn pre";
    EXPECT_EQ(DiffReport(G.hc_post[1], file(L["hc_ffn"]["post"])), "") << at << "hc_ffn post";
    EXPECT_EQ(DiffReport(G.hc_comb[1], file(L["hc_ffn"]["comb"])), "") << at << "hc_ffn comb";
    EXPECT_EQ(DiffReport(G.ffn_out, file(L["ffn_out"])), "") << at << "ffn_out";
    EXPECT_EQ(DiffReport(G.out_streams, file(L["out_streams"])), "") << at << "out_streams";
    // Router choices and weights.
    std::vector<int32_t> ri;
    std::vector<float> rw;
    for (const auto& row : L["router_indices"])
      for (const auto& v : row) ri.push_back(v.get<int32_t>());
    for (const auto& row : L["router_weights"])
      for (const auto& v : row) rw.push_back(v.get<float>());
    EXPECT_EQ(G.router_indices, ri) << at << "router indices";
    EXPECT_EQ(DiffReport(G.router_weights, rw), "") << at << "router weights";
    // State after the prefill.
    const SequenceStateView S = st.view();
    EXPECT_EQ(DiffReport(model_->WindowRows(S, l), file(L["window_kv_slots"])), "") << at << "window ring";
    const int r = c.compress_ratios[l];
    if (r > 0) {
      EXPECT_EQ(DiffReport(model_->CompressedRows(S, l, T / r), file(L["compressed_kv"])), "") << at << "compressed kv";
      EXPECT_EQ(DiffReport(model_->CarryRows(S, l, false, false), file(L["compressor_state_kv"])), "")
          << at << "compressor kv state";
      EXPECT_EQ(DiffReport(model_->CarryRows(S, l, false, true), file(L["compressor_state_score"])), "")
          << at << "compressor score state";
    }
    if (r == 4) {
      EXPECT_EQ(DiffReport(model_->IndexKeyRows(S, l, T / r), file(L["indexer_keys"])), "") << at << "indexer keys";
      std::vector<int32_t> tk;
      for (const auto& row : L["indexer_topk"])
        for (const auto& v : row) tk.push_back(v.get<int32_t>());
      EXPECT_EQ(G.indexer_topk, tk) << at << "indexer top-k";
    }
  }
}

// Greedy decode: 16 one-token steps after the prefill; tokens == `generated`
// and every step's full logits vector bit-identical (its sha256).
TEST_F(V4Golden, DecodeGreedyBitIdentical) {
  for (int k = 0; k < 10; ++k) {
    const json& P = Golden()["prompts"][k];
    const std::vector<int32_t> ids = PromptIds(k);
    const std::vector<int32_t> gen = P["generated"].get<std::vector<int32_t>>();
    V4State st = model_->NewState(1024);
    std::vector<float> logits = model_->Forward(ids.data(), static_cast<int64_t>(ids.size()), &st);
    int32_t tok = static_cast<int32_t>(Argmax(logits));
    ASSERT_EQ(tok, gen[0]) << "prompt " << k << " prefill argmax";
    int same = 0;
    const json& steps = P["decode_steps"];
    for (size_t j = 0; j < steps.size(); ++j) {
      ASSERT_EQ(steps[j]["fed_token"].get<int32_t>(), tok);
      ASSERT_EQ(steps[j]["start_pos"].get<int64_t>(), st.len);
      logits = model_->Forward(&tok, 1, &st);
      const bool bit = Sha(logits) == steps[j]["decode"]["sha256_f32le"].get<std::string>();
      EXPECT_TRUE(bit) << "prompt " << k << " decode step " << j + 1;
      same += bit;
      tok = static_cast<int32_t>(Argmax(logits));
      EXPECT_EQ(tok, gen[j + 1]) << "prompt " << k << " decode step " << j + 1;
      if (tok != gen[j + 1]) break;
    }
    std::printf("prompt %d: %d/%zu decode steps bit-identical\n", k, same, steps.size());
  }
}

// MTP (mtp.0): the draft after the prefill (full vector) and the four recorded
// draft steps (main decode at p, then mtp.0(X_p, p, g_j)), bit-identical.
TEST_F(V4Golden, MtpDraftsBitIdentical) {
  for (const auto& [key, M] : Golden()["mtp"].items()) {
    const int k = M["prompt_index"].get<int>();
    const std::vector<int32_t> ids = PromptIds(k);
    const int64_t n = static_cast<int64_t>(ids.size());
    V4State st = model_->NewState(1024);
    std::vector<float> streams;
    std::vector<float> logits = model_->Forward(ids.data(), n, &st, &streams);
    int32_t g = static_cast<int32_t>(Argmax(logits));
    const json& steps = M["steps"];
    // Step 0: streams of positions 0..n-1 with ids t1..t(n-1), g0.
    std::vector<int32_t> next(ids.begin() + 1, ids.end());
    next.push_back(g);
    ASSERT_EQ(steps[0]["mtp_input_ids_last"].get<int32_t>(), g);
    std::vector<float> draft = model_->Mtp(streams.data(), next.data(), n, 0, &st);
    const std::vector<float> want = ReadF32(kData / steps[0]["draft_file"].get<std::string>());
    EXPECT_EQ(DiffReport(draft, want), "") << "prompt " << k << " MTP prefill draft";
    EXPECT_EQ(Sha(draft), steps[0]["draft"]["sha256_f32le"].get<std::string>()) << "prompt " << k;
    std::printf("prompt %d MTP prefill draft: max |d| %g\n", k, MaxAbsDiff(draft, want));
    for (size_t j = 1; j < steps.size(); ++j) {
      const int64_t p = steps[j]["start_pos"].get<int64_t>();
      ASSERT_EQ(p, st.len);
      ASSERT_EQ(steps[j]["main_input_token"].get<int32_t>(), g);
      logits = model_->Forward(&g, 1, &st, &streams);
      g = static_cast<int32_t>(Argmax(logits));
      ASSERT_EQ(g, steps[j]["main_argmax"].get<int32_t>()) << "prompt " << k << " step " << j;
      draft = model_->Mtp(streams.data(), &g, 1, p, &st);
      EXPECT_EQ(Sha(draft), steps[j]["draft"]["sha256_f32le"].get<std::string>()) << "prompt " << k << " step " << j;
      EXPECT_EQ(Argmax(draft), steps[j]["draft"]["argmax"].get<int64_t>()) << "prompt " << k << " step " << j;
    }
  }
}

}  // namespace
}  // namespace deepinfer::v4
