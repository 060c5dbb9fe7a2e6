// deepinfer/model/v41/weights.h — the DeepSeek-V4.1 tensors bound from a
// TensorStore into typed views (model-spec §2.4, §2.5).
//
// Quantised weights point into the mapped checkpoint (zero copy). Tensors that
// the reference transforms at load time are materialised once:
//   * `attn.wo_a`: E4M3 × its 32×32 UE8M0 block scale → BF16 (exact), as the
//     reference's convert.py does (model-spec §2.5 step 3);
//   * F32 tensors (mHC, sink, router bias) are copied (alignment);
//   * BF16 tensors are used in place when 2-byte aligned, else copied;
//   * Engram `q_weight ⊙ k_weight` is formed in FP32 (the reference only uses
//     the product).
// Load-time repacking (PackForCpu, done unless V41Options::reference_kernels):
// every linear weight, the router gate and the mHC `hc_*_fn` also get the
// layout the fast kernels read (kernels/cpu/cpu_ops.h, bit-identical to the
// reference ops); `packed` is null when the reference kernels are used.
// The e4m3-ieee mode (Bind's fp8_format = Fp8Format::kE4M3Ieee, the Neuron
// contract of format/numerics.h) transforms every bound FP8 tensor once, here:
// each E4M3 code becomes HalveE4M3(code) and each UE8M0 block scale b becomes
// b + 1, so code × scale is unchanged except for the inexact codes that
// HalveE4M3 documents (counted in ModelWeights::ieee_report). The transformed
// bytes are owned by ModelWeights (the checkpoint stays read-only mapped); the
// linears' act_format is set so that their activations are quantised to 224.
// `wo_a` is transformed before its BF16 dequantisation. The Engram tables are
// the exception in storage only: they are not copied (a V4.1-Flash table is
// ~100 GB); each looked-up row is decoded through kHalvedE4M3 with its scale
// + 1 (EngramWeights::halve_codes), which is the same bytes' value; with a
// sharded table the raw row is fetched first and decoded by the rank that
// uses it. A scale byte 254 (not raisable; for a table: in this rank's rows)
// is an Error(kInvalidArgument) naming the tensor and the flag.
// Binding validates every dtype and shape against the config and throws
// Error(kCorruptData) naming the tensor, expected and found; a missing tensor
// throws Error(kNotFound). Tensors the V4.1 text forward does not use
// (`gate.bias_vl` while vision is off) are not bound; the DSpark drafter's
// `mtp.*` only by BindDspark (when the drafter is enabled).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/numerics.h"
#include "format/safetensors.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_ops.h"
#include "model/config.h"

namespace deepinfer::v41 {

// BF16 vector/matrix: points into the checkpoint or into `own`.
struct Bf16Tensor {
  const uint16_t* data = nullptr;
  int64_t rows = 0, cols = 0;  // a vector has rows == 1
  std::vector<uint16_t> own;
  std::unique_ptr<cpu::PackedBf16> packed;  // matrices used as linears, after PackForCpu
  ref::Bf16Weight weight() const { return {data, rows, cols}; }
};

struct F32Tensor {
  std::vector<float> v;
  std::unique_ptr<cpu::PackedF32> packed;  // mHC `hc_*_fn` [mix, hc·dim], after PackForCpu
  const float* data() const { return v.data(); }
};

// FP8 E4M3 linear [out, in] with UE8M0 block scales: the checkpoint view and
// its repacked form.
struct Fp8Linear {
  ref::Fp8Weight w;
  std::unique_ptr<cpu::PackedFp8> packed;
  Fp8Format act_format = Fp8Format::kE4M3FN;  // the activation quantiser (448 / 224)
};
// FP4 E2M1 routed-expert linear [out, in] (UE8M0 per row and 32 columns).
struct Fp4Linear {
  ref::Fp4Weight w;
  std::unique_ptr<cpu::PackedFp4> packed;
  Fp8Format act_format = Fp8Format::kE4M3FN;  // the activation quantiser (448 / 224)
};

struct AttentionWeights {
  Fp8Linear wq_a, wq_b, wkv, wo_b;
  Bf16Tensor q_norm, kv_norm;
  Bf16Tensor wo_a;  // BF16 [n_groups·o_lora_rank, n_heads·head_dim / n_groups]
  F32Tensor attn_sink;
  // KV sources.
  bool has_compressor = false;
  Bf16Tensor compressor_wkv, compressor_wgate, compressor_norm;  // wgate only for ratio > 1
  Bf16Tensor indexer_wk, indexer_k_norm;
  // Index sources.
  bool has_indexer_query = false;
  Fp8Linear indexer_wq_b;
  Bf16Tensor indexer_weights_proj;
};

struct ExpertWeights {
  bool bound = false;  // false: another expert-parallel rank owns this expert (nothing loaded)
  Fp4Linear w1, w2, w3;
  // The gate and up projections merged, [w1; w3] (cpu::ConcatPackedRows),
  // made by PackForCpu when both pack for the fast kernels (w1.packed and
  // w3.packed are then dropped: the merged copy replaces them); else null.
  std::unique_ptr<cpu::PackedFp4> w13;
};

struct MoeWeights {
  Bf16Tensor gate;  // [n_routed_experts, dim]
  F32Tensor bias, bias_vl;
  std::vector<ExpertWeights> experts;
  Fp8Linear shared_w1, shared_w2, shared_w3;
  std::unique_ptr<cpu::PackedFp8> shared_w13;  // [shared_w1; shared_w3], as ExpertWeights::w13
};

struct EngramWeights {
  const uint8_t* table = nullptr;        // E4M3 [rows, head_dim] (the mapped checkpoint)
  const uint8_t* table_scale = nullptr;  // E8M0 [rows, head_dim / 32]
  int64_t rows = 0;
  // Rows this rank reads: [row_begin, row_end) (all rows in one process; a
  // contiguous 1/N share with N ranks, parallel/sharded_rows.h). Other rows'
  // pages of the mapping are never touched, so they are never resident.
  int64_t row_begin = 0, row_end = 0;
  // e4m3-ieee: a row's code c reads as kHalvedE4M3[c] and its scale byte b as
  // b + 1 (the transform applied on lookup; checked at load: no b = 254).
  bool halve_codes = false;
  Fp8Linear wkv;                         // [(hc+1)·dim, (N−1)·heads·head_dim]
  F32Tensor qk;                          // FP32 q_weight ⊙ k_weight [hc, dim]
};

struct LayerWeights {
  Bf16Tensor attn_norm, ffn_norm;
  F32Tensor hc_attn_fn, hc_attn_base, hc_attn_scale;
  F32Tensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  AttentionWeights attn;
  MoeWeights ffn;
  bool has_engram = false;
  EngramWeights engram;
};

// What the e4m3-ieee transform did (all zero in the default mode).
struct IeeeTransformReport {
  int64_t tensors = 0;   // FP8 weight tensors transformed (Engram tables included)
  int64_t values = 0;    // E4M3 codes transformed (Engram tables excluded: decoded on lookup, not scanned)
  int64_t inexact = 0;   // of those, how many v/2 was not representable (rounded half to even)
  int64_t scales = 0;    // UE8M0 scales raised by one (Engram tables included)
};

struct ModelWeights {
  Bf16Tensor embed;  // [vocab, dim]
  Bf16Tensor head;   // [vocab, dim] (used as FP32: exact upcast on the fly)
  Bf16Tensor norm;
  std::vector<LayerWeights> layers;  // n_layers main layers

