// The V4 step workspace (model/v4/workspace.h) and decode threading on the
// tiny V4 checkpoint (ctest fixture fixture_make_tiny_v4, or
// $DEEPINFER_TINY_V4_DIR):
//  * a steady-state decode step makes no heap allocation, the main model's
//    Forward and the MTP drafter's Mtp alike (counted through the allocator
//    hook of base/alloc_count.h over 100 steps);
//  * the reused workspace and a fresh one per call (the eager path) give the
//    same bits over a mix of prefill (both layouts), decode, MTP and batch sizes;
//  * 1, 2 and 3 threads give the same bits, with every kernel forced to split
//    its work (cpu::SetMinParallelMacs(0));
//  * two Forward / Mtp calls at once on one model (the second runs on a
//    fresh workspace) give the bits of the same calls one after the other;
//  * StableTopK (its buffer-free form) equals the stable sort it replaced.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/alloc_count.h"
#include "base/parallel.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/state.h"
#include "model/v4/model.h"
#include "model/v4/ops.h"

namespace deepinfer::v4 {
namespace {

// $DEEPINFER_TINY_V4_DIR, else the checkpoint of the ctest fixture (fixture_make_tiny_v4).
std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_V4_DIR");
  return d && *d ? d : DEEPINFER_TINY_V4_FIXTURE;
}

std::unique_ptr<V4Model> LoadTiny(bool reuse) {
  V4Options opt;
  opt.reuse_step_workspace = reuse;
  return V4Model::Load(TinyDir(), opt);
}

// B sequences in one dense arena, driven like the serving engine (block size 16).
struct Batch {
  static constexpr int64_t kMaxTokens = 320;
  StateGeometry geo;
  std::unique_ptr<DenseStateArena> arena;
  std::vector<std::vector<int32_t>> tables;
  std::vector<SequenceStateView> views;
  std::vector<int64_t> pos;
  Batch(const V4Model& m, int B) {
    geo = m.Geometry(16);
    const int64_t blocks = geo.BlocksForTokens(kMaxTokens);
    arena = std::make_unique<DenseStateArena>(geo, B, blocks * B);
    tables.resize(B);
    for (int s = 0; s < B; ++s) {
      for (int64_t b = 0; b < blocks; ++b) tables[s].push_back(static_cast<int32_t>(s * blocks + b));
      views.push_back(arena->View(s, tables[s].data(), blocks));
    }
    pos.assign(B, 0);
  }
};

std::vector<int32_t> Prompt(int s, int64_t len, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) p[i] = static_cast<int32_t>((7 + 131 * s + 17 * i + i * i) % vocab);
  return p;
}

int32_t Argmax(const float* l, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (l[i] > l[best]) best = i;
  return static_cast<int32_t>(best);
}

// Feeds (*chunks)[s] to every sequence s of `active` in one Forward call
// (per_row_layout as given), then the MTP block on the same positions: its
// tokens are each row's next token (the chunk shifted by one, then the
// argmax of the last logits) and its streams the call's final streams, as the
// MTP drafter does. Appends the logits of both calls to *all and sets
// (*chunks)[s] to the greedy next token.
void Step(V4Model& m, Batch& bt, const std::vector<int>& active, std::vector<std::vector<int32_t>>* chunks,
          bool per_row, std::vector<float>* all) {
  const int64_t V = m.config().vocab_size;
  std::vector<V4Seq> seqs;
  for (int s : active) {
    const std::vector<int32_t>& c = (*chunks)[s];
    seqs.push_back({c.data(), static_cast<int64_t>(c.size()), bt.pos[s], bt.views[s], true, false});
  }
  std::vector<float> logits, streams;
  m.ForwardInto(seqs, per_row, &logits, &streams);
  all->insert(all->end(), logits.begin(), logits.end());
  std::vector<std::vector<int32_t>> next_ids(active.size());
  for (size_t i = 0; i < active.size(); ++i) {
    const std::vector<int32_t>& c = (*chunks)[active[i]];
    next_ids[i].assign(c.begin() + 1, c.end());
    next_ids[i].push_back(Argmax(logits.data() + i * V, V));
    seqs[i].tokens = next_ids[i].data();
  }
  std::vector<float> draft;
  m.MtpInto(seqs, streams.data(), per_row, &draft);
  all->insert(all->end(), draft.begin(), draft.end());
  for (size_t i = 0; i < active.size(); ++i) {
    const int s = active[i];
    bt.pos[s] += static_cast<int64_t>((*chunks)[s].size());
    (*chunks)[s] = {next_ids[i].back()};
  }
}

