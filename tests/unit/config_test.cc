// Tests for model/config: explicit-key reading of config.json for
// deepseek_v41 (tiny golden config, release config) and deepseek_v4
// (V4-Flash, tiny V4), the layer schedule of model-spec §1.4 / §3.3.4, and the
// one-line errors for missing/ill-typed keys and inconsistent schedules.
#include "model/config.h"

#include <functional>
#include <numeric>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
using testing_util::ExpectError;
using testing_util::ReadFile;
using testing_util::TempDir;
using testing_util::WriteFile;

std::string Data(const std::string& f) { return std::string(DEEPINFER_TEST_DATA) + "/" + f; }
json Fixture(const std::string& f) { return json::parse(ReadFile(Data(f))); }

ModelConfig FromJson(const json& j) { return ModelConfig::FromJsonText(j.dump(), "config.json"); }

// Expects FromJson(mutated fixture) to fail with a message containing `parts`.
std::string ExpectConfigError(const std::string& fixture, const std::function<void(json&)>& mutate,
                              const std::vector<std::string>& parts) {
  json j = Fixture(fixture);
  mutate(j);
  return ExpectError([&] { FromJson(j); }, parts);
}

const char* kTiny = "tiny_v41_config.json";
const char* kV41 = "v41_flash_config.json";
const char* kV4 = "v4_flash_config.json";
const char* kTinyV4 = "tiny_v4_config.json";

TEST(Config, TinyV41Fields) {
  TempDir d;
  WriteFile(d / "config.json", ReadFile(Data(kTiny)));
  ModelConfig c = ModelConfig::Load(d.path());
  EXPECT_EQ(c.arch, Arch::kDeepseekV41);
  EXPECT_EQ(c.model_type, "deepseek_v41");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.moe_inter_dim, 64);
  EXPECT_EQ(c.n_layers, 8);
  EXPECT_EQ(c.n_mtp_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.o_groups, 2);
  EXPECT_EQ(c.o_lora_rank, 64);
  EXPECT_EQ(c.window_size, 16);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 0, 2, 2, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 4}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(c.candidate_source_layer, 4);
  EXPECT_EQ(c.candidate_topk_blocks, 4);
  EXPECT_EQ(c.candidate_block_size, 4);
  EXPECT_EQ(c.index_n_heads, 2);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 8);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.n_activated_experts, 2);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.score_func, "sqrtsoftplus");
  EXPECT_EQ(c.gate_temp, 1.0f);  // absent from config.json
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.route_scale, 1.5f);
  EXPECT_EQ(c.swiglu_limit, 10.0f);
  EXPECT_EQ(c.norm_eps, 1e-20f);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6f);
  EXPECT_EQ(c.hc_mix_dim(), 24);
  EXPECT_EQ(c.rope_theta, 10000);
  EXPECT_EQ(c.compress_rope_theta, 160000);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_EQ(c.rope_factor, 16);
  EXPECT_EQ(c.beta_fast, 32);
  EXPECT_EQ(c.beta_slow, 1);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{2132, 2260}));
  EXPECT_EQ(c.engram_max_ngram_size, 3);
  EXPECT_EQ(c.engram_vocab_size, 512);
  EXPECT_EQ(c.engram_n_heads, 2);
  EXPECT_EQ(c.engram_head_dim, 32);
  EXPECT_EQ(c.engram_pad_id, 2);
  EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
  // TINY_V41_SPEC.md §1: primes (n=2: 521, 523; n=3: 541, 547) and (557, 563; 569, 571).
  ASSERT_EQ(c.engram_primes.size(), 2u);
  EXPECT_EQ(c.engram_primes[0], (std::vector<int64_t>{521, 523, 541, 547}));
  EXPECT_EQ(c.engram_primes[1], (std::vector<int64_t>{557, 563, 569, 571}));
  EXPECT_EQ(c.dspark_block_size, 3);
  EXPECT_EQ(c.dspark_noise_token_id, 128799);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{6, 7}));
  EXPECT_EQ(c.dspark_markov_rank, 16);
  EXPECT_EQ(c.dspark_n_routed_experts, 4);
  EXPECT_EQ(c.dspark_n_activated_experts, 2);
  EXPECT_EQ(c.vision_n_layers, 0);
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_EQ(c.weight_block_size, 32);
  EXPECT_EQ(c.act_block_size, 32);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.pad_token_id, 2);
}

struct Row {
  int layer, ratio;
  CsaMode mode;
  bool kv, index, cand;
  int kv_from, index_from, cand_from, engram;
  bool dspark;
};

