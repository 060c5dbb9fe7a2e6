// deepinfer/engine/parallel_runner.h — the leader/follower step protocol of
// a parallel job (docs/parallel.md "Leader and followers").
//
// Rank 0 (the leader) owns the tokenizer, schedulers, sampler, server and
// outputs. Each step it broadcasts the step's host metadata — per data-
// parallel shard, per chunk: token ids, start position, slot, block table,
// which logits it wants, whether its slot is fresh — and every rank runs the
// same forward on its own pool: all ranks the one batch (expert parallelism
// only: attention replicated), or rank i shard i's batch (data-parallel
// attention). The ranks then check that every batch validated (one small
// AllReduce) before the collective forward. With data parallelism the
// logits rows of every rank are gathered to the leader (GatherV); followers
// never sample. A stop message ends the followers' loop.
//
// Per step: Broadcast ×2 (size, message), AllReduce ×1, then inside the
// forward per MoE layer the expert exchange (parallel/expert_parallel.h) and
// per Engram layer one row fetch (parallel/sharded_rows.h), then (DP) one
// GatherV of logits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "deepinfer/engine.h"
#include "engine/backend.h"
#include "model/state.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace deepinfer {

// The paged pool's size for these arguments (the same on every rank):
// --num-kv-blocks, else what --kv-cache-memory holds, else enough for
// max_num_seqs × max_model_len. Throws Error(kInvalidArgument) naming the flag.
int64_t KvBlocksFor(const EngineArgs& args, const StateGeometry& geometry);

// The engine's own argument checks (--max-num-seqs, --max-model-len,
// --block-size, --max-num-batched-tokens, --num-kv-blocks), run by every rank
// before it builds its pool so that all ranks fail with the same message.
void ValidateEngineArgs(const EngineArgs& args);

// Checks --ep / --dp / --dp-moe-exchange / --prefill-attempt-interval against
// the job's rank count, and refuses --speculative-config in a job of several
// ranks (every rank calls this first, so all fail alike); throws
// Error(kInvalidArgument) naming the flags (a malformed --speculative-config:
// ParseSpeculativeConfig's error).
void CheckParallelArgs(const EngineArgs& args, int world_size);

// The exchange a step uses (expert_parallel.h).
EpExchange StepExchange(const EngineArgs& args, bool decode_step);

// One chunk of a step message.
struct StepChunk {
  int64_t len = 0, start_pos = 0;
  int32_t slot = -1;
  uint8_t logits = 0;  // 0 none, 1 last row, 2 every row
  uint8_t reset = 0;   // zero the slot's fixed state first
  int64_t restore_prefix = 0;           // prefix-cache hit: rebuild the fixed state (RestoreFixedState)
  std::vector<int32_t> restore_tokens;  // raw ids of the positions just before restore_prefix
  std::vector<int32_t> tokens;       // [len]
  std::vector<int32_t> block_table;  // physical block ids
};

struct StepMessage {
  enum Kind : int32_t { kForward = 1, kStop = 2 };
  int32_t kind = kForward;
  EpExchange exchange = EpExchange::kReplicated;
  std::vector<std::vector<StepChunk>> shards;  // one batch per DP rank (one without DP)

  std::vector<uint8_t> Serialize() const;
  // Throws Error(kCorruptData) on a malformed message.
  static StepMessage Parse(const std::vector<uint8_t>& bytes);
};

// Rows of logits a chunk returns.
inline int64_t ChunkLogitsRows(const StepChunk& c) { return c.logits == 2 ? c.len : c.logits == 1 ? 1 : 0; }

}  // namespace deepinfer
