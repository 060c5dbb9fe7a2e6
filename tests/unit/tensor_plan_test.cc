// Tests for model/tensor_plan: the tensor inventory reproduces the golden tiny
// checkpoint's TSV (772 names/dtypes/shapes), the published totals of the
// releases (model-spec §0.3), and ValidateCheckpoint's one-line errors on
// synthetic checkpoints.
#include "model/tensor_plan.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"
#include "format/safetensors.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
using testing_util::ExpectError;
using testing_util::FakeTensor;
using testing_util::ReadFile;
using testing_util::SafetensorsImage;
using testing_util::TempDir;
using testing_util::WriteFile;

std::string Data(const std::string& f) { return std::string(DEEPINFER_TEST_DATA) + "/" + f; }
ModelConfig Config(const std::string& f) {
  return ModelConfig::FromJsonText(ReadFile(Data(f)), "config.json");
}

std::vector<int64_t> ParseShape(const std::string& s) {  // "[129280, 64]"
  std::vector<int64_t> v;
  std::string t;
  for (char c : s) {
    if (c >= '0' && c <= '9') {
      t += c;
    } else if (!t.empty()) {
      v.push_back(std::stoll(t));
      t.clear();
    }
  }
  return v;
}

struct TsvRow {
  std::string name, dtype;
  std::vector<int64_t> shape, logical;
  std::string encoding;
};

std::vector<TsvRow> ReadTsv() {
  std::ifstream f(Data("tiny_v41_tensors.tsv"));
  std::string line;
  std::getline(f, line);  // header
  EXPECT_EQ(line.substr(0, 13), "tensor\tdtype\t");
  std::vector<TsvRow> rows;
  while (std::getline(f, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, '\t')) cols.push_back(c);
    EXPECT_EQ(cols.size(), 8u) << line;
    if (cols.size() != 8) continue;
    rows.push_back({cols[0], cols[1], ParseShape(cols[2]), ParseShape(cols[4]), cols[7]});
  }
  return rows;
}

TensorRole RoleOfEncoding(const std::string& enc, const std::map<std::string, TensorRole>& weights,
                          const std::string& name) {
  if (enc == "bf16") return TensorRole::kBf16;
  if (enc == "f32") return TensorRole::kF32;
  if (enc == "fp8_block32x32") return TensorRole::kFp8Weight;
  if (enc == "fp8_row_group32") return TensorRole::kEngramTable;
  if (enc == "fp4_e2m1_group32_packed") return TensorRole::kFp4Weight;
  const std::string p = "ue8m0 scale of ";
  if (enc.rfind(p, 0) == 0) {
    TensorRole w = weights.at(enc.substr(p.size()));
    return w == TensorRole::kFp8Weight   ? TensorRole::kFp8Scale
           : w == TensorRole::kFp4Weight ? TensorRole::kFp4Scale
                                         : TensorRole::kEngramScale;
  }
  ADD_FAILURE() << "unknown encoding " << enc << " of " << name;
  return TensorRole::kBf16;
}

TEST(TensorPlan, TinyV41MatchesGoldenTsv) {
  const std::vector<ExpectedTensor> plan = ExpectedTensors(Config("tiny_v41_config.json"));
  const std::vector<TsvRow> tsv = ReadTsv();
  ASSERT_EQ(tsv.size(), 772u);
  ASSERT_EQ(plan.size(), tsv.size());
  std::map<std::string, TensorRole> weights;
  for (const TsvRow& r : tsv)
    if (r.encoding.rfind("ue8m0", 0) != 0)
      weights[r.name] = RoleOfEncoding(r.encoding, weights, r.name);
  for (size_t i = 0; i < tsv.size(); ++i) {  // both sorted by name
    SCOPED_TRACE(tsv[i].name);
    EXPECT_EQ(plan[i].name, tsv[i].name);
    EXPECT_EQ(DTypeName(plan[i].dtype), tsv[i].dtype);
    EXPECT_EQ(plan[i].shape, tsv[i].shape);
    EXPECT_EQ(plan[i].logical_shape, tsv[i].logical);
    EXPECT_EQ(plan[i].role, RoleOfEncoding(tsv[i].encoding, weights, tsv[i].name))
        << TensorRoleName(plan[i].role);
  }
}

TEST(TensorPlan, TinyV41Totals) {
  // TINY_V41_SPEC.md: 772 tensors, 23,056,468 parameters (FP4 byte = 2), 43,737,056 data bytes.
  const TensorStats s = SummarizeTensors(ExpectedTensors(Config("tiny_v41_config.json")));
  EXPECT_EQ(s.n_tensors, 772);
  EXPECT_EQ(s.params, 23056468);
  EXPECT_EQ(s.scale_params, 33136);  // F8_E8M0 bytes
  EXPECT_EQ(s.bytes, 43737056u);
  EXPECT_EQ(s.bytes_by_dtype.at(DType::kBF16) + s.bytes_by_dtype.at(DType::kF32) +
                s.bytes_by_dtype.at(DType::kF8E4M3) + s.bytes_by_dtype.at(DType::kF8E8M0) +
                s.bytes_by_dtype.at(DType::kI8),
            s.bytes);
  EXPECT_EQ(s.tensors_by_dtype.at(DType::kI8), 216);  // 8 layers x 8 + 2 x 4 experts, x3
}

