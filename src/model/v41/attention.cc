// Attention of the DeepSeek-V4.1 forward pass (forward_pass.h), model-spec
// §3.3.4 (rounding per §4): the query and window KV projections, the
// compressor (Compressor.forward: ratio 1 and the ratio-2 softmax pooling
// with its carry) publishing compressed KV and index keys, the lightning
// indexer with the candidate-block filter and the Reuse/Reindex layers'
// shared selections, the sparse attention call with sink over the window and
// the selected compressed positions, and the grouped output projection.
// Context parallelism (docs/parallel.md) shares rows and selections here.
//
// Attention candidate list (the order matters: probabilities are rounded to
// BF16 per 64-wide chunk of the list, and chunk sums follow torch's order):
//   * window part: a start_pos-0 call uses the reference prefill layout —
//     min(T, window) slots, the query's window positions oldest first, absent
//     slots last; any other call uses the reference decode layout — window
//     slots, positions p−window+1 .. p oldest first (absent = before the
//     sequence start, first);
//   * compressed part (ratio > 0): min(index_topk, E) slots with
//     E = ⌊(start_pos+T)/ratio⌋, the selected compressed positions ascending,
//     absent slots last.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

#include "base/error.h"
#include "base/parallel.h"
#include "base/region_timer.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "model/v41/forward_pass.h"
#include "model/v41/kernels.h"
#include "model/v41/weights.h"
#include "model/v41/workspace.h"
#include "parallel/context_parallel.h"

