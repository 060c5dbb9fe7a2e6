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
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
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
  // Free = never written or no longer wanted: the free list plus the cached
  // blocks no request holds (evicted, least recently released first, when
  // the free list runs out).
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_blocks_.size() + lru_.size()); }
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

  // --- Prefix caching (docs/engine.md "Prefix caching"). A full block whose
  // contents are final is published under its key: BlockKey(parent key, its
  // block_size token ids). Published blocks are read-only; a request whose
  // prompt starts with the same tokens takes them with Acquire instead of
  // computing them. When its last reference goes, a published block stays
  // cached (evictable, LRU) until an allocation needs it.
  static uint64_t BlockKey(uint64_t parent, std::span<const int32_t> tokens);
  // The published block of `key` whose parent key and tokens match exactly
  // (the key's hash is checked against the stored content: a collision is a
  // miss), or nullopt.
  std::optional<int32_t> Lookup(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const;
  // Takes a reference to a published block found by Lookup (an evictable one
  // leaves the LRU list and is owned again).
  void Acquire(int32_t block);
  // Publishes an owned block under `key` after the forward pass that wrote it
  // has finished. Returns false (and publishes nothing) if the key is
  // published already (by another block) or the block is published.
  bool Publish(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens);
  bool is_published(int32_t block) const { return key_of_[static_cast<size_t>(block)].has_value(); }
  bool is_evictable(int32_t block) const { return evictable_[static_cast<size_t>(block)] != 0; }
  int64_t num_cached_blocks() const { return static_cast<int64_t>(by_key_.size()); }  // published
  int64_t num_evictable_blocks() const { return static_cast<int64_t>(lru_.size()); }
  int64_t num_evictions() const { return num_evictions_; }
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
  // Prefix cache.
  struct Content {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
  };
  void Evict();  // oldest evictable block → free list (unpublished)
  std::vector<std::optional<uint64_t>> key_of_;  // per block: its key while published
  std::vector<Content> content_;                 // per published block
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::list<int32_t> lru_;                       // evictable blocks, least recently released first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<uint8_t> evictable_;
  int64_t num_evictions_ = 0;
};

}  // namespace deepinfer
