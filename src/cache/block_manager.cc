#include "cache/block_manager.h"

#include <algorithm>

#include <xxhash.h>

#include "base/error.h"

namespace deepinfer {

BlockManager::BlockManager(int64_t num_blocks, int num_slots)
    : num_blocks_(num_blocks), num_slots_(num_slots) {
  if (num_blocks < 1) Fail(ErrorKind::kInvalidArgument, "num_kv_blocks must be >= 1, got {}", num_blocks);
  if (num_slots < 1) Fail(ErrorKind::kInvalidArgument, "max_num_seqs must be >= 1, got {}", num_slots);
  refcount_.assign(num_blocks, 0);
  planned_.assign(num_blocks, 0);
  key_of_.assign(num_blocks, std::nullopt);
  content_.resize(num_blocks);
  lru_pos_.resize(num_blocks);
  evictable_.assign(num_blocks, 0);
  free_blocks_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
  slot_used_.assign(num_slots, 0);
  for (int s = num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

int BlockManager::refcount(int32_t block) const {
  if (block < 0 || block >= num_blocks_) Fail(ErrorKind::kInternal, "block id {} out of range [0, {})", block, num_blocks_);
  return refcount_[block];
}

std::optional<BlockManager::Plan> BlockManager::PlanBlocks(int64_t n) {
  if (n < 0) Fail(ErrorKind::kInternal, "PlanBlocks({}) with a negative count", n);
  if (n > num_free_blocks()) return std::nullopt;
  Plan plan;
  plan.blocks.reserve(n);
  while (static_cast<int64_t>(free_blocks_.size()) < n) Evict();
  for (int64_t i = 0; i < n; ++i) {
    int32_t b = free_blocks_.back();
    free_blocks_.pop_back();
    planned_[b] = 1;
    plan.blocks.push_back(b);
  }
  peak_used_blocks_ = std::max(peak_used_blocks_, num_used_blocks());
  return plan;
}

void BlockManager::Commit(Plan& plan) {
  if (plan.done) Fail(ErrorKind::kInternal, "block plan committed or rolled back twice");
  for (int32_t b : plan.blocks) {
    if (!planned_[b]) Fail(ErrorKind::kInternal, "committing block {} that is not planned", b);
    planned_[b] = 0;
    refcount_[b] = 1;
  }
  plan.done = true;
}

void BlockManager::Rollback(Plan& plan) {
  if (plan.done) Fail(ErrorKind::kInternal, "block plan committed or rolled back twice");
  for (auto it = plan.blocks.rbegin(); it != plan.blocks.rend(); ++it) {
    if (!planned_[*it]) Fail(ErrorKind::kInternal, "rolling back block {} that is not planned", *it);
    planned_[*it] = 0;
    free_blocks_.push_back(*it);
  }
  plan.done = true;
}

std::optional<std::vector<int32_t>> BlockManager::Allocate(int64_t n) {
  auto plan = PlanBlocks(n);
  if (!plan) return std::nullopt;
  Commit(*plan);
  return std::move(plan->blocks);
}

void BlockManager::IncRef(int32_t block) {
  if (refcount(block) < 1) Fail(ErrorKind::kInternal, "IncRef of free block {}", block);
  ++refcount_[block];
}

void BlockManager::Free(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    if (refcount(b) < 1) Fail(ErrorKind::kInternal, "double free of block {}", b);
    if (--refcount_[b] != 0) continue;
    if (key_of_[b]) {
      lru_pos_[b] = lru_.insert(lru_.end(), b);  // cached: evictable, most recently released last
      evictable_[b] = 1;
    } else {
      free_blocks_.push_back(b);
    }
  }
}

uint64_t BlockManager::BlockKey(uint64_t parent, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

std::optional<int32_t> BlockManager::Lookup(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  const Content& c = content_[static_cast<size_t>(it->second)];
  if (c.parent != parent || !std::equal(c.tokens.begin(), c.tokens.end(), tokens.begin(), tokens.end()))
    return std::nullopt;
  return it->second;
}

void BlockManager::Acquire(int32_t block) {
  (void)refcount(block);  // range check
  if (!key_of_[block]) Fail(ErrorKind::kInternal, "Acquire of unpublished block {}", block);
  if (evictable_[block]) {
    lru_.erase(lru_pos_[block]);
    evictable_[block] = 0;
    refcount_[block] = 1;
    peak_used_blocks_ = std::max(peak_used_blocks_, num_used_blocks());
  } else {
    IncRef(block);
  }
}

bool BlockManager::Publish(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens) {
  if (refcount(block) < 1) Fail(ErrorKind::kInternal, "Publish of block {} that is not owned", block);
  if (key_of_[block] || by_key_.count(key)) return false;
  key_of_[block] = key;
  content_[block] = Content{parent, std::vector<int32_t>(tokens.begin(), tokens.end())};
  by_key_[key] = block;
  return true;
}

void BlockManager::Evict() {
  if (lru_.empty()) Fail(ErrorKind::kInternal, "Evict with no evictable block");
  const int32_t b = lru_.front();
  lru_.pop_front();
  evictable_[b] = 0;
  by_key_.erase(*key_of_[b]);
  key_of_[b].reset();
  content_[b] = Content{};
  free_blocks_.push_back(b);
  ++num_evictions_;
}

std::optional<int32_t> BlockManager::AllocateSlot() {
  if (free_slots_.empty()) return std::nullopt;
  int32_t s = free_slots_.back();
  free_slots_.pop_back();
  slot_used_[s] = 1;
  return s;
}

void BlockManager::FreeSlot(int32_t slot) {
  if (slot < 0 || slot >= num_slots_) Fail(ErrorKind::kInternal, "slot id {} out of range [0, {})", slot, num_slots_);
  if (!slot_used_[slot]) Fail(ErrorKind::kInternal, "double free of slot {}", slot);
  slot_used_[slot] = 0;
  free_slots_.push_back(slot);
}

void BlockManager::CheckInvariants() const {
  std::vector<uint8_t> seen(num_blocks_, 0);
  for (int32_t b : free_blocks_) {
    if (b < 0 || b >= num_blocks_) Fail(ErrorKind::kInternal, "free list holds out-of-range block {}", b);
    if (seen[b]) Fail(ErrorKind::kInternal, "block {} twice on the free list", b);
    seen[b] = 1;
    if (refcount_[b] != 0 || planned_[b]) Fail(ErrorKind::kInternal, "free block {} is owned or planned", b);
  }
  for (int32_t b : lru_) {
    if (seen[b]) Fail(ErrorKind::kInternal, "block {} is both free and evictable", b);
    seen[b] = 1;
    if (refcount_[b] != 0 || planned_[b] || !evictable_[b] || !key_of_[b])
      Fail(ErrorKind::kInternal, "evictable block {} is owned, planned or unpublished", b);
  }
  for (const auto& [key, b] : by_key_)
    if (!key_of_[b] || *key_of_[b] != key) Fail(ErrorKind::kInternal, "cache index and block {} disagree", b);
  for (int64_t b = 0; b < num_blocks_; ++b) {
    if (key_of_[b] && by_key_.count(*key_of_[b]) == 0)
      Fail(ErrorKind::kInternal, "published block {} missing from the cache index", b);
    if (evictable_[b] && refcount_[b] != 0) Fail(ErrorKind::kInternal, "evictable block {} is owned", b);
    if (!seen[b] && refcount_[b] == 0 && !planned_[b])
      Fail(ErrorKind::kInternal, "block {} is neither free, planned nor owned (leaked)", b);
    if (refcount_[b] < 0) Fail(ErrorKind::kInternal, "block {} has negative refcount", b);
  }
  std::vector<uint8_t> sseen(num_slots_, 0);
  for (int32_t s : free_slots_) {
    if (s < 0 || s >= num_slots_ || sseen[s] || slot_used_[s])
      Fail(ErrorKind::kInternal, "slot free list corrupt at slot {}", s);
    sseen[s] = 1;
  }
  for (int s = 0; s < num_slots_; ++s)
    if (!sseen[s] && !slot_used_[s]) Fail(ErrorKind::kInternal, "slot {} leaked", s);
}

}  // namespace deepinfer
