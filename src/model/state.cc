// StateGeometry and DenseStateArena (model/state.h; model-spec §5.1).
#include "model/state.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace deepinfer {

StateGeometry StateGeometry::FromConfig(const ModelConfig& cfg, int64_t block_size, bool window_history,
                                        bool drafter_rings) {
  if (block_size <= 0)
    Fail(ErrorKind::kInvalidArgument, "state block size {} must be positive", block_size);
  StateGeometry g;
  g.block_size = block_size;
  for (int k = 0; k < static_cast<int>(StateKind::kCount); ++k) g.kinds[k].kind = static_cast<StateKind>(k);
  auto& win = g.kinds[static_cast<int>(StateKind::kWindow)];
  auto& ckv = g.kinds[static_cast<int>(StateKind::kCompressedKv)];
  auto& ik = g.kinds[static_cast<int>(StateKind::kIndexKey)];
  auto& carry = g.kinds[static_cast<int>(StateKind::kCompressorCarry)];
  auto& eng = g.kinds[static_cast<int>(StateKind::kEngram)];
  auto& hist = g.kinds[static_cast<int>(StateKind::kWindowHistory)];
  if (cfg.arch == Arch::kDeepseekV4) {
    // V4 (model-spec §3.2, §5.1): every block (MTP included) has a window ring;
    // ratio-r layers page their compressed entries (r ≤ block size: block/r
    // rows per block; r > block size, a multiple of it: one row per block, entry
    // j in the block of its first token r·j), C4 layers also their indexer keys
    // (block/4 rows); the compressor carries are fixed rows of FP32: kv and score
    // rows of the attention compressor, then (C4) the indexer's, 2·coff·r rows each
    // (coff = 2 with overlap), each coff·max(head_dim, index_head_dim) floats.
    if (window_history)
      Fail(ErrorKind::kInvalidArgument, "deepseek_v4: prefix caching (paged window history) is not supported");
    for (int l = 0; l < cfg.n_layers + cfg.n_mtp_layers; ++l) {
      win.regions.push_back({l, cfg.head_dim * 2, cfg.window_size});
      const int r = cfg.compress_ratios.at(l);
      if (r <= 0) continue;
      int64_t rows = 0;
      if (block_size % r == 0) rows = block_size / r;
      else if (r % block_size == 0) rows = 1;
      else
        Fail(ErrorKind::kInvalidArgument,
             "state block size {} and compress ratio {} of layer {}: one must be a multiple of the other", block_size,
             r, l);
      ckv.regions.push_back({l, cfg.head_dim * 2, rows});
      const int coff = r == 4 ? 2 : 1;
      const int64_t width = coff * std::max(cfg.head_dim, cfg.index_head_dim) * 4;
      if (r == 4) {
        if (block_size % 4 != 0)
          Fail(ErrorKind::kInvalidArgument, "state block size {} is not a multiple of 4 (C4 layer {})", block_size, l);
        ik.regions.push_back({l, cfg.index_head_dim * 2, block_size / 4});
        carry.regions.push_back({l, width, 4 * coff * r});
      } else {
        carry.regions.push_back({l, width, 2 * coff * r});
      }
    }
    return g;
  }
  for (int l = 0; l < cfg.n_layers; ++l) {
    win.regions.push_back({l, cfg.head_dim * 2, cfg.window_size});
    if (window_history) hist.regions.push_back({l, cfg.head_dim * 2, block_size});
    const int r = cfg.compress_ratios.at(l);
    const bool kv_source = std::find(cfg.kv_source_layers.begin(), cfg.kv_source_layers.end(), l) !=
                           cfg.kv_source_layers.end();
    if (!kv_source || r <= 0) continue;
    if (block_size % r != 0)
      Fail(ErrorKind::kInvalidArgument,
           "state block size {} is not a multiple of compress ratio {} of KV-source layer {}", block_size, r, l);
    ckv.regions.push_back({l, cfg.head_dim * 2, block_size / r});
    ik.regions.push_back({l, cfg.index_head_dim * 2, block_size / r});
    if (r > 1) carry.regions.push_back({l, cfg.head_dim * 2 * 4, r - 1});
  }
  // DSpark rings (model-spec §3.3.6): written by the drafter only.
  if (drafter_rings && cfg.dspark_block_size > 0)
    for (int l = cfg.n_layers; l < cfg.n_layers + cfg.n_mtp_layers; ++l)
      win.regions.push_back({l, cfg.head_dim * 2, cfg.window_size});
  if (!cfg.engram_layer_ids.empty())
    eng.regions.push_back({-1, 4, std::max(1, cfg.engram_max_ngram_size - 1)});
  return g;
}