namespace deepinfer::v41 {

namespace {
// A cached K/V row (BF16 codes, head_dim of them) read in place by the
// attention kernel: the window ring and the compressed rows are not copied.
const uint16_t* Bf16Row(const uint8_t* row) {
  DI_CHECK(reinterpret_cast<uintptr_t>(row) % alignof(uint16_t) == 0);
  return reinterpret_cast<const uint16_t*>(row);
}
}  // namespace

// ------------------------------------------------------------------ attention

void ForwardPass::Attention(int l, const float* x, float* v) {
  RegionScope region(Region::kAttention);
  const LayerSchedule& sch = c_.layers[l];
  const AttentionWeights& A = w_.layers[l].attn;
  const int64_t n = R_, H = c_.n_heads, D = c_.head_dim, rd = c_.rope_head_dim, qr_dim = c_.q_lora_rank;
  const int64_t win = c_.window_size;
  const int ratio = sch.compress_ratio;
  const ref::RopeTable& rope = t_.For(ratio);
  const int ab = c_.act_block_size;

  // Query: c_q = q_norm(wq_a(x)); q = wq_b(c_q), RoPE on each head's last rd dims.
  // Context-parallel prefill: c_q and the window K of every row are shared
  // (SplitRows); q, the attention core and the output projection run on this
  // rank's rows [r0, r1) only, and the output rows are shared at the end.
  const int64_t d = c_.dim, r0 = cp_r0_, r1 = cp_r1_;
  // Sized, not zeroed: qr and kv get every row (SplitRows), q and o this
  // rank's rows [r0, r1), the only ones read (RoPE, the attention core, wo_a);
  // kvb and z every row they are read at.
  std::vector<float>& qr = Sized(ws_.qr, n * qr_dim);
  std::vector<float>& q = Sized(ws_.q, n * H * D);
  SplitRows(n, qr_dim, qr.data(), [&](int64_t a, int64_t b) {
    Linear(x + a * d, b - a, A.wq_a, ab, qr.data() + a * qr_dim);
    ref::RmsNorm(qr.data() + a * qr_dim, b - a, qr_dim, A.q_norm.data, c_.norm_eps, qr.data() + a * qr_dim);
  });
  Linear(qr.data() + r0 * qr_dim, r1 - r0, A.wq_b, ab, q.data() + r0 * H * D);
  // Window K (= V): kv_norm(wkv(x)), RoPE, FP8 QDQ over all D dims in blocks of 32.
  std::vector<float>& kv = Sized(ws_.kv, n * D);
  SplitRows(n, D, kv.data(), [&](int64_t a, int64_t b) {
    Linear(x + a * d, b - a, A.wkv, ab, kv.data() + a * D);
    ref::RmsNorm(kv.data() + a * D, b - a, D, A.kv_norm.data, c_.norm_eps, kv.data() + a * D);
    RegionScope core(Region::kAttnCore);
    ParallelFor(b - a, (b - a) * D > (int64_t{1} << 16), [&](int64_t i) {
      rope.Apply(kv.data() + (a + i) * D + D - rd, row_pos_[a + i], false);
      Fp8Qdq(w_.packed_for_cpu, kv.data() + (a + i) * D, D, 32, w_.fp8_format);
    });
  });
  std::optional<RegionScope> core(std::in_place, Region::kAttnCore);
  ParallelFor(r1 - r0, (r1 - r0) * H * D > (int64_t{1} << 16), [&](int64_t i) {
    rope.ApplyHeads(q.data() + (r0 + i) * H * D + D - rd, H, D, row_pos_[r0 + i], false);
  });
  std::vector<uint16_t>& kvb = Sized(ws_.kvb, n * D);
  ParallelFor(n, n * D > (int64_t{1} << 16), [&](int64_t r) {
    for (int64_t i = r * D; i < (r + 1) * D; ++i) kvb[i] = FloatToBf16(kv[i]);
  });

  core.reset();
  // Compressed branch: KV sources publish new entries; index sources select.
  const int S = static_cast<int>(seq_.size());
  if (ratio > 0) {
    if (sch.kv_source)
      for (int s = 0; s < S; ++s) Compressor(l, s, x);
    if (sch.index_source) {
      sel_[l].resize(n);
      for (std::vector<int32_t>& row : sel_[l]) row.clear();
      for (int s = 0; s < S; ++s) Indexer(l, s, x, qr.data());
    } else {
      sel_[l].resize(n);
      for (int64_t r = 0; r < n; ++r) {
        ReserveInSteps(sel_[l][r], c_.index_topk, 1);
        sel_[l][r] = sel_[sch.index_from][r];
      }
    }
  }

  // Context parallelism: the selected compressed rows stored on other ranks
  // are gathered first, in row order then selection order
  // (parallel/context_parallel.h; the same bytes, the same candidate list).
  std::vector<uint8_t> cp_kv;
  std::vector<int64_t> cp_at;
  if (ratio > 0 && St(0).sharding) {
    std::vector<PagedRowRef> refs;
    cp_at.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      cp_at[r] = static_cast<int64_t>(refs.size());
      for (int32_t j : sel_[l][r]) refs.push_back({&St(row_seq_[r]), j});
    }
    cp_kv.resize(refs.size() * static_cast<size_t>(D * 2));
    GatherPagedRows(m_.cp_comm_, StateKind::kCompressedKv,
                    St(0).geometry->of(StateKind::kCompressedKv).RegionOf(sch.kv_from), refs.data(),
                    static_cast<int64_t>(refs.size()), cp_kv.data());
  }
  // Sparse attention with sink over window + selected compressed positions.
  core.emplace(Region::kAttnCore);
  std::vector<float>& o = Sized(ws_.o, n * H * D);
  const float scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
  // One query row: the window and selected rows, then the attention kernel.
  // Several rows run in parallel, one row per thread; a single row (a batch-1
  // decode step) runs outside any parallel region, so the kernel can split
  // its own work over the team (cpu::SparseAttention).
  auto attend_row = [&](int64_t r) {
    thread_local std::vector<const uint16_t*> rows;
    thread_local std::vector<int32_t> slots;
    {
      const int s = row_seq_[r];
      const SeqInfo& qi = seq_[s];
      const int64_t p = row_pos_[r];
      rows.clear();
      slots.clear();
      ReserveInSteps(rows, win + c_.index_topk, 1);
      ReserveInSteps(slots, win + c_.index_topk, 1);
      const bool prefill_layout = qi.start == 0 && !b_.per_row_layout;
      const int64_t W = prefill_layout ? std::min<int64_t>(qi.T, win) : win;
      const int64_t first = std::max<int64_t>(0, p - win + 1);
      for (int64_t qpos = first; qpos <= p; ++qpos) {
        const int64_t slot = prefill_layout ? qpos - first : win - 1 - (p - qpos);
        if (qpos >= qi.start) {
          rows.push_back(kvb.data() + (qi.row0 + qpos - qi.start) * D);
        } else {  // the cache's row itself (BF16, read in place)
          rows.push_back(Bf16Row(Row(s, StateKind::kWindow, l, qpos % win)));
        }
        slots.push_back(static_cast<int32_t>(slot));
      }
      int64_t list_len = W;
      if (ratio > 0) {
        const int64_t E = b_.per_row_layout ? (p + 1) / ratio : (qi.start + qi.T) / ratio;
        const int64_t K = std::min<int64_t>(c_.index_topk, E);
        const std::vector<int32_t>& sel = sel_[l][r];
        for (size_t i = 0; i < sel.size(); ++i) {
          const uint8_t* src = cp_kv.empty() || !St(s).sharding
                                   ? Row(s, StateKind::kCompressedKv, sch.kv_from, sel[i])
                                   : cp_kv.data() + (cp_at[r] + static_cast<int64_t>(i)) * D * 2;
          rows.push_back(Bf16Row(src));
          slots.push_back(static_cast<int32_t>(W + i));
        }
        list_len = W + K;
      }
      float* orow = o.data() + r * H * D;
      (w_.packed_for_cpu ? cpu::SparseAttention : ref::SparseAttention)(q.data() + r * H * D, static_cast<int>(H), D, rows.data(), slots.data(),
                           static_cast<int>(rows.size()), static_cast<int32_t>(list_len), A.attn_sink.data(),
                           scale, orow);
      rope.ApplyHeads(orow + D - rd, H, D, p, true);
    }
  };
  if (r1 - r0 == 1) {
    attend_row(r0);
  } else {
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = r0; r < r1; ++r) attend_row(r);
  }
  // Window ring: positions of this chunk into slot p mod window (last `win` only).
  for (int s = 0; s < S; ++s) {
    const SeqInfo& qi = seq_[s];
    for (int64_t i = std::max<int64_t>(0, qi.T - win); i < qi.T; ++i)
      std::memcpy(Row(s, StateKind::kWindow, l, (qi.start + i) % win), kvb.data() + (qi.row0 + i) * D, D * 2);
    // Prefix caching: every position's window row also goes to the paged
    // history, from which a cache hit rebuilds the ring (model/state.h).
    if (St(s).geometry->has_window_history())
      for (int64_t i = 0; i < qi.T; ++i)
        if (Owns(s, StateKind::kWindowHistory, l, qi.start + i))
          std::memcpy(Row(s, StateKind::kWindowHistory, l, qi.start + i), kvb.data() + (qi.row0 + i) * D, D * 2);
  }
  core.reset();
  // Grouped BF16 wo_a, then FP8 wo_b.
  const int64_t zw = c_.o_groups * c_.o_lora_rank;
  std::vector<float>& z = Sized(ws_.z, n * zw);
  SplitRows(n, d, v, [&](int64_t a, int64_t b) {
    GroupedLinearBf16(o.data() + a * H * D, b - a, c_.o_groups, A.wo_a, z.data() + a * zw);
    Linear(z.data() + a * zw, b - a, A.wo_b, ab, v + a * d);
  });
}

