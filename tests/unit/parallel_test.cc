// The parallel runtime's pieces that run without MPI (docs/parallel.md):
// data-parallel engine shards over a sharded canary backend (lockstep, dummy
// steps, the prefill vote, least-loaded assignment; results equal one shard),
// the expert combine order, step messages, the single-process communicator,
// sharded-row ownership, argument checks and the decode-only scheduler step.
// The MPI paths themselves run in tests/cli/parallel_mpi.sh and server_mpi.sh.
// Also the thread team's stealing loop (base/parallel.h ParallelForStealing).
#include <omp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "base/alloc_count.h"
#include "base/parallel.h"
#include "cache/cache_pool.h"
#include "canary_backend.h"
#include "deepinfer/engine.h"
#include "engine/parallel_runner.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"
#include "parallel/sharded_rows.h"
#include "scheduler/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

using test_support::CanaryBackend;
using test_support::Args;

// D shards of the canary model: shard 0 in the engine's pool, shard i > 0 in
// a pool of its own (as rank i's), addressed only by slot and block ids. It
// checks the lockstep contract of ForwardShards on every step.
class ShardedCanary : public CanaryBackend {
 public:
  ShardedCanary(int shards, const EngineArgs& args) : shards_(shards), args_(args) {}
  int data_parallel_size() const override { return shards_; }
  void ForwardShards(const std::vector<std::vector<BackendSeq>>& batches, bool decode_step,
                     std::vector<std::vector<float>>* logits) override {
    ASSERT_EQ(static_cast<int>(batches.size()), shards_);
    if (pools_.empty()) {
      geometry_ = Geometry(args_.block_size);
      for (int i = 1; i < shards_; ++i)
        pools_.push_back(std::make_unique<CachePool>(geometry_, KvBlocksFor(args_, geometry_), args_.max_num_seqs));
    }
    ++steps;
    if (decode_step) ++decode_steps;
    for (int i = 0; i < shards_; ++i) {
      const auto& b = batches[static_cast<size_t>(i)];
      ASSERT_FALSE(b.empty()) << "shard " << i << " got no rows: an idle shard must run padding rows";
      if (decode_step) {
        ASSERT_EQ(b.size(), batches[0].size()) << "decode steps have the same row count on every shard";
        for (const BackendSeq& s : b) ASSERT_EQ(s.len, 1);
      }
      std::vector<BackendSeq> local = b;
      if (i > 0) {
        CachePool& pool = *pools_[static_cast<size_t>(i - 1)];
        for (BackendSeq& s : local) {
          ASSERT_EQ(s.state.pools, nullptr) << "a remote shard's view must not point into the leader's pool";
          if (s.reset_state) pool.ResetSlot(s.state.slot);
          s.state = pool.View(s.state.slot, s.state.block_table, s.state.num_blocks);
        }
      }
      Forward(local, &(*logits)[static_cast<size_t>(i)]);
    }
  }
  int64_t steps = 0, decode_steps = 0;

 private:
  int shards_;
  EngineArgs args_;
  StateGeometry geometry_;
  std::vector<std::unique_ptr<CachePool>> pools_;
};

std::vector<GenerateRequest> Requests(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    std::vector<int32_t> ids(1 + rng() % 30);
    for (auto& t : ids) t = 2 + static_cast<int32_t>(rng() % 290);
    r.prompt_token_ids = ids;
    r.params.max_tokens = 1 + static_cast<int64_t>(rng() % 16);
    r.params.temperature = i % 2 ? 0.0 : 0.9;
    if (i % 2 == 0) r.params.seed = 100 + i;
    r.params.logprobs = 2;
    r.request_id = std::to_string(i);
    reqs.push_back(r);
  }
  return reqs;
}

struct Result {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<float>> logprobs;
  std::map<std::string, std::string> finish;
  EngineStats stats;
  int64_t steps = 0, decode_steps = 0;
};

