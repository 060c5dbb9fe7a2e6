// deepinfer/cache/cache_pool.h — the memory of the paged state pool
// (model-spec §5; serving-notes §1.6). One allocation per state kind,
// layer-major: each layer's region is contiguous and holds every block (paged
// kinds) or every slot (fixed kinds), plus one scratch block/slot at the end
// that padding rows write to and nothing owns. Metadata (which sequence owns
// what) lives in BlockManager; this class only owns bytes and hands out
// SequenceStateViews.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/state.h"

namespace deepinfer {

class CachePool {
 public:
  // Allocates (num_blocks + 1) paged blocks and (num_slots + 1) fixed slots
  // for every region of `geometry`, zero-filled. Throws Error(kResourceExhausted)
  // if the allocation fails, naming the byte count.
  CachePool(const StateGeometry& geometry, int64_t num_blocks, int num_slots);
  // Context parallelism (model/state.h PagedSharding): this rank `cp_rank` of
  // `cp_size` holds num_blocks local blocks; views take global block tables
  // ([0, cp_size·num_blocks), scratch cp_size·num_blocks). cp_size 1 = the above.
  CachePool(const StateGeometry& geometry, int64_t num_blocks, int num_slots, int cp_size, int cp_rank);

  const StateGeometry& geometry() const { return geometry_; }
  int64_t num_blocks() const { return num_blocks_; }
  int num_slots() const { return num_slots_; }
  int64_t total_bytes() const { return total_bytes_; }

  // View of one sequence's state. block_table must stay alive while the view is used.
  SequenceStateView View(int32_t slot, const int32_t* block_table, int64_t num_blocks) const;
  // A table of `n` entries all pointing at the scratch block (for padding rows;
  // with context parallelism the global scratch id).
  const int32_t* ScratchTable(int64_t n);
  // Zero the fixed-kind rows of `slot` (a sequence starts from empty state).
  void ResetSlot(int32_t slot);

  // Bytes needed for num_blocks + 1 blocks and num_slots + 1 slots.
  static int64_t BytesFor(const StateGeometry& geometry, int64_t num_blocks, int num_slots);
  // Largest num_blocks whose pool fits in `bytes` with `num_slots` slots (0 if none).
  static int64_t BlocksThatFit(const StateGeometry& geometry, int64_t bytes, int num_slots);

 private:
  StateGeometry geometry_;
  int64_t num_blocks_;
  int num_slots_;
  int64_t total_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> memory_;  // per kind
  StatePoolView pools_[static_cast<int>(StateKind::kCount)];
  std::vector<int32_t> scratch_table_;
  PagedSharding sharding_;  // size 1: not sharded
};

}  // namespace deepinfer