// A mixed schedule on 5 sequences: 3 prompts prefilled together in the
// reference's prefill layout (one of 140 tokens: a C128 entry and a selective
// C4 indexer), decode at batch 3, a fourth prompt alone, decode at batch 4,
// a 9-token chunk of sequence 2 with a decode row of sequence 0, decode of one
// sequence, then a fifth prompt beside decode rows. Returns every logits row.
std::vector<float> Mixed(V4Model& m) {
  const int64_t V = m.config().vocab_size;
  Batch bt(m, 5);
  std::vector<std::vector<int32_t>> c = {Prompt(0, 21, V), Prompt(1, 5, V), Prompt(2, 140, V), Prompt(3, 13, V),
                                         Prompt(4, 37, V)};
  std::vector<float> all;
  Step(m, bt, {0, 1, 2}, &c, /*per_row=*/false, &all);
  for (int i = 0; i < 6; ++i) Step(m, bt, {0, 1, 2}, &c, true, &all);
  Step(m, bt, {3}, &c, true, &all);
  for (int i = 0; i < 5; ++i) Step(m, bt, {0, 1, 2, 3}, &c, true, &all);
  c[2] = Prompt(5, 9, V);
  Step(m, bt, {0, 2}, &c, true, &all);
  for (int i = 0; i < 5; ++i) Step(m, bt, {1}, &c, true, &all);
  Step(m, bt, {0, 4, 1}, &c, true, &all);
  for (int i = 0; i < 3; ++i) Step(m, bt, {0, 4, 1}, &c, true, &all);
  return all;
}

int64_t Differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], 4) != 0;
  return diff;
}

class V4StepPlan : public ::testing::Test {
 protected:
  void SetUp() override { threads_ = NumThreads(); }
  void TearDown() override {
    SetNumThreads(threads_);
    cpu::SetMinParallelMacs(int64_t{1} << 16);
  }
  int threads_ = 1;
};

TEST_F(V4StepPlan, SteadyStateDecodeMakesNoHeapAllocation) {
  std::unique_ptr<V4Model> m = LoadTiny(/*reuse=*/true);
  const int64_t V = m->config().vocab_size;
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    SetNumThreads(threads);
    constexpr int B = 3;
    Batch bt(*m, B);
    std::vector<std::vector<int32_t>> c = {Prompt(0, 30, V), Prompt(1, 9, V), Prompt(2, 17, V)};
    std::vector<float> unused;
    Step(*m, bt, {0, 1, 2}, &c, true, &unused);  // prefill
    for (int i = 0; i < 4; ++i) Step(*m, bt, {0, 1, 2}, &c, true, &unused);  // warm-up decode steps
    // The caller's batches and outputs are built once and updated in place, as
    // a serving loop does; only Forward and Mtp themselves are counted.
    std::vector<int32_t> next(B), mtp_next(B);
    for (int s = 0; s < B; ++s) next[s] = c[s][0];
    std::vector<V4Seq> main(B), mtp(B);
    for (int s = 0; s < B; ++s) {
      main[s] = {&next[s], 1, 0, bt.views[s], true, false};
      mtp[s] = {&mtp_next[s], 1, 0, bt.views[s], true, false};
    }
    std::vector<float> logits, streams, draft;
    uint64_t fwd_allocs = 0, mtp_allocs = 0;
    auto step = [&](bool count) {
      for (int s = 0; s < B; ++s) main[s].start_pos = mtp[s].start_pos = bt.pos[s]++;
      uint64_t a0 = HeapAllocations();
      m->ForwardInto(main, /*per_row_layout=*/true, &logits, &streams);
      if (count) fwd_allocs += HeapAllocations() - a0;
      for (int s = 0; s < B; ++s) next[s] = mtp_next[s] = Argmax(logits.data() + s * V, V);
      a0 = HeapAllocations();
      m->MtpInto(mtp, streams.data(), /*per_row_layout=*/true, &draft);
      if (count) mtp_allocs += HeapAllocations() - a0;
    };
    for (int i = 0; i < 3; ++i) step(false);  // the step's own buffers reach their size
    for (int i = 0; i < 100; ++i) step(true);
    EXPECT_EQ(fwd_allocs, 0u) << "heap allocations over 100 steady-state decode steps (Forward)";
    EXPECT_EQ(mtp_allocs, 0u) << "heap allocations over 100 steady-state decode steps (Mtp)";
    ASSERT_EQ(logits.size(), static_cast<size_t>(B * V));
    ASSERT_EQ(draft.size(), static_cast<size_t>(B * V));
  }
}

