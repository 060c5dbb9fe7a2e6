// The V4.1 step workspace (model/v41/workspace.h) and decode threading on the
// tiny checkpoint:
//  * a steady-state decode step makes no heap allocation (counted through the
//    allocator hook of base/alloc_count.h over 100 steps), nor does a
//    steady-state DSpark draft step (the main model's step capturing the
//    drafter's hidden rows, then Dspark::Run seeding and drafting);
//  * the reused workspace and a fresh one per call (the eager path) give the
//    same bits over a mix of prefill, decode and batch sizes;
//  * 1, 2 and 3 threads give the same bits, with every kernel forced to split
//    its work (cpu::SetMinParallelMacs(0)).
// Needs DEEPINFER_TINY_DIR (ctest's fixture sets it).
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/alloc_count.h"
#include "base/parallel.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/state.h"
#include "model/v41/dspark.h"
#include "model/v41/model.h"

namespace deepinfer::v41 {
namespace {

namespace fs = std::filesystem;

std::string TinyDir() {
  const char* t = std::getenv("DEEPINFER_TINY_DIR");
  return t ? t : "";
}

std::unique_ptr<V41Model> LoadTiny(bool reuse) {
  V41Options opt;
  opt.engram_token_map_file = fs::path(DEEPINFER_TEST_DATA) / "golden-tiny-v41" / "engram_token_map.i32";
  opt.reuse_step_workspace = reuse;
  return V41Model::Load(TinyDir(), opt);
}

// B sequences in one dense arena, driven like the serving engine (per-row layout).
struct Batch {
  static constexpr int64_t kMaxTokens = 256;
  StateGeometry geo;
  std::unique_ptr<DenseStateArena> arena;
  std::vector<std::vector<int32_t>> tables;
  std::vector<SequenceStateView> views;
  std::vector<int64_t> pos;
  Batch(const V41Model& m, int B, bool dspark_rings = false) {
    geo = m.geometry(16, false, dspark_rings);
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

// Prefills sequences [0, B) of `bt` with prompts of different lengths in one
// call, then runs `steps` greedy decode steps over the sequences in `active`.
// Returns every logits row of every call, concatenated.
std::vector<float> Drive(V41Model& m, Batch& bt, const std::vector<int>& active, int steps,
                         std::vector<std::vector<int32_t>>* prompts) {
  const int64_t V = m.config().vocab_size;
  std::vector<float> all;
  ForwardOutput out;
  std::vector<int32_t> next(bt.views.size());
  {
    ForwardBatch b;
    b.per_row_layout = true;
    for (int s : active) {
      ForwardSeq q;
      q.tokens = (*prompts)[s].data();
      q.len = static_cast<int64_t>((*prompts)[s].size());
      q.start_pos = bt.pos[s];
      q.state = bt.views[s];
      b.seqs.push_back(q);
    }
    m.Forward(b, &out);
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    for (size_t i = 0; i < active.size(); ++i) {
      const int s = active[i];
      bt.pos[s] += static_cast<int64_t>((*prompts)[s].size());
      next[s] = Argmax(out.logits.data() + i * V, V);
    }
  }
  for (int st = 0; st < steps; ++st) {
    ForwardBatch b;
    b.per_row_layout = true;
    for (int s : active) {
      ForwardSeq q;
      q.tokens = &next[s];
      q.len = 1;
      q.start_pos = bt.pos[s];
      q.state = bt.views[s];
      b.seqs.push_back(q);
    }
    m.Forward(b, &out);
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    for (size_t i = 0; i < active.size(); ++i) {
      const int s = active[i];
      ++bt.pos[s];
      next[s] = Argmax(out.logits.data() + i * V, V);
    }
  }
  return all;
}

// A mixed schedule: 3 prompts prefilled together, decode at batch 3, then a
// fourth prompt alone, decode at batch 4, then decode of one sequence.
std::vector<float> Mixed(V41Model& m) {
  const int64_t V = m.config().vocab_size;
  Batch bt(m, 4);
  std::vector<std::vector<int32_t>> prompts = {Prompt(0, 21, V), Prompt(1, 5, V), Prompt(2, 40, V),
                                               Prompt(3, 13, V)};
  std::vector<float> all = Drive(m, bt, {0, 1, 2}, 6, &prompts);
  std::vector<float> more = Drive(m, bt, {3}, 0, &prompts);
  all.insert(all.end(), more.begin(), more.end());
  // Decode at batch 4, then sequence 1 alone (its "prompt" is its last token).
  for (const std::vector<int>& act : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{1}}) {
    for (int s : act) prompts[s] = {static_cast<int32_t>((bt.pos[s] * 29) % V)};
    more = Drive(m, bt, act, 5, &prompts);
    all.insert(all.end(), more.begin(), more.end());
  }
  return all;
}

// Heap allocations made by `steps` calls of step() (only those calls counted).
template <typename F>
uint64_t AllocationsOver(int steps, F&& step) {
  uint64_t allocs = 0;
  for (int i = 0; i < steps; ++i) {
    const uint64_t a0 = HeapAllocations();
    step();
    allocs += HeapAllocations() - a0;
  }
  return allocs;
}

int64_t Differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], 4) != 0;
  return diff;
}

class V41StepPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TinyDir().empty()) GTEST_FAIL() << "DEEPINFER_TINY_DIR is not set (ctest's fixture sets it)";
    threads_ = NumThreads();
  }
  void TearDown() override {
    SetNumThreads(threads_);
    cpu::SetMinParallelMacs(int64_t{1} << 20);
  }
  int threads_ = 1;
};