TEST(TensorPlan, V4FlashReproducesPublishedIndex) {
  // model-spec §0.3: 69,187 tensors, total_size 159,609,485,896 bytes; §1.2: ≈290.9B
  // parameters with MTP (model-card convention: scales not counted).
  const TensorStats s = SummarizeTensors(ExpectedTensors(Config("v4_flash_config.json")));
  EXPECT_EQ(s.n_tensors, 69187);
  EXPECT_EQ(s.bytes, 159609485896u);
  EXPECT_NEAR(static_cast<double>(s.weight_params()) / 1e9, 290.9, 0.05);
  EXPECT_EQ(s.tensors_by_dtype.at(DType::kI64), 3);  // tid2eid on layers 0..2
}

TEST(TensorPlan, V41FlashReproducesPublishedIndex) {
  // model-spec §0.3: 96,085 tensors / 510,286,023,000 bytes with vision (266 BF16 tensors,
  // 485,268,480 parameters); 95,819 text tensors; 763.2B parameters.
  const ModelConfig c = Config("v41_flash_config.json");
  const TensorStats s = SummarizeTensors(ExpectedTensors(c));
  EXPECT_EQ(s.n_tensors, 96085);
  EXPECT_EQ(s.bytes, 510286023000u);
  EXPECT_NEAR(static_cast<double>(s.weight_params()) / 1e9, 763.2, 0.05);

  json j = json::parse(ReadFile(Data("v41_flash_config.json")));
  j.erase("vision_config");
  const TensorStats t =
      SummarizeTensors(ExpectedTensors(ModelConfig::FromJsonText(j.dump(), "config.json")));
  EXPECT_EQ(t.n_tensors, 95819);
  EXPECT_EQ(s.params - t.params, 485268480);
}