void ExpectSchedule(const ModelConfig& c, const std::vector<Row>& rows) {
  ASSERT_EQ(c.layers.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const LayerSchedule& L = c.layers[i];
    const Row& r = rows[i];
    SCOPED_TRACE("layer " + std::to_string(r.layer));
    EXPECT_EQ(L.layer, r.layer);
    EXPECT_EQ(L.is_mtp, r.layer >= c.n_layers);
    EXPECT_EQ(L.compress_ratio, r.ratio);
    EXPECT_EQ(L.mode, r.mode) << CsaModeName(L.mode);
    EXPECT_EQ(L.kv_source, r.kv);
    EXPECT_EQ(L.index_source, r.index);
    EXPECT_EQ(L.candidate_source, r.cand);
    EXPECT_EQ(L.kv_from, r.kv_from);
    EXPECT_EQ(L.index_from, r.index_from);
    EXPECT_EQ(L.candidate_from, r.cand_from);
    EXPECT_EQ(L.engram_slot, r.engram);
    EXPECT_EQ(L.dspark_target, r.dspark);
    EXPECT_FALSE(L.hash_routed);
  }
}

TEST(Config, TinyV41Schedule) {
  // TINY_V41_SPEC.md §1 "Layer roles".
  ModelConfig c = FromJson(Fixture(kTiny));
  using M = CsaMode;
  ExpectSchedule(c, {
      {0, 0, M::kSwa, false, false, false, -1, -1, -1, -1, false},
      {1, 0, M::kSwa, false, false, false, -1, -1, -1, 0, false},
      {2, 2, M::kFull, true, true, false, 2, 2, -1, 1, false},
      {3, 2, M::kReuse, false, false, false, 2, 2, -1, -1, false},
      {4, 1, M::kFull, true, true, true, 4, 4, -1, -1, false},
      {5, 1, M::kReuse, false, false, false, 4, 4, -1, -1, false},
      {6, 1, M::kReindex, false, true, false, 4, 6, 4, -1, true},
      {7, 1, M::kReuse, false, false, false, 4, 6, -1, -1, true},
      {8, 0, M::kSwa, false, false, false, -1, -1, -1, -1, false},
      {9, 0, M::kSwa, false, false, false, -1, -1, -1, -1, false},
  });
}

TEST(Config, V41ReleaseSchedule) {
  // model-spec §1.3 / §1.4.
  ModelConfig c = FromJson(Fixture(kV41));
  ASSERT_EQ(c.layers.size(), 43u);
  EXPECT_EQ(c.vision_n_layers, 32);
  EXPECT_EQ(c.vision_dim, 1024);
  for (int i = 0; i < 43; ++i) {
    const LayerSchedule& L = c.layers[i];
    SCOPED_TRACE("layer " + std::to_string(i));
    if (i < 2 || i >= 40) {
      EXPECT_EQ(L.mode, CsaMode::kSwa);
      EXPECT_EQ(L.kv_from, -1);
      continue;
    }
    const int kv = i < 8 ? 2 : i < 14 ? 8 : i < 20 ? 14 : 20;
    EXPECT_EQ(L.compress_ratio, i < 20 ? 2 : 1);
    EXPECT_EQ(L.kv_from, kv);
    const bool full = i == 2 || i == 8 || i == 14 || i == 20;
    const bool reindex = i == 24 || i == 28 || i == 32 || i == 36;
    EXPECT_EQ(L.mode, full ? CsaMode::kFull : reindex ? CsaMode::kReindex : CsaMode::kReuse);
    const int index_from = i < 24 ? kv : (i / 4) * 4;  // nearest preceding index source
    EXPECT_EQ(L.index_from, index_from);
    EXPECT_EQ(L.candidate_source, i == 20);
    EXPECT_EQ(L.candidate_from, reindex ? 20 : -1);
    EXPECT_EQ(L.dspark_target, i >= 37);
    EXPECT_EQ(L.engram_slot, i == 1 ? 0 : i == 14 ? 1 : -1);
  }
  // model-spec §3.3.2: 24 consecutive primes 16000057 ... 16000463 (sum 384,006,168), then
  // 16000477 ... 16000889 (sum 384,016,682).
  ASSERT_EQ(c.engram_primes.size(), 2u);
  EXPECT_EQ(c.engram_primes[0].size(), 24u);
  EXPECT_EQ(c.engram_primes[0].front(), 16000057);
  EXPECT_EQ(c.engram_primes[0].back(), 16000463);
  EXPECT_EQ(c.engram_primes[1].front(), 16000477);
  EXPECT_EQ(c.engram_primes[1].back(), 16000889);
  EXPECT_EQ(std::accumulate(c.engram_primes[1].begin(), c.engram_primes[1].end(), int64_t{0}),
            384016682);
}

