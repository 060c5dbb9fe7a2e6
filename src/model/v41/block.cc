// One layer on the residual streams of the DeepSeek-V4.1 forward pass
// (forward_pass.h): the Engram module (model-spec §3.3.2; the reference's
// ParallelEngramEmbedding lookup, then the per-stream gate) and the block
// with its two single-pass mHC sites around attention and the MoE
// (model-spec §3.3.3; the reference's Block.forward). Rounding per §4.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/parallel.h"
#include "base/region_timer.h"
#include "format/numerics.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "model/v41/engram.h"
#include "model/v41/forward_pass.h"
#include "model/v41/kernels.h"
#include "model/v41/weights.h"
#include "model/v41/workspace.h"
#include "parallel/sharded_rows.h"

namespace deepinfer::v41 {

// ------------------------------------------------------------------ Engram

void ForwardPass::Engram(int l) {
  RegionScope region(Region::kEmbed);
  const EngramWeights& G = w_.layers[l].engram;
  const EngramHasher& eh = *m_.engram_;
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim, hd = c_.engram_head_dim;
  const int slot = c_.layers[l].engram_slot;
  const int cols = eh.cols();
  const int per_row = eh.n_layers() * cols;
  const int64_t ein = static_cast<int64_t>(cols) * hd;
  // Table rows (raw E4M3 codes and UE8M0 scales), from the ranks that hold
  // them when the table is sharded (parallel/sharded_rows.h), then
  // E4M3 × UE8M0 per 32 → FP32 → BF16 (ParallelEngramEmbedding).
  const int64_t row_bytes = hd + hd / 32;
  std::vector<int64_t>& ids = Zeroed(ws_.eg_ids, R_ * cols);
  for (int64_t r = 0; r < R_; ++r)
    for (int k = 0; k < cols; ++k) ids[r * cols + k] = hash_ids_[r * per_row + slot * cols + k];
  std::vector<uint8_t>& raw = Zeroed(ws_.eg_raw, R_ * cols * row_bytes);
  FetchShardedRows(
      m_.comm_, b_.exchange, G.rows, ids.data(), R_ * cols, row_bytes,
      [&](int64_t row, uint8_t* dst) {
        DI_CHECK(row >= G.row_begin && row < G.row_end);
        std::memcpy(dst, G.table + row * hd, static_cast<size_t>(hd));
        std::memcpy(dst + hd, G.table_scale + row * (hd / 32), static_cast<size_t>(hd / 32));
      },
      raw.data());
  std::vector<float>& e = Sized(ws_.eg_e, R_ * ein);  // every row below
  ParallelFor(R_, R_ * ein > (int64_t{1} << 16), [&](int64_t r) {
    for (int k = 0; k < cols; ++k) {
      const uint8_t* q = raw.data() + (r * cols + k) * row_bytes;
      if (G.halve_codes) {  // e4m3-ieee: the load-time transform applied to this row (weights.h)
        for (int64_t i = 0; i < hd; ++i) {
          uint8_t sb = 0;
          RaiseE8M0ForIeee(q[hd + i / 32], &sb);  // never 254: checked at load
          e[r * ein + k * hd + i] = RoundBf16(E4M3ToFloat(kHalvedE4M3[q[i]]) * E8M0ToFloat(sb));
        }
      } else {
        for (int64_t i = 0; i < hd; ++i)
          e[r * ein + k * hd + i] = RoundBf16(E4M3ToFloat(q[i]) * E8M0ToFloat(q[hd + i / 32]));
      }
    }
  });
  std::vector<float>& kv = Sized(ws_.eg_kv, R_ * (hc + 1) * d);  // the linear's output
  Linear(e.data(), R_, G.wkv, c_.act_block_size, kv.data());
  const float eps = c_.norm_eps;
  const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
#pragma omp parallel if(R_ * hc * d > (int64_t{1} << 16))
  {
    thread_local std::vector<float> tmp;
    Zeroed(tmp, d);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R_; ++r) {
      if (row_image_[r]) continue;  // image positions: Engram gate 0 (X unchanged)
      const float* value = kv.data() + r * (hc + 1) * d + hc * d;
      for (int j = 0; j < hc; ++j) {
        float* h = X_.data() + (r * hc + j) * d;
        const float* key = kv.data() + r * (hc + 1) * d + j * d;
        const float* wqk = G.qk.data() + j * d;
        for (int64_t i = 0; i < d; ++i) tmp[i] = h[i] * h[i];
        const float ms_h = ref::TorchSum(tmp.data(), d) / static_cast<float>(d);
        for (int64_t i = 0; i < d; ++i) tmp[i] = key[i] * key[i];
        const float ms_k = ref::TorchSum(tmp.data(), d) / static_cast<float>(d);
        const float rstd = (1.0f / std::sqrt(ms_h + eps)) * (1.0f / std::sqrt(ms_k + eps));
        for (int64_t i = 0; i < d; ++i) tmp[i] = (h[i] * wqk[i]) * key[i];
        const float dot = (ref::TorchSum(tmp.data(), d) * rstd) * inv_sqrt_dim;
        const float mag = std::sqrt(std::max(std::fabs(dot), 1e-6f));
        const float gate = ref::TorchSigmoid(std::copysign(mag, dot), j < sig_vec_[r]);
        for (int64_t i = 0; i < d; ++i) h[i] = RoundBf16(h[i] + gate * value[i]);
      }
    }
  }
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size())) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->engram_out[l].assign(X_.begin() + q.row0 * hc * d, X_.begin() + (q.row0 + q.T) * hc * d);
  }
}