TEST_F(V41StepPlan, SteadyStateDecodeMakesNoHeapAllocation) {
  std::unique_ptr<V41Model> m = LoadTiny(/*reuse=*/true);
  const int64_t V = m->config().vocab_size;
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    SetNumThreads(threads);
    constexpr int B = 3;
    Batch bt(*m, B);
    std::vector<std::vector<int32_t>> prompts = {Prompt(0, 30, V), Prompt(1, 9, V), Prompt(2, 17, V)};
    Drive(*m, bt, {0, 1, 2}, 4, &prompts);  // prefill, then warm-up decode steps
    // The caller's batch and output are built once and updated in place, as
    // a serving loop does; only Forward itself is counted.
    ForwardBatch b;
    b.per_row_layout = true;
    std::vector<int32_t> next(B, 1);
    for (int s = 0; s < B; ++s) {
      ForwardSeq q;
      q.tokens = &next[s];
      q.len = 1;
      q.state = bt.views[s];
      b.seqs.push_back(q);
    }
    ForwardOutput out;
    auto step = [&] {
      for (int s = 0; s < B; ++s) b.seqs[s].start_pos = bt.pos[s]++;
      m->Forward(b, &out);
      for (int s = 0; s < B; ++s) next[s] = Argmax(out.logits.data() + s * V, V);
    };
    for (int i = 0; i < 3; ++i) step();  // the step's own buffers reach their size
    EXPECT_EQ(AllocationsOver(100, step), 0u) << "heap allocations over 100 steady-state decode steps";
    ASSERT_EQ(out.logits.size(), static_cast<size_t>(B * V));
  }
}

// The drafter's step as the engine runs it (v41_backend.cc DsparkDrafter): a
// decode step of the main model capturing the DSpark hidden rows, then one
// Dspark::Run that seeds each sequence's rings with its new row and drafts a
// block after it, with the caller's batch and drafts kept between steps.
TEST_F(V41StepPlan, SteadyStateDsparkDraftStepMakesNoHeapAllocation) {
  std::unique_ptr<V41Model> m = LoadTiny(/*reuse=*/true);
  Dspark dspark(*m);
  const int64_t V = m->config().vocab_size, W = dspark.hidden_width();
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    SetNumThreads(threads);
    constexpr int B = 3;
    Batch bt(*m, B, /*dspark_rings=*/true);
    std::vector<std::vector<int32_t>> prompts = {Prompt(0, 30, V), Prompt(1, 9, V), Prompt(2, 17, V)};
    Drive(*m, bt, {0, 1, 2}, 2, &prompts);
    std::vector<float> hidden(static_cast<size_t>(B * W), 0.0f);
    ForwardBatch b;
    b.per_row_layout = true;
    std::vector<int32_t> next(B, 1);
    std::vector<DsparkSeq> ds(B);
    for (int s = 0; s < B; ++s) {
      ForwardSeq q;
      q.tokens = &next[s];
      q.len = 1;
      q.state = bt.views[s];
      q.dspark_hidden = hidden.data() + s * W;
      b.seqs.push_back(q);
      ds[s].main_hidden = hidden.data() + s * W;
      ds[s].n = 1;
      ds[s].state = bt.views[s];
    }
    ForwardOutput out;
    std::vector<DsparkDraft> drafts;
    auto step = [&] {
      for (int s = 0; s < B; ++s) b.seqs[s].start_pos = ds[s].start_pos = bt.pos[s]++;
      m->Forward(b, &out);
      for (int s = 0; s < B; ++s) ds[s].input_token = next[s] = Argmax(out.logits.data() + s * V, V);
      dspark.Run(ds, /*want_logits=*/false, &drafts);
    };
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(AllocationsOver(100, step), 0u) << "heap allocations over 100 steady-state draft steps";
    ASSERT_EQ(drafts.size(), static_cast<size_t>(B));
    for (const DsparkDraft& d : drafts) {
      ASSERT_EQ(static_cast<int>(d.ids.size()), dspark.block_size());
      for (int32_t id : d.ids) EXPECT_TRUE(id >= 0 && id < V) << id;
    }
  }
}

TEST_F(V41StepPlan, ReusedWorkspaceGivesTheEagerBits) {
  std::unique_ptr<V41Model> planned = LoadTiny(/*reuse=*/true);
  std::unique_ptr<V41Model> eager = LoadTiny(/*reuse=*/false);
  const std::vector<float> want = Mixed(*eager);
  const std::vector<float> got = Mixed(*planned);
  ASSERT_GT(want.size(), 0u);
  EXPECT_EQ(Differing(got, want), 0) << "logits differing between the reused and a fresh workspace";
  // And again on the now-warm workspace (nothing carried over from the last calls).
  EXPECT_EQ(Differing(Mixed(*planned), want), 0);
}

TEST_F(V41StepPlan, OneTwoThreeThreadsGiveTheSameBits) {
  std::unique_ptr<V41Model> m = LoadTiny(/*reuse=*/true);
  cpu::SetMinParallelMacs(0);  // every kernel splits its work, however small
  SetNumThreads(1);
  const std::vector<float> want = Mixed(*m);
  for (int threads : {2, 3}) {
    SetNumThreads(threads);
    EXPECT_EQ(Differing(Mixed(*m), want), 0) << threads << " threads";
  }
}

}  // namespace
}  // namespace deepinfer::v41
