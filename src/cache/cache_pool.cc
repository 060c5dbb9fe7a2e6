#include "cache/cache_pool.h"

#include <cstring>
#include <new>

#include "base/error.h"

namespace deepinfer {

namespace {
int64_t UnitsFor(const StateKindGeometry& k, int64_t num_blocks, int num_slots) {
  return k.paged() ? num_blocks + 1 : static_cast<int64_t>(num_slots) + 1;
}
}  // namespace

int64_t CachePool::BytesFor(const StateGeometry& g, int64_t num_blocks, int num_slots) {
  int64_t total = 0;
  for (const auto& k : g.kinds) total += k.bytes_per_block() * UnitsFor(k, num_blocks, num_slots);
  return total;
}

int64_t CachePool::BlocksThatFit(const StateGeometry& g, int64_t bytes, int num_slots) {
  int64_t fixed = BytesFor(g, 0, num_slots);  // includes one scratch block
  int64_t per_block = 0;
  for (const auto& k : g.kinds) if (k.paged()) per_block += k.bytes_per_block();
  if (bytes <= fixed || per_block <= 0) return 0;
  return (bytes - fixed) / per_block;
}

CachePool::CachePool(const StateGeometry& geometry, int64_t num_blocks, int num_slots, int cp_size, int cp_rank)
    : CachePool(geometry, num_blocks, num_slots) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size)
    Fail(ErrorKind::kInvalidArgument, "cache pool: context-parallel rank {} of {} is out of range", cp_rank, cp_size);
  sharding_ = PagedSharding{cp_size, cp_rank, static_cast<int64_t>(cp_size) * num_blocks};
}

CachePool::CachePool(const StateGeometry& geometry, int64_t num_blocks, int num_slots)
    : geometry_(geometry), num_blocks_(num_blocks), num_slots_(num_slots) {
  if (num_blocks < 1 || num_slots < 1)
    Fail(ErrorKind::kInvalidArgument, "cache pool needs >= 1 block and >= 1 slot (got {} blocks, {} slots)",
         num_blocks, num_slots);
  memory_.resize(static_cast<int>(StateKind::kCount));
  for (int ki = 0; ki < static_cast<int>(StateKind::kCount); ++ki) {
    const StateKindGeometry& k = geometry_.kinds[ki];
    const int64_t units = UnitsFor(k, num_blocks, num_slots);
    StatePoolView& view = pools_[ki];
    int64_t off = 0;
    view.region_offset.clear();
    for (const auto& r : k.regions) {
      view.region_offset.push_back(off);
      off += r.block_bytes() * units;
    }
    if (off > 0) {
      memory_[ki].reset(new (std::nothrow) uint8_t[off]);
      if (!memory_[ki])
        Fail(ErrorKind::kResourceExhausted, "cannot allocate {} bytes for the KV/state cache pool", off);
      std::memset(memory_[ki].get(), 0, off);
    }
    view.base = memory_[ki].get();
    total_bytes_ += off;
  }
}

SequenceStateView CachePool::View(int32_t slot, const int32_t* block_table, int64_t num_blocks) const {
  SequenceStateView v;
  v.pools = pools_;
  v.geometry = &geometry_;
  v.slot = slot;
  v.block_table = block_table;
  v.num_blocks = num_blocks;
  if (sharding_.size > 1) v.sharding = &sharding_;
  return v;
}

const int32_t* CachePool::ScratchTable(int64_t n) {
  if (static_cast<int64_t>(scratch_table_.size()) < n) scratch_table_.assign(n, static_cast<int32_t>(num_blocks_ * sharding_.size));
  return scratch_table_.data();
}

void CachePool::ResetSlot(int32_t slot) {
  if (slot < 0 || slot > num_slots_) Fail(ErrorKind::kInternal, "ResetSlot({}) out of range", slot);
  for (int ki = 0; ki < static_cast<int>(StateKind::kCount); ++ki) {
    const StateKindGeometry& k = geometry_.kinds[ki];
    if (k.paged()) continue;
    for (size_t r = 0; r < k.regions.size(); ++r) {
      const int64_t bb = k.regions[r].block_bytes();
      std::memset(pools_[ki].base + pools_[ki].region_offset[r] + slot * bb, 0, bb);
    }
  }
}

}  // namespace deepinfer
