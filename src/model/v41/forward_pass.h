// deepinfer/model/v41/forward_pass.h — internal to the V4.1 forward pass (not
// a public header): the RoPE tables and the ForwardPass class, one Forward
// call's computation, whose members are defined along the model's structure
// (model-spec §3.3):
//   model.cc      Load, Forward, the step layout (Run), embedding, DSpark
//                 capture, final collapse / norm / head, debug dump (§3.3.1)
//   block.cc      Engram (§3.3.2) and the block's two mHC sites (§3.3.3)
//   attention.cc  attention, compressor, indexer, the sparse attention call
//                 (§3.3.4)
//   moe.cc        router, routed and shared experts, combine (§3.3.5)
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "base/region_timer.h"
#include "kernels/ref/ref_ops.h"
#include "model/state.h"
#include "model/v41/model.h"
#include "model/v41/weights.h"
#include "model/v41/workspace.h"
#include "parallel/communicator.h"

namespace deepinfer::v41 {

struct Tables {
  ref::RopeTable rope_swa;       // ratio 0: rope_theta, no YaRN
  ref::RopeTable rope_compress;  // ratio > 0: compress_rope_theta with YaRN
  const ref::RopeTable& For(int ratio) const { return ratio > 0 ? rope_compress : rope_swa; }
};

class ForwardPass {
 public:
  ForwardPass(V41Model& m, const ForwardBatch& b, ForwardOutput* out, StepWorkspace& ws)
      : m_(m), c_(m.cfg_), w_(*m.w_), t_(*m.tables_), b_(b), out_(out), ws_(ws) {}

  void Run();
  void ValidateOnly() { Validate(); }

 private:
  // Per-row bookkeeping.
  using SeqInfo = StepSeq;

  void Validate();
  void Engram(int l);
  void Block(int l);
  void Attention(int l, const float* x, float* v);
  void Compressor(int l, int s, const float* x);
  void Indexer(int l, int s, const float* x, const float* qr);
  void Moe(int l, const float* x, float* v, int64_t r0, int64_t r1);

  // Context-parallel prefill (docs/parallel.md): with --cp N and a step of at
  // least kCpSplitMinRows rows, a row-wise computation runs on this rank's
  // slice [n·q/N, n·(q+1)/N) of the n rows and one AllGatherV shares the
  // slices. f(a, b) fills rows [a, b) of y [n, width]. The kernels are
  // row-invariant, so every row has the bits one rank would compute. Without
  // a split: f(0, n).
  static constexpr int64_t kCpSplitMinRows = 32;
  template <class F>
  void SplitRows(int64_t n, int64_t width, float* y, F&& f) {
    if (!cp_split_) {
      f(0, n);
      return;
    }
    Communicator& cp = *m_.cp_comm_;
    const int N = cp.size();
    f(n * cp.rank() / N, n * (cp.rank() + 1) / N);
    std::vector<int64_t> counts(static_cast<size_t>(N));
    for (int p = 0; p < N; ++p) counts[p] = (n * (p + 1) / N - n * p / N) * width * static_cast<int64_t>(sizeof(float));
    std::vector<float> all(static_cast<size_t>(n * width));
    {
      RegionScope scope(Region::kCollective);
      cp.AllGatherV(y + n * cp.rank() / N * width, counts, all.data());
    }
    std::memcpy(y, all.data(), all.size() * sizeof(float));
  }
  // Context-parallel prefill: after Indexer scored this rank's rows of
  // sequence s, every rank gets every row's selection (and candidate mask).
  void ShareSelections(int l, int s, bool cand_source);
  bool cp_split_ = false;      // this step splits its rows over the CP ranks
  int64_t cp_r0_ = 0, cp_r1_ = 0;  // this rank's rows [cp_r0_, cp_r1_) of the step
  void Head();
  void DsparkCapture(int l);
  void Record(int l, bool block_done);

  // State row accessors (memcpy: the pool's alignment is the caller's business).
  const SequenceStateView& St(int s) const { return b_.seqs[s].state; }
  uint8_t* Row(int s, StateKind k, int layer, int64_t row) const {
    const int region = St(s).geometry->of(k).RegionOf(layer);
    return St(s).Row(k, region, row);
  }
  // Context parallelism: whether this rank stores the paged row (model/state.h).
  bool Owns(int s, StateKind k, int layer, int64_t row) const {
    return St(s).OwnsRow(k, St(s).geometry->of(k).RegionOf(layer), row);
  }

  V41Model& m_;
  const ModelConfig& c_;
  const ModelWeights& w_;
  const Tables& t_;
  const ForwardBatch& b_;
  ForwardOutput* out_;
  StepWorkspace& ws_;  // this call's buffers (workspace.h); the members below live there

  int64_t R_ = 0;
  std::vector<SeqInfo>& seq_ = ws_.seq;
  std::vector<int32_t>& row_seq_ = ws_.row_seq;
  std::vector<int64_t>& row_pos_ = ws_.row_pos;
  std::vector<int64_t>& row_in_seq_ = ws_.row_in_seq;
  std::vector<uint8_t>& row_image_ = ws_.row_image;  // 1: an image-span position (token type >= 0)
  static bool IsImage(const ForwardSeq& q, int64_t i) { return q.token_types && q.token_types[i] >= 0; }
  std::vector<float>& X_ = ws_.X;
  std::vector<float>& pre_in_ = ws_.pre_in;
  std::vector<int64_t>& hash_ids_ = ws_.hash_ids;  // [R][n_engram][cols]
  // Compressed selection per layer (index sources; Reuse layers copy their source):
  // per row, the selected compressed positions ascending.
  std::vector<std::vector<std::vector<int32_t>>>& sel_ = ws_.sel;
  // Candidate mask of the candidate source, per row over [0, E).
  std::vector<std::vector<uint8_t>>& cand_ = ws_.cand;
  bool have_cand_ = false;
  std::vector<int32_t>& sig_vec_ = ws_.sig_vec;   // per row: vectorised-path count for [T, hc] sigmoids
  std::vector<int32_t>& soft_vec_ = ws_.soft_vec;  // per row: vectorised-path count for [T, E] softplus
  // Debug scratch.
  std::vector<int32_t> dbg_router_idx_;
  std::vector<float> dbg_router_w_;
};

}  // namespace deepinfer::v41