void ForwardPass::Compressor(int l, int s, const float* x) {
  RegionScope region(Region::kCompressor);
  const LayerSchedule& sch = c_.layers[l];
  const AttentionWeights& A = w_.layers[l].attn;
  const SeqInfo& qi = seq_[s];
  const int r = sch.compress_ratio;
  const int64_t D = c_.head_dim, d = c_.dim, rd = c_.rope_head_dim, ID = c_.index_head_dim;
  const ref::RopeTable& rope = t_.For(r);
  const float* xs = x + qi.row0 * d;
  // Latents of the groups completed in this chunk, pre-RoPE, BF16.
  std::vector<int64_t>& js = ws_.cmp_js;
  std::vector<float>& lat = ws_.cmp_lat;
  js.clear();
  lat.clear();
  if (r == 1) {
    Zeroed(lat, qi.T * D);
    LinearBf16(xs, qi.T, A.compressor_wkv, lat.data());
    ref::RmsNorm(lat.data(), qi.T, D, A.compressor_norm.data, c_.norm_eps, lat.data());
    for (int64_t i = 0; i < qi.T; ++i) js.push_back(qi.start + i);
  } else {
    // FP32 projections a = x·wkvᵀ, g = x·wgateᵀ; softmax over the r tokens of
    // a group per channel, weighted sum, BF16, RMSNorm (Compressor.forward).
    std::vector<float>& a = Zeroed(ws_.cmp_a, qi.T * D);
    std::vector<float>& g = Zeroed(ws_.cmp_g, qi.T * D);
    LinearF32Bf16W(xs, qi.T, A.compressor_wkv, a.data());
    LinearF32Bf16W(xs, qi.T, A.compressor_wgate, g.data());
    constexpr int kMaxRatio = 8;
    DI_CHECK(r <= kMaxRatio);
    std::vector<float>& carry = Zeroed(ws_.cmp_carry, (r - 1) * 2 * D);
    for (int i = 0; i < r - 1; ++i)
      std::memcpy(carry.data() + i * 2 * D, Row(s, StateKind::kCompressorCarry, l, i), 2 * D * sizeof(float));
    // The groups completed in this chunk, in order; each pooled into its own
    // latent row, the groups over the team (a row's arithmetic on one thread).
    for (int64_t i = 0; i < qi.T; ++i)
      if ((qi.start + i + 1) % r == 0) js.push_back((qi.start + i) / r);
    const int64_t ng = static_cast<int64_t>(js.size());
    lat.resize(static_cast<size_t>(ng * D));
    ParallelFor(ng, ng * D * r > (int64_t{1} << 15), [&](int64_t gi) {
      const int64_t j = js[gi];
      const float* ga[kMaxRatio];
      const float* gg[kMaxRatio];
      for (int t = 0; t < r; ++t) {
        const int64_t pt = j * r + t;
        if (pt >= qi.start) {
          ga[t] = a.data() + (pt - qi.start) * D;
          gg[t] = g.data() + (pt - qi.start) * D;
        } else {
          ga[t] = carry.data() + (pt % r) * 2 * D;
          gg[t] = carry.data() + (pt % r) * 2 * D + D;
        }
      }
      float* row = lat.data() + gi * D;
      float e[kMaxRatio];
      for (int64_t ch = 0; ch < D; ++ch) {
        float mx = gg[0][ch];
        for (int t = 1; t < r; ++t) mx = std::max(mx, gg[t][ch]);
        float sum = 0.0f;
        for (int t = 0; t < r; ++t) {
          e[t] = ref::SleefExpf(gg[t][ch] - mx);
          sum += e[t];
        }
        float acc = 0.0f;
        for (int t = 0; t < r; ++t) acc += ga[t][ch] * (e[t] / sum);
        row[ch] = RoundBf16(acc);
      }
      ref::RmsNorm(row, 1, D, A.compressor_norm.data, c_.norm_eps, row);
    });
    if (float* cap = b_.seqs[s].carry_capture) {
      const int region = St(s).geometry->of(StateKind::kCompressorCarry).RegionOf(l);
      float* dst = cap + static_cast<int64_t>(region) * qi.T * 2 * D;
      for (int64_t i = 0; i < qi.T; ++i) {
        std::memcpy(dst + i * 2 * D, a.data() + i * D, D * sizeof(float));
        std::memcpy(dst + i * 2 * D + D, g.data() + i * D, D * sizeof(float));
      }
    }
    // Carry the incomplete group's rows (FP32 a, g) to the next call.
    const int64_t end = qi.start + qi.T;
    for (int64_t p = (end / r) * r; p < end; ++p) {
      if (p < qi.start) continue;  // already in the carry
      float* dst = reinterpret_cast<float*>(Row(s, StateKind::kCompressorCarry, l, p % r));
      std::memcpy(dst, a.data() + (p - qi.start) * D, D * sizeof(float));
      std::memcpy(dst + D, g.data() + (p - qi.start) * D, D * sizeof(float));
    }
  }
  if (js.empty()) return;
  const int64_t nj = static_cast<int64_t>(js.size());
  // Index keys from the pre-RoPE latent: k_norm(wk(ℓ)), RoPE at r·j, FP4 QDQ (UE8M0, 32).
  std::vector<float>& k = Zeroed(ws_.cmp_k, nj * ID);
  LinearBf16(lat.data(), nj, A.indexer_wk, k.data());
  ref::RmsNorm(k.data(), nj, ID, A.indexer_k_norm.data, c_.norm_eps, k.data());
  // Rows over the team (each row's arithmetic and its cache rows on one thread).
  ParallelFor(nj, nj * D > (int64_t{1} << 16), [&](int64_t i) {
    const int64_t pos = js[i] * r;
    float* kr = k.data() + i * ID;
    rope.Apply(kr + ID - rd, pos, false);
    Fp4QdqUe8m0(w_.packed_for_cpu, kr, ID, 32);
    // Context parallelism: only the rank that stores position js[i] keeps it.
    const bool own = Owns(s, StateKind::kIndexKey, l, js[i]);
    uint16_t* dst = own ? reinterpret_cast<uint16_t*>(Row(s, StateKind::kIndexKey, l, js[i])) : nullptr;
    for (int64_t c = 0; c < ID && own; ++c) {
      const uint16_t b = FloatToBf16(kr[c]);
      std::memcpy(dst + c, &b, 2);
    }
    // Compressed entry: RoPE at r·j, FP4 QDQ with E4M3 scales in blocks of 16.
    float* lr = lat.data() + i * D;
    rope.Apply(lr + D - rd, pos, false);
    Fp4QdqE4m3InPlace(lr, D, 16, w_.fp8_format);
    uint16_t* cdst = own ? reinterpret_cast<uint16_t*>(Row(s, StateKind::kCompressedKv, l, js[i])) : nullptr;
    for (int64_t c = 0; c < D && own; ++c) {
      const uint16_t b = FloatToBf16(lr[c]);
      std::memcpy(cdst + c, &b, 2);
    }
  });
}

