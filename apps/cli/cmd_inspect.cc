// deepinfer inspect MODEL_DIR [--json] [--tensors] [--config-only]
//
// Reads MODEL_DIR/config.json (ModelConfig::Load), derives the tensor plan
// (ExpectedTensors), opens the safetensors checkpoint (TensorStore::Open) and
// validates it (ValidateCheckpoint), then prints the architecture, key
// dimensions, the layer schedule (one line per layer), the parameter count
// (FP4 byte = 2 parameters) and bytes per dtype. --config-only skips the
// checkpoint (sizes are then the plan's); --tensors lists the expected tensors
// (name, dtype, stored shape, role). Errors are deepinfer::Error: main
// prints "error: <message>" and exits with status 2.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "commands.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/tensor_plan.h"

namespace deepinfer::cli {
namespace {

struct InspectOptions {
  std::string model_dir;
  bool json = false;
  bool config_only = false;
  bool tensors = false;
};

// 23056468 -> "23,056,468".
std::string Grouped(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string IntList(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
std::string IntList64(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string LayerName(const ModelConfig& c, const LayerSchedule& L) {
  return L.is_mtp ? fmt::format("mtp.{}", L.layer - c.n_layers) : std::to_string(L.layer);
}

// Role words of one layer, e.g. "kv-source index-source candidate-source engram[1]".
std::vector<std::string> LayerRoles(const ModelConfig& c, const LayerSchedule& L) {
  std::vector<std::string> r;
  if (L.kv_source) r.push_back("kv-source");
  if (L.index_source) r.push_back("index-source");
  if (L.candidate_source) r.push_back("candidate-source");
  if (L.candidate_from >= 0) r.push_back(fmt::format("candidates-from={}", L.candidate_from));
  if (L.mode == CsaMode::kReuse || L.mode == CsaMode::kReindex)
    r.push_back(fmt::format("kv-from={}", L.kv_from));
  if (L.mode == CsaMode::kReuse) r.push_back(fmt::format("topk-from={}", L.index_from));
  if (L.engram_slot >= 0) r.push_back(fmt::format("engram[{}]", L.engram_slot));
  if (L.dspark_target) r.push_back("dspark-target");
  if (L.hash_routed) r.push_back("hash-routed");
  if (L.is_mtp) r.push_back(c.arch == Arch::kDeepseekV41 ? "dspark-block" : "mtp-block");
  return r;
}

nlohmann::json TensorListJson(const std::vector<ExpectedTensor>& plan) {
  nlohmann::json a = nlohmann::json::array();
  for (const ExpectedTensor& t : plan)
    a.push_back({{"name", t.name},
                 {"dtype", std::string(DTypeName(t.dtype))},
                 {"shape", t.shape},
                 {"role", TensorRoleName(t.role)}});
  return a;
}

nlohmann::json ToJson(const ModelConfig& c, const TensorStats& st, const ValidationReport* rep,
                      const TensorStore* store, const std::string& dir) {
  using nlohmann::json;
  json j;
  j["model_dir"] = dir;
  j["architecture"] = ArchName(c.arch);
  j["dims"] = {{"vocab_size", c.vocab_size},
               {"hidden_size", c.dim},
               {"num_hidden_layers", c.n_layers},
               {"num_nextn_predict_layers", c.n_mtp_layers},
               {"num_attention_heads", c.n_heads},
               {"head_dim", c.head_dim},
               {"qk_rope_head_dim", c.rope_head_dim},
               {"q_lora_rank", c.q_lora_rank},
               {"o_groups", c.o_groups},
               {"o_lora_rank", c.o_lora_rank},
               {"sliding_window", c.window_size},
               {"moe_intermediate_size", c.moe_inter_dim},
               {"n_routed_experts", c.n_routed_experts},
               {"num_experts_per_tok", c.n_activated_experts},
               {"n_shared_experts", c.n_shared_experts},
               {"index_n_heads", c.index_n_heads},
               {"index_head_dim", c.index_head_dim},
               {"index_topk", c.index_topk},
               {"hc_mult", c.hc_mult},
               {"weight_block_size", c.weight_block_size},
               {"expert_dtype", c.expert_dtype}};
  json layers = json::array();
  for (const LayerSchedule& L : c.layers) {
    json l = {{"name", LayerName(c, L)},
              {"layer", L.layer},
              {"is_mtp", L.is_mtp},
              {"compress_ratio", L.compress_ratio},
              {"mode", CsaModeName(L.mode)},
              {"kv_source", L.kv_source},
              {"index_source", L.index_source},
              {"candidate_source", L.candidate_source},
              {"kv_from", L.kv_from},
              {"index_from", L.index_from},
              {"candidate_from", L.candidate_from},
              {"engram_slot", L.engram_slot},
              {"dspark_target", L.dspark_target},
              {"hash_routed", L.hash_routed}};
    layers.push_back(l);
  }
  j["layers"] = layers;
  j["tensors"] = st.n_tensors;
  j["parameters"] = st.params;
  j["parameters_without_scales"] = st.weight_params();
  j["bytes"] = st.bytes;
  json by = json::object();
  for (const auto& [dt, b] : st.bytes_by_dtype)
    by[std::string(DTypeName(dt))] = {{"bytes", b}, {"tensors", st.tensors_by_dtype.at(dt)}};
  j["bytes_by_dtype"] = by;
  if (store && rep) {
    j["checkpoint"] = {{"shards", store->shard_names()},
                       {"tensors_checked", rep->n_checked},
                       {"ignored", rep->ignored}};
  } else {
    j["checkpoint"] = nullptr;
  }
  return j;
}

void PrintText(const ModelConfig& c, const TensorStats& st, const ValidationReport* rep,
               const TensorStore* store, const std::string& dir) {
  std::printf("model         %s\n", dir.c_str());
  std::printf("architecture  %s\n", ArchName(c.arch));
  std::printf("dims          vocab %lld, hidden %lld, layers %d + %d %s, heads %d x %lld "
              "(rope %lld), q_lora %lld, o_groups %d x o_lora %lld, window %lld\n",
              (long long)c.vocab_size, (long long)c.dim, c.n_layers, c.n_mtp_layers,
              c.arch == Arch::kDeepseekV41 ? "DSpark" : "MTP", c.n_heads, (long long)c.head_dim,
              (long long)c.rope_head_dim, (long long)c.q_lora_rank, c.o_groups,
              (long long)c.o_lora_rank, (long long)c.window_size);
  std::printf("moe           %d experts top-%d + %d shared, inter %lld, %s, route_scale %g, "
              "swiglu_limit %g%s\n",
              c.n_routed_experts, c.n_activated_experts, c.n_shared_experts,
              (long long)c.moe_inter_dim, c.score_func.c_str(), c.route_scale, c.swiglu_limit,
              c.arch == Arch::kDeepseekV4 ? fmt::format(", hash layers {}", c.n_hash_layers).c_str()
                                          : "");
  std::printf("indexer       %d heads x %lld, top-%d", c.index_n_heads, (long long)c.index_head_dim,
              c.index_topk);
  if (c.arch == Arch::kDeepseekV41) {
    if (c.candidate_source_layer >= 0)
      std::printf("; candidate source %d: %d blocks x %d", c.candidate_source_layer,
                  c.candidate_topk_blocks, c.candidate_block_size);
    else
      std::printf("; no candidate source");
  }
  std::printf("\n");
  if (c.arch == Arch::kDeepseekV41) {
    std::printf("engram        layers %s, rows %s, n-grams 2..%d, %d heads x %lld\n",
                IntList(c.engram_layer_ids).c_str(), IntList64(c.engram_num_embeddings).c_str(),
                c.engram_max_ngram_size, c.engram_n_heads, (long long)c.engram_head_dim);
    std::printf("dspark        block %d, targets %s, %d experts top-%d, markov rank %lld\n",
                c.dspark_block_size, IntList(c.dspark_target_layer_ids).c_str(),
                c.dspark_n_routed_experts, c.dspark_n_activated_experts,
                (long long)c.dspark_markov_rank);
    if (c.vision_n_layers > 0)
      std::printf("vision        %d layers, hidden %lld\n", c.vision_n_layers,
                  (long long)c.vision_dim);
    else
      std::printf("vision        off\n");
  }
  std::printf("quantisation  weights FP8 E4M3 %dx%d blocks (UE8M0 scales), experts %s\n",
              c.weight_block_size, c.weight_block_size, c.expert_dtype.c_str());
  std::printf("norm_eps      %g, hc_mult %d, rope_theta %g / compress %g, yarn factor %g\n",
              c.norm_eps, c.hc_mult, c.rope_theta, c.compress_rope_theta, c.rope_factor);

  std::printf("layer schedule (%zu entries)\n", c.layers.size());
  std::printf("  %-6s %5s  %-7s %7s %10s  %s\n", "layer", "ratio", "mode", "kv_from", "index_from",
              "roles");
  for (const LayerSchedule& L : c.layers) {
    std::string roles;
    for (const std::string& r : LayerRoles(c, L)) roles += (roles.empty() ? "" : " ") + r;
    std::string kv = L.kv_from >= 0 ? std::to_string(L.kv_from) : "-";
    std::string ix = L.index_from >= 0 ? std::to_string(L.index_from) : "-";
    std::printf("  %-6s %5d  %-7s %7s %10s  %s\n", LayerName(c, L).c_str(), L.compress_ratio,
                CsaModeName(L.mode), kv.c_str(), ix.c_str(), roles.c_str());
  }
  if (store && rep) {
    std::string shards;
    for (const std::string& s : store->shard_names()) shards += (shards.empty() ? "" : ", ") + s;
    std::printf("checkpoint    %s: all %lld expected tensors present with the expected dtype "
                "and shape",
                shards.c_str(), (long long)rep->n_checked);
    if (!rep->ignored.empty()) std::printf("; %zu tolerated extra tensors ignored", rep->ignored.size());
    std::printf("\n");
  } else {
    std::printf("checkpoint    not opened (--config-only)\n");
  }
  std::printf("tensors       %s\n", Grouped(st.n_tensors).c_str());
  std::printf("parameters    %s (every stored element, scales included; an FP4 byte counts as "
              "2); %s without scales\n",
              Grouped(st.params).c_str(), Grouped(st.weight_params()).c_str());
  std::printf("bytes         %s\n", Grouped(st.bytes).c_str());
  for (const auto& [dt, b] : st.bytes_by_dtype)
    std::printf("  %-8s %18s bytes in %s tensors\n", std::string(DTypeName(dt)).c_str(),
                Grouped(b).c_str(), Grouped(st.tensors_by_dtype.at(dt)).c_str());
}

void RunInspect(const InspectOptions& o) {
  const ModelConfig cfg = ModelConfig::Load(o.model_dir);
  const std::vector<ExpectedTensor> plan = ExpectedTensors(cfg);
  const TensorStats st = SummarizeTensors(plan);
  std::unique_ptr<TensorStore> store;
  ValidationReport rep;
  if (!o.config_only) {
    store = TensorStore::Open(o.model_dir);
    rep = ValidateCheckpoint(cfg, *store);
  }
  if (o.json) {
    nlohmann::json j = ToJson(cfg, st, store ? &rep : nullptr, store.get(), o.model_dir);
    if (o.tensors) j["expected_tensors"] = TensorListJson(plan);
    std::string out = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", out.c_str());
  } else {
    PrintText(cfg, st, store ? &rep : nullptr, store.get(), o.model_dir);
    if (o.tensors) {
      std::printf("expected tensors (%zu)\n", plan.size());
      for (const ExpectedTensor& t : plan)
        std::printf("  %s\t%s\t%s\t%s\n", t.name.c_str(), std::string(DTypeName(t.dtype)).c_str(),
                    ShapeString(t.shape).c_str(), TensorRoleName(t.role));
    }
  }
}

}  // namespace

void RegisterInspect(CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand(
      "inspect", "Validate a checkpoint and print its architecture, layer schedule and sizes");
  cmd->add_option("MODEL_DIR", opts->model_dir, "Model directory (config.json + safetensors)")
      ->required();
  cmd->add_flag("--json", opts->json, "Machine-readable output");
  cmd->add_flag("--tensors", opts->tensors,
                "Also list every expected tensor (name, dtype, stored shape, role)");
  cmd->add_flag("--config-only", opts->config_only,
                "Read config.json only; do not open or validate the safetensors files");
  cmd->callback([opts] { RunInspect(*opts); });
}

}  // namespace deepinfer::cli
