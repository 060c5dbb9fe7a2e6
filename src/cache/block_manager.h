// deepinfer/cache/block_manager.h — metadata of the paged state pool
// (model-spec §5; serving-notes §1.6, §2.3–2.4). Plain data, no tensors.
//
// Two id spaces, both fixed at start-up:
//   blocks  [0, num_blocks): paged history (compressed KV + index keys of every
//           KV-source layer; StateGeometry::block_size tokens per block).
//           Block id num_blocks is the scratch block: never allocated, never
//           owned; padding rows write there.
//   slots   [0, num_slots): per-sequence fixed state (window rings, ratio-2
//           compressor carry, Engram look-back). Slot id num_slots is scratch.
// Blocks carry reference counts so a later prefix cache can share them
// (lifecycle: plan → commit → publish-after-write → rollback; see Plan/Commit/
// Rollback). No code relies on block 0 being empty.
//
// Errors: misuse (freeing a free block, committing twice, ids out of range)
// throws Error(kInternal) — these are engine bugs, never user input.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace deepinfer {

class BlockManager {
 public:
  // num_blocks >= 1, num_slots >= 1, else Error(kInvalidArgument).
  BlockManager(int64_t num_blocks, int num_slots);

  int64_t num_blocks() const { return num_blocks_; }
  int num_slots() const { return num_slots_; }
  int32_t scratch_block() const { return static_cast<int32_t>(num_blocks_); }
  int32_t scratch_slot() const { return num_slots_; }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }
  int64_t num_used_blocks() const { return num_blocks_ - num_free_blocks(); }
  int num_free_slots() const { return static_cast<int>(free_slots_.size()); }
  int num_used_slots() const { return num_slots_ - num_free_slots(); }
  int64_t peak_used_blocks() const { return peak_used_blocks_; }
  int refcount(int32_t block) const;

  // --- Blocks: two-phase allocation. Plan(n) takes n blocks off the free list
  // (all or nothing: nullopt if fewer than n are free); the caller then either
  // Commit()s them (they become owned, refcount 1) or Rollback()s them (back on
  // the free list, in the order they were taken).
  struct Plan {
    std::vector<int32_t> blocks;
    bool done = false;
  };
  std::optional<Plan> PlanBlocks(int64_t n);
  void Commit(Plan& plan);
  void Rollback(Plan& plan);
  // Convenience: Plan + Commit. nullopt if not enough free blocks.
  std::optional<std::vector<int32_t>> Allocate(int64_t n);
  // Share an owned block (refcount + 1).
  void IncRef(int32_t block);
  // Drop one reference to each block; blocks reaching 0 return to the free list.
  void Free(const std::vector<int32_t>& blocks);

  // --- Slots.
  std::optional<int32_t> AllocateSlot();
  void FreeSlot(int32_t slot);

  // Throws Error(kInternal) if the free lists, refcounts and counts disagree.
  void CheckInvariants() const;

 private:
  int64_t num_blocks_;
  int num_slots_;
  std::vector<int32_t> free_blocks_;  // stack: back() is handed out next
  std::vector<int32_t> refcount_;     // per block; 0 = free or planned
  std::vector<uint8_t> planned_;      // per block: taken by an open Plan
  std::vector<int32_t> free_slots_;
  std::vector<uint8_t> slot_used_;
  int64_t peak_used_blocks_ = 0;
};

}  // namespace deepinfer