void ForwardPass::Indexer(int l, int s, const float* x, const float* qr) {
  RegionScope region(Region::kIndexer);
  const LayerSchedule& sch = c_.layers[l];
  const AttentionWeights& A = w_.layers[l].attn;
  const SeqInfo& qi = seq_[s];
  const int r = sch.compress_ratio;
  const int64_t E = (qi.start + qi.T) / r;
  if (E == 0) return;  // nothing compressed yet: empty selections
  const int64_t nh = c_.index_n_heads, ID = c_.index_head_dim, rd = c_.rope_head_dim, d = c_.dim;
  const ref::RopeTable& rope = t_.For(r);
  const int64_t T = qi.T;
  // Context-parallel prefill: this rank scores its rows [i0, i1) of the
  // sequence; the selections are shared after the loop.
  const int64_t i0 = std::clamp<int64_t>(cp_r0_ - qi.row0, 0, T), i1 = std::clamp<int64_t>(cp_r1_ - qi.row0, 0, T);
  // Query heads: FP8 wq_b(c_q), RoPE on each head's last rd dims, FP4 QDQ (UE8M0, 32).
  std::vector<float>& qI = Zeroed(ws_.idx_q, T * nh * ID);
  Linear(qr + (qi.row0 + i0) * c_.q_lora_rank, i1 - i0, A.indexer_wq_b, c_.act_block_size, qI.data() + i0 * nh * ID);
  // Rows over the team (each row's elements on one thread: the same bits).
  ParallelFor(i1 - i0, (i1 - i0) * nh * ID > (int64_t{1} << 16), [&](int64_t j) {
    const int64_t i = i0 + j;
    rope.ApplyHeads(qI.data() + i * nh * ID + ID - rd, nh, ID, qi.start + i, false);
    Fp4QdqUe8m0(w_.packed_for_cpu, qI.data() + i * nh * ID, nh * ID, 32);
  });
  // Head weights: BF16 weights_proj(x) × (index_head_dim^-½ · n_heads^-½), BF16.
  std::vector<float>& wts = Zeroed(ws_.idx_w, T * nh);
  LinearBf16(x + (qi.row0 + i0) * d, i1 - i0, A.indexer_weights_proj, wts.data() + i0 * nh);
  const float wscale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5) *
                                          std::pow(static_cast<double>(nh), -0.5));
  for (auto& v : wts) v = RoundBf16(v * wscale);
  // Index keys of the KV source (the fixed publication: always this layer's source).
  // Context parallelism: the keys stored on other ranks are gathered first
  // (parallel/context_parallel.h; the same bytes).
  // FP32 keys: row-major for the scalar loop, cpu::IndexerScores' blocked
  // layout (padded to whole key blocks) for the fast path.
  const bool fast = w_.packed_for_cpu;
  const int64_t Ep = fast ? (E + cpu::kIndexKeyBlock - 1) / cpu::kIndexKeyBlock * cpu::kIndexKeyBlock : E;
  // One row (a decode step): its keys are packed and scored together, split
  // over the team (cpu::PackAndScoreIndexKeys, which writes every element it
  // reads, so the buffer is not zeroed first), instead of the row loop's one
  // thread; the same bits.
  const bool one_row = fast && i1 - i0 == 1;
  ReserveInSteps(ws_.idx_keys, Ep * ID, kGrowPositions * ID);
  if (one_row) ws_.idx_keys.resize(static_cast<size_t>(Ep * ID));
  std::vector<float>& keys = one_row ? ws_.idx_keys : Zeroed(ws_.idx_keys, Ep * ID);
  std::vector<uint8_t> cp_keys;
  if (St(s).sharding) {
    std::vector<PagedRowRef> refs(static_cast<size_t>(E));
    for (int64_t j = 0; j < E; ++j) refs[j] = {&St(s), j};
    cp_keys.resize(static_cast<size_t>(E * ID * 2));
    GatherPagedRows(m_.cp_comm_, StateKind::kIndexKey, St(s).geometry->of(StateKind::kIndexKey).RegionOf(sch.kv_from),
                    refs.data(), E, cp_keys.data());
  }
  std::vector<const uint16_t*>& key_rows = ws_.idx_key_rows;
  ReserveInSteps(key_rows, one_row ? E : 0, kGrowPositions);
  key_rows.resize(one_row ? static_cast<size_t>(E) : 0);
  for (int64_t j = 0; j < E; ++j) {
    const uint16_t* kr = St(s).sharding ? reinterpret_cast<const uint16_t*>(cp_keys.data() + j * ID * 2)
                                        : reinterpret_cast<const uint16_t*>(Row(s, StateKind::kIndexKey, sch.kv_from, j));
    if (one_row) {
      key_rows[j] = kr;
      continue;
    }
    if (fast) {
      cpu::PackIndexKey(kr, j, ID, keys.data());
      continue;
    }
    for (int64_t c = 0; c < ID; ++c) {
      uint16_t b;
      std::memcpy(&b, kr + c, 2);
      keys[j * ID + c] = Bf16ToFloat(b);
    }
  }
  const bool is_cand_source = sch.candidate_source;
  const bool uses_cand = sch.candidate_from >= 0;
  if (is_cand_source) {
    cand_.resize(static_cast<size_t>(R_));  // every row's mask is (re)set below
    have_cand_ = true;
  }
  const int64_t K = std::min<int64_t>(c_.index_topk, E);
  const int64_t bs = c_.candidate_block_size;
  const float ninf = -std::numeric_limits<float>::infinity();
  // The one row's scores, before the row loop: a team opened inside its
  // region (even an inactive one) would be a nested team, started afresh.
  std::vector<float>& score1 = ws_.idx_score1;
  if (one_row) {
    const int64_t V = (qi.start + i0 + 1) / r, Er = b_.per_row_layout ? V : E;
    ReserveInSteps(score1, E, kGrowPositions);
    score1.resize(static_cast<size_t>(E));
    if (Er > 0)
      cpu::PackAndScoreIndexKeys(qI.data() + i0 * nh * ID, wts.data() + i0 * nh, nh, ID, key_rows.data(),
                                 std::min(Er, V), keys.data(), score1.data());
  }