// ------------------------------------------------------------------ block

void ForwardPass::Block(int l) {
  const LayerWeights& L = w_.layers[l];
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim;
  const int64_t n = R_;
  // Sized, not zeroed (workspace.h): every element is written before it is
  // read (the mixes and X2 by HcMixes / HcExpand, x by HcCollapse, v by
  // Attention and Moe, each for every row).
  std::vector<float>& pre_a = Sized(ws_.pre_a, n * hc);
  std::vector<float>& post_a = Sized(ws_.post_a, n * hc);
  std::vector<float>& comb_a = Sized(ws_.comb_a, n * hc * hc);
  std::vector<float>& pre_f = Sized(ws_.pre_f, n * hc);
  std::vector<float>& post_f = Sized(ws_.post_f, n * hc);
  std::vector<float>& comb_f = Sized(ws_.comb_f, n * hc * hc);
  std::vector<float>& x = Sized(ws_.x, n * d);
  std::vector<float>& v = Sized(ws_.v, n * d);
  std::vector<float>& X2 = Sized(ws_.X2, static_cast<int64_t>(X_.size()));
  // Single-pass mHC (model-spec §3.3.3): each site's `pre` is used by the next site.
  {
    RegionScope region(Region::kMhc);
    HcMixes(X_.data(), n, hc, d, L.hc_attn_fn, L.hc_attn_base.data(), L.hc_attn_scale.data(), c_.norm_eps,
            c_.hc_sinkhorn_iters, c_.hc_eps, sig_vec_.data(), pre_a.data(), post_a.data(), comb_a.data());
    HcCollapse(w_.packed_for_cpu, X_.data(), pre_in_.data(), n, hc, d, x.data());
  }
  {
    RegionScope region(Region::kNorm);
    ref::RmsNorm(x.data(), n, d, L.attn_norm.data, c_.norm_eps, x.data());
  }
  Attention(l, x.data(), v.data());
  {
    RegionScope region(Region::kMhc);
    HcExpand(w_.packed_for_cpu, v.data(), X_.data(), post_a.data(), comb_a.data(), n, hc, d, X2.data());
  }
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size())) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->ffn_in_streams[l].assign(X2.begin() + q.row0 * hc * d, X2.begin() + (q.row0 + q.T) * hc * d);
  }
  {
    RegionScope region(Region::kMhc);
    HcMixes(X2.data(), n, hc, d, L.hc_ffn_fn, L.hc_ffn_base.data(), L.hc_ffn_scale.data(), c_.norm_eps,
            c_.hc_sinkhorn_iters, c_.hc_eps, sig_vec_.data(), pre_f.data(), post_f.data(), comb_f.data());
    HcCollapse(w_.packed_for_cpu, X2.data(), pre_a.data(), n, hc, d, x.data());
  }
  {
    RegionScope region(Region::kNorm);
    ref::RmsNorm(x.data(), n, d, L.ffn_norm.data, c_.norm_eps, x.data());
  }
  if (cp_split_ && !(m_.comm_ && m_.comm_->size() > 1))  // with --ep the experts are split instead
    SplitRows(n, d, v.data(), [&](int64_t a, int64_t b) { Moe(l, x.data(), v.data(), a, b); });
  else
    Moe(l, x.data(), v.data(), 0, n);
  {
    RegionScope region(Region::kMhc);
    HcExpand(w_.packed_for_cpu, v.data(), X2.data(), post_f.data(), comb_f.data(), n, hc, d, X_.data());
  }
  pre_in_.swap(pre_f);  // pre_f is refilled by the next Block
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size())) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->out_streams[l].assign(X_.begin() + q.row0 * hc * d, X_.begin() + (q.row0 + q.T) * hc * d);
    m_.debug_->out_pre_mix[l].assign(pre_in_.begin() + q.row0 * hc, pre_in_.begin() + (q.row0 + q.T) * hc);
  }
}

}  // namespace deepinfer::v41