Result RunShards(int shards, const EngineArgs& args, const std::vector<GenerateRequest>& reqs) {
  auto backend = std::make_unique<ShardedCanary>(shards, args);
  ShardedCanary* b = backend.get();
  auto engine = Engine::OpenWithBackend(args, std::move(backend), nullptr);
  for (const auto& r : reqs) engine->Submit(r);
  Result res;
  while (engine->HasUnfinished())
    for (auto& o : engine->Step()) {
      if (o.finished) res.finish[o.request_id] = o.finish_reason;  // "error" for the canary's NaN token
      auto& t = res.tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      for (auto& lp : o.new_logprobs) res.logprobs[o.request_id].push_back(lp.chosen.logprob);
    }
  res.stats = engine->Stats();
  res.steps = b->steps;
  res.decode_steps = b->decode_steps;
  EXPECT_EQ(res.stats.num_kv_blocks_used, 0);
  EXPECT_EQ(res.stats.num_running + res.stats.num_waiting, 0);
  return res;
}

// Every item runs exactly once, for team sizes around and above the item count.
TEST(ParallelForStealing, RunsEachItemOnce) {
  const int saved = NumThreads();
  for (int T : {1, 2, 3, 5}) {
    SetNumThreads(T);
    int calls = 0;
    ParallelForStealing(-5, [&](int64_t) { ++calls; });  // a negative count runs nothing
    EXPECT_EQ(calls, 0) << "T " << T;
    for (int64_t items : {0, 1, 2, 3, 7, 64, 1001}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(items));
      ParallelForStealing(items, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < items; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "T " << T << " items " << items << " item " << i;
    }
  }
  SetNumThreads(saved);
}

// ParallelFor: every item once; no region at all (omp_get_level() stays 0,
// where an `if(false)` region would make it 1) when no team is asked for or
// there is one item; a team when asked for with two or more items and
// threads; inside a region, no nested one (the level stays 1) and every item
// on the calling thread — ParallelForStealing too, and with one thread.
TEST(ParallelFor, RunsEachItemOnceAndOpensARegionOnlyForATeam) {
  const int saved = NumThreads();
  for (int T : {1, 2, 3}) {
    SetNumThreads(T);
    for (bool team : {false, true}) {
      for (int64_t items : {-3, 0, 1, 2, 7, 100}) {
        std::vector<std::atomic<int>> runs(static_cast<size_t>(std::max<int64_t>(items, 0)));
        std::atomic<int> max_level{0};
        std::atomic<uint32_t> thread_mask{0};
        ParallelFor(items, team, [&](int64_t i) {
          runs[static_cast<size_t>(i)].fetch_add(1);
          int lv = omp_get_level();
          int prev = max_level.load();
          while (lv > prev && !max_level.compare_exchange_weak(prev, lv)) {
          }
          thread_mask.fetch_or(1u << omp_get_thread_num());
        });
        for (int64_t i = 0; i < items; ++i)
          EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "T " << T << " team " << team << " items " << items;
        if (items <= 0) continue;
        const bool region = team && items > 1 && T > 1;
        EXPECT_EQ(max_level.load(), region ? 1 : 0) << "T " << T << " team " << team << " items " << items;
        if (!region) {
          EXPECT_EQ(thread_mask.load(), 1u) << "T " << T << " team " << team << " items " << items;
        }
        if (T == 1) {  // one thread: ParallelForStealing opens no region either
          std::atomic<int> level{0};
          ParallelForStealing(items, [&](int64_t) { level.fetch_or(omp_get_level() + 1); });
          EXPECT_EQ(level.load(), 1) << "items " << items;
        }
      }
    }
  }
  SetNumThreads(2);
  std::atomic<int> bad{0}, ran{0};
#pragma omp parallel num_threads(2)
  {
    const int me = omp_get_thread_num();
    const auto check = [&](int64_t) {
      ran.fetch_add(1);
      if (omp_get_level() != 1 || omp_get_thread_num() != me) bad.fetch_add(1);
    };
    ParallelFor(10, true, check);
    ParallelForStealing(10, check);
  }
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(ran.load(), 2 * 2 * 10);
  SetNumThreads(saved);
}

