// Tests for tools/make_tiny_v4: the V4 roles and encoders against the check
// values of TINY_V4_SPEC.md §6 (make_tiny_v4.py --selftest), the config files
// (emitted == the golden bytes, read by ModelConfig), the plan against the
// loader's V4 inventory (tensor_plan.h) for every preset, and validation.
// (The sha256 of the four golden files is checked by tests/cli/make_tiny_v4.sh.)
#include "tools/make_tiny_v4.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "format/dtype.h"
#include "model/config.h"
#include "model/tensor_plan.h"

namespace deepinfer::tiny {
namespace {

const PlannedTensor& Find(const std::vector<PlannedTensor>& plan, const std::string& name) {
  for (const PlannedTensor& t : plan)
    if (t.name == name) return t;
  ADD_FAILURE() << "no planned tensor " << name;
  static PlannedTensor none;
  return none;
}

std::string Hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t k = 0; k < n; ++k) {
    std::snprintf(b, sizeof b, "%02x", p[k]);
    s += b;
  }
  return s;
}

// The weight's and scale's bytes of one planned tensor.
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> Encode(const PlannedTensor& t) {
  std::vector<uint8_t> w(WeightBytes(t)), s(std::max<uint64_t>(ScaleBytes(t), 1));
  EncodeTensor(t, w.data(), s.data());
  return {w, s};
}

// ------------------------------------------------------------------ spec §6 check values
TEST(MakeTinyV4, SelftestQuantisedBytes) {
  const std::vector<PlannedTensor> plan = PlanV4Tensors(TinyV4Config{});
  struct Case { const char* name; const char* w8; const char* s4; } cases[] = {
      {"layers.0.attn.wq_a.weight", "71f4ecd6f8f6df6d", "74"},
      {"layers.0.ffn.experts.0.w1.weight", "5641e8ce0ea5ddca", "7c7c7c7c"},
      {"layers.3.attn.indexer.wq_b.weight", "5865f5ccefe86ff8", "74747474"},
  };
  for (const Case& c : cases) {
    const auto [w, s] = Encode(Find(plan, c.name));
    EXPECT_EQ(Hex(w.data(), 8), c.w8) << c.name;
    const std::string want_s = c.s4;
    EXPECT_EQ(Hex(s.data(), want_s.size() / 2), want_s) << c.name;
  }
}

TEST(MakeTinyV4, SelftestTid2eidAndRoles) {
  const std::vector<PlannedTensor> plan = PlanV4Tensors(TinyV4Config{});
  const int64_t want[2][4][2] = {{{1, 5}, {0, 4}, {5, 3}, {0, 3}}, {{5, 2}, {4, 0}, {6, 5}, {5, 7}}};
  for (int layer = 0; layer < 2; ++layer) {
    const PlannedTensor& t = Find(plan, "layers." + std::to_string(layer) + ".ffn.gate.tid2eid");
    EXPECT_EQ(t.kind, TinyKind::kTid2eid);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{129280, 2}));
    const auto [w, s] = Encode(t);
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 2; ++k) {
        int64_t v = 0;
        for (int b = 0; b < 8; ++b) v |= static_cast<int64_t>(w[(r * 2 + k) * 8 + b]) << (8 * b);
        EXPECT_EQ(v, want[layer][r][k]) << "layer " << layer << " row " << r;
      }
    // Every row: two distinct ids in [0, 8).
    for (int64_t r = 0; r < 129280; ++r) {
      const int64_t e0 = w[r * 16], e1 = w[r * 16 + 8];
      ASSERT_TRUE(e0 < 8 && e1 < 8 && e0 != e1) << "row " << r;
    }
  }
  // Roles: APE (0, 0.5), expert up 4x / down 1/4 the linear rule, hc fn by in_features 512.
  EXPECT_EQ(Find(plan, "layers.1.attn.compressor.ape").amp, 0.5);
  EXPECT_EQ(Find(plan, "layers.1.attn.compressor.ape").shape, (std::vector<int64_t>{4, 256}));
  EXPECT_EQ(Find(plan, "layers.2.attn.compressor.ape").shape, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(Find(plan, "layers.2.ffn.experts.3.w1.weight").amp, 0.5);
  EXPECT_EQ(Find(plan, "layers.2.ffn.shared_experts.w2.weight").amp, 0.03125);
  EXPECT_EQ(Find(plan, "hc_head_fn").amp, 0.0625);
  EXPECT_EQ(Find(plan, "mtp.0.hc_head_scale").center, 1.0);
}