#pragma omp parallel if(i1 - i0 > 1 && (i1 - i0) * E * nh * ID > (int64_t{1} << 20))
  {
    thread_local std::vector<float> score, bsc;
    thread_local std::vector<int64_t> idx;
    ReserveInSteps(score, E, kGrowPositions);
    ReserveInSteps(bsc, E / bs + 1, kGrowPositions);
    ReserveInSteps(idx, std::max<int64_t>(c_.index_topk, c_.candidate_topk_blocks), 1);
    Zeroed(score, E);
    Zeroed(idx, std::max<int64_t>(K, c_.candidate_topk_blocks));
#pragma omp for schedule(dynamic)
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = qi.start + i;
      const int64_t row = qi.row0 + i;
      const int64_t V = (p + 1) / r;  // visible compressed positions
      // Per-row layout: the row is scored exactly as a one-token decode at p would be.
      const int64_t Er = b_.per_row_layout ? V : E;
      const int64_t Kr = std::min<int64_t>(c_.index_topk, Er);
      if (Er == 0) {
        if (is_cand_source) {
          ReserveInSteps(cand_[row], E, kGrowPositions);
          cand_[row].assign(E, 0);
        }
        sel_[l][row].clear();
        continue;
      }
      const float* qrow = qI.data() + i * nh * ID;
      if (fast) {
        // The same scores (bit-identical); keys j >= V are -inf without scoring.
        const int64_t n = std::min(Er, V);
        if (one_row) {
          std::copy(score1.begin(), score1.begin() + n, score.begin());
        } else {
          cpu::IndexerScores(qrow, wts.data() + i * nh, nh, ID, keys.data(), n, score.data());
        }
        for (int64_t j = n; j < Er; ++j) score[j] = ninf;
      } else {
        for (int64_t j = 0; j < Er; ++j) {
          // score(p, j) = Σ_h w_h·ReLU(q_h·k_j), each product and the head sum BF16.
          float acc = 0.0f;
          for (int64_t h = 0; h < nh; ++h) {
            const float* qh = qrow + h * ID;
            const float* kj = keys.data() + j * ID;
            float dot = 0.0f;
            for (int64_t c = 0; c < ID; ++c) dot += qh[c] * kj[c];
            const float rl = std::max(RoundBf16(dot), 0.0f);
            acc += RoundBf16(rl * wts[i * nh + h]);
          }
          score[j] = j < V ? RoundBf16(acc) : ninf;
        }
      }
      if (is_cand_source) {
        // Candidate blocks: block score = max over its positions; the newest
        // visible block forced to +inf; keep the top blocks that are not −inf.
        const int64_t nb = (Er + bs - 1) / bs;
        bsc.assign(static_cast<size_t>(nb), ninf);
        for (int64_t j = 0; j < Er; ++j) bsc[j / bs] = std::max(bsc[j / bs], score[j]);
        const int64_t last = V >= 1 ? (V - 1) / bs : -1;
        if (last >= 0) bsc[last] = std::numeric_limits<float>::infinity();
        const int64_t kb = std::min<int64_t>(c_.candidate_topk_blocks, nb);
        ref::TorchTopK(bsc.data(), nb, kb, /*sorted=*/true, idx.data());
        std::vector<uint8_t>& mask = cand_[row];
        ReserveInSteps(mask, E, kGrowPositions);
        mask.assign(E, 0);
        for (int64_t t = 0; t < kb; ++t) {
          const int64_t bk = idx[t];
          if (!(bsc[bk] > ninf)) continue;
          for (int64_t j = bk * bs; j < std::min(Er, (bk + 1) * bs); ++j) mask[j] = 1;
        }
      } else if (uses_cand) {
        const std::vector<uint8_t>& mask = cand_[row];
        for (int64_t j = 0; j < Er; ++j)
          if (!mask[j]) score[j] = ninf;
      }
      ref::TorchTopK(score.data(), Er, Kr, /*sorted=*/false, idx.data());
      std::vector<int32_t>& chosen = sel_[l][row];
      chosen.clear();
      ReserveInSteps(chosen, c_.index_topk, 1);
      for (int64_t t = 0; t < Kr; ++t)
        if (idx[t] < V) chosen.push_back(static_cast<int32_t>(idx[t]));
      std::sort(chosen.begin(), chosen.end());
    }
  }
  if (cp_split_) ShareSelections(l, s, is_cand_source);
  if (m_.debug_ && m_.debug_seq_ == s) {
    const int64_t offset = qi.start == 0 ? qi.T : c_.window_size;
    std::vector<int32_t> lists(T * K, -1);
    for (int64_t i = 0; i < T; ++i) {
      const auto& ch = sel_[l][qi.row0 + i];
      for (size_t t = 0; t < ch.size(); ++t) lists[i * K + t] = static_cast<int32_t>(ch[t] + offset);
    }
    m_.debug_->indexer_topk[l] = std::move(lists);
    m_.debug_->indexer_k[l] = static_cast<int>(K);
  }
}

