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
//                sequence → addressed by the sequence's `slot`. With the
//                DSpark drafter on (FromConfig's drafter_rings) the DSpark
//                blocks n_layers .. n_layers+n_mtp_layers−1 have rings too.
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
//   kWindowHistory  (only with prefix caching, FromConfig(..., window_history))
//                every layer: the window row of EVERY position (the same BF16
//                bits the ring gets), paged like the compressed KV with
//                block_size rows per block. A prefix-cache hit of H tokens
//                rebuilds the ring from the history rows of positions
//                [H - window, H) (RestoreFixedState), so the paged blocks
//                carry everything a hit needs (docs/engine.md "Prefix caching").
//
// Layout: one allocation per kind, layer-major — each layer's region is
// contiguous: region i starts at base + region_offset[i]. Paged kinds use one
// global block id space (vLLM's --block-size tokens per block): block b of a
// ratio-r layer's region holds rows_per_block = block_size / r compressed
// positions, so one block table per sequence serves every KV-source layer
// (block_size must be a multiple of every ratio). Fixed kinds have one block
// per slot holding that sequence's rows. Block id num_blocks (one past the
// last allocatable) and slot num_slots are scratch: padding rows write there,
// nothing ever owns them.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace deepinfer {

enum class StateKind { kWindow = 0, kCompressedKv, kIndexKey, kCompressorCarry, kEngram, kWindowHistory, kCount };

// Geometry of one region (one layer's part of one state kind).
struct StateRegionGeometry {
  int layer = -1;             // model layer id owning the region (kEngram: -1)
  int64_t row_bytes = 0;      // bytes per row
  int64_t rows_per_block = 0; // paged: block_size / ratio; fixed: rows per sequence
  int64_t block_bytes() const { return row_bytes * rows_per_block; }
};

// Geometry of one state kind.
struct StateKindGeometry {
  StateKind kind = StateKind::kWindow;
  std::vector<StateRegionGeometry> regions;
  bool paged() const {
    return kind == StateKind::kCompressedKv || kind == StateKind::kIndexKey || kind == StateKind::kWindowHistory;
  }
  // Region index of a model layer, -1 if that layer has no region of this kind.
  int RegionOf(int layer) const {
    for (size_t i = 0; i < regions.size(); ++i) if (regions[i].layer == layer) return static_cast<int>(i);
    return -1;
  }
  // Bytes of one block (paged) or one slot (fixed) summed over all regions.
  int64_t bytes_per_block() const {
    int64_t n = 0;
    for (const auto& r : regions) n += r.block_bytes();
    return n;
  }
};

// All state kinds of a model, declared once from the config and read by
// allocation, admission and max-length sizing.
struct StateGeometry {
  StateKindGeometry kinds[static_cast<int>(StateKind::kCount)];
  int64_t block_size = 0;  // tokens per paged block (vLLM --block-size)

  // Builds the geometry from a config. Throws kInvalidArgument if block_size
  // is not a positive multiple of every KV-source layer's compress ratio.
  // window_history adds the kWindowHistory kind (prefix caching).
  // drafter_rings (V4.1 with DSpark, model-spec §3.3.6 and §5.1): kWindow also
  // gets one ring per DSpark block, regions of layers n_layers ..
  // n_layers + n_mtp_layers − 1 (window_size rows of head_dim BF16, slot p %
  // window_size, the K of main_x at position p); ignored for V4 (its MTP ring
  // is always there) and for a config without DSpark.
  static StateGeometry FromConfig(const ModelConfig& cfg, int64_t block_size, bool window_history = false,
                                  bool drafter_rings = false);
  bool has_window_history() const { return !of(StateKind::kWindowHistory).regions.empty(); }
  const StateKindGeometry& of(StateKind k) const { return kinds[static_cast<int>(k)]; }
  // Paged blocks a sequence of `num_tokens` tokens needs: ceil(num_tokens / block_size).
  int64_t BlocksForTokens(int64_t num_tokens) const { return (num_tokens + block_size - 1) / block_size; }
  // Bytes per paged block over both paged kinds, and per fixed slot over the fixed kinds.
  int64_t PagedBytesPerBlock() const;
  int64_t FixedBytesPerSlot() const;
};

// Memory of one state kind: region i starts at base + region_offset[i] and
// holds (num_blocks + 1) blocks (paged; the last is scratch) or (num_slots + 1)
// slots (fixed; the last is scratch) of regions[i].block_bytes() each.
struct StatePoolView {
  uint8_t* base = nullptr;
  std::vector<int64_t> region_offset;  // bytes, per region
};

// Context parallelism (docs/parallel.md "Context parallelism"): the paged
// kinds are sharded over `size` ranks by block id. Global block id g (the ids
// the scheduler hands out, [0, size·B) for B blocks per rank) lives on rank
// g % size at local block g / size; the scratch id size·B is local on every
// rank (local id B, each rank's own scratch block). Fixed kinds are not
// sharded (every rank holds every slot).
struct PagedSharding {
  int size = 1;
  int rank = 0;
  int64_t scratch = -1;  // global scratch block id (size × blocks per rank)
  bool Owns(int64_t g) const { return g == scratch || g % size == rank; }
  // The rank that serves block g to the others (the scratch: rank 0).
  int Owner(int64_t g) const { return g == scratch ? 0 : static_cast<int>(g % size); }
};

// Everything the forward pass needs to address one sequence's state.
struct SequenceStateView {
  const StatePoolView* pools = nullptr;  // [StateKind::kCount], shared by all sequences
  const StateGeometry* geometry = nullptr;
  int32_t slot = -1;                     // fixed-kind block of this sequence
  const int32_t* block_table = nullptr;  // paged kinds: logical block → physical block
  int64_t num_blocks = 0;                // entries in block_table
  // Null: every paged block is in `pools`. Else block_table holds global ids
  // and only the blocks this rank owns are here (Row translates them; reading
  // or writing a row of a block owned elsewhere is a bug: check OwnsRow).
  const PagedSharding* sharding = nullptr;