// A thread held up in an item does not hold up the rest of its range: the
// first item to start blocks its thread until every other item has run,
// which only happens if the other threads take what is left of that thread's
// range from its back. (Without stealing the wait times out.)
TEST(ParallelForStealing, OtherThreadsTakeTheRangeOfAHeldUpThread) {
  const int saved = NumThreads();
  for (int T : {2, 3}) {
    SetNumThreads(T);
    constexpr int64_t kItems = 60;
    std::atomic<int> held{-1};
    std::atomic<int64_t> total{0}, by_held{0};
    std::atomic<bool> timed_out{false};
    ParallelForStealing(kItems, [&](int64_t) {
      const int t = omp_get_thread_num();
      int none = -1;
      if (held.compare_exchange_strong(none, t)) {
        by_held.fetch_add(1);
        total.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (total.load() < kItems) {
          if (std::chrono::steady_clock::now() > until) {
            timed_out = true;
            break;
          }
          std::this_thread::yield();
        }
        return;
      }
      if (t == held.load()) by_held.fetch_add(1);
      total.fetch_add(1);
    });
    EXPECT_FALSE(timed_out.load()) << "T " << T;
    EXPECT_EQ(by_held.load(), 1) << "T " << T;
    EXPECT_EQ(total.load(), kItems) << "T " << T;
  }
  SetNumThreads(saved);
}

TEST(DataParallelEngine, ShardsGiveTheSameTokensAsOne) {
  const auto reqs = Requests(40, 3);
  const Result one = RunShards(1, Args(8, 64), reqs);
  for (int shards : {2, 3, 4}) {
    for (int64_t budget : {int64_t{8}, int64_t{64}}) {
      const Result dp = RunShards(shards, Args(8, budget), reqs);
      EXPECT_EQ(dp.tokens, one.tokens) << shards << " shards, budget " << budget;
      EXPECT_EQ(dp.logprobs, one.logprobs) << shards << " shards, budget " << budget;
      EXPECT_EQ(dp.finish, one.finish) << shards << " shards, budget " << budget;
      // Least-loaded assignment spreads the requests.
      ASSERT_EQ(dp.stats.dp_requests.size(), static_cast<size_t>(shards));
      int64_t total = 0;
      for (int64_t n : dp.stats.dp_requests) {
        EXPECT_GE(n, 40 / shards - 1);
        total += n;
      }
      EXPECT_EQ(total, 40);
      EXPECT_GT(dp.decode_steps, 0);
      EXPECT_EQ(dp.stats.num_decode_steps, dp.decode_steps);
      EXPECT_EQ(dp.stats.num_prefill_steps + dp.stats.num_decode_steps, dp.steps);
    }
  }
}

TEST(DataParallelEngine, PreemptionInEveryShardKeepsTheTokens) {
  const auto reqs = Requests(30, 9);
  const Result one = RunShards(1, Args(6, 32), reqs);
  const Result dp = RunShards(3, Args(6, 32, /*blocks=*/14), reqs);
  EXPECT_GT(dp.stats.num_preemptions, 0);
  EXPECT_EQ(dp.tokens, one.tokens);
  EXPECT_EQ(dp.logprobs, one.logprobs);
  EXPECT_EQ(dp.finish, one.finish);
}

