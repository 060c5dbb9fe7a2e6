// deepinfer/model/v41/workspace.h — the step workspace of the V4.1 forward
// pass (forward_pass.h): every activation buffer and per-layer scratch of one
// Forward call, kept by the model and reused by the next call (the CPU form
// of a per-bucket step plan, issue 20 item 4).
//
// Sizing: each buffer is (re)filled per use with Zeroed(), which keeps its
// capacity, so the buffers grow to the largest step seen and a steady-state
// decode step at a batch size already seen makes no heap allocation
// (v41_step_plan_test counts them). Per-thread scratch inside the OpenMP
// loops is thread_local in the function that uses it, for the same reason.
//
// Results: a buffer's contents before use never reach a result (every use
// starts from Zeroed() or is fully overwritten, as the per-call locals it
// replaces were), so a reused workspace gives the bits of a fresh one
// (V41Options::reuse_step_workspace = false runs a fresh one per call).
//
// Not thread-safe: one Forward call at a time uses the model's workspace; a
// concurrent call on the same model runs on a fresh one (V41Model::Forward).
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer::v41 {

// One sequence's rows in the step: rows [row0, row0 + T), positions start ...
struct StepSeq {
  int64_t row0 = 0, T = 0, start = 0;
};

struct StepWorkspace {
  // Step layout (ForwardPass::Run).
  std::vector<StepSeq> seq;
  std::vector<int32_t> row_seq;
  std::vector<int64_t> row_pos, row_in_seq;
  std::vector<uint8_t> row_image;
  std::vector<int32_t> sig_vec, soft_vec;
  std::vector<int64_t> hash_ids;    // [R][n_engram][cols]
  std::vector<int32_t> engram_back;  // one sequence's Engram look-back
  // Residual streams [R, hc, dim] and the `pre` of the next site [R, hc].
  std::vector<float> X, pre_in;
  // Compressed selections [layer][row] and candidate masks [row] (attention.cc).
  std::vector<std::vector<std::vector<int32_t>>> sel;
  std::vector<std::vector<uint8_t>> cand;
  // Engram.
  std::vector<int64_t> eg_ids;
  std::vector<uint8_t> eg_raw;
  std::vector<float> eg_e, eg_kv;
  // Block: mHC mixes of both sites, the collapsed row, the sublayer output.
  std::vector<float> pre_a, post_a, comb_a, pre_f, post_f, comb_f, x, v, X2;
  // Attention.
  std::vector<float> qr, q, kv, o, z;
  std::vector<uint16_t> kvb;
  // Compressor (one sequence at a time).
  std::vector<int64_t> cmp_js;
  std::vector<float> cmp_lat, cmp_a, cmp_g, cmp_carry, cmp_k;
  // Indexer (one sequence at a time).
  std::vector<float> idx_q, idx_w, idx_keys;
  std::vector<const uint16_t*> idx_key_rows;  // a one-row call's BF16 key rows (cpu::PackAndScoreIndexKeys)
  std::vector<float> idx_score1;              // ... and its scores
  // MoE.
  std::vector<int32_t> moe_idx;
  std::vector<float> moe_w, moe_y, moe_sh;
  std::vector<const float*> moe_bias;
  int64_t moe_reserved_rows = 0;  // rows per expert every thread's MoE scratch holds (moe.cc)
  int moe_reserved_threads = 0;   // ... on a team of this many threads
  // Head.
  std::vector<int64_t> head_rows;
  std::vector<float> head_X, head_pre, head_y;
};

// v filled with n value-initialised elements; keeps the capacity.
template <class T>
std::vector<T>& Zeroed(std::vector<T>& v, int64_t n) {
  v.assign(static_cast<size_t>(n), T{});
  return v;
}

// v holding n elements, their values unspecified (left from an earlier use;
// zero where it grew); keeps the capacity. For a buffer whose every element
// that is read is written first in the same use (a linear's or a kernel's
// output rows), where Zeroed was a serial pass over the whole buffer: per
// layer of a 1 024-row prefill of the `large` preset ~110 MB (q and the
// attention output alone 32 MB each), ~1.7% of the step on two threads.
template <class T>
std::vector<T>& Sized(std::vector<T>& v, int64_t n) {
  v.resize(static_cast<size_t>(n));
  return v;
}

// Room for n elements, grown in steps of `step` elements: a buffer that grows
// with the sequence (one compressed position per decode step) reallocates
// once per `step`, not at every doubling of its size.
template <class T>
void ReserveInSteps(std::vector<T>& v, int64_t n, int64_t step) {
  if (static_cast<int64_t>(v.capacity()) < n) v.reserve(static_cast<size_t>((n + step - 1) / step * step));
}
// The step of the buffers sized by a sequence's compressed length, in
// compressed positions (a decode step allocates only when a sequence's
// compressed length crosses a multiple of it).
constexpr int64_t kGrowPositions = 1024;

}  // namespace deepinfer::v41