int64_t StateGeometry::PagedBytesPerBlock() const {
  return of(StateKind::kCompressedKv).bytes_per_block() + of(StateKind::kIndexKey).bytes_per_block() +
         of(StateKind::kWindowHistory).bytes_per_block();
}

int64_t StateGeometry::FixedBytesPerSlot() const {
  return of(StateKind::kWindow).bytes_per_block() + of(StateKind::kCompressorCarry).bytes_per_block() +
         of(StateKind::kEngram).bytes_per_block();
}

void RestoreFixedState(const SequenceStateView& view, int64_t prefix_len, const int32_t* lookback_tokens,
                       int64_t num_lookback_tokens) {
  const StateGeometry& g = *view.geometry;
  if (!g.has_window_history()) Fail(ErrorKind::kInternal, "RestoreFixedState: the pool has no window history");
  if (prefix_len <= 0 || prefix_len % g.block_size != 0)
    Fail(ErrorKind::kInternal, "RestoreFixedState: prefix {} is not a positive multiple of block size {}", prefix_len,
         g.block_size);
  const StateKindGeometry& win = g.of(StateKind::kWindow);
  const StateKindGeometry& hist = g.of(StateKind::kWindowHistory);
  for (size_t ri = 0; ri < win.regions.size(); ++ri) {
    const StateRegionGeometry& w = win.regions[ri];
    const int hr = hist.RegionOf(w.layer);
    DI_CHECK(hr >= 0 && hist.regions[hr].row_bytes == w.row_bytes);
    for (int64_t p = std::max<int64_t>(0, prefix_len - w.rows_per_block); p < prefix_len; ++p)
      std::memcpy(view.Row(StateKind::kWindow, static_cast<int>(ri), p % w.rows_per_block),
                  view.Row(StateKind::kWindowHistory, hr, p), static_cast<size_t>(w.row_bytes));
  }
  const StateKindGeometry& eng = g.of(StateKind::kEngram);
  if (!eng.regions.empty()) {
    // Raw ids of positions prefix_len − L .. prefix_len − 1 (−1 before the sequence), as the forward leaves them.
    const int64_t L = eng.regions[0].rows_per_block;
    int32_t* st = reinterpret_cast<int32_t*>(view.Row(StateKind::kEngram, 0, 0));
    for (int64_t i = 0; i < L; ++i) {
      const int64_t back = L - i;  // positions before prefix_len
      const int32_t v = back <= num_lookback_tokens ? lookback_tokens[num_lookback_tokens - back] : -1;
      std::memcpy(st + i, &v, sizeof(v));
    }
  }
}

void SnapshotFixedState(const SequenceStateView& view, int64_t start, int64_t len, FixedStateSnapshot* snap) {
  const StateGeometry& g = *view.geometry;
  snap->start = start;
  snap->len = len;
  const StateKindGeometry& win = g.of(StateKind::kWindow);
  snap->window.clear();
  for (size_t ri = 0; ri < win.regions.size(); ++ri) {
    const StateRegionGeometry& w = win.regions[ri];
    if (len > w.rows_per_block)
      Fail(ErrorKind::kInternal, "SnapshotFixedState: chunk of {} rows exceeds the window ring of {}", len,
           w.rows_per_block);
    for (int64_t p = start; p < start + len; ++p) {
      const uint8_t* r = view.Row(StateKind::kWindow, static_cast<int>(ri), p % w.rows_per_block);
      snap->window.insert(snap->window.end(), r, r + w.row_bytes);
    }
  }
  const StateKindGeometry& carry = g.of(StateKind::kCompressorCarry);
  snap->carry.clear();
  for (size_t ri = 0; ri < carry.regions.size(); ++ri) {
    const uint8_t* r = view.Row(StateKind::kCompressorCarry, static_cast<int>(ri), 0);
    snap->carry.insert(snap->carry.end(), r, r + carry.regions[ri].block_bytes());
  }
}

void RollbackWindowRings(const SequenceStateView& view, const FixedStateSnapshot& snap, int64_t end, int max_layer) {
  const int64_t start = snap.start, len = snap.len;
  DI_CHECK(end > start && end <= start + len);
  const StateKindGeometry& win = view.geometry->of(StateKind::kWindow);
  int64_t off = 0;
  for (size_t ri = 0; ri < win.regions.size(); ++ri) {
    const StateRegionGeometry& w = win.regions[ri];
    for (int64_t p = start; p < start + len; ++p, off += w.row_bytes)
      if (p >= end && w.layer < max_layer)
        std::memcpy(view.Row(StateKind::kWindow, static_cast<int>(ri), p % w.rows_per_block),
                    snap.window.data() + off, static_cast<size_t>(w.row_bytes));
  }
}