TEST(DataParallelEngine, IdleShardRunsDummyStepsAndALateRequestIsNotParked) {
  for (int64_t interval : {int64_t{0}, int64_t{1}, int64_t{3}}) {
    EngineArgs args = Args(4, 64);
    args.prefill_attempt_interval = interval;
    auto engine = Engine::OpenWithBackend(args, std::make_unique<ShardedCanary>(2, args), nullptr);
    GenerateRequest longr;
    longr.prompt_token_ids = std::vector<int32_t>{5, 6, 7};
    longr.params.max_tokens = 60;
    longr.params.ignore_eos = true;
    longr.params.temperature = 0.0;
    longr.request_id = "long";
    engine->Submit(longr);
    for (int i = 0; i < 5; ++i) engine->Step();  // shard 0 decodes, shard 1 idles
    EXPECT_GT(engine->Stats().dp_dummy_steps[1], 0);
    // A prompt for the idle shard: the shard that decodes has no prefill work,
    // so the vote runs a prefill step once `interval` decode steps have passed
    // since the last one (at once here: the last prefill step was long ago).
    auto serve = [&](const char* name) {
      GenerateRequest late = longr;
      late.prompt_token_ids = std::vector<int32_t>(20, 9);
      late.params.max_tokens = 1;
      late.request_id = name;
      const uint64_t id = engine->Submit(late);
      for (int steps = 1; steps < 100; ++steps)
        for (auto& o : engine->Step())
          if (o.id == id && o.finished) return steps;
      return -1;
    };
    EXPECT_EQ(serve("late1"), 1) << "interval " << interval;
    // Right after a prefill step: served after exactly `interval` decode steps.
    EXPECT_EQ(serve("late2"), interval + 1) << "interval " << interval;
    EXPECT_EQ(engine->Stats().dp_requests, (std::vector<int64_t>{1, 2}));
    while (engine->HasUnfinished()) engine->Step();
  }
}

TEST(ExpertParallel, CombineSumsInIncreasingExpertIdOneProcess) {
  // Outputs chosen so that the FP32 sum order matters.
  const int64_t n = 5, d = 3;
  const int k = 3;
  std::vector<float> x(n * d);
  for (int64_t i = 0; i < n * d; ++i) x[i] = 1.0f + static_cast<float>(i);
  std::vector<int32_t> idx = {7, 0, 3, 1, 6, 2, 5, 4, 0, 2, 7, 1, 3, 6, 5};
  std::vector<float> wts(n * k, 1.0f);
  auto value = [](int e, int64_t r, int64_t c) {
    return e % 2 ? 1e8f : (1.0f + static_cast<float>(e + r + c)) * 0.37f;
  };
  std::vector<std::vector<int64_t>> seen(8);
  ExpertShard shard{8, 1, 0};
  std::vector<float> y(n * d);
  RoutedExperts(nullptr, EpExchange::kReplicated, shard, x.data(), n, d, idx.data(), wts.data(), k,
                [&](int e, const float* xin, int64_t m, const float* rw, float* out) {
                  for (int64_t i = 0; i < m; ++i) {
                    const int64_t r = static_cast<int64_t>(xin[i * d] - 1.0f) / d;  // row from its x
                    for (int64_t c = 0; c < d; ++c) out[i * d + c] = value(e, r, c) * (e % 3 == 0 ? -1.0f : 1.0f);
                    EXPECT_EQ(rw[i], 1.0f);
                  }
                },
                y.data());
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int> es(idx.begin() + r * k, idx.begin() + (r + 1) * k);
    std::sort(es.begin(), es.end());
    for (int64_t c = 0; c < d; ++c) {
      float want = 0.0f;
      for (int e : es) want += value(e, r, c) * (e % 3 == 0 ? -1.0f : 1.0f);
      EXPECT_EQ(y[r * d + c], want) << r << "," << c;
    }
  }
}