TEST(Config, V4Flash) {
  ModelConfig c = FromJson(Fixture(kV4));
  EXPECT_EQ(c.arch, Arch::kDeepseekV4);
  EXPECT_EQ(c.dim, 4096);
  EXPECT_EQ(c.n_layers, 43);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.n_hash_layers, 3);
  EXPECT_EQ(c.weight_block_size, 128);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.gate_temp, 1.0f);
  EXPECT_EQ(c.pad_token_id, -1);  // absent
  ASSERT_EQ(c.layers.size(), 44u);
  int c4 = 0, c128 = 0;
  for (const LayerSchedule& L : c.layers) {
    SCOPED_TRACE("layer " + std::to_string(L.layer));
    EXPECT_EQ(L.hash_routed, L.layer < 3);
    if (L.layer < 2 || L.layer == 43) {
      EXPECT_EQ(L.mode, CsaMode::kSwa);
    } else if (L.layer % 2 == 0) {
      EXPECT_EQ(L.mode, CsaMode::kC4);
      EXPECT_TRUE(L.kv_source && L.index_source);
      EXPECT_EQ(L.kv_from, L.layer);
      EXPECT_EQ(L.index_from, L.layer);
      ++c4;
    } else {
      EXPECT_EQ(L.mode, CsaMode::kC128);
      EXPECT_TRUE(L.kv_source);
      EXPECT_FALSE(L.index_source);
      EXPECT_EQ(L.index_from, -1);
      ++c128;
    }
  }
  EXPECT_EQ(c4, 21);   // model-spec §1.2
  EXPECT_EQ(c128, 20);
  EXPECT_TRUE(c.layers[43].is_mtp);
}

TEST(Config, TinyV4) {
  ModelConfig c = FromJson(Fixture(kTinyV4));
  ASSERT_EQ(c.layers.size(), 5u);
  EXPECT_EQ(c.layers[0].mode, CsaMode::kSwa);
  EXPECT_EQ(c.layers[1].mode, CsaMode::kC4);
  EXPECT_EQ(c.layers[2].mode, CsaMode::kC128);
  EXPECT_EQ(c.layers[3].mode, CsaMode::kC4);
  EXPECT_TRUE(c.layers[1].hash_routed);
  EXPECT_FALSE(c.layers[2].hash_routed);
}

TEST(Config, GateTempOptional) {
  json j = Fixture(kTiny);
  j["text_config"]["gate_temp"] = 2.0;
  EXPECT_EQ(FromJson(j).gate_temp, 2.0f);
  j["text_config"]["gate_temp"] = "hot";
  ExpectError([&] { FromJson(j); },
              {"config.json: text_config.gate_temp: expected a number, found a string \"hot\""});
}

TEST(Config, BadJson) {
  ExpectError([] { ModelConfig::FromJsonText("{\"model_type\": ", "m/config.json"); },
              {"m/config.json: not valid JSON"});
  ExpectError([] { ModelConfig::FromJsonText("[1]", "config.json"); },
              {"config.json: expected a JSON object at the top level, found an array"});
  ExpectError([] { ModelConfig::FromJsonText("{}", "config.json"); },
              {"config.json: missing required key model_type"});
  ExpectError([] { ModelConfig::FromJsonText(R"({"model_type":"llama"})", "config.json"); },
              {"model_type: expected \"deepseek_v41\" or \"deepseek_v4\", found \"llama\""});
}

TEST(Config, LoadMissingFile) {
  TempDir d;
  ExpectError([&] { ModelConfig::Load(d.path()); }, {"config.json: cannot open"});
  WriteFile(d / "config.json", "{ nope");
  ExpectError([&] { ModelConfig::Load(d.path()); }, {"config.json: not valid JSON"});
}