TEST(MakeTinyV4, LayoutTotals) {
  const Layout L = BuildLayout(PlanV4Tensors(TinyV4Config{}));
  EXPECT_EQ(L.tensors.size(), 427u);
  EXPECT_EQ(L.n_params, 36994033u);
  EXPECT_EQ(L.data_bytes, 73474591u);
  EXPECT_EQ(L.header.size(), 42992u);
  EXPECT_EQ(L.file_bytes(), 73517591u);
}

TEST(MakeTinyV4, TensorListMatchesGoldenTsv) {
  std::ifstream f(std::string(DEEPINFER_TEST_DATA) + "/tiny_v4_tensors.tsv", std::ios::binary);
  const std::string want(std::istreambuf_iterator<char>(f), {});
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(V4TensorListTsv(TinyV4Config{}), want);
}

// ------------------------------------------------------------------ configs
TEST(MakeTinyV4, ConfigFilesAreReadByTheLoader) {
  const TinyV4Config c;
  const std::string hf = V4HfConfigJson(c);
  // Golden sizes and a few exact lines (sha256 checked by the CLI test).
  EXPECT_NE(hf.find("\n  \"hc_eps\": 1e-06,\n"), std::string::npos);
  EXPECT_NE(hf.find("\n  \"swiglu_limit\": 10.0,\n"), std::string::npos);
  EXPECT_EQ(hf.substr(hf.size() - 26), "  \"expert_dtype\": \"fp4\"\n}\n");
  const std::string inf = V4InferenceConfigJson(c);
  EXPECT_EQ(inf.substr(0, 27), "{\n  \"vocab_size\": 129280,\n ");
  const ModelConfig mc = ModelConfig::FromJsonText(hf, "tiny-v4/config.json");
  EXPECT_EQ(mc.arch, Arch::kDeepseekV4);
  EXPECT_EQ(mc.n_layers, 4);
  EXPECT_EQ(mc.n_hash_layers, 2);
  EXPECT_EQ(mc.weight_block_size, 128);
  EXPECT_EQ(mc.compress_ratios, (std::vector<int>{0, 4, 128, 4, 0}));
}

TEST(MakeTinyV4, PresetsAgreeWithLoaderInventory) {
  for (TinyPreset p : {TinyPreset::kTiny, TinyPreset::kLarge}) {
    const TinyV4Config c = V4PresetConfig(p);
    ValidateV4Config(c);
    const ModelConfig mc = ModelConfig::FromJsonText(V4HfConfigJson(c), std::string(PresetName(p)) + "/config.json");
    const std::vector<ExpectedTensor> want = ExpectedTensors(mc);
    const Layout L = BuildLayout(PlanV4Tensors(c));
    ASSERT_EQ(L.tensors.size(), want.size()) << PresetName(p);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(L.tensors[i].name, want[i].name) << PresetName(p);
      EXPECT_EQ(L.tensors[i].dtype, DTypeName(want[i].dtype)) << want[i].name;
      EXPECT_EQ(L.tensors[i].shape, want[i].shape) << want[i].name;
    }
  }
  EXPECT_THROW(V4PresetConfig(TinyPreset::kSmall), Error);
}

TEST(MakeTinyV4, RejectsInvalidConfigs) {
  auto bad = [](auto edit, const char* want) {
    TinyV4Config c;
    edit(c);
    try {
      ValidateV4Config(c);
      ADD_FAILURE() << "accepted; expected an error containing " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  bad([](TinyV4Config& c) { c.dim = 96; }, "dim = 96 must be a positive multiple of 128");
  bad([](TinyV4Config& c) { c.compress_ratios = {0, 4, 2, 4, 0}; }, "compress_ratios[2] = 2");
  bad([](TinyV4Config& c) { c.compress_ratios = {0, 4, 128, 4, 4}; }, "on an MTP block");
  bad([](TinyV4Config& c) { c.compress_ratios = {0, 4}; }, "compress_ratios has 2 entries");
  bad([](TinyV4Config& c) { c.n_hash_layers = 5; }, "n_hash_layers = 5");
  bad([](TinyV4Config& c) { c.n_activated_experts = 9; }, "n_activated_experts = 9");
}

}  // namespace
}  // namespace deepinfer::tiny