void RollbackFixedState(const SequenceStateView& view, const FixedStateSnapshot& snap, int64_t end,
                        const float* carry_capture, const int32_t* lookback_tokens, int64_t num_lookback_tokens) {
  const StateGeometry& g = *view.geometry;
  const int64_t start = snap.start, len = snap.len;
  RollbackWindowRings(view, snap, end);
  const StateKindGeometry& carry = g.of(StateKind::kCompressorCarry);
  int64_t off = 0;
  for (size_t ri = 0; ri < carry.regions.size(); ++ri) {
    const StateRegionGeometry& c = carry.regions[ri];
    const int64_t r = c.rows_per_block + 1;  // the layer's compress ratio
    std::memcpy(view.Row(StateKind::kCompressorCarry, static_cast<int>(ri), 0), snap.carry.data() + off,
                static_cast<size_t>(c.block_bytes()));
    off += c.block_bytes();
    DI_CHECK(carry_capture != nullptr);
    for (int64_t p = (end / r) * r; p < end; ++p) {
      if (p < start) continue;  // was in the carry before the chunk
      const float* src = carry_capture + (static_cast<int64_t>(ri) * len + (p - start)) * (c.row_bytes / 4);
      std::memcpy(view.Row(StateKind::kCompressorCarry, static_cast<int>(ri), p % r), src,
                  static_cast<size_t>(c.row_bytes));
    }
  }
  const StateKindGeometry& eng = g.of(StateKind::kEngram);
  if (!eng.regions.empty()) {
    const int64_t L = eng.regions[0].rows_per_block;
    int32_t* st = reinterpret_cast<int32_t*>(view.Row(StateKind::kEngram, 0, 0));
    for (int64_t i = 0; i < L; ++i) {
      const int64_t back = L - i;
      const int32_t v = back <= num_lookback_tokens ? lookback_tokens[num_lookback_tokens - back] : -1;
      std::memcpy(st + i, &v, sizeof(v));
    }
  }
}

DenseStateArena::DenseStateArena(const StateGeometry& geometry, int num_slots, int64_t num_blocks)
    : geometry_(geometry), memory_(static_cast<int>(StateKind::kCount)) {
  if (num_slots < 0 || num_blocks < 0)
    Fail(ErrorKind::kInvalidArgument, "DenseStateArena: {} slots and {} blocks, expected non-negative counts",
         num_slots, num_blocks);
  for (int k = 0; k < static_cast<int>(StateKind::kCount); ++k) {
    const StateKindGeometry& kg = geometry_.kinds[k];
    const int64_t units = kg.paged() ? num_blocks + 1 : static_cast<int64_t>(num_slots) + 1;  // + scratch
    int64_t off = 0;
    pools_[k].region_offset.clear();
    for (const auto& r : kg.regions) {
      pools_[k].region_offset.push_back(off);
      off += units * r.block_bytes();
    }
    memory_[k].assign(static_cast<size_t>(off), 0);
    pools_[k].base = memory_[k].data();
  }
}

void DenseStateArena::ResetBlocks(const int32_t* blocks, int64_t n) {
  for (int k = 0; k < static_cast<int>(StateKind::kCount); ++k) {
    const StateKindGeometry& kg = geometry_.kinds[k];
    if (!kg.paged()) continue;
    for (size_t ri = 0; ri < kg.regions.size(); ++ri) {
      const int64_t bb = kg.regions[ri].block_bytes();
      for (int64_t i = 0; i < n; ++i)
        std::memset(pools_[k].base + pools_[k].region_offset[ri] + static_cast<int64_t>(blocks[i]) * bb, 0,
                    static_cast<size_t>(bb));
    }
  }
}

SequenceStateView DenseStateArena::View(int slot, const int32_t* block_table, int64_t num_blocks) const {
  SequenceStateView v;
  v.pools = pools_;
  v.geometry = &geometry_;
  v.slot = slot;
  v.block_table = block_table;
  v.num_blocks = num_blocks;
  return v;
}

void DenseStateArena::ResetSlot(int slot) {
  for (int k = 0; k < static_cast<int>(StateKind::kCount); ++k) {
    const StateKindGeometry& kg = geometry_.kinds[k];
    if (kg.paged()) continue;
    for (size_t ri = 0; ri < kg.regions.size(); ++ri) {
      const int64_t bb = kg.regions[ri].block_bytes();
      std::memset(pools_[k].base + pools_[k].region_offset[ri] + static_cast<int64_t>(slot) * bb, 0,
                  static_cast<size_t>(bb));
    }
  }
}

}  // namespace deepinfer
