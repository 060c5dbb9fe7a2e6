// Step messages, pool sizing and argument checks of parallel jobs: see
// parallel_runner.h. The backends that use them are in v41_backend.cc.
#include "engine/parallel_runner.h"

#include <algorithm>

#include "cache/cache_pool.h"
#include "parallel/context_parallel.h"

namespace deepinfer {

int64_t KvBlocksFor(const EngineArgs& args, const StateGeometry& geometry) {
  const int64_t blocks_per_seq = (args.max_model_len + args.block_size - 1) / args.block_size;
  int64_t num_blocks = args.num_kv_blocks;
  if (num_blocks <= 0) {
    if (args.kv_cache_memory_bytes > 0) {
      num_blocks = CachePool::BlocksThatFit(geometry, args.kv_cache_memory_bytes, args.max_num_seqs);
      if (num_blocks < 1)
        Fail(ErrorKind::kInvalidArgument,
             "--kv-cache-memory {} bytes is too small: the fixed per-sequence state alone needs {} bytes",
             args.kv_cache_memory_bytes, CachePool::BytesFor(geometry, 1, args.max_num_seqs));
    } else {
      // Enough for max_num_seqs × max_model_len over the whole CP group.
      num_blocks = BlocksPerCpRank(blocks_per_seq * args.max_num_seqs, std::max(1, args.context_parallel_size));
    }
  }
  if (args.context_parallel_size >= 1) {
    // --cp given: one sequence of max_model_len tokens must fit the group's pool.
    const int cp = args.context_parallel_size;
    if (blocks_per_seq > num_blocks * cp)
      Fail(ErrorKind::kInvalidArgument,
           "--max-model-len {} needs {} blocks of {} tokens, but --cp {} ranks of {} blocks each (--num-kv-blocks / "
           "--kv-cache-memory, per rank) hold {} tokens: raise --cp or the pool, or lower --max-model-len",
           args.max_model_len, blocks_per_seq, args.block_size, cp, num_blocks, num_blocks * cp * args.block_size);
  }
  return num_blocks;
}

void CheckParallelArgs(const EngineArgs& args, int world_size) {
  const int ep = args.expert_parallel_size, dp = args.data_parallel_size;
  if (args.context_parallel_size < 0)
    Fail(ErrorKind::kInvalidArgument, "--cp must be >= 1, got {}", args.context_parallel_size);
  const int cp = std::max(1, args.context_parallel_size);
  if (cp > 1) {
    if (world_size == 1)
      Fail(ErrorKind::kInvalidArgument, "--cp {} needs {} ranks, but this is one process: start it with mpirun -np {}",
           cp, cp, cp);
    if (cp != world_size)
      Fail(ErrorKind::kInvalidArgument,
           "--cp {} must equal the number of ranks ({}, from mpirun -np): every rank holds a share of each sequence",
           cp, world_size);
    if (dp > 1)
      Fail(ErrorKind::kInvalidArgument,
           "--cp {} with --dp {} is not supported: context parallelism runs every sequence on all ranks (use --dp 1)",
           cp, dp);
    if (ep != 1 && ep != cp)
      Fail(ErrorKind::kInvalidArgument,
           "--cp {} with --ep {} is not supported: expert parallelism with --cp runs on the same ranks (--ep 1 or "
           "--ep {})",
           cp, ep, cp);
  }
  if (ep < 1) Fail(ErrorKind::kInvalidArgument, "--ep must be >= 1, got {}", ep);
  if (dp < 1) Fail(ErrorKind::kInvalidArgument, "--dp must be >= 1, got {}", dp);
  if (dp > 1 && ep == 1)
    Fail(ErrorKind::kInvalidArgument,
         "--dp {} needs --ep {}: data-parallel attention runs on expert-parallel ranks (mpirun -np {} ... --ep {} "
         "--dp {})",
         dp, dp, dp, dp, dp);
  if (world_size == 1 && (ep > 1 || dp > 1))
    Fail(ErrorKind::kInvalidArgument,
         "--ep {} --dp {} needs {} ranks, but this is one process: start it with mpirun -np {}", ep, dp,
         std::max(ep, dp), std::max(ep, dp));
  if (world_size > 1 && cp == 1 && ep != world_size)
    Fail(ErrorKind::kInvalidArgument,
         "--ep {} must equal the number of ranks ({}, from mpirun -np): the experts are split over every rank", ep,
         world_size);
  if (dp != 1 && dp != ep)
    Fail(ErrorKind::kInvalidArgument,
         "--dp {} is not supported with --ep {}: data-parallel attention runs on every expert-parallel rank "
         "(--dp 1 or --dp {})",
         dp, ep, ep);
  // Speculative decoding runs in one process (engine.cc refuses it too, for
  // library users); refused here, on every rank before any collective, so the
  // other ranks fail with the same message instead of a broken collective.
  if (world_size > 1 && !args.speculative_config.empty() && ParseSpeculativeConfig(args.speculative_config).enabled()) {
    if (cp > 1)
      Fail(ErrorKind::kInvalidArgument,
           "--speculative-config cannot be combined with --cp {}: the draft and rollback steps are not "
           "context-parallel",
           cp);
    Fail(ErrorKind::kInvalidArgument,
         "--speculative-config cannot be combined with a parallel job (--ep {} --dp {}): the rollback of rejected "
         "drafts runs in this process's pool only",
         ep, dp);
  }
  if (args.dp_moe_exchange != "auto" && args.dp_moe_exchange != "general")
    Fail(ErrorKind::kInvalidArgument, "--dp-moe-exchange must be auto or general, got \"{}\"", args.dp_moe_exchange);
  if (args.prefill_attempt_interval < 0)
    Fail(ErrorKind::kInvalidArgument, "--prefill-attempt-interval must be >= 0, got {}",
         args.prefill_attempt_interval);
  if (!(args.distributed_timeout_s >= 0))
    Fail(ErrorKind::kInvalidArgument, "--distributed-timeout must be >= 0 seconds, got {}",
         args.distributed_timeout_s);
}

EpExchange StepExchange(const EngineArgs& args, bool decode_step) {
  if (args.data_parallel_size <= 1) return EpExchange::kReplicated;
  return decode_step && args.dp_moe_exchange == "auto" ? EpExchange::kStatic : EpExchange::kGeneral;
}

std::vector<uint8_t> StepMessage::Serialize() const {
  ByteWriter w;
  w.Put<int32_t>(kind);
  w.Put<int32_t>(static_cast<int32_t>(exchange));
  w.Put<int64_t>(static_cast<int64_t>(shards.size()));
  for (const auto& batch : shards) {
    w.Put<int64_t>(static_cast<int64_t>(batch.size()));
    for (const StepChunk& c : batch) {
      w.Put(c.len);
      w.Put(c.start_pos);
      w.Put(c.slot);
      w.Put(c.logits);
      w.Put(c.reset);
      w.Put(c.restore_prefix);
      w.PutSpan<int32_t>(c.restore_tokens);
      w.PutSpan<int32_t>(c.tokens);
      w.PutSpan<int32_t>(c.block_table);
    }
  }
  return std::move(w.bytes());
}

StepMessage StepMessage::Parse(const std::vector<uint8_t>& bytes) {
  ByteReader r(bytes);
  StepMessage m;
  m.kind = r.Get<int32_t>();
  if (m.kind != kForward && m.kind != kStop) Fail(ErrorKind::kCorruptData, "step message: unknown kind {}", m.kind);
  const int32_t ex = r.Get<int32_t>();
  if (ex < 0 || ex > 2) Fail(ErrorKind::kCorruptData, "step message: unknown exchange {}", ex);
  m.exchange = static_cast<EpExchange>(ex);
  const int64_t ns = r.Get<int64_t>();
  if (ns < 0 || ns > 65536) Fail(ErrorKind::kCorruptData, "step message: {} shards", ns);
  m.shards.resize(static_cast<size_t>(ns));
  for (auto& batch : m.shards) {
    const int64_t n = r.Get<int64_t>();
    if (n < 0 || n > (int64_t{1} << 24)) Fail(ErrorKind::kCorruptData, "step message: {} chunks", n);
    batch.resize(static_cast<size_t>(n));
    for (StepChunk& c : batch) {
      c.len = r.Get<int64_t>();
      c.start_pos = r.Get<int64_t>();
      c.slot = r.Get<int32_t>();
      c.logits = r.Get<uint8_t>();
      c.reset = r.Get<uint8_t>();
      c.restore_prefix = r.Get<int64_t>();
      c.restore_tokens = r.GetVector<int32_t>();
      c.tokens = r.GetVector<int32_t>();
      c.block_table = r.GetVector<int32_t>();
      if (static_cast<int64_t>(c.tokens.size()) != c.len)
        Fail(ErrorKind::kCorruptData, "step message: chunk of len {} with {} tokens", c.len, c.tokens.size());
    }
  }
  if (!r.done()) Fail(ErrorKind::kCorruptData, "step message: trailing bytes");
  return m;
}

}  // namespace deepinfer
