// Tests for cache/block_manager and scheduler/scheduler: plain-data metadata
// with random admit / grow / finish / preempt / abort sequences and invariant
// checks after every step.
#include "scheduler/scheduler.h"

#include <map>
#include <random>

#include <gtest/gtest.h>

#include "base/error.h"
#include "cache/block_manager.h"

namespace deepinfer {
namespace {

TEST(BlockManager, PlanCommitRollbackAndRefcounts) {
  BlockManager bm(8, 2);
  EXPECT_EQ(bm.scratch_block(), 8);
  EXPECT_EQ(bm.scratch_slot(), 2);
  auto plan = bm.PlanBlocks(3);
  ASSERT_TRUE(plan);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  bm.Rollback(*plan);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  bm.CheckInvariants();
  auto plan2 = bm.PlanBlocks(3);
  ASSERT_TRUE(plan2);
  EXPECT_EQ(plan2->blocks, plan->blocks);  // rollback restores the free-list order
  bm.Commit(*plan2);
  EXPECT_THROW(bm.Commit(*plan2), Error);
  for (int32_t b : plan2->blocks) EXPECT_EQ(bm.refcount(b), 1);
  bm.IncRef(plan2->blocks[0]);
  bm.Free(plan2->blocks);
  EXPECT_EQ(bm.num_used_blocks(), 1);  // the shared block survives
  bm.Free({plan2->blocks[0]});
  EXPECT_EQ(bm.num_used_blocks(), 0);
  EXPECT_THROW(bm.Free({plan2->blocks[0]}), Error);  // double free
  EXPECT_FALSE(bm.PlanBlocks(9).has_value());
  EXPECT_EQ(bm.peak_used_blocks(), 3);
  bm.CheckInvariants();
  auto s0 = bm.AllocateSlot(), s1 = bm.AllocateSlot();
  ASSERT_TRUE(s0 && s1);
  EXPECT_FALSE(bm.AllocateSlot().has_value());
  bm.FreeSlot(*s0);
  EXPECT_THROW(bm.FreeSlot(*s0), Error);
  EXPECT_THROW(bm.FreeSlot(bm.scratch_slot()), Error);  // scratch is never owned
}

SchedulerConfig Config(int max_seqs, int64_t budget, int64_t blocks, int64_t block_size = 4) {
  SchedulerConfig c;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = budget;
  c.max_model_len = 512;
  c.block_size = block_size;
  c.num_kv_blocks = blocks;
  return c;
}

TEST(Scheduler, RejectsBadRequests) {
  Scheduler s(Config(2, 16, 8));
  EXPECT_THROW(s.Add(1, {}, 4), Error);
  EXPECT_THROW(s.Add(2, std::vector<int32_t>(512, 5), 4), Error);  // prompt == max_model_len
  try {
    s.Add(3, std::vector<int32_t>(40, 5), 10);  // needs ceil(49/4) = 13 blocks > 8
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 13 KV blocks"), std::string::npos) << e.what();
  }
  SchedulerConfig bad = Config(0, 16, 8);
  EXPECT_THROW(Scheduler{bad}, Error);
  // Buckets past the step limits would pad every step past them.
  auto message = [](const SchedulerConfig& c) {
    try {
      Scheduler{c};
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SchedulerConfig big_prefill = Config(8, 64, 256);
  big_prefill.prefill_token_buckets = {16, 100000};
  EXPECT_NE(message(big_prefill).find("--prefill-token-buckets): bucket 100000 is larger than max_num_batched_tokens 64"),
            std::string::npos)
      << message(big_prefill);
  SchedulerConfig big_decode = Config(8, 64, 256);
  big_decode.decode_batch_buckets = {1, 2147483647};
  EXPECT_NE(message(big_decode).find("--decode-batch-buckets): bucket 2147483647 is larger than max_num_seqs 8"),
            std::string::npos)
      << message(big_decode);
  SchedulerConfig unsorted = Config(8, 64, 256);
  unsorted.decode_batch_buckets = {4, 2};
  EXPECT_NE(message(unsorted).find("strictly increasing"), std::string::npos) << message(unsorted);
}

TEST(Scheduler, ChunkedPrefillThenDecode) {
  Scheduler s(Config(4, 8, 64));
  s.Add(1, std::vector<int32_t>(20, 7), 3);
  auto p = s.Schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].len, 8);
  EXPECT_FALSE(p.seqs[0].sample);
  EXPECT_TRUE(p.seqs[0].fresh_slot);
  s.Update(p, {0});
  p = s.Schedule();
  EXPECT_EQ(p.seqs[0].start, 8);
  EXPECT_EQ(p.seqs[0].len, 8);
  s.Update(p, {0});
  p = s.Schedule();
  EXPECT_EQ(p.seqs[0].len, 4);
  EXPECT_TRUE(p.seqs[0].sample);
  s.Update(p, {100});
  p = s.Schedule();
  EXPECT_EQ(p.seqs[0].start, 20);
  EXPECT_EQ(p.seqs[0].len, 1);
  EXPECT_TRUE(p.decode_shaped);
  s.Update(p, {101});
  p = s.Schedule();
  s.Update(p, {102});
  const SeqState* st = s.Get(1);
  EXPECT_EQ(st->status, RequestStatus::kFinished);
  EXPECT_EQ(st->finish_reason, SeqFinishReason::kLength);
  EXPECT_EQ(std::vector<int32_t>(st->token_ids.end() - 3, st->token_ids.end()), (std::vector<int32_t>{100, 101, 102}));
  EXPECT_EQ(s.blocks().num_used_blocks(), 0);
  s.CheckInvariants();
}

TEST(Scheduler, DecodesAreNotStarvedByLongPrefill) {
  Scheduler s(Config(4, 8, 256));
  s.Add(1, std::vector<int32_t>(2, 7), 50);
  auto p = s.Schedule();
  s.Update(p, {1});
  s.Add(2, std::vector<int32_t>(100, 7), 5);  // long prompt arrives while 1 decodes
  for (int step = 0; step < 5; ++step) {
    p = s.Schedule();
    ASSERT_GE(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].id, 1u);  // the decode is scheduled every step
    EXPECT_EQ(p.seqs[0].len, 1);
    EXPECT_LE(p.num_tokens, 8);
    std::vector<int32_t> toks(p.seqs.size(), 3);
    s.Update(p, toks);
  }
}

TEST(Scheduler, PaddingBuckets) {
  SchedulerConfig c = Config(8, 64, 256);
  c.prefill_token_buckets = {16, 32, 64};
  c.decode_batch_buckets = {1, 2, 4, 8};
  Scheduler s(c);
  s.Add(1, std::vector<int32_t>(20, 7), 4);
  s.Add(2, std::vector<int32_t>(1, 7), 4);
  auto p = s.Schedule();
  EXPECT_EQ(p.num_tokens, 21);
  EXPECT_FALSE(p.decode_shaped);
  EXPECT_EQ(p.num_padding_tokens, 11);  // → bucket 32
  s.Update(p, {5, 5});
  p = s.Schedule();
  EXPECT_TRUE(p.decode_shaped);
  EXPECT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.num_padding_seqs, 0);
  s.Add(3, std::vector<int32_t>(1, 7), 4);  // one-token prompt runs decode-shaped
  s.Update(p, {5, 5});
  p = s.Schedule();
  EXPECT_TRUE(p.decode_shaped);
  EXPECT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(p.num_padding_seqs, 1);  // → bucket 4
}

