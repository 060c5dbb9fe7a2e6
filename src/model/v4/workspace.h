// deepinfer/model/v4/workspace.h — the step workspace of the V4-Flash forward
// pass (model.cc): every activation buffer and per-layer scratch of one
// Forward or Mtp call, kept by the model and reused by the next call (the CPU
// form of a per-bucket step plan, issue 20 item 4; V4.1's is
// model/v41/workspace.h).
//
// Shapes: R = rows of the call (Σ chunk lengths), n = rows of one sequence's
// chunk, d = dim, hc = hc_mult, H·D = n_heads·head_dim, E = compressed entries
// visible to the chunk (a sequence's compressed length), k = activated
// experts, I = moe_inter_dim, m = rows routed to one expert.
//
// Sizing: each buffer is (re)filled per use with Zeroed(), which keeps its
// capacity, so the buffers grow to the largest step seen and a steady-state
// decode step at a batch size already seen makes no heap allocation
// (v4_step_plan_test counts them, Forward and Mtp). The buffers sized by a
// sequence's compressed length grow in steps of kGrowPositions entries
// (ReserveInSteps), so a decode step allocates only when a compressed length
// first crosses a multiple of it. Scratch of the operators in ops.cc /
// ops_hwy.cc (and of the OpenMP loops there) is thread_local in the function
// that uses it, for the same reason.
//
// Results: a buffer's contents before use never reach a result (every use
// starts from Zeroed() — the value-initialised vector the per-call local it
// replaces was — and is then written as before), so a reused workspace gives
// the bits of a fresh one (V4Options::reuse_step_workspace = false runs a
// fresh one per call).
//
// Not thread-safe: one Forward / Mtp call at a time uses the model's
// workspace; a concurrent call on the same model runs on a fresh one
// (V4Model::Forward).
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer::v4 {

// One sequence's rows in the step: rows [row0, row0 + T) at positions start ...
struct StepSeq {
  int64_t row0 = 0, T = 0, start = 0;
};

struct StepWorkspace {
  // Step layout (Pass): per sequence, and per row [R] its sequence, position, token.
  std::vector<StepSeq> seq;
  std::vector<int32_t> row_seq;
  std::vector<int64_t> row_pos;
  std::vector<int32_t> row_tok;
  // Residual streams [R, hc, d] (the main model's, or the MTP block's).
  std::vector<float> X;
  // MTP inputs: embeddings e and e_proj(e) [R, d]; hnorm(streams) and h_proj of it [R, hc, d].
  std::vector<float> mtp_e, mtp_ep, mtp_xs, mtp_hp;
  // Block: mHC mixes of the current site pre/post [R, hc], comb [R, hc, hc];
  // the collapsed, normed row x [R, d]; the sublayer output v [R, d]; the
  // expanded streams X2 [R, hc, d].
  std::vector<float> pre, post, comb, x, v, X2;
  // Attention: q_norm(wq_a(x)) qr [R, q_lora_rank]; q [R, H·D]; window K kv
  // [R, D] and its BF16 kvb (one row's squares and candidate list are per
  // thread: rows run in parallel); every sequence's ring rows ring [S, window, D] and compressed entries
  // ckv (sequence s's from row ckv_off[s]) (BF16); the C4 selections sel
  // [R][≤ index_topk] (−1 absent); the attention output o [R, H·D]; wo_a's
  // output z [R, o_groups·o_lora_rank].
  std::vector<float> qr, q, kv, o, z;
  std::vector<uint16_t> kvb, ring, ckv;
  std::vector<int64_t> ckv_off;
  std::vector<std::vector<int64_t>> sel;
  // Compressor: x·wkvᵀ a and x·wgateᵀ g of all R rows [R, coff·hd] (the
  // attention's; the indexer's in idx_cmp_a, idx_cmp_g); one sequence at a
  // time: the carry's kv and score slots [coff·r, coff·hd]; one channel's
  // softmax e and products prod [coff·r]; the pooled entry ent [hd].
  std::vector<float> cmp_a, cmp_g, cmp_kvs, cmp_scs, cmp_e, cmp_prod, cmp_ent;
  // Indexer: queries q [R, index_n_heads·index_head_dim] and head weights w
  // [R, index_n_heads] of all rows; its compressor's projections idx_cmp_a,
  // idx_cmp_g; one sequence at a time: keys [E, index_head_dim] (FP32 of the
  // BF16 rows kb [index_head_dim]); one row's scores [E] and top-k ids [≤ index_topk].
  std::vector<float> idx_q, idx_w, idx_cmp_a, idx_cmp_g, idx_keys, idx_score;
  std::vector<uint16_t> idx_kb;
  std::vector<int64_t> idx_top;
  // MoE: routes idx and weights w [R, k]; gate logits [R, n_routed_experts];
  // one row's scores s, sel [n_routed_experts] and top [k]; the routes sorted
  // by expert (expert e's rows rows[beg[e] .. beg[e+1]) and route weights rw
  // [R·k], fill [n_routed_experts] the counting sort's cursors), the experts
  // with rows (active); every route's expert output out [R·k, d]; the routed
  // sum y and shared expert sh [R, d]. (An expert's inputs and SwiGLU halves
  // are per thread: the experts run in parallel.)
  std::vector<int32_t> moe_idx, moe_active;
  std::vector<float> moe_w, moe_logits, moe_s, moe_sel, moe_y, moe_sh, moe_rw, moe_out;
  std::vector<int64_t> moe_top, moe_rows, moe_beg, moe_fill;
  // Head: one row's squares sq [hc·d] and pre [hc]; the normed rows y [m, d].
  std::vector<float> head_sq, head_pre, head_y;
};

// v filled with n value-initialised elements; keeps the capacity.
template <class T>
std::vector<T>& Zeroed(std::vector<T>& v, int64_t n) {
  v.assign(static_cast<size_t>(n), T{});
  return v;
}

// Room for n elements, grown in steps of `step` elements: a buffer that grows
// with the sequence (one compressed position every few decode steps)
// reallocates once per `step`, not at every doubling of its size.
template <class T>
void ReserveInSteps(std::vector<T>& v, int64_t n, int64_t step) {
  if (static_cast<int64_t>(v.capacity()) < n) v.reserve(static_cast<size_t>((n + step - 1) / step * step));
}
// The step of the buffers sized by a sequence's compressed length, in
// compressed positions.
constexpr int64_t kGrowPositions = 1024;

}  // namespace deepinfer::v4
