// deepinfer bench e2e --model DIR --json OUT [--png PNG] [--threads N]
//                     [--batches 1 4 16] [--prompt-len N] [--decode-steps N]
//
// End-to-end V4.1 or V4 (deepseek_v4, one process) forward speed on a checkpoint (meant for the `large`
// make-tiny preset, a few GB): prefill tok/s and decode tok/s at each batch
// size, the bytes of weights one decode token streams (batch 1: every dense
// tensor, top-k of the routed experts, one embedding row), the implied GB/s
// and its fraction of the STREAM triad bandwidth measured in the same run
// (`triad_gbps` at the top level), and the wall time split by model region
// (base/region_timer.h) when the forward pass is instrumented.
//
// Prompts are deterministic pseudo-random token ids (identical across batch
// sizes); the Engram token map is synthetic (id mod engram_compressed_vocab)
// unless the model directory has a tokenizer.json (then the real map).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/alloc_count.h"
#include "base/error.h"
#include "base/parallel.h"
#include "base/region_timer.h"
#include "bench_util.h"
#include "deepinfer/engine.h"
#include "engine/parallel_runner.h"
#include "engine/speculative.h"
#include "parallel/communicator.h"
#include "format/safetensors.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/config.h"
#include "model/state.h"
#include "model/v41/model.h"
#include "model/v4/model.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli::bench {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct E2eArgs {
  std::string model, json_out, png_out, target;
  int threads = 0;
  std::vector<int> batches = {1, 4, 16};
  int64_t prompt_len = 64;
  int decode_steps = 8;
  // Under mpirun (docs/parallel.md): --ep N splits the routed experts over the
  // N ranks (every rank runs the same batch: attention replicated); with
  // --dp N too, every rank runs its own batch of `batch` sequences and the
  // MoE layers exchange rows (general path for prefill, static for decode).
  int ep = 1, dp = 1;
  std::string fp8_format = "e4m3fn";
  // --speculative-config (docs/speculative.md): adds a section that decodes a
  // repetition prompt through the engine (batch 1, greedy) with speculation
  // off and on and reports ms/step, mean accepted length and decode tok/s.
  std::string speculative_config;
  int speculative_tokens = 64;  // output tokens of each speculative run
};

// Bytes of weights a batch-1 decode token reads (see file comment).
// wo_a_decode: the bytes the model's batch-1 decode streams for wo_a (its
// 8-bit decode copy where the packing made one), or 0: BF16, 2 per element.
json ActiveBytes(const TensorStore& store, const ModelConfig& c, int64_t wo_a_decode) {
  static const std::regex kExpert(R"(^layers\.\d+\.ffn\.experts\.\d+\..*)");
  static const std::regex kEngramTable(R"(^layers\.\d+\.engram\.embed\..*)");
  static const std::regex kWoA(R"(^layers\.\d+\.attn\.wo_a\.(weight|scale)$)");
  uint64_t dense = 0, routed_all = 0, excluded = 0, woa_numel = 0;
  for (const auto& [name, t] : store.all()) {
    if (name.rfind("mtp.", 0) == 0 || name.rfind("dspark", 0) == 0 || name.find("bias_vl") != std::string::npos ||
        name.find("tid2eid") != std::string::npos ||
        name.rfind("vision", 0) == 0 || name == "embed.weight" || std::regex_match(name, kEngramTable)) {
      excluded += t.nbytes;
    } else if (std::regex_match(name, kExpert)) {
      routed_all += t.nbytes;
    } else if (std::regex_match(name, kWoA)) {
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) woa_numel += t.numel();
    } else {
      dense += t.nbytes;
    }
  }
  // wo_a is dequantised to BF16 at load (2 bytes per element); a batch-1
  // decode streams its 8-bit copy instead where the packing made one.
  dense += wo_a_decode > 0 ? static_cast<uint64_t>(wo_a_decode) : 2 * woa_numel;
  const double routed_active =
      static_cast<double>(routed_all) * c.n_activated_experts / std::max(1, c.n_routed_experts);
  const double embed_row = 2.0 * c.dim;
  const double total = static_cast<double>(dense) + routed_active + embed_row;
  return json{{"bytes_per_token", total},
              {"dense_bytes", dense},
              {"routed_expert_bytes_all", routed_all},
              {"routed_expert_bytes_active", routed_active},
              {"excluded_bytes", excluded},
              {"wo_a_bytes", wo_a_decode > 0 ? static_cast<uint64_t>(wo_a_decode) : 2 * woa_numel},
              {"note", "batch 1: dense tensors (wo_a as its 8-bit decode copy where the packing made one, else "
                       "BF16) + top-k/E of routed experts + one embedding row; "
                       "MTP/DSpark, vision, Engram tables and KV-cache reads excluded"}};
}

