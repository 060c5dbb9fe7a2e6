// The MoE of the DeepSeek-V4.1 forward pass (forward_pass.h), model-spec
// §3.3.5 (rounding per §4), as the reference's MoE.forward: the router
// (sqrtsoftplus gate, `bias` / `bias_vl`), the routed experts on their owner
// ranks (parallel/expert_parallel.h) and the shared expert, each a SwiGLU with
// the limit (Expert.forward, kernels.h SwiGlu), and the FP32 combine rounded
// to BF16.
#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "base/region_timer.h"
#include "format/numerics.h"
#include "model/v41/forward_pass.h"
#include "model/v41/kernels.h"
#include "model/v41/weights.h"
#include "model/v41/workspace.h"
#include "parallel/expert_parallel.h"

namespace deepinfer::v41 {

// ------------------------------------------------------------------ MoE

namespace {
// Decode steps of up to this many rows run the shared expert as one task
// beside the routed experts (RoutedExperts `alongside`).
constexpr int64_t kSharedAlongsideMaxRows = 16;
thread_local ExpertScratch tl_expert;
}  // namespace

ExpertScratch& ThreadExpertScratch() { return tl_expert; }

void ReserveExpertScratch(int64_t rows, int64_t d, int64_t I, int64_t* reserved_rows, int* reserved_threads) {
  rows = std::max(rows, *reserved_rows);
  if (rows == *reserved_rows && NumThreads() <= *reserved_threads) return;
#pragma omp parallel
  {
    ExpertScratch& es = tl_expert;
    ReserveInSteps(es.gt, rows * I, 1);
    ReserveInSteps(es.up, rows * I, 1);
    ReserveInSteps(es.g13, rows * 2 * I, 1);
    ReserveInSteps(es.neg, rows * I, 1);
    ReserveRoutedExpertScratch(rows, d);
    cpu::ReserveLinearScratch(rows, std::max(d, I));
  }
  *reserved_rows = rows;
  *reserved_threads = NumThreads();
}

void ForwardPass::Moe(int l, const float* x_all, float* v_all, int64_t r0, int64_t r1) {
  RegionScope region(Region::kMoe);
  const MoeWeights& F = w_.layers[l].ffn;
  const int64_t n = r1 - r0, d = c_.dim, I = c_.moe_inter_dim;
  const float* x = x_all + r0 * d;  // rows [r0, r1) of the step
  float* v = v_all + r0 * d;
  const int k = c_.n_activated_experts;
  const int ab = c_.act_block_size;
  const float lim = c_.swiglu_limit;
  // Sized, not zeroed (workspace.h): Router writes every row's k slots,
  // RoutedExperts every row of y, the shared expert every row of sh.
  std::vector<int32_t>& idx = Sized(ws_.moe_idx, n * k);
  std::vector<float>& wts = Sized(ws_.moe_w, n * k);
  std::vector<const float*>& bias = ws_.moe_bias;  // text tokens: `bias`; image spans: `bias_vl`
  bias.assign(static_cast<size_t>(n), F.bias.data());
  for (int64_t r = 0; r < n; ++r)
    if (row_image_[r0 + r]) bias[r] = F.bias_vl.data();  // row r of this call is the step's row r0 + r
  std::optional<RegionScope> router(std::in_place, Region::kRouter);
  Router(x, n, F.gate, bias.data(), k, c_.gate_temp, c_.norm_topk_prob, c_.route_scale,
              soft_vec_.data() + r0, idx.data(), wts.data());
  router.reset();
  // Routed experts in increasing expert id, FP32 combine (MoE.forward).
  std::vector<float>& y = Sized(ws_.moe_y, n * d);
  // Every thread's expert scratch for the most rows one expert can get in
  // this step shape (n rows of this rank, times the ranks that may send rows
  // here), made once per new largest n: a later step whose routing puts more
  // rows on one expert than any step before allocates nothing (the decode
  // step plan, workspace.h).
  // Again when the team grew (SetNumThreads): its new threads hold nothing yet.
  ReserveExpertScratch(n * (m_.comm_ ? m_.comm_->size() : 1), d, I, &ws_.moe_reserved_rows,
                       &ws_.moe_reserved_threads);
  // Routed experts: each on its owner rank (one process: all local), the
  // experts' SwiGLUs in parallel (each on one thread; the kernels inside run
  // on that thread), then per row the combine in increasing expert id, as
  // the reference sums (parallel/expert_parallel.h).
  // The shared expert: at decode sizes (one process) one more task of the
  // experts' loop, on one thread beside the routed experts; else after them
  // with its linears split over the team. Same rows, same kernels: the same
  // bits either way.
  std::vector<float>& sh = Sized(ws_.moe_sh, n * d);
  const auto shared = [&] {
    ExpertSwiGlu(x, n, F.shared_w1, F.shared_w3, F.shared_w13.get(), F.shared_w2, I, ab, lim, nullptr, sh.data());
  };
  const bool shared_alongside = n <= kSharedAlongsideMaxRows && !(m_.comm_ && m_.comm_->size() > 1);
  const auto routed = [&](int e, const float* xin, int64_t m, const float* rw, float* out) {
    const ExpertWeights& ew = F.experts[e];
    DI_CHECK(ew.bound);
    ExpertSwiGlu(xin, m, ew.w1, ew.w3, ew.w13.get(), ew.w2, I, ab, lim, rw, out);
  };
  // std::ref: each std::function holds a reference, no heap copy of the closure.
  RoutedExperts(m_.comm_, b_.exchange, m_.shard_, x, n, d, idx.data(), wts.data(), k, std::ref(routed), y.data(),
                shared_alongside ? std::function<void()>(std::ref(shared)) : std::function<void()>());
  if (!shared_alongside) shared();
  ParallelFor(n, n * d > (int64_t{1} << 16), [&](int64_t r) {
    for (int64_t i = r * d; i < (r + 1) * d; ++i) v[i] = RoundBf16(y[i] + sh[i]);
  });
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size()) && r0 == 0 && r1 == R_) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->router_indices[l].assign(idx.begin() + q.row0 * k, idx.begin() + (q.row0 + q.T) * k);
    m_.debug_->router_weights[l].assign(wts.begin() + q.row0 * k, wts.begin() + (q.row0 + q.T) * k);
  }
}

}  // namespace deepinfer::v41