TEST(Config, MissingKeys) {
  ExpectConfigError(kTiny, [](json& j) { j["text_config"].erase("hidden_size"); },
                    {"config.json: missing required key text_config.hidden_size"});
  ExpectConfigError(kTiny, [](json& j) { j.erase("text_config"); },
                    {"config.json: missing required key text_config"});
  ExpectConfigError(kTiny, [](json& j) { j["quantization_config"].erase("weight_block_size"); },
                    {"missing required key quantization_config.weight_block_size"});
  ExpectConfigError(kTiny, [](json& j) { j["quantization_config"].erase("expert_dtype"); },
                    {"missing required key quantization_config.expert_dtype"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["rope_scaling"].erase("factor"); },
                    {"missing required key text_config.rope_scaling.factor"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"].erase("engram_pad_token_id"); },
                    {"missing required key text_config.engram_pad_token_id"});
  ExpectConfigError(kTiny, [](json& j) { j.erase("image_token_id"); },
                    {"missing required key image_token_id"});
  ExpectConfigError(kV4, [](json& j) { j.erase("num_hash_layers"); },
                    {"missing required key num_hash_layers"});
  ExpectConfigError(kV4, [](json& j) { j.erase("expert_dtype"); },
                    {"missing required key expert_dtype"});
  ExpectConfigError(kV41, [](json& j) { j["vision_config"].erase("patch_size"); },
                    {"missing required key vision_config.patch_size"});
  // The flat-config spelling of the Engram pad key is accepted too.
  json j = Fixture(kTiny);
  j["text_config"].erase("engram_pad_token_id");
  j["text_config"]["engram_pad_id"] = 2;
  EXPECT_EQ(FromJson(j).engram_pad_id, 2);
}

TEST(Config, WrongTypes) {
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["hidden_size"] = "64"; },
                    {"config.json: text_config.hidden_size: expected an integer, found a string "
                     "\"64\""});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["num_hidden_layers"] = 8.5; },
                    {"text_config.num_hidden_layers: expected an integer, found a number 8.5"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["norm_topk_prob"] = 1; },
                    {"text_config.norm_topk_prob: expected a boolean, found an integer 1"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["compress_ratios"] = 3; },
                    {"text_config.compress_ratios: expected an array of integers, found an "
                     "integer 3"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["kv_source_layer_ids"][1] = "4"; },
                    {"text_config.kv_source_layer_ids[1]: expected an integer, found a string"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["rope_scaling"] = nullptr; },
                    {"text_config.rope_scaling: expected an object, found null"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["scoring_func"] = "relu"; },
                    {"text_config.scoring_func: expected \"sqrtsoftplus\", \"softmax\" or "
                     "\"sigmoid\", found \"relu\""});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["hidden_size"] = 0; },
                    {"text_config.hidden_size: expected an integer in [1, 2147483647], found 0"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["num_key_value_heads"] = 8; },
                    {"text_config.num_key_value_heads: expected an integer in [1, 1], found 8"});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["hidden_act"] = "gelu"; },
                    {"text_config.hidden_act: expected \"silu\""});
  ExpectConfigError(kTiny, [](json& j) { j["quantization_config"]["weight_block_size"] = {32, 64}; },
                    {"quantization_config.weight_block_size: expected two equal block sizes"});
  ExpectConfigError(kTiny, [](json& j) { j["quantization_config"]["expert_dtype"] = "int4"; },
                    {"quantization_config.expert_dtype: expected \"fp4\" or \"fp8\", found "
                     "\"int4\""});
  ExpectConfigError(kTiny, [](json& j) { j["text_config"]["rope_scaling"]["rope_type"] = "linear"; },
                    {"text_config.rope_scaling.rope_type: expected \"yarn\""});
}