std::vector<int32_t> Prompt(int64_t len, int seq, int64_t vocab) {
  std::vector<int32_t> t(len);
  uint64_t s = 0x1234567ull + static_cast<uint64_t>(seq) * 0x9E3779B97F4A7C15ull;
  for (auto& v : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<int32_t>(3 + (s >> 33) % static_cast<uint64_t>(std::min<int64_t>(vocab - 3, 120000)));
  }
  return t;
}

// Speculative decoding through the engine: one request whose prompt is a
// pseudo-random 16-token phrase repeated to prompt_len tokens, greedy,
// decode_steps output tokens; decode time = total − time to first token.
json SpeculativeRun(const E2eArgs& a, const std::string& spec) {
  EngineArgs ea;
  ea.model = a.model;
  ea.max_num_seqs = 1;
  ea.max_model_len = a.prompt_len + a.speculative_tokens + 16;
  ea.max_num_batched_tokens = std::max<int64_t>(512, a.prompt_len);
  ea.num_threads = a.threads;
  ea.fp8_format = a.fp8_format;
  ea.speculative_config = spec;
  ea.enable_prefix_caching = false;
  std::unique_ptr<Engine> engine = Engine::Open(ea);
  GenerateRequest req;
  std::vector<int32_t> phrase = Prompt(16, 7, engine->vocab_size()), ids;
  while (static_cast<int64_t>(ids.size()) < a.prompt_len) ids.push_back(phrase[ids.size() % phrase.size()]);
  req.prompt_token_ids = ids;
  req.params.temperature = 0;
  req.params.max_tokens = a.speculative_tokens;
  req.params.ignore_eos = true;
  // Random-weight checkpoints (make-tiny presets) practically never repeat
  // themselves; logit_bias +100 on three of the phrase's ids confines the
  // output to them (the order still follows the logits): a repetitive output,
  // the regime where n-gram drafting pays (serving-notes: report it as such).
  for (int i = 0; i < 3; ++i) req.params.logit_bias[phrase[static_cast<size_t>(i)]] = 100.0;
  engine->Submit(req);
  RequestOutput done;
  int64_t decode_steps = 0;
  bool first = true;
  while (engine->HasUnfinished()) {
    for (auto& o : engine->Step()) {
      if (!o.new_token_ids.empty() && !first) ++decode_steps;
      if (!o.new_token_ids.empty()) first = false;
      if (o.finished) done = o;
    }
  }
  if (!done.error.empty()) Fail(ErrorKind::kInternal, "bench e2e: speculative run failed: {}", done.error);
  const EngineStats st = engine->Stats();
  const double decode_s = done.total_time_s - done.time_to_first_token_s;
  const int64_t decoded = static_cast<int64_t>(done.token_ids.size()) - 1;
  json bias = json::object();
  for (const auto& [id, b] : req.params.logit_bias) bias[std::to_string(id)] = b;
  json r{{"speculative_config", spec.empty() ? json(nullptr) : json::parse(spec)},
         {"logit_bias", bias},
         {"prompt_len", a.prompt_len},
         {"generated_tokens", done.token_ids.size()},
         {"decode_seconds", decode_s},
         {"decode_steps", decode_steps},
         {"ms_per_step", decode_steps > 0 ? 1e3 * decode_s / decode_steps : 0.0},
         {"decode_tok_s", decode_s > 0 ? decoded / decode_s : 0.0},
         {"mean_accepted_length", st.spec_mean_accepted_length()},
         {"num_drafts", st.spec_num_drafts},
         {"num_draft_tokens", st.spec_num_draft_tokens},
         {"num_accepted_tokens", st.spec_num_accepted_tokens},
         {"num_accepted_tokens_per_pos", st.spec_num_accepted_tokens_per_pos},
         {"token_ids", done.token_ids}};
  std::printf("  speculative %-60s: %.1f ms/step, accepted length %.3f, %.2f tok/s\n",
              spec.empty() ? "off" : spec.c_str(), r["ms_per_step"].get<double>(), st.spec_mean_accepted_length(),
              r["decode_tok_s"].get<double>());
  std::fflush(stdout);
  return r;
}