TEST_F(V4StepPlan, ReusedWorkspaceGivesTheEagerBits) {
  std::unique_ptr<V4Model> planned = LoadTiny(/*reuse=*/true);
  std::unique_ptr<V4Model> eager = LoadTiny(/*reuse=*/false);
  const std::vector<float> want = Mixed(*eager);
  const std::vector<float> got = Mixed(*planned);
  ASSERT_GT(want.size(), 0u);
  EXPECT_EQ(Differing(got, want), 0) << "logits differing between the reused and a fresh workspace";
  // And again on the now-warm workspace (nothing carried over from the last calls).
  EXPECT_EQ(Differing(Mixed(*planned), want), 0);
  // The returning form (a fresh output vector per call) gives the same bits.
  Batch bt(*planned, 1);
  const std::vector<int32_t> p = Prompt(0, 21, planned->config().vocab_size);
  const std::vector<float> ret =
      planned->Forward(std::vector<V4Seq>{{p.data(), 21, 0, bt.views[0], true, false}}, /*per_row_layout=*/false);
  EXPECT_EQ(Differing(ret, std::vector<float>(want.begin(), want.begin() + ret.size())), 0);
}

TEST_F(V4StepPlan, OneTwoThreeThreadsGiveTheSameBits) {
  std::unique_ptr<V4Model> m = LoadTiny(/*reuse=*/true);
  cpu::SetMinParallelMacs(0);  // every kernel splits its work, however small
  SetNumThreads(1);
  const std::vector<float> want = Mixed(*m);
  for (int threads : {2, 3}) {
    SetNumThreads(threads);
    EXPECT_EQ(Differing(Mixed(*m), want), 0) << threads << " threads";
  }
}

// One sequence: a prompt, then `steps` greedy decode steps (Forward + Mtp each).
std::vector<float> Single(V4Model& m, int which, int steps) {
  const int64_t V = m.config().vocab_size;
  Batch bt(m, 1);
  std::vector<std::vector<int32_t>> c = {Prompt(which, 25 + 11 * which, V)};
  std::vector<float> all;
  for (int i = 0; i <= steps; ++i) Step(m, bt, {0}, &c, true, &all);
  return all;
}

TEST_F(V4StepPlan, ConcurrentCallsGiveTheSequentialBits) {
  std::unique_ptr<V4Model> m = LoadTiny(/*reuse=*/true);
  SetNumThreads(1);
  const std::vector<float> want0 = Single(*m, 0, 12), want1 = Single(*m, 1, 12);
  std::vector<float> got0, got1;
  std::thread t([&] {
    SetNumThreads(1);
    got1 = Single(*m, 1, 12);
  });
  got0 = Single(*m, 0, 12);
  t.join();
  EXPECT_EQ(Differing(got0, want0), 0);
  EXPECT_EQ(Differing(got1, want1), 0);
}

TEST(V4StableTopK, EqualsTheStableSort) {
  std::mt19937 rng(11);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + trial % 70, k = 1 + (trial * 7) % n;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      const int r = static_cast<int>(rng() % 8);  // many ties, ±0 and −∞
      x = r == 0 ? ninf : r == 1 ? -0.0f : r == 2 ? 0.0f : static_cast<float>(static_cast<int>(rng() % 5) - 2);
    }
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
    std::vector<int64_t> got(static_cast<size_t>(k));
    StableTopK(v.data(), n, k, got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), order.begin())) << "n " << n << " k " << k;
  }
  // With a NaN the stable sort itself runs.
  std::vector<float> v = {1.0f, std::nanf(""), 3.0f, 3.0f, -1.0f};
  std::vector<int64_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  std::vector<int64_t> got(v.size());
  StableTopK(v.data(), static_cast<int64_t>(v.size()), static_cast<int64_t>(v.size()), got.data());
  EXPECT_EQ(got, order);
}

}  // namespace
}  // namespace deepinfer::v4
