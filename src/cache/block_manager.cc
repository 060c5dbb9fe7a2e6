#include "cache/block_manager.h"

#include <algorithm>

#include "base/error.h"

namespace deepinfer {

BlockManager::BlockManager(int64_t num_blocks, int num_slots)
    : num_blocks_(num_blocks), num_slots_(num_slots) {
  if (num_blocks < 1) Fail(ErrorKind::kInvalidArgument, "num_kv_blocks must be >= 1, got {}", num_blocks);
  if (num_slots < 1) Fail(ErrorKind::kInvalidArgument, "max_num_seqs must be >= 1, got {}", num_slots);
  refcount_.assign(num_blocks, 0);
  planned_.assign(num_blocks, 0);
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
    if (--refcount_[b] == 0) free_blocks_.push_back(b);
  }
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
  for (int64_t b = 0; b < num_blocks_; ++b) {
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
