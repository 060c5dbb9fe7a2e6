// Context parallelism's single-process pieces (docs/parallel.md "Context
// parallelism"): the block sharding of the paged pool (global ids → local
// blocks, the scratch block on every rank), the local path of the paged-row
// gather, the per-rank pool size, the start-up capacity check and the flag
// checks. The multi-rank paths (bit-identical to one process) run in
// tests/cli/context_parallel_mpi.sh.
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "cache/cache_pool.h"
#include "deepinfer/engine.h"
#include "engine/parallel_runner.h"
#include "model/config.h"
#include "parallel/context_parallel.h"

namespace deepinfer {
namespace {

// A geometry with one paged region (kCompressedKv, ratio 1: one row per
// token, 4 bytes per row) and one fixed region, built by hand.
StateGeometry TinyGeometry(int64_t block_size) {
  StateGeometry g;
  g.block_size = block_size;
  auto& kv = g.kinds[static_cast<int>(StateKind::kCompressedKv)];
  kv.kind = StateKind::kCompressedKv;
  kv.regions.push_back({0, 4, block_size});
  auto& win = g.kinds[static_cast<int>(StateKind::kWindow)];
  win.kind = StateKind::kWindow;
  win.regions.push_back({0, 4, 2});
  return g;
}

TEST(ContextParallel, PoolShardsBlocksByGlobalIdAndKeepsTheScratchEverywhere) {
  const StateGeometry g = TinyGeometry(4);
  // Two ranks of 3 blocks: global ids 0..5, scratch 6.
  CachePool r0(g, 3, 2, 2, 0), r1(g, 3, 2, 2, 1);
  EXPECT_EQ(r0.ScratchTable(1)[0], 6);
  const int32_t table[3] = {5, 2, 6};  // logical block 0 on rank 1, 1 on rank 0, 2 the scratch
  const SequenceStateView v0 = r0.View(0, table, 3), v1 = r1.View(0, table, 3);
  ASSERT_NE(v0.sharding, nullptr);
  const StateKind K = StateKind::kCompressedKv;
  EXPECT_FALSE(v0.OwnsRow(K, 0, 0));
  EXPECT_TRUE(v1.OwnsRow(K, 0, 3));
  EXPECT_TRUE(v0.OwnsRow(K, 0, 4));
  EXPECT_FALSE(v1.OwnsRow(K, 0, 7));
  EXPECT_TRUE(v0.OwnsRow(K, 0, 8) && v1.OwnsRow(K, 0, 11));  // scratch: both
  EXPECT_TRUE(v0.OwnsRow(StateKind::kWindow, 0, 1));          // fixed kinds: not sharded
  EXPECT_EQ(v0.sharding->Owner(5), 1);
  EXPECT_EQ(v0.sharding->Owner(2), 0);
  EXPECT_EQ(v0.sharding->Owner(6), 0);
  // Global block 5 is rank 1's local block 2; global 2 is rank 0's local 1;
  // the scratch 6 is local block 3 (each pool's own scratch).
  const uint8_t* base1 = v1.pools[static_cast<int>(K)].base;
  const uint8_t* base0 = v0.pools[static_cast<int>(K)].base;
  const int64_t bb = 4 * 4;
  EXPECT_EQ(v1.Row(K, 0, 1), base1 + 2 * bb + 4);
  EXPECT_EQ(v0.Row(K, 0, 5), base0 + 1 * bb + 4);
  EXPECT_EQ(v0.Row(K, 0, 9), base0 + 3 * bb + 4);
  EXPECT_EQ(v1.Row(K, 0, 9), base1 + 3 * bb + 4);
  // A pool without sharding reads block ids as they are.
  CachePool one(g, 6, 2);
  const SequenceStateView u = one.View(0, table, 3);
  EXPECT_EQ(u.sharding, nullptr);
  EXPECT_EQ(u.Row(K, 0, 1), u.pools[static_cast<int>(K)].base + 5 * bb + 4);
  EXPECT_THROW(CachePool(g, 3, 2, 2, 2), Error);
}

TEST(ContextParallel, GatherWithoutShardingCopiesLocalRowsInRequestOrder) {
  const StateGeometry g = TinyGeometry(2);
  CachePool pool(g, 4, 1);
  const int32_t table[2] = {3, 1};
  const SequenceStateView v = pool.View(0, table, 2);
  for (int64_t row = 0; row < 4; ++row) {
    const uint32_t x = 100 + static_cast<uint32_t>(row);
    std::memcpy(v.Row(StateKind::kCompressedKv, 0, row), &x, 4);
  }
  const PagedRowRef refs[3] = {{&v, 2}, {&v, 0}, {&v, 3}};
  uint32_t out[3] = {};
  GatherPagedRows(nullptr, StateKind::kCompressedKv, 0, refs, 3, reinterpret_cast<uint8_t*>(out));
  EXPECT_EQ(out[0], 102u);
  EXPECT_EQ(out[1], 100u);
  EXPECT_EQ(out[2], 103u);
  const PagedRowRef bad[1] = {{&v, 4}};
  EXPECT_THROW(GatherPagedRows(nullptr, StateKind::kCompressedKv, 0, bad, 1, reinterpret_cast<uint8_t*>(out)), Error);
}

TEST(ContextParallel, PoolIsPerRankAndMaxModelLenMustFitTheGroup) {
  const StateGeometry g = TinyGeometry(16);
  EngineArgs a;
  a.block_size = 16;
  a.max_model_len = 256;  // 16 blocks
  a.max_num_seqs = 3;     // 48 blocks in all
  EXPECT_EQ(KvBlocksFor(a, g), 48);  // --cp not given
  a.context_parallel_size = 2;
  EXPECT_EQ(KvBlocksFor(a, g), 24);
  a.context_parallel_size = 4;
  EXPECT_EQ(KvBlocksFor(a, g), 12);
  // --num-kv-blocks is per rank: 8 blocks hold 128 tokens, two ranks 256.
  a.num_kv_blocks = 8;
  a.context_parallel_size = 2;
  EXPECT_EQ(KvBlocksFor(a, g), 8);
  a.context_parallel_size = 1;
  try {
    KvBlocksFor(a, g);
    ADD_FAILURE() << "--cp 1 with 8 blocks accepted --max-model-len 256";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--max-model-len 256 needs 16 blocks"), std::string::npos) << m;
    EXPECT_NE(m.find("--cp 1"), std::string::npos) << m;
  }
  a.context_parallel_size = 0;  // not given: no capacity check (the pre-CP behaviour)
  EXPECT_EQ(KvBlocksFor(a, g), 8);
  EXPECT_EQ(BlocksPerCpRank(7, 2), 4);
  EXPECT_EQ(BlocksPerCpRank(8, 4), 2);
}

TEST(ContextParallel, UnsupportedCombinationsNameTheFlags) {
  auto msg = [](int cp, int ep, int dp, int world, const std::string& spec = "") {
    EngineArgs a;
    a.context_parallel_size = cp;
    a.expert_parallel_size = ep;
    a.data_parallel_size = dp;
    a.speculative_config = spec;
    try {
      CheckParallelArgs(a, world);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(msg(2, 1, 1, 2), "");
  EXPECT_EQ(msg(2, 2, 1, 2), "");
  EXPECT_EQ(msg(4, 1, 1, 4), "");
  EXPECT_EQ(msg(1, 1, 1, 1), "");
  EXPECT_NE(msg(2, 1, 1, 1).find("--cp 2 needs 2 ranks"), std::string::npos);
  EXPECT_NE(msg(3, 1, 1, 2).find("--cp 3 must equal the number of ranks (2"), std::string::npos);
  EXPECT_NE(msg(2, 2, 2, 2).find("--cp 2 with --dp 2 is not supported"), std::string::npos);
  EXPECT_NE(msg(2, 4, 1, 2).find("--cp 2 with --ep 4 is not supported"), std::string::npos);
  EXPECT_NE(msg(-1, 1, 1, 1).find("--cp must be >= 1"), std::string::npos);
  EXPECT_NE(msg(1, 1, 1, 2).find("--ep 1 must equal the number of ranks"), std::string::npos);
  // Speculative decoding in a job of several ranks: refused by every rank's
  // check (before, only the engine's rank refused it and the others met a
  // broken collective); one process keeps it.
  const std::string spec = R"({"method": "ngram", "num_speculative_tokens": 2})";
  EXPECT_EQ(msg(1, 1, 1, 1, spec), "");
  EXPECT_NE(msg(2, 1, 1, 2, spec).find("--speculative-config cannot be combined with --cp 2"), std::string::npos);
  EXPECT_NE(msg(1, 2, 1, 2, spec).find("--speculative-config cannot be combined with a parallel job (--ep 2"),
            std::string::npos);
}

}  // namespace
}  // namespace deepinfer