json RegionsJson(double total_seconds) {
  const auto secs = RegionSeconds();
  double sum = 0;
  for (double s : secs) sum += s;
  if (sum <= 0) return nullptr;
  json j = json::object();
  for (int i = 0; i < static_cast<int>(Region::kCount); ++i)
    j[RegionName(static_cast<Region>(i))] = json{{"seconds", secs[i]}, {"share", secs[i] / total_seconds}};
  j["uninstrumented"] = json{{"seconds", total_seconds - sum}, {"share", (total_seconds - sum) / total_seconds}};
  return j;
}

void RunE2e(const E2eArgs& a) {
  if (a.model.empty()) Fail(ErrorKind::kInvalidArgument, "bench e2e: --model DIR is required");
  if (a.json_out.empty()) Fail(ErrorKind::kInvalidArgument, "bench e2e: --json OUT is required");
  if (a.prompt_len < 1 || a.prompt_len > 65536)
    Fail(ErrorKind::kInvalidArgument, "bench e2e: --prompt-len must be in [1, 65536], got {}", a.prompt_len);
  if (a.decode_steps < 1 || a.decode_steps > 65536)
    Fail(ErrorKind::kInvalidArgument, "bench e2e: --decode-steps must be in [1, 65536], got {}", a.decode_steps);
  if (a.batches.empty()) Fail(ErrorKind::kInvalidArgument, "bench e2e: --batches needs at least one batch size");
  (void)ParseSpeculativeConfig(a.speculative_config);  // a bad flag fails before anything is measured
  if (a.speculative_tokens < 2 || a.speculative_tokens > 65536)
    Fail(ErrorKind::kInvalidArgument, "bench e2e: --speculative-tokens must be in [2, 65536], got {}",
         a.speculative_tokens);
  Fp8Format fp8_format = Fp8Format::kE4M3FN;
  if (!ParseFp8Format(a.fp8_format, &fp8_format))
    Fail(ErrorKind::kInvalidArgument, "bench e2e: --fp8-format: unknown format '{}' (expected e4m3fn or e4m3-ieee)",
         a.fp8_format);
  for (const int B : a.batches) {
    if (B < 1 || B > 4096) Fail(ErrorKind::kInvalidArgument, "bench e2e: --batches must be in [1, 4096], got {}", B);
    if (static_cast<int64_t>(B) * (a.prompt_len + a.decode_steps) > (int64_t{1} << 20))
      Fail(ErrorKind::kInvalidArgument,
           "bench e2e: batch {} x (--prompt-len {} + --decode-steps {}) is over 2^20 tokens of state", B,
           a.prompt_len, a.decode_steps);
  }
  Communicator& world = World();
  {
    EngineArgs pa;
    pa.expert_parallel_size = a.ep;
    pa.data_parallel_size = a.dp;
    CheckParallelArgs(pa, world.size());
  }
  Communicator* comm = world.size() > 1 ? &world : nullptr;
  const bool leader = world.rank() == 0;
  if (!leader) std::freopen("/dev/null", "w", stdout);  // one report, from rank 0
  if (leader) {
    CheckWritable(a.json_out, "--json");
    if (!a.png_out.empty()) CheckWritable(a.png_out, "--png");
  }
  // The model's config before anything is measured (a wrong --model fails fast).
  (void)ModelConfig::Load(a.model);
  if (!a.target.empty()) cpu::SelectTarget(a.target);
  if (a.threads != 0) SetNumThreads(a.threads);
  const int threads = NumThreads();
  const fs::path dir(a.model);
  const fs::path json_path(a.json_out);
  const fs::path png = a.png_out.empty() ? fs::path(json_path).replace_extension(".png") : fs::path(a.png_out);

  json out;
  out["benchmark"] = "e2e";
  out["machine"] = MachineJson(threads);
  out["model"] = a.model;
  out["fp8_format"] = Fp8FormatName(fp8_format);
  std::printf("bench e2e: %s, %d threads, target %s\n", a.model.c_str(), threads, cpu::ActiveTarget().c_str());
  if (a.dp > 1)
    std::printf("  --dp %d: every rank runs its own batch; tok/s below are the job's (all ranks), GB/s one rank's\n",
                a.dp);
  // The triad runs on rank 0 alone (the others wait), so it is one rank's bandwidth.
  json stream = leader ? MeasureStream(int64_t{32} << 20, 5) : json{{"triad", {{"gbps", 0.0}}}};
  if (comm) comm->Barrier();
  const double triad = stream["triad"]["gbps"].get<double>();
  out["triad_gbps"] = triad;
  out["stream"] = stream;
  std::printf("  stream triad %.2f GB/s\n", triad);

  const ModelConfig cfg = ModelConfig::Load(dir);
  v41::V41Options opts;
  opts.comm = comm;
  opts.fp8_format = fp8_format;
  if (!cfg.engram_layer_ids.empty()) {
    if (fs::exists(dir / "tokenizer.json")) {
      const Tokenizer tok = Tokenizer::Load(dir);
      opts.engram_token_map =
          BuildCheckedEngramTokenMap(tok, cfg.engram_compressed_vocab_size, cfg.vocab_size, a.model).ids;
      out["engram_token_map"] = "tokenizer.json";
    } else {
      opts.engram_token_map.resize(cfg.vocab_size);
      for (int64_t i = 0; i < cfg.vocab_size; ++i)
        opts.engram_token_map[i] = static_cast<int32_t>(i % cfg.engram_compressed_vocab_size);
      out["engram_token_map"] = "synthetic (id mod engram_compressed_vocab_size)";
    }
  }
  // deepseek_v4 (model/v4/model.h): one process, the engine's per-row layout.
  const bool is_v4 = cfg.arch == Arch::kDeepseekV4;
  if (is_v4 && world.size() > 1)
    Fail(ErrorKind::kInvalidArgument, "bench e2e: deepseek_v4 runs in one process only (no --ep/--dp)");
  double t0 = Now();
  std::unique_ptr<v41::V41Model> model;
  std::unique_ptr<v4::V4Model> model4;
  if (is_v4) model4 = v4::V4Model::Load(dir);
  else model = v41::V41Model::Load(dir, opts);
  out["load_seconds"] = Now() - t0;
  out["ranks"] = world.size();
  out["expert_parallel_size"] = a.ep;
  out["data_parallel_size"] = a.dp;
  if (model) {
    // Weight bytes per rank (routed experts are split; the rest replicated).
    const auto& wb = model->weight_bytes();
    const int64_t mine[4] = {wb.routed_experts, wb.engram_rows, wb.replicated, wb.packed};
    std::vector<int64_t> all(static_cast<size_t>(4 * world.size()));
    if (comm) comm->AllGather(mine, sizeof(mine), all.data());
    else std::copy(mine, mine + 4, all.begin());
    json per = json::array();
    for (int q = 0; q < world.size(); ++q)
      per.push_back({{"rank", q},
                     {"routed_expert_bytes", all[4 * q]},
                     {"engram_row_bytes", all[4 * q + 1]},
                     {"replicated_bytes", all[4 * q + 2]},
                     {"packed_bytes", all[4 * q + 3]}});
    out["weight_bytes_per_rank"] = per;
    std::printf("  %d rank(s): routed experts %.1f MiB per rank, Engram rows %.1f MiB, replicated %.1f MiB\n",
                world.size(), all[0] / 1048576.0, all[1] / 1048576.0, all[2] / 1048576.0);
  }
  {
    std::unique_ptr<TensorStore> store = TensorStore::Open(dir);
    const int64_t wo_a_decode = model ? model->weight_bytes().wo_a_decode : (model4 ? model4->wo_a_decode_bytes() : 0);
    out["active_weights"] = ActiveBytes(*store, cfg, wo_a_decode);
    out["checkpoint_bytes"] = store->total_bytes();
  }
  const double active = out["active_weights"]["bytes_per_token"].get<double>();
  std::printf("  model: dim %lld, %d layers, %d/%d experts; %.1f MB of weights per decode token (batch 1)\n",
              static_cast<long long>(cfg.dim), cfg.n_layers, cfg.n_activated_experts, cfg.n_routed_experts,
              active / 1e6);

  const int64_t total_tokens = a.prompt_len + a.decode_steps + 1;
  std::vector<json> runs;
  for (int B : a.batches) {
    if (B < 1) Fail(ErrorKind::kInvalidArgument, "bench e2e: batch sizes must be >= 1");
    const StateGeometry geo = is_v4 ? model4->Geometry(16) : model->geometry(16);
    const int64_t blocks = geo.BlocksForTokens(total_tokens);
    DenseStateArena arena(geo, B, blocks * B);
    std::vector<std::vector<int32_t>> tables(B), prompts(B);
    std::vector<SequenceStateView> views(B);
    for (int s = 0; s < B; ++s) {
      for (int64_t b = 0; b < blocks; ++b) tables[s].push_back(static_cast<int32_t>(s * blocks + b));
      views[s] = arena.View(s, tables[s].data(), blocks);
      prompts[s] = Prompt(a.prompt_len, s, cfg.vocab_size);
    }
    v41::ForwardOutput fo;
    // Prefill: all B prompts in one call.
    ResetRegionTimes();
    EnableRegionTimer(true);
    v41::ForwardBatch pb;
    pb.exchange = a.dp > 1 ? EpExchange::kGeneral : EpExchange::kReplicated;
    for (int s = 0; s < B; ++s) {
      v41::ForwardSeq q;
      q.tokens = prompts[s].data();
      q.len = a.prompt_len;
      q.start_pos = 0;
      q.state = views[s];
      pb.seqs.push_back(q);
    }
    // V4: the same chunks through V4Model::Forward (its logits in fo's layout).
    // The V4 batch and logits vectors are reused (capacity kept), so a
    // steady-state decode step allocates only what the model does.
    std::vector<v4::V4Seq> seqs4;
    auto forward = [&](const v41::ForwardBatch& b) {
      if (!is_v4) {
        model->Forward(b, &fo);
        return;
      }
      seqs4.clear();
      for (const v41::ForwardSeq& q : b.seqs) seqs4.push_back({q.tokens, q.len, q.start_pos, q.state, true, false});
      model4->ForwardInto(seqs4, /*per_row_layout=*/true, &fo.logits);
      fo.vocab = cfg.vocab_size;
    };
    t0 = Now();
    forward(pb);
    const double prefill_s = Now() - t0;
    const json prefill_regions = RegionsJson(prefill_s);
    // Decode: one token per sequence per step (greedy next token, so the
    // routed experts follow the model).
    std::vector<int32_t> next(B);
    auto argmax_rows = [&] {
      for (int s = 0; s < B; ++s) {
        const float* l = fo.logits.data() + static_cast<int64_t>(s) * fo.vocab;
        next[s] = static_cast<int32_t>(std::max_element(l, l + fo.vocab) - l);
      }
    };
    argmax_rows();
    std::vector<double> steps;
    ResetRegionTimes();
    double decode_total = 0;
    uint64_t decode_allocs = 0, first_step_allocs = 0;
    v41::ForwardBatch db;
    db.exchange = a.dp > 1 ? EpExchange::kStatic : EpExchange::kReplicated;
    for (int st = 0; st < a.decode_steps; ++st) {
      db.seqs.clear();
      for (int s = 0; s < B; ++s) {
        v41::ForwardSeq q;
        q.tokens = &next[s];
        q.len = 1;
        q.start_pos = a.prompt_len + st;
        q.state = views[s];
        db.seqs.push_back(q);
      }
      const uint64_t allocs0 = HeapAllocations();
      t0 = Now();
      forward(db);
      const double dt = Now() - t0;
      // The first decode step after the prefill may grow buffers (decode
      // shapes differ from prefill shapes); steady state is every later step.
      (st == 0 ? first_step_allocs : decode_allocs) += HeapAllocations() - allocs0;
      steps.push_back(dt);
      decode_total += dt;
      argmax_rows();
    }
    EnableRegionTimer(false);
    const json decode_regions = RegionsJson(decode_total);
    const double step = Median(steps);
    // With --dp every rank runs its own B sequences: the job's rate is dp times one rank's.
    const double prefill_tps = a.dp * B * a.prompt_len / prefill_s, decode_tps = a.dp * B / step;
    json r{{"batch", B},
           {"prompt_len", a.prompt_len},
           {"prefill_seconds", prefill_s},
           {"prefill_tok_s", prefill_tps},
           {"decode_steps", a.decode_steps},
           {"decode_step_seconds_median", step},
           {"decode_step_samples", steps},
           {"decode_tok_s", decode_tps},
           {"heap_allocations_per_decode_step",
            a.decode_steps > 1 ? static_cast<double>(decode_allocs) / (a.decode_steps - 1) : 0.0},
           {"heap_allocations_first_decode_step", static_cast<double>(first_step_allocs)},
           {"sequences_per_rank", B},
           {"collective_seconds_per_decode_step",
            decode_regions.is_null() || !decode_regions.contains("collective")
                ? 0.0
                : decode_regions["collective"]["seconds"].get<double>() / a.decode_steps},
           {"prefill_regions", prefill_regions},
           {"decode_regions", decode_regions}};
    if (B == 1) {
      const double gbps = active / step / 1e9;
      r["decode_weight_bytes_per_step"] = active;
      r["decode_weight_gbps"] = gbps;
      r["fraction_of_triad"] = gbps / triad;
      r["fraction_basis"] = "active_weights.bytes_per_token";
    } else {
      // Upper bound of distinct weights per step: dense once + min(E, B·k) experts.
      const auto& aw = out["active_weights"];
      const double experts = std::min<double>(cfg.n_routed_experts, static_cast<double>(B) * cfg.n_activated_experts);
      const double bytes = aw["dense_bytes"].get<double>() +
                           aw["routed_expert_bytes_all"].get<double>() * experts / cfg.n_routed_experts;
      r["decode_weight_bytes_per_step"] = bytes;
      r["decode_weight_gbps"] = bytes / step / 1e9;
      r["fraction_of_triad"] = bytes / step / 1e9 / triad;
      r["fraction_basis"] = "upper bound: dense bytes + min(E, B*topk) routed experts per step";
    }
    std::printf("  batch %2d: prefill %8.1f tok/s (%.2f s for %lld tokens), decode %7.2f tok/s (step %.1f ms)%s\n", B,
                prefill_tps, prefill_s, static_cast<long long>(B * a.prompt_len), decode_tps, step * 1e3,
                B == 1 ? fmt::format(", {:.2f} GB/s = {:.1f}% of triad", r["decode_weight_gbps"].get<double>(),
                                     100 * r["fraction_of_triad"].get<double>())
                             .c_str()
                       : "");
    std::printf("            heap allocations per decode step: %.1f (steady state; first step after the prefill: %.0f)\n",
                r["heap_allocations_per_decode_step"].get<double>(),
                r["heap_allocations_first_decode_step"].get<double>());
    if (!decode_regions.is_null()) {
      std::printf("            decode time by region:");
      for (auto it = decode_regions.begin(); it != decode_regions.end(); ++it)
        std::printf(" %s %.0f%%", it.key().c_str(), 100 * it.value()["share"].get<double>());
      std::printf("\n");
    }
    std::fflush(stdout);
    runs.push_back(r);
  }
  out["runs"] = runs;
  if (runs[0]["batch"] == 1) {
    out["decode_batch1_fraction_of_triad"] = runs[0]["fraction_of_triad"];
    const json& dr = runs[0]["decode_regions"];
    if (!dr.is_null()) {
      // Regions whose time is not GEMM/GEMV (the issue's "non-GEMM share").
      double non_gemm = 0;
      for (const char* k : {"embed", "mhc", "norm", "attention_core", "compressor", "indexer", "router"})
        if (dr.contains(k)) non_gemm += dr[k]["share"].get<double>();
      out["decode_batch1_non_gemm_share"] = non_gemm;
      out["non_gemm_regions"] = {"embed", "mhc", "norm", "attention_core", "compressor", "indexer", "router"};
      std::printf("  batch-1 decode: %.1f%% of triad, non-GEMM share %.1f%%\n",
                  100 * runs[0]["fraction_of_triad"].get<double>(), 100 * non_gemm);
    }
  }
  out["regions_instrumented"] = !runs[0]["decode_regions"].is_null();
  if (!a.speculative_config.empty()) {
    if (comm) Fail(ErrorKind::kInvalidArgument, "bench e2e: --speculative-config runs in one process only (no mpirun)");
    model.reset();  // the engine loads its own copy
    json spec = json::object();
    spec["off"] = SpeculativeRun(a, "");
    spec["on"] = SpeculativeRun(a, a.speculative_config);
    spec["identical_tokens"] = spec["off"]["token_ids"] == spec["on"]["token_ids"];
    spec["speedup"] = spec["on"]["decode_tok_s"].get<double>() / std::max(1e-12, spec["off"]["decode_tok_s"].get<double>());
    std::printf("  speculative: tokens identical to off: %s, decode speed-up %.2fx\n",
                spec["identical_tokens"].get<bool>() ? "yes" : "NO", spec["speedup"].get<double>());
    out["speculative"] = spec;
  }
  if (!leader) return;
  WriteJson(json_path, out);

  // Plot: tok/s per batch (prefill, decode) and the batch-1 decode region split.
  const fs::path base = fs::path(png).replace_extension("");
  {
    std::ofstream f(base.string() + ".tps.dat");
    f << "# batch prefill_tok_s decode_tok_s\n";
    for (const json& r : runs)
      f << r["batch"].get<int>() << " " << r["prefill_tok_s"].get<double>() << " " << r["decode_tok_s"].get<double>()
        << "\n";
  }
  bool have_regions = false;
  {
    std::ofstream f(base.string() + ".regions.dat");
    f << "# region decode_share_batch1\n";
    const json& dr = runs[0]["decode_regions"];
    if (!dr.is_null())
      for (auto it = dr.begin(); it != dr.end(); ++it) {
        f << '"' << it.key() << "\" " << 100 * it.value()["share"].get<double>() << "\n";
        have_regions = true;
      }
  }
  std::string script = fmt::format(
      R"GP(set terminal pngcairo size 1400,600 font ",10" noenhanced
set output '{png}'
set multiplot layout 1,{panels} title "deepinfer bench e2e — {model}; triad {triad:.1f} GB/s; batch-1 decode {frac:.1f}% of triad"
set title "tokens/s by batch size"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set logscale y
set ylabel "tok/s"
set xlabel "batch"
plot '{tps}' using 2:xtic(1) title "prefill", '' using 3 title "decode"
)GP",
      fmt::arg("png", png.string()), fmt::arg("panels", have_regions ? 2 : 1), fmt::arg("model", a.model),
      fmt::arg("triad", triad),
      fmt::arg("frac", runs[0].contains("fraction_of_triad") ? 100 * runs[0]["fraction_of_triad"].get<double>() : 0.0),
      fmt::arg("tps", base.string() + ".tps.dat"));
  if (have_regions)
    script += fmt::format(R"GP(unset logscale y
set title "batch-1 decode time by region (%)"
set style data histograms
set style histogram rowstacked
set ylabel "% of decode step"
set xlabel ""
set xtics rotate by -35 left
set rmargin 12
plot '{reg}' using 2:xtic(1) notitle lc rgb "#4477aa"
)GP",
                          fmt::arg("reg", base.string() + ".regions.dat"));
  script += "unset multiplot\n";
  const bool plotted = RunGnuplot(png, script);
  std::printf("wrote %s%s\n", json_path.string().c_str(), plotted ? (" and " + png.string()).c_str() : "");
}

}  // namespace