TEST(TensorPlan, TinyV4) {
  // model-spec §6.1: 427 tensors, 36.4M parameters (without scales and tid2eid), 73.5 MB on
  // disk (of which 4.1 MB tid2eid).
  const std::vector<ExpectedTensor> plan = ExpectedTensors(Config("tiny_v4_config.json"));
  const TensorStats s = SummarizeTensors(plan);
  EXPECT_EQ(s.n_tensors, 427);
  const int64_t tid2eid = 2 * 129280 * 2;
  EXPECT_EQ(s.bytes_by_dtype.at(DType::kI64), static_cast<uint64_t>(tid2eid) * 8);
  EXPECT_NEAR(static_cast<double>(s.weight_params() - tid2eid) / 1e6, 36.4, 0.05);
  EXPECT_NEAR(static_cast<double>(s.bytes) / 1e6, 73.5, 0.05);
  auto find = [&](const std::string& n) -> const ExpectedTensor& {
    for (const auto& t : plan)
      if (t.name == n) return t;
    ADD_FAILURE() << "no " << n;
    return plan[0];
  };
  // Shapes listed in model-spec §6.1.
  EXPECT_EQ(find("layers.1.attn.compressor.ape").shape, (std::vector<int64_t>{4, 256}));
  EXPECT_EQ(find("layers.2.attn.compressor.ape").shape, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(find("layers.1.attn.indexer.wq_b.weight").shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(find("layers.1.attn.indexer.wq_b.scale").shape, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(find("layers.0.ffn.gate.tid2eid").shape, (std::vector<int64_t>{129280, 2}));
  EXPECT_EQ(find("layers.0.ffn.experts.0.w1.weight").shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(find("layers.0.ffn.experts.0.w1.scale").shape, (std::vector<int64_t>{128, 4}));
  EXPECT_EQ(find("mtp.0.e_proj.weight").shape, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(find("hc_head_fn").shape, (std::vector<int64_t>{4, 512}));
}

TEST(TensorPlan, UnsupportedExpertDtype) {
  ModelConfig c = Config("tiny_v41_config.json");
  c.expert_dtype = "fp8";
  ExpectError([&] { ExpectedTensors(c); }, {"expert_dtype \"fp8\"", "only \"fp4\""});
}

TEST(TensorPlan, RefusesAbsurdSizesBeforeAllocating) {
  ModelConfig c = Config("tiny_v41_config.json");
  c.n_routed_experts = 1 << 20;
  ExpectError([&] { ExpectedTensors(c); }, {"config.json implies about", "tensors", "more than"});
  c = Config("tiny_v41_config.json");
  c.vocab_size = int64_t{1} << 31;
  c.dim = int64_t{1} << 30;
  ExpectError([&] { ExpectedTensors(c); },
              {"config.json implies tensor embed.weight of shape [2147483648, 1073741824], more "
               "than"});
}

TEST(TensorPlan, ToleratedExtras) {
  ModelConfig c = Config("tiny_v41_config.json");
  EXPECT_TRUE(IsToleratedExtraTensor(c, "vision.blocks.0.norm1.weight"));
  EXPECT_TRUE(IsToleratedExtraTensor(c, "aligner.w1.bias"));
  EXPECT_TRUE(IsToleratedExtraTensor(c, "image_newline"));
  EXPECT_TRUE(IsToleratedExtraTensor(c, "mtp.1.embed.weight"));
  EXPECT_TRUE(IsToleratedExtraTensor(c, "mtp.0.head.weight"));
  EXPECT_FALSE(IsToleratedExtraTensor(c, "mtp.x.head.weight"));
  EXPECT_FALSE(IsToleratedExtraTensor(c, "layers.0.attn.wq_c.weight"));
  EXPECT_FALSE(IsToleratedExtraTensor(c, "visionary"));
  c.vision_n_layers = 2;  // vision on: its tensors are planned, not tolerated
  EXPECT_FALSE(IsToleratedExtraTensor(c, "vision.norm.weight"));
}

// ---------------------------------------------------------------------------
// ValidateCheckpoint on synthetic checkpoints built from the plan of a
// reduced-vocab tiny config (fast to write).

class ValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = Config("tiny_v41_config.json");
    cfg_.vocab_size = 512;
    for (const ExpectedTensor& e : ExpectedTensors(cfg_))
      tensors_.push_back({e.name, std::string(DTypeName(e.dtype)), e.shape, ""});
  }
  FakeTensor& Get(const std::string& name) {
    for (FakeTensor& t : tensors_)
      if (t.name == name) return t;
    ADD_FAILURE() << "no " << name;
    return tensors_[0];
  }
  void Remove(const std::string& name) {
    std::erase_if(tensors_, [&](const FakeTensor& t) { return t.name == name; });
  }
  ValidationReport Validate() {
    WriteFile(dir_ / "model.safetensors", SafetensorsImage(tensors_));
    auto store = TensorStore::Open(dir_.path());
    return ValidateCheckpoint(cfg_, *store);
  }
  std::string Fails(const std::vector<std::string>& parts) {
    return ExpectError([&] { Validate(); }, parts);
  }

  ModelConfig cfg_;
  std::vector<FakeTensor> tensors_;
  TempDir dir_;
};

TEST_F(ValidateTest, CompleteCheckpointPasses) {
  ValidationReport r = Validate();
  EXPECT_EQ(r.n_checked, 772);
  EXPECT_TRUE(r.ignored.empty());
}

TEST_F(ValidateTest, WrongDtype) {
  Get("layers.3.attn.wq_b.weight").dtype = "BF16";
  std::string msg = Fails({});
  EXPECT_EQ(msg,
            "model.safetensors: tensor layers.3.attn.wq_b.weight: expected dtype F8_E4M3 shape "
            "[512, 64], found BF16 [512, 64]");
}

TEST_F(ValidateTest, WrongShape) {
  Get("layers.0.ffn.experts.1.w2.weight").shape = {64, 64};  // unpacked FP4
  Fails({"model.safetensors: tensor layers.0.ffn.experts.1.w2.weight: expected dtype I8 shape "
         "[64, 32], found I8 [64, 64]"});
  Get("layers.0.ffn.experts.1.w2.weight").shape = {64, 32};
  Get("layers.2.engram.embed.scale").shape = {2260};
  Fails({"tensor layers.2.engram.embed.scale: expected dtype F8_E8M0 shape [2260, 1], found "
         "F8_E8M0 [2260]"});
}

TEST_F(ValidateTest, MissingTensor) {
  Remove("layers.6.attn.indexer.weights_proj.weight");
  Fails({"missing tensor layers.6.attn.indexer.weights_proj.weight: expected dtype BF16 shape "
         "[2, 64] (bf16)"});
}

TEST_F(ValidateTest, UnexpectedTensor) {
  // An indexer on a Reuse layer is not part of the plan.
  tensors_.push_back({"layers.3.attn.indexer.weights_proj.weight", "BF16", {2, 64}, ""});
  Fails({"model.safetensors: unexpected tensor layers.3.attn.indexer.weights_proj.weight: BF16 "
         "[2, 64] is not part of a deepseek_v41 checkpoint for this config.json"});
}

TEST_F(ValidateTest, ToleratedExtrasAreIgnored) {
  tensors_.push_back({"vision.norm.weight", "BF16", {1024}, ""});
  tensors_.push_back({"image_start", "BF16", {64}, ""});
  tensors_.push_back({"mtp.0.embed.weight", "BF16", {512, 64}, ""});
  ValidationReport r = Validate();
  EXPECT_EQ(r.n_checked, 772);
  EXPECT_EQ(r.ignored,
            (std::vector<std::string>{"image_start", "mtp.0.embed.weight", "vision.norm.weight"}));
}

TEST_F(ValidateTest, CountsFurtherProblems) {
  Remove("norm.weight");
  Get("head.weight").dtype = "F32";
  tensors_.push_back({"bogus", "F32", {1}, ""});
  Fails({"missing tensor norm.weight",
         "(and 2 more problems: 1 missing, 1 wrong dtype/shape, 1 unexpected)"});
}

}  // namespace
}  // namespace deepinfer
