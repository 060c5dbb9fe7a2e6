// deepinfer/vision/vit.h — the V4.1 ViT tower and aligner on the CPU
// (model-spec §3.3.7; the reference's vision.py as restated in the shared
// TINY_V41_VISION_SPEC.md §4 steps 2–3), with the reference's BF16 rounding
// points:
//
//   x = patch_embed(patches)                  BF16 linear 3p² → D, + bias
//   per block: x = x + wo(attn(norm1(x)))     RMSNorm ε 1e-6 (FP32 maths, FP32 weight)
//              x = x + w2(silu(g)·u), [g|u] = w1(norm2(x))
//   x = norm(x)
//   aligner: pad the [n_vit_h, n_vit_w] grid to multiples of r, r×r unfold
//            (feature c·r² + dy·r + dx), w2(gelu(w1(·))) (exact erf GELU)
//
// Every FP32 operation is the one the reference's CPU kernels perform (torch
// 2.14, AVX2 dispatch; docs/vision.md, "Bit-identical ViT"), so the outputs are
// bit-identical to the golden vectors:
//   linears: the dot products of torch's BF16 GEMM fallback (vit_linear.h:
//     ATen's 8×8-register dot, or its 4-partial-sum dot for the aligner's
//     transposed unfold input), the BF16 bias added to the FP32 sum, one
//     rounding to BF16;
//   attention: torch's CPU flash kernel for BF16 (one kv block): scores q·k of
//     the rotated BF16 q, k (FP32, sequential, vit_attn.h) × fl32(1/√head_dim),
//     e = exp(s − max) with ATen's fexp_u20 (std::exp on the n mod 8 tail), the
//     FP32 sum of the unrounded e in torch's lane order, P = BF16(e), P·V in
//     FP32 (sequential in the key index), × (1/sum), one rounding to BF16;
//   rotary: FP32 tables (θ_j = 1/θ^(2j/R), SLEEF pow; glibc cos/sin),
//     rotate-half over the whole head, result rounded to BF16.
//
// Every row's arithmetic has a fixed order, so the output does not depend on
// the thread count. Thread-safe for concurrent Forward calls (weights are
// read-only after Bind).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "model/config.h"

namespace deepinfer::vision {

// A BF16 linear [out, in] with an optional BF16 bias [out].
struct VisionLinear {
  std::vector<uint16_t> w;      // [out, in] BF16 bits (owned copy)
  std::vector<float> bias;      // [out] BF16 values as FP32 (empty: no bias)
  int64_t out = 0, in = 0;
  std::vector<float> wT;        // [in, out] the weight transposed, as FP32 (vit_linear.h)
  bool transposed_input = false;  // the reference's input is a transposed view (aligner w1)
};

struct VisionBlockWeights {
  std::vector<uint16_t> norm1, norm2;  // [D] BF16 (the reference upcasts to FP32 exactly)
  VisionLinear wqkv, wo, w1, w2;
};

class VisionTower {
 public:
  // Binds vision.*, aligner.* and image_start / image_end / image_newline
  // from `store` (all BF16; shapes from `cfg`, model-spec §2.4). Throws
  // Error(kNotFound) for a missing tensor, Error(kCorruptData) naming the
  // tensor for a wrong dtype or shape, Error(kInvalidArgument) when the config
  // has no vision tower.
  static std::unique_ptr<VisionTower> Bind(const TensorStore& store, const ModelConfig& cfg);

  // ViT: patches [n_vit_h·n_vit_w, 3·p·p] (BF16 values) → [n, D] (BF16 values).
  std::vector<float> Vit(const float* patches, int n_vit_h, int n_vit_w) const;
  // Aligner: ViT output [n_vit_h·n_vit_w, D] → [n_llm_h·n_llm_w, dim], cells in
  // reading order.
  std::vector<float> Align(const float* vit_out, int n_vit_h, int n_vit_w) const;
  // The embeddings of a whole span for the token types of ImageTokenTypes:
  // START / NEW_LINE / END rows get the learned delimiters, IMAGE rows the
  // aligner rows in order. [n_tokens, dim].
  std::vector<float> SpanEmbeddings(const float* patches, int n_vit_h, int n_vit_w, int n_llm_h,
                                    int n_llm_w) const;

  // The span rows from given aligner rows [n_llm_h·n_llm_w, dim].
  std::vector<float> AssembleSpan(const float* aligner_rows, int n_llm_h, int n_llm_w) const;

  int64_t dim() const { return dim_; }

 private:
  int64_t dim_ = 0, vdim_ = 0, inter_ = 0;
  int heads_ = 0, ratio_ = 0, patch_ = 0;
  double rope_theta_ = 10000.0;
  VisionLinear patch_embed_, aligner_w1_, aligner_w2_;
  std::vector<VisionBlockWeights> blocks_;
  std::vector<uint16_t> norm_;
  std::vector<float> image_start_, image_end_, image_newline_;
};

// One linear of the tower: y [M, out] = bf16(Σ_k x·W + bias), the sum in torch's order
// (vit_linear.h; transposed_input selects the aligner-w1 form). x: [M, in] FP32 (BF16 values).
void VisionLinearForward(const float* x, int64_t M, const VisionLinear& l, float* y);

}  // namespace deepinfer::vision