void RegisterBenchE2e(CLI::App& bench) {
  auto args = std::make_shared<E2eArgs>();
  auto* e = bench.add_subcommand("e2e", "End-to-end prefill/decode tok/s vs memory bandwidth on a checkpoint");
  e->add_option("--model", args->model, "Model directory (e.g. make-tiny --preset large)")->required();
  e->add_option("--json", args->json_out, "Output JSON file")->required();
  e->add_option("--png", args->png_out, "Output PNG plot (default: JSON path with .png)");
  e->add_option("--threads", args->threads, "Worker threads (default: all hardware threads)");
  e->add_option("--target", args->target, "SIMD target: auto | avx512 | avx2 | the fallback (default auto)");
  e->add_option("--batches", args->batches, "Batch sizes")->capture_default_str();
  e->add_option("--prompt-len", args->prompt_len, "Prompt tokens per sequence")->capture_default_str();
  e->add_option("--decode-steps", args->decode_steps, "Decode steps timed (median reported)")->capture_default_str();
  e->add_option("--ep,--expert-parallel-size", args->ep, "Under mpirun -np N: routed experts split over N ranks")
      ->capture_default_str();
  e->add_option("--dp,--data-parallel-size", args->dp, "Under mpirun: each rank runs its own batch (1 or --ep N)")
      ->capture_default_str();
  e->add_option("--fp8-format", args->fp8_format, "FP8 numerics: e4m3fn | e4m3-ieee (see generate --help)")
      ->capture_default_str();
  e->add_option("--speculative-config", args->speculative_config,
                "Also decode a repetition prompt through the engine with and without this speculative config "
                "(docs/speculative.md)");
  e->add_option("--speculative-tokens", args->speculative_tokens,
                "Output tokens of each --speculative-config run")
      ->capture_default_str();
  e->callback([args] { RunE2e(*args); });
}

}  // namespace deepinfer::cli::bench
