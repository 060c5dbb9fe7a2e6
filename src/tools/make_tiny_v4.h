// deepinfer/tools/make_tiny_v4.h — the deterministic tiny DeepSeek-V4-Flash
// checkpoint generator (`deepinfer make-tiny --arch deepseek_v4 OUT_DIR`).
//
// A C++ re-implementation of shared/golden/TINY_V4_SPEC.md (reference:
// make_tiny_v4.py). The value rule is V4.1's (make_tiny.h: fnv1a64 / splitmix64
// counter hash); what is V4's: the tensor roles (compressors with APE, the
// indexer, hash-routing `tid2eid` on the first n_hash_layers, `hc_head`, the MTP
// block's e_proj/h_proj/enorm/hnorm/norm), 128×128 FP8 blocks and the
// 4×/¼× expert amplitudes. The default (tiny) model is byte-identical to the
// golden checkpoint:
//   model.safetensors             e1691e695b17bce27d5b4eedc26046f6ca542bc10b013f3820b9e8c63f38b22d
//   model.safetensors.index.json  f73fce717ccc8f913d335e06bd8036c13000844e63cf7fcb26d44ede85034496
//   config.json                   789f38098d1bf057470a069593e017b1d190b950fa104b7403b9c01d46b269b3
//   inference/config.json         241918d0c8ef615d245f2159386565644273a83a0715a7b99d5b8d32a17e698c
//
// Presets:
//  preset  dim layers(hash) mtp heads  hd q_lora o_grp o_lora inter  E/top window idx(h,topk) ratios
//  tiny    128   4 (2)       1    2   128   128    2     64   128   8/2    32    4, 16      0,4,128,4 | 0
//  large  1024  16 (3)       1   16   512   512    8    512   512 128/6   128   16, 512    0,0,4,128,4,128,...,4 | 0
// (`large` is the end-to-end benchmark model; everything else as tiny.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tools/make_tiny.h"

namespace deepinfer::tiny {

// Flat V4 ModelArgs, field names and order as in the reference's
// inference/config.json (TINY_V4_SPEC.md §1).
struct TinyV4Config {
  int64_t vocab_size = 129280;
  int64_t dim = 128;
  int64_t moe_inter_dim = 128;
  int n_layers = 4;
  int n_hash_layers = 2;
  int n_mtp_layers = 1;
  int n_heads = 2;
  int64_t head_dim = 128;
  int64_t rope_head_dim = 64;
  int64_t q_lora_rank = 128;
  int o_groups = 2;
  int64_t o_lora_rank = 64;
  int64_t window_size = 32;
  std::vector<int> compress_ratios = {0, 4, 128, 4, 0};
  int index_n_heads = 4;
  int64_t index_head_dim = 128;
  int index_topk = 16;
  int n_routed_experts = 8;
  int n_activated_experts = 2;
  int n_shared_experts = 1;
  std::string score_func = "sqrtsoftplus";
  double route_scale = 1.5;
  double swiglu_limit = 10.0;
  double norm_eps = 1e-06;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-06;
  int64_t rope_theta = 10000;
  int64_t compress_rope_theta = 160000;
  int64_t original_seq_len = 65536;
  int64_t rope_factor = 16;
  int64_t beta_fast = 32;
  int64_t beta_slow = 1;
  std::string dtype = "fp8";
  std::string scale_fmt = "ue8m0";
  std::string expert_dtype = "fp4";

  bool operator==(const TinyV4Config&) const = default;
};

// "tiny" (the golden model) or "large"; Error(kInvalidArgument) for others.
TinyV4Config V4PresetConfig(TinyPreset p);
// Throws Error(kInvalidArgument) naming the field when `c` cannot be written:
// dims not multiples of 128 (FP8 blocks) / 32 (FP4 groups), compress_ratios not
// n_layers + n_mtp_layers entries of {0, 4, 128} (MTP 0), n_hash_layers outside
// [0, n_layers], n_routed_experts < 2, ... (tid2eid with k > 2 ids: the
// extension of the spec's rule in make_tiny.cc EncodeTid2eid).
void ValidateV4Config(const TinyV4Config& c);
// Every value tensor (make_tiny.h PlannedTensor), TINY_V4_SPEC.md §4.
std::vector<PlannedTensor> PlanV4Tensors(const TinyV4Config& c);
// config.json (HF form, hf_config() of the script) and inference/config.json
// (json.dumps(CFG, indent=2) + "\n"), by the emitter.
std::string V4HfConfigJson(const TinyV4Config& c);
std::string V4InferenceConfigJson(const TinyV4Config& c);
// TSV of make_tiny_v4.py --list.
std::string V4TensorListTsv(const TinyV4Config& c);
// Validates and writes OUT_DIR (make_tiny.h WritePlannedCheckpoint).
WriteResult WriteTinyV4Checkpoint(const TinyV4Config& c, const std::filesystem::path& out_dir,
                                  const WriteOptions& opts = {});

}  // namespace deepinfer::tiny