// The decode step plan (model/v41/workspace.h): once every thread's expert
// scratch holds n rows, a step whose routing puts all n rows on one expert
// (after one that spread them) allocates nothing. The count is 0 in
// sanitizer builds (nothing interposed), where this only checks the outputs.
TEST(ExpertParallel, ReservedScratchMakesALaterRoutingAllocateNothing) {
  const int64_t n = 4, d = 8;
  const int k = 2;
  std::vector<float> x(n * d), y(n * d), wts(n * k, 0.5f);
  for (int64_t i = 0; i < n * d; ++i) x[i] = static_cast<float>(i);
  const ExpertShard shard{8, 1, 0};
  const ExpertFn fn = [](int e, const float* xin, int64_t m, const float* rw, float* out) {
    for (int64_t i = 0; i < m * 8; ++i) out[i] = xin[i] * rw[i / 8] * static_cast<float>(e + 1);
  };
#pragma omp parallel
  ReserveRoutedExpertScratch(n, d);
  const std::vector<int32_t> spread = {0, 1, 2, 3, 4, 5, 6, 7};
  RoutedExperts(nullptr, EpExchange::kReplicated, shard, x.data(), n, d, spread.data(), wts.data(), k, fn, y.data());
  const std::vector<int32_t> two = {0, 1, 0, 1, 0, 1, 0, 1};  // every row on experts 0 and 1
  const uint64_t a0 = HeapAllocations();
  RoutedExperts(nullptr, EpExchange::kReplicated, shard, x.data(), n, d, two.data(), wts.data(), k, fn, y.data());
  EXPECT_EQ(HeapAllocations() - a0, 0u);
  for (int64_t i = 0; i < n * d; ++i) EXPECT_EQ(y[i], x[i] * 0.5f * 1.0f + x[i] * 0.5f * 2.0f) << i;
}

TEST(ExpertParallel, ShardOwnership) {
  ExpertShard s{8, 4, 2};
  EXPECT_EQ(s.first(), 4);
  EXPECT_EQ(s.end(), 6);
  EXPECT_TRUE(s.owns(5));
  EXPECT_FALSE(s.owns(6));
  EXPECT_EQ(s.owner(7), 3);
  for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{512}, int64_t{1000003}})
    for (int n : {1, 2, 3, 4})
      for (int64_t r : {int64_t{0}, rows / 3, rows / 2, rows - 1}) {
        const int q = RowOwner(rows, n, r);
        EXPECT_GE(r, RowBegin(rows, n, q));
        EXPECT_LT(r, RowBegin(rows, n, q + 1));
      }
}

TEST(ShardedRows, OneProcessReadsEveryRowAndRejectsOutOfRange) {
  const int64_t ids[3] = {4, 0, 4};
  uint8_t out[6];
  FetchShardedRows(nullptr, EpExchange::kGeneral, 5, ids, 3, 2,
                   [](int64_t row, uint8_t* dst) { dst[0] = static_cast<uint8_t>(row), dst[1] = 0xAB; }, out);
  EXPECT_EQ(out[0], 4);
  EXPECT_EQ(out[2], 0);
  EXPECT_EQ(out[5], 0xAB);
  const int64_t bad[1] = {5};
  EXPECT_THROW(FetchShardedRows(nullptr, EpExchange::kGeneral, 5, bad, 1, 2, [](int64_t, uint8_t*) {}, out), Error);
}

TEST(StepMessage, RoundTripAndCorruptInput) {
  StepMessage m;
  m.exchange = EpExchange::kStatic;
  m.shards.resize(2);
  StepChunk c;
  c.len = 3;
  c.start_pos = 17;
  c.slot = 2;
  c.logits = 2;
  c.reset = 1;
  c.tokens = {5, 6, 7};
  c.block_table = {9, 8, 7, 6, 5};
  m.shards[1].push_back(c);
  const std::vector<uint8_t> bytes = m.Serialize();
  const StepMessage r = StepMessage::Parse(bytes);
  EXPECT_EQ(r.kind, StepMessage::kForward);
  EXPECT_EQ(r.exchange, EpExchange::kStatic);
  ASSERT_EQ(r.shards.size(), 2u);
  EXPECT_TRUE(r.shards[0].empty());
  ASSERT_EQ(r.shards[1].size(), 1u);
  EXPECT_EQ(r.shards[1][0].tokens, c.tokens);
  EXPECT_EQ(r.shards[1][0].block_table, c.block_table);
  EXPECT_EQ(r.shards[1][0].start_pos, 17);
  EXPECT_EQ(ChunkLogitsRows(r.shards[1][0]), 3);
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<uint8_t> t(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_THROW(StepMessage::Parse(t), Error) << "cut at " << cut;
  }
  std::vector<uint8_t> bad = bytes;
  bad[0] = 9;  // unknown kind
  EXPECT_THROW(StepMessage::Parse(bad), Error);
}