  // Global block id of a paged row (row as in Row).
  int64_t BlockOf(StateKind kind, int region, int64_t row) const {
    return block_table[row / geometry->of(kind).regions[region].rows_per_block];
  }
  // True when the paged row is stored on this rank (always for fixed kinds).
  bool OwnsRow(StateKind kind, int region, int64_t row) const {
    if (!sharding || !geometry->of(kind).paged()) return true;
    return sharding->Owns(BlockOf(kind, region, row));
  }

  // Row `row` of kind `kind` in region `region` (region = geometry->of(kind).RegionOf(layer)).
  // Fixed kinds: row in [0, rows_per_block). Paged kinds: row = compressed position of that
  // layer; row / rows_per_block < num_blocks (the caller guarantees capacity).
  uint8_t* Row(StateKind kind, int region, int64_t row) const {
    const StatePoolView& p = pools[static_cast<int>(kind)];
    const StateRegionGeometry& g = geometry->of(kind).regions[region];
    uint8_t* r = p.base + p.region_offset[region];
    if (kind == StateKind::kCompressedKv || kind == StateKind::kIndexKey || kind == StateKind::kWindowHistory) {
      int64_t b = block_table[row / g.rows_per_block];
      if (sharding) b /= sharding->size;  // global → local block id (OwnsRow says whether it is here)
      return r + b * g.block_bytes() + (row % g.rows_per_block) * g.row_bytes;
    }
    return r + static_cast<int64_t>(slot) * g.block_bytes() + row * g.row_bytes;
  }
};

// Prefix-cache hit (docs/engine.md "Prefix caching"): rebuilds the fixed
// state of a sequence whose first `prefix_len` positions are in its paged
// blocks, as if those positions had just been computed: every layer's window
// ring from the kWindowHistory rows of positions [prefix_len − window,
// prefix_len); the Engram look-back from `lookback_tokens` (the raw ids of the
// positions before prefix_len, oldest first, as many as the region holds;
// fewer at the start of the sequence); the ratio-2 compressor carry needs
// nothing (prefix_len is a multiple of block_size, hence of every ratio: no
// group is open). The slot must be zeroed first. Throws Error(kInternal) if
// the geometry has no window history or prefix_len is not a multiple of
// block_size.
void RestoreFixedState(const SequenceStateView& view, int64_t prefix_len, const int32_t* lookback_tokens,
                       int64_t num_lookback_tokens);

// Speculative decoding rollback (docs/speculative.md). A verification chunk
// writes positions [start, start + len) of a sequence, of which only
// [start, end) are kept (start < end <= start + len). Paged kinds need no
// rollback: the rows of the rejected positions are never read (a row reads
// compressed positions below its own) and are overwritten when those
// positions are computed for real. The fixed kinds are put back as if the
// chunk had been [start, end):
//  - window ring: the rows the rejected positions overwrote, from a snapshot
//    taken before the forward (SnapshotFixedState; requires len <= window);
//  - compressor carry: the snapshot, then the (a, g) of the kept open group's
//    rows from the forward's capture (ForwardSeq::carry_capture, layout
//    [carry region][len][2·head_dim] FP32);
//  - Engram look-back: the raw ids of the positions before `end`
//    (`lookback_tokens`, oldest first, as RestoreFixedState).
struct FixedStateSnapshot {
  int64_t start = 0, len = 0;
  std::vector<uint8_t> window;  // [window region][len] rows of positions start .. start+len-1's ring slots
  std::vector<uint8_t> carry;   // [carry region] the whole slot rows
};
// Copies what a chunk [start, start+len) will overwrite in the fixed kinds.
// Throws Error(kInternal) if len exceeds the window ring.
void SnapshotFixedState(const SequenceStateView& view, int64_t start, int64_t len, FixedStateSnapshot* snap);
// Puts back the window-ring rows of the rejected positions [end, start+len)
// of the layers l < max_layer from the snapshot (part of RollbackFixedState;
// V4's rollback uses it with its own carry replay, V4Model::RollbackCarry).
void RollbackWindowRings(const SequenceStateView& view, const FixedStateSnapshot& snap, int64_t end,
                         int max_layer = 1 << 30);
// Rolls the fixed kinds back to `end` (see above). carry_capture may be null
// only when the geometry has no compressor carry.
void RollbackFixedState(const SequenceStateView& view, const FixedStateSnapshot& snap, int64_t end,
                        const float* carry_capture, const int32_t* lookback_tokens, int64_t num_lookback_tokens);

// Simple owner of state memory for tests and the single-sequence CLI path:
// `num_slots` fixed slots and `num_blocks` paged blocks per kind, all zeroed.
class DenseStateArena {
 public:
  DenseStateArena(const StateGeometry& geometry, int num_slots, int64_t num_blocks);
  // Zero all rows of the paged blocks listed (blocks reused by a new sequence).
  void ResetBlocks(const int32_t* blocks, int64_t n);
  // View for slot `slot` with the given block table (must outlive the view).
  SequenceStateView View(int slot, const int32_t* block_table, int64_t num_blocks) const;
  const StatePoolView* pools() const { return pools_; }
  // Zero the fixed-kind rows of `slot` (a new sequence starts from empty state).
  void ResetSlot(int slot);

 private:
  StateGeometry geometry_;
  std::vector<std::vector<uint8_t>> memory_;  // per kind
  StatePoolView pools_[static_cast<int>(StateKind::kCount)];
};

}  // namespace deepinfer