// Simulated model: the next token is a hash of the whole sequence so far, so a
// request's output depends on every token it has seen (as the real model's does).
int32_t NextToken(const std::vector<int32_t>& toks) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : toks) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % 1000);
}

struct SimResult {
  std::map<uint64_t, std::vector<int32_t>> outputs;
  int preemptions = 0;
};

SimResult Simulate(const SchedulerConfig& cfg, uint32_t seed, int n_requests, bool random_aborts) {
  std::mt19937 rng(seed);
  Scheduler s(cfg);
  SimResult r;
  std::map<uint64_t, std::vector<int32_t>> prompts;
  std::uniform_int_distribution<int> plen(1, 40), mt(1, 30), tok(3, 999);
  for (int i = 0; i < n_requests; ++i) {
    std::vector<int32_t> p(plen(rng));
    for (auto& t : p) t = tok(rng);
    prompts[i] = p;
  }
  std::uniform_int_distribution<int> coin(0, 99);
  uint64_t next = 0;
  int guard = 0;
  while ((next < prompts.size() || s.has_unfinished()) && ++guard < 100000) {
    // Requests arrive over time.
    while (next < prompts.size() && coin(rng) < 30) {
      s.Add(next, prompts[next], 1 + (next * 7) % 30);
      ++next;
    }
    auto plan = s.Schedule();
    r.preemptions += static_cast<int>(plan.preempted.size());
    s.CheckInvariants();
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs) {
      const SeqState* st = s.Get(q.id);
      // The "model" sees exactly the tokens [0, start+len) of this request.
      std::vector<int32_t> seen(st->token_ids.begin(), st->token_ids.begin() + q.start + q.len);
      EXPECT_EQ(q.start, st->num_computed_tokens);
      sampled.push_back(NextToken(seen));
    }
    s.Update(plan, sampled);
    // Stop on a "stop token" (value < 20) like an EOS.
    for (const auto& q : plan.seqs) {
      const SeqState* st = s.Get(q.id);
      if (st->status == RequestStatus::kRunning && q.sample && st->token_ids.back() < 20) s.Finish(q.id, SeqFinishReason::kStop);
    }
    if (random_aborts && coin(rng) < 3 && next > 0) s.Abort(rng() % next);
    s.CheckInvariants();
  }
  EXPECT_LT(guard, 100000) << "scheduler did not drain";
  for (uint64_t id = 0; id < next; ++id) {
    const SeqState* st = s.Get(id);
    EXPECT_EQ(st->status, RequestStatus::kFinished);
    if (st->finish_reason != SeqFinishReason::kAbort)
      r.outputs[id] = std::vector<int32_t>(st->token_ids.begin() + st->num_prompt_tokens, st->token_ids.end());
  }
  EXPECT_EQ(s.blocks().num_used_blocks(), 0);
  EXPECT_EQ(s.blocks().num_used_slots(), 0);
  return r;
}

TEST(Scheduler, RandomWorkloadsKeepInvariantsAndOutputs) {
  // Reference: a pool large enough for everything and a big budget.
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SimResult big = Simulate(Config(8, 256, 4096), seed, 40, false);
    // Tiny pool and small budgets: preemption and chunking must not change any output.
    for (int64_t budget : {3, 16, 64}) {
      SimResult small = Simulate(Config(6, budget, 20, 4), seed, 40, false);
      EXPECT_EQ(small.outputs, big.outputs) << "seed " << seed << " budget " << budget;
      if (budget == 64) {
        EXPECT_GT(small.preemptions, 0) << "pool of 20 blocks should force preemption";
      }
    }
  }
}

TEST(Scheduler, RandomAbortsNeverLeak) {
  for (uint32_t seed = 10; seed < 16; ++seed) Simulate(Config(4, 32, 24, 4), seed, 30, true);
}

}  // namespace
}  // namespace deepinfer