TEST(Communicator, SingleProcessCollectivesCopy) {
  LocalCommunicator c;
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.rank(), 0);
  const int32_t in[3] = {1, 2, 3};
  int32_t out[3] = {};
  c.AllGatherV(in, {12}, out);
  EXPECT_EQ(out[2], 3);
  int32_t o2[3] = {};
  c.AllToAllV(in, {12}, o2, {12});
  EXPECT_EQ(o2[1], 2);
  std::vector<int64_t> v = {4, 5};
  c.BroadcastVector(&v, 0);
  EXPECT_EQ(v.size(), 2u);
  EXPECT_EQ(c.AllReduceOne(7, ReduceOp::kSum), 7);
  EXPECT_THROW(c.Broadcast(out, 4, 1), Error);
  EXPECT_FALSE(WorldIsMpi());
  EXPECT_EQ(World().size(), 1);  // not started by mpirun
  EXPECT_FALSE(IsFollowerRank());
}

TEST(ParallelArgs, UnsupportedCombinationsNameTheFlags) {
  auto msg = [](int ep, int dp, int world, const std::string& exchange = "auto") {
    EngineArgs a;
    a.expert_parallel_size = ep;
    a.data_parallel_size = dp;
    a.dp_moe_exchange = exchange;
    try {
      CheckParallelArgs(a, world);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(msg(1, 1, 1), "");
  EXPECT_EQ(msg(4, 4, 4), "");
  EXPECT_EQ(msg(2, 1, 2), "");
  EXPECT_NE(msg(2, 1, 1).find("mpirun -np 2"), std::string::npos);
  EXPECT_NE(msg(1, 1, 2).find("--ep 1 must equal the number of ranks (2"), std::string::npos);
  EXPECT_NE(msg(4, 2, 4).find("--dp 2 is not supported with --ep 4"), std::string::npos);
  EXPECT_NE(msg(2, 2, 2, "fast").find("--dp-moe-exchange"), std::string::npos);
  EXPECT_NE(msg(0, 1, 1).find("--ep must be >= 1"), std::string::npos);
  EngineArgs a;
  a.prefill_attempt_interval = -1;
  EXPECT_THROW(CheckParallelArgs(a, 1), Error);
  EXPECT_EQ(StepExchange(EngineArgs{}, true), EpExchange::kReplicated);
  a = EngineArgs{};
  a.expert_parallel_size = a.data_parallel_size = 2;
  EXPECT_EQ(StepExchange(a, true), EpExchange::kStatic);
  EXPECT_EQ(StepExchange(a, false), EpExchange::kGeneral);
  a.dp_moe_exchange = "general";
  EXPECT_EQ(StepExchange(a, true), EpExchange::kGeneral);
}

TEST(Scheduler, DecodeOnlyStepSkipsPrefillWork) {
  SchedulerConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 4;
  c.block_size = 4;
  c.num_kv_blocks = 32;
  Scheduler s(c);
  s.Add(1, {3, 4}, 10);
  EXPECT_TRUE(s.HasPrefillWork());
  EXPECT_TRUE(s.Schedule(/*allow_prefill=*/false).empty());  // waiting requests are not admitted
  StepPlan p = s.Schedule(true);
  ASSERT_EQ(p.seqs.size(), 1u);
  s.Update(p, {7});
  EXPECT_FALSE(s.HasPrefillWork());  // decoding now
  s.Add(2, std::vector<int32_t>(9, 5), 3);
  p = s.Schedule(true);  // request 1 decodes, request 2's first chunk (3 tokens: budget 4)
  ASSERT_EQ(p.seqs.size(), 2u);
  s.Update(p, {8, -1});
  EXPECT_TRUE(s.HasPrefillWork());  // request 2 still has 6 prompt tokens
  p = s.Schedule(false);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].id, 1u);
  EXPECT_TRUE(p.decode_shaped);
  s.CheckInvariants();
}

}  // namespace
}  // namespace deepinfer