void ForwardPass::ShareSelections(int l, int s, bool cand_source) {
  // Per row a fixed-size record every rank can size: k_r = min(index_topk,
  // ⌊(p+1)/ratio⌋) int32 slots (the ascending selection, −1 padded) and, for
  // a candidate source, the E-byte mask. Rows are split in contiguous
  // ascending slices, so the AllGatherV output is in row order.
  DI_CHECK(b_.per_row_layout);  // k_r from the row alone (the engine's layout)
  const SeqInfo& qi = seq_[s];
  const int r = c_.layers[l].compress_ratio;
  const int64_t E = (qi.start + qi.T) / r;
  Communicator& cp = *m_.cp_comm_;
  const int N = cp.size();
  auto kr = [&](int64_t i) { return std::min<int64_t>(c_.index_topk, (qi.start + i + 1) / r); };
  auto bytes = [&](int64_t i) { return kr(i) * 4 + (cand_source ? E : 0); };
  std::vector<int64_t> counts(static_cast<size_t>(N), 0);
  for (int p = 0; p < N; ++p) {
    const int64_t a = std::clamp<int64_t>(R_ * p / N - qi.row0, 0, qi.T), b = std::clamp<int64_t>(R_ * (p + 1) / N - qi.row0, 0, qi.T);
    for (int64_t i = a; i < b; ++i) counts[p] += bytes(i);
  }
  const int64_t i0 = std::clamp<int64_t>(cp_r0_ - qi.row0, 0, qi.T), i1 = std::clamp<int64_t>(cp_r1_ - qi.row0, 0, qi.T);
  std::vector<uint8_t> mine, all;
  mine.reserve(static_cast<size_t>(counts[cp.rank()]));
  for (int64_t i = i0; i < i1; ++i) {
    const std::vector<int32_t>& sel = sel_[l][qi.row0 + i];
    DI_CHECK(static_cast<int64_t>(sel.size()) <= kr(i));
    std::vector<int32_t> rec(static_cast<size_t>(kr(i)), -1);
    std::copy(sel.begin(), sel.end(), rec.begin());
    const uint8_t* p = reinterpret_cast<const uint8_t*>(rec.data());
    mine.insert(mine.end(), p, p + rec.size() * 4);
    if (cand_source) {
      const std::vector<uint8_t>& m = cand_[qi.row0 + i];
      DI_CHECK(static_cast<int64_t>(m.size()) == E);
      mine.insert(mine.end(), m.begin(), m.end());
    }
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  all.resize(static_cast<size_t>(total));
  {
    RegionScope scope(Region::kCollective);
    cp.AllGatherV(mine.data(), counts, all.data());
  }
  int64_t at = 0;
  for (int64_t i = 0; i < qi.T; ++i) {
    const int64_t k = kr(i);
    std::vector<int32_t> rec(static_cast<size_t>(k));
    std::memcpy(rec.data(), all.data() + at, static_cast<size_t>(k * 4));
    at += k * 4;
    std::vector<int32_t>& sel = sel_[l][qi.row0 + i];
    sel.clear();
    for (int32_t j : rec)
      if (j >= 0) sel.push_back(j);
    if (cand_source) {
      cand_[qi.row0 + i].assign(all.begin() + at, all.begin() + at + E);
      at += E;
    }
  }
}

}  // namespace deepinfer::v41
