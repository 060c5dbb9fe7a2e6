// deepinfer/model/tensor_plan.h — the list of tensors a checkpoint must hold,
// derived from a ModelConfig, and checkpoint validation against it.
//
// ExpectedTensors() is the ONE place that knows the checkpoint inventory:
//   * deepseek_v41: model-spec §2.4 (+ the vision tower when vision is on),
//     identical to shared/golden/TINY_V41_SPEC.md §4 for the tiny model
//     (tests/data/tiny_v41_tensors.tsv: 772 tensors).
//   * deepseek_v4:  model-spec §2.3 (69,187 tensors for V4-Flash).
// It drives ValidateCheckpoint (load-time checks) and memory accounting
// (`deepinfer inspect`).
//
// Encodings (model-spec §2.2), B = quantization_config.weight_block_size:
//   FP8 linear  <name>.weight F8_E4M3 [out, in]  + <name>.scale F8_E8M0 [ceil(out/B), ceil(in/B)]
//   FP4 expert  <name>.weight I8 [out, in/2]     + <name>.scale F8_E8M0 [out, in/32]
//   Engram      engram.embed.weight F8_E4M3 [rows, hd] + engram.embed.scale F8_E8M0 [rows, hd/B]
//   everything else BF16 or F32 as listed; V4 gate.tid2eid I64 [vocab, top-k].
// Only expert_dtype "fp4" has a known layout; ExpectedTensors throws
// Error(kInvalidArgument) for "fp8" (V4-Flash-Base: layout unverified).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "model/config.h"

namespace deepinfer {

class TensorStore;

// What a stored tensor is, for loading and accounting.
enum class TensorRole : uint8_t {
  kBf16,         // BF16 used as is (norm weights, embeddings, head, BF16 linears, vision)
  kF32,          // F32 (mHC fn/base/scale, attn_sink, gate biases, V4 compressor ape)
  kFp8Weight,    // F8_E4M3 [out, in], one UE8M0 scale per BxB block
  kFp8Scale,     // F8_E8M0 [ceil(out/B), ceil(in/B)], scales of the matching .weight
  kFp4Weight,    // I8 [out, in/2]: packed E2M1 pairs (low nibble = even element)
  kFp4Scale,     // F8_E8M0 [out, in/32], scales of the matching .weight
  kEngramTable,  // F8_E4M3 [rows, engram_head_dim] Engram hash table
  kEngramScale,  // F8_E8M0 [rows, engram_head_dim/B], one scale per row group
  kI64,          // I64 (V4 ffn.gate.tid2eid)
};
const char* TensorRoleName(TensorRole r);  // "bf16", "fp8_weight", ...

struct ExpectedTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;          // stored shape (what the safetensors header says)
  TensorRole role = TensorRole::kBf16;
  std::vector<int64_t> logical_shape;  // unquantised [out, in] for weights and their scales;
                                       // equal to `shape` otherwise
  int64_t numel() const;
  // Parameters: numel, except an FP4 byte counts as 2 (scales count too).
  int64_t params() const;
  uint64_t nbytes() const;             // numel * DTypeSize(dtype)
};

// Every tensor the checkpoint must contain for `config`, sorted by name.
// Throws Error(kInvalidArgument) for layouts it cannot describe (expert_dtype
// "fp8", FP4 expert input dims not a multiple of 32).
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// Totals over a tensor list.
struct TensorStats {
  int64_t n_tensors = 0;
  // Every stored element counted, scales included, an FP4 byte = 2 parameters
  // (the convention of TINY_V41_SPEC.md: 23,056,468 for the tiny model).
  int64_t params = 0;
  // Of which block/group scales (F8_E8M0 .scale tensors).
  int64_t scale_params = 0;
  // params - scale_params: the model-card convention (model-spec §0.3: 763.2B
  // for V4.1-Flash with vision, ≈290.9B for V4-Flash with MTP).
  int64_t weight_params() const { return params - scale_params; }
  uint64_t bytes = 0;
  std::map<DType, uint64_t> bytes_by_dtype;
  std::map<DType, int64_t> tensors_by_dtype;
  std::map<TensorRole, uint64_t> bytes_by_role;
};
TensorStats SummarizeTensors(const std::vector<ExpectedTensor>& tensors);

// Tensors a checkpoint may contain beyond ExpectedTensors() without being an
// error (they are ignored, never loaded):
//   * deepseek_v41 with vision off (no vision_config or 0 layers): the vision
//     tower and aligner — "vision.*", "aligner.*", "image_start", "image_end",
//     "image_newline" — so a text-only config can serve the released files.
//   * both architectures: "mtp.{i}.embed.weight" / "mtp.{i}.head.weight"
//     copies (absent from the releases; the reference converter skips them,
//     model-spec §2.1).
// Anything else unexpected is an error (a typo'd or foreign tensor must not be
// silently ignored).
bool IsToleratedExtraTensor(const ModelConfig& config, const std::string& name);

struct ValidationReport {
  int64_t n_checked = 0;             // expected tensors found with the right dtype and shape
  std::vector<std::string> ignored;  // tolerated extra tensors present in the checkpoint
};

// Checks that `store` holds every ExpectedTensors(config) entry with exactly
// that dtype and stored shape, and nothing else except tolerated extras.
// Throws Error with one line naming the first problem (missing tensors first,
// then dtype/shape mismatches, then unexpected tensors, each in name order)
// and how many more there are, e.g.
//   "model.safetensors: tensor layers.3.attn.wq_b.weight: expected dtype F8_E4M3 shape
//    [512, 64], found BF16 [512, 64]"            (kCorruptData)
//   "/m: missing tensor layers.3.ffn.gate.bias: expected dtype F32 shape [8] (f32)" (kNotFound)
//   "model.safetensors: unexpected tensor foo: BF16 [3] is not part of a deepseek_v41
//    checkpoint for this config.json"             (kCorruptData)
ValidationReport ValidateCheckpoint(const ModelConfig& config, const TensorStore& store);

}  // namespace deepinfer