TEST(Config, ScheduleErrors) {
  auto tc = [](std::function<void(json&)> f) {
    return [f](json& j) { f(j["text_config"]); };
  };
  // A ratio>0 layer with no preceding KV source.
  ExpectConfigError(kTiny, tc([](json& t) {
                      t["compress_ratios"] = {0, 2, 2, 2, 1, 1, 1, 1, 0, 0};
                    }),
                    {"layer 1 has compress ratio 2 but no KV source at or before it"});
  // Reading a KV source of another ratio.
  ExpectConfigError(kTiny, tc([](json& t) { t["compress_ratios"] = {0, 0, 2, 1, 1, 1, 1, 1, 0, 0}; }),
                    {"layer 3 has compress ratio 1 but would read the compressed KV of layer 2 "
                     "(ratio 2)"});
  // List ids out of range / unordered.
  ExpectConfigError(kTiny, tc([](json& t) { t["kv_source_layer_ids"] = {2, 9}; }),
                    {"text_config.kv_source_layer_ids[1] = 9: expected a main-layer id in [0, 8)"});
  ExpectConfigError(kTiny, tc([](json& t) { t["index_source_layer_ids"] = {4, 2, 6}; }),
                    {"text_config.index_source_layer_ids = [4, 2, 6]: expected strictly "
                     "ascending"});
  ExpectConfigError(kTiny, tc([](json& t) { t["dspark_target_layer_ids"] = {6, 8}; }),
                    {"text_config.dspark_target_layer_ids[1] = 8"});
  ExpectConfigError(kTiny, tc([](json& t) { t["engram_layer_ids"] = {1, 20}; }),
                    {"text_config.engram_layer_ids[1] = 20"});
  // KV / index sources on ratio-0 layers; KV source that is not an index source.
  ExpectConfigError(kTiny, tc([](json& t) { t["index_source_layer_ids"] = {1, 2, 4, 6}; }),
                    {"layer 1 has compress ratio 0, expected > 0 for an index source"});
  ExpectConfigError(kTiny, tc([](json& t) { t["index_source_layer_ids"] = {2, 6}; }),
                    {"KV source layer 4 is not in text_config.index_source_layer_ids"});
  // Candidate source.
  ExpectConfigError(kTiny, tc([](json& t) { t["candidate_source_layer_id"] = 5; }),
                    {"text_config.candidate_source_layer_id = 5: expected one of "
                     "text_config.index_source_layer_ids = [2, 4, 6]"});
  ExpectConfigError(kTiny, tc([](json& t) { t["candidate_topk_blocks"] = 2; }),
                    {"text_config.candidate_topk_blocks 2 x text_config.candidate_block_size 4 - "
                     "(4 - 1) = 5 candidate positions, expected >= text_config.index_topk 8"});
  ExpectConfigError(kTiny, tc([](json& t) { t["candidate_source_layer_id"] = 2; }),
                    {"index source layer 4 follows the candidate source 2 but reads the "
                     "compressed KV of layer 4, expected layer 2"});
  // Candidate off is fine: Reindex layers then have no candidate mask.
  {
    json j = Fixture(kTiny);
    j["text_config"]["candidate_source_layer_id"] = -1;
    ModelConfig c = FromJson(j);
    EXPECT_EQ(c.layers[6].mode, CsaMode::kReindex);
    EXPECT_EQ(c.layers[6].candidate_from, -1);
  }
  // compress_ratios length and MTP entries.
  ExpectConfigError(kTiny, tc([](json& t) { t["compress_ratios"] = {0, 0, 2, 2, 1, 1, 1, 1}; }),
                    {"text_config.compress_ratios: expected 10 entries (num_hidden_layers 8 + "
                     "num_nextn_predict_layers 2), found 8"});
  ExpectConfigError(kTiny, tc([](json& t) { t["compress_ratios"] = {0, 0, 2, 2, 1, 1, 1, 1, 0, 1}; }),
                    {"text_config.compress_ratios[9] = 1: expected 0 (DSpark block mtp.1"});
  ExpectConfigError(kTiny, tc([](json& t) { t["compress_ratios"] = {0, 0, 4, 4, 1, 1, 1, 1, 0, 0}; }),
                    {"text_config.compress_ratios[2] = 4: expected 0, 1 or 2"});
  ExpectConfigError(kV4, [](json& j) { j["compress_ratios"][2] = 2; },
                    {"config.json: compress_ratios[2] = 2: expected 0, 4 or 128 for deepseek_v4"});
  // Engram rows must equal the sum of the bucket primes.
  ExpectConfigError(kTiny, tc([](json& t) { t["engram_num_embeddings"] = {2132, 2261}; }),
                    {"text_config.engram_num_embeddings[1]: expected 2260 rows", "found 2261"});
  ExpectConfigError(kTiny, tc([](json& t) { t["engram_num_embeddings"] = {2132}; }),
                    {"text_config.engram_num_embeddings: expected 2 entries"});
  ExpectConfigError(kTiny, tc([](json& t) { t["engram_n_heads"] = 4000; }),
                    {"text_config.engram_n_heads: 2 Engram layers x 2 n-gram orders x 4000 heads = "
                     "16000 hash tables, expected at most 4096"});
  // Shape relations.
  ExpectConfigError(kTiny, tc([](json& t) { t["o_groups"] = 3; }),
                    {"text_config.o_groups: expected a divisor of num_attention_heads (4), found 3"});
  ExpectConfigError(kTiny, tc([](json& t) { t["num_experts_per_tok"] = 9; }),
                    {"text_config.num_experts_per_tok: expected <= n_routed_experts (8), found 9"});
}

TEST(Config, MessagesAreSingleLine) {
  // Control characters from the file are escaped.
  std::string msg = ExpectError(
      [] { ModelConfig::FromJsonText(R"({"model_type":"a\nb"})", "config.json"); },
      {"found \"a\\x0ab\""});
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
