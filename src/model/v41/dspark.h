// deepinfer/model/v41/dspark.h — the DSpark drafter of DeepSeek-V4.1
// (`mtp.0 .. mtp.{n_mtp_layers−1}`, model-spec §3.3.6; reference: model.py's
// DSparkBlock, DSparkAttention, DSparkMarkovHead, DSparkConfidenceHead and
// Transformer.forward_spec), on the rows the main model captured
// (ForwardSeq::dspark_hidden).
//
// What one Run computes, per sequence:
//  * main_x = RMSNorm_main_norm(FP8 linear main_proj(main_hidden)) for every
//    given row (BF16 [n, dim]);
//  * seeding: each DSpark block b writes K = FP8-QDQ32(RoPE(kv_norm(wkv(main_x))))
//    of every given position q (rope_theta, no YaRN) into its own window ring,
//    slot q % window_size (the last window_size rows of the call) — the
//    reference's prefill seeding and its per-step write at p, so chunked
//    prefill and preemption-recompute are the same rows passed again;
//  * with input_token >= 0, a draft after the last row p: the block of
//    dspark_block_size tokens [input_token, noise × (bs−1)] at positions
//    p+1 .. p+bs → embedding → hc identical streams, identity pre → the
//    DSpark blocks (single-pass mHC, attention over ring slots
//    0 .. min(window, p+1)−1 then all bs block tokens — bidirectional inside
//    the block — with sink and inverse RoPE, MoE of dspark_n_routed_experts
//    with top-dspark_num_experts_per_tok plus the shared expert) → logits_i =
//    FP32 head(RMSNorm_norm(collapse)) → sequentially for i = 0 .. bs−1:
//    logits_i += markov_head.embed[out_i] · markov_head.headᵀ (FP32), out_{i+1}
//    = argmax(logits_i) (ties: the lowest id; out_0 = input_token) →
//    confidence_i = FP32 confidence_head.proj(concat(collapse_i, e_i)).
// Numerics follow the main model's (model-spec §4; v41/kernels.h): FP8
// activations per 32, BF16 rounding points as the reference, attention
// probabilities rounded per 64-wide chunk of the list (ring slots first).
//
// State: only the DSpark rings (StateKind::kWindow regions of layers
// n_layers .. n_layers+n_mtp_layers−1, V41Model::geometry(.., dspark_rings));
// Run writes ring rows of the given positions and nothing else, so a caller
// that passes only kept positions needs no rollback. Rows are computed
// independently (the block's rows only see their own sequence), so results do
// not depend on the batch, the thread count or the SIMD target.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/state.h"
#include "model/v41/model.h"

namespace deepinfer::v41 {

struct DsparkSeq {
  const float* main_hidden = nullptr;  // [n][n_targets·dim] BF16 values (ForwardSeq::dspark_hidden rows)
  int64_t n = 0;                       // >= 1 rows: positions start_pos .. start_pos+n−1
  int64_t start_pos = 0;
  SequenceStateView state;             // a geometry with the DSpark rings
  int32_t input_token = -1;            // >= 0: draft after position p = start_pos+n−1; the token at p+1
};

struct DsparkDraft {
  std::vector<int32_t> ids;         // [bs] out_1 .. out_bs (drafts for positions p+2 .. p+bs+1)
  std::vector<float> logits;        // [bs, vocab] FP32 with the Markov bias (Run's want_logits), else empty
  std::vector<float> confidence;    // [bs] FP32
};

struct DsparkWorkspace;  // dspark.cc: the buffers Run reuses between calls

class Dspark {
 public:
  // Binds the model's `mtp.*` tensors (ModelWeights::BindDspark; errors as
  // there: kInvalidArgument without DSpark, kNotFound / kCorruptData naming
  // a tensor). Not with expert or context parallelism (kInvalidArgument).
  explicit Dspark(V41Model& model);
  ~Dspark();
  int block_size() const;
  int64_t hidden_width() const;  // n_targets · dim floats per main_hidden row
  // Seeds every sequence's rings and drafts where input_token >= 0; `out`
  // gets one entry per seqs entry (empty for input_token < 0). Throws
  // Error(kInvalidArgument) naming the sequence for: n < 1, negative
  // start_pos, no main_hidden, a geometry without the DSpark rings,
  // input_token outside the vocabulary. Nothing is written when it throws.
  // `out`'s entries are emptied and refilled, keeping their capacity: a caller
  // that passes the same `out` every step, with a batch shape seen before,
  // gets a step without heap allocations (the drafter's step plan). Not
  // thread-safe: one Run at a time per Dspark.
  void Run(const std::vector<DsparkSeq>& seqs, bool want_logits, std::vector<DsparkDraft>* out);

 private:
  V41Model& m_;
  std::unique_ptr<DsparkWorkspace> ws_;
};

}  // namespace deepinfer::v41
