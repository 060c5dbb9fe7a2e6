// deepinfer/model/state.h — per-sequence model state held in caller-provided
// memory (model-spec §5; serving-notes §1.6, §2.3–2.4).
//
// The forward pass never allocates sequence state. It reads and writes rows
// through the views below, whose memory is owned by the caller: the paged
// cache pool of the serving core (src/cache/) or, in tests, DenseStateArena.
//
// State kinds (V4.1, model-spec §5.1):
//   kWindow      every layer l in [0, n_layers): a ring of window_size rows of
//                head_dim values (the RoPE'd, FP8-QDQ'd window K=V, stored as
//                BF16 bits; QDQ values are exact in BF16). Row of absolute
//                position p is ring slot p % window_size. Fixed size per
//                sequence → addressed by the sequence's `slot`.
//   kCompressedKv  every KV-source layer: one row of head_dim BF16 per
//                compressed position j (FP4-QDQ'd values, exact in BF16).
//                Grows with the sequence → paged by `block_table`.
//   kIndexKey    every KV-source layer: one row of index_head_dim BF16 per
//                compressed position (FP4-QDQ'd index keys). Same block table
//                and positions as kCompressedKv.
//   kCompressorCarry  every ratio-2 KV-source layer: one FP32 row of
//                2*head_dim = (a, g) of the pending token of an incomplete
//                group (model-spec §3.3.4). Fixed size → `slot`.
//   kEngram      per sequence (not per layer): int32 [max(1, engram_max_ngram_size-1)]
//                raw token ids of the last positions before the current call
//                (-1 = none / DEAD). Fixed size → `slot`.
//
// Layout: one allocation per kind, layer-major — each layer's region is
// contiguous: region(layer_idx) = base + layer_idx * layer_stride_bytes.
// Inside a region, a paged kind has fixed-size blocks of `rows_per_block` rows;
// a fixed kind has one block per slot holding that sequence's rows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace deepinfer {

enum class StateKind { kWindow = 0, kCompressedKv, kIndexKey, kCompressorCarry, kEngram, kCount };

// Geometry of one state kind, fixed at start-up from the config.
struct StateKindGeometry {
  StateKind kind;
  std::vector<int> layers;      // model layer ids that own a region (kEngram: {-1})
  int64_t row_bytes = 0;        // bytes per row
  int64_t rows_per_block = 0;   // rows per block (fixed kinds: rows per sequence)
  int64_t block_bytes() const { return row_bytes * rows_per_block; }
  bool paged() const { return kind == StateKind::kCompressedKv || kind == StateKind::kIndexKey; }
  // Region index of a model layer in `layers`, -1 if that layer has no region.
  int RegionOf(int layer) const {
    for (size_t i = 0; i < layers.size(); ++i) if (layers[i] == layer) return static_cast<int>(i);
    return -1;
  }
};

// All state kinds of a model, declared once from the config and read by
// allocation, admission and max-length sizing.
struct StateGeometry {
  StateKindGeometry kinds[static_cast<int>(StateKind::kCount)];
  int64_t compressed_block_size = 0;  // compressed positions per paged block

  // Builds the geometry from a config. `compressed_block_size` is the number of
  // compressed positions per block of the paged kinds (> 0, else kInvalidArgument).
  static StateGeometry FromConfig(const ModelConfig& cfg, int64_t compressed_block_size);
  const StateKindGeometry& of(StateKind k) const { return kinds[static_cast<int>(k)]; }
  // Compressed positions a sequence of `num_tokens` tokens needs in the
  // layer with the smallest ratio (ratio 1 → num_tokens).
  int64_t MaxCompressedRows(int64_t num_tokens) const;
};

// A pool region for one state kind: base of region 0 and stride between regions.
struct StatePoolView {
  uint8_t* base = nullptr;
  int64_t layer_stride_bytes = 0;  // bytes between consecutive layers' regions
  int64_t block_bytes = 0;
  int64_t row_bytes = 0;
  int64_t rows_per_block = 0;
};

// Everything the forward pass needs to address one sequence's state.
struct SequenceStateView {
  const StatePoolView* pools = nullptr;  // [StateKind::kCount], shared by all sequences
  const StateGeometry* geometry = nullptr;
  int32_t slot = -1;                     // fixed-kind block of this sequence
  const int32_t* block_table = nullptr;  // paged kinds: logical block → physical block
  int64_t num_blocks = 0;                // entries in block_table

  // Row `row` of kind `kind` in region `region` (region = geometry->of(kind).RegionOf(layer)).
  // Fixed kinds: row in [0, rows_per_block). Paged kinds: row = compressed position,
  // row / rows_per_block < num_blocks (the caller guarantees capacity).
  uint8_t* Row(StateKind kind, int region, int64_t row) const {
    const StatePoolView& p = pools[static_cast<int>(kind)];
    uint8_t* r = p.base + region * p.layer_stride_bytes;
    if (kind == StateKind::kCompressedKv || kind == StateKind::kIndexKey) {
      return r + static_cast<int64_t>(block_table[row / p.rows_per_block]) * p.block_bytes +
             (row % p.rows_per_block) * p.row_bytes;
    }
    return r + static_cast<int64_t>(slot) * p.block_bytes + row * p.row_bytes;
  }
};

// Simple owner of state memory for tests and the single-sequence CLI path:
// `num_slots` fixed slots and `num_blocks` paged blocks per kind, all zeroed.
class DenseStateArena {
 public:
  DenseStateArena(const StateGeometry& geometry, int num_slots, int64_t num_blocks);
  // View for slot `slot` with the given block table (must outlive the view).
  SequenceStateView View(int slot, const int32_t* block_table, int64_t num_blocks) const;
  // Zero the fixed-kind rows of `slot` (a new sequence starts from empty state).
  void ResetSlot(int slot);

 private:
  StateGeometry geometry_;
  std::vector<std::vector<uint8_t>> memory_;  // per kind
  StatePoolView pools_[static_cast<int>(StateKind::kCount)];
};

}  // namespace deepinfer