  // Binds every tensor the V4.1 text forward uses. `store` must outlive the
  // result. With expert parallelism (`shard_size` ranks, this is `shard_rank`)
  // only the routed experts of this rank's contiguous range are bound (the
  // others stay `bound = false`) and each Engram table records this rank's row
  // range; the default binds everything. fp8_format = kE4M3Ieee also applies
  // the load-time transform (header comment; single-threaded, one pass over
  // every bound FP8 tensor; an Engram table's scales only over this rank's rows).
  static std::unique_ptr<ModelWeights> Bind(const TensorStore& store, const ModelConfig& cfg, int shard_size = 1,
                                            int shard_rank = 0, Fp8Format fp8_format = Fp8Format::kE4M3FN);
  Fp8Format fp8_format = Fp8Format::kE4M3FN;
  IeeeTransformReport ieee_report;

  // Repacks every weight the fast CPU kernels read (sets the `packed`
  // members and packed_for_cpu). Adds about the checkpoint's size in resident
  // memory (the mapped pages stay mapped; they are clean and the kernel may
  // drop them). Each weight is packed in parallel over its tiles; returns the
  // bytes allocated.
  size_t PackForCpu();
  bool packed_for_cpu = false;  // the forward pass uses the cpu:: kernels
  // After PackForCpu: the bytes a batch-1 decode step streams for every
  // layer's wo_a (its 8-bit decode copy, cpu::PackedBf16::w8, where made).
  int64_t wo_a_decode_bytes = 0;

  // Bytes of the weights this rank uses: the quantised checkpoint bytes of
  // the bound tensors (routed experts separately) and the Engram rows it owns.
  struct Bytes {
    int64_t routed_experts = 0, other = 0, engram_rows = 0;
  } bytes;

  // The DSpark drafter (model-spec §3.3.6, `mtp.*`), bound by BindDspark:
  // the blocks mtp.0 .. mtp.{n_mtp_layers−1} (sliding-window attention, MoE
  // of dspark_n_routed_experts), mtp.0's main_proj [dim, n_targets·dim] (FP8)
  // and main_norm, and the last block's norm, Markov head (embed and head
  // [vocab, dspark_markov_rank] BF16; the head used as FP32) and confidence
  // projection [1, dim + dspark_markov_rank] (BF16, used as FP32).
  struct DsparkWeights {
    std::vector<LayerWeights> blocks;
    Fp8Linear main_proj;
    Bf16Tensor main_norm, norm;
    Bf16Tensor markov_embed, markov_head, confidence_proj;
  } dspark;
  bool has_dspark = false;
  // Binds (and, after PackForCpu, packs) the DSpark tensors; a second call
  // does nothing. Throws Error(kInvalidArgument) when the config has no
  // DSpark (num_nextn_predict_layers 0 or dspark_block_size 0) and the
  // Bind errors (kNotFound / kCorruptData naming the tensor).
  void BindDspark(const TensorStore& store, const ModelConfig& cfg);

  // The transformed FP8 bytes of the e4m3-ieee mode (codes and scales); the
  // Fp8Linear views point into them.
  std::vector<std::vector<uint8_t>> ieee_bytes;
};

}  // namespace deepinfer::v41
