// Speed of the V4.1 forward pass (scalar reference ops) on the tiny checkpoint:
// time per prefill token and per decode step. Needs DEEPINFER_TINY_DIR (the
// output of `deepinfer make-tiny --arch deepseek_v41 DIR`) and the Engram
// token map from tests/data/golden-tiny-v41.
//
//   DEEPINFER_TINY_DIR=/tmp/tiny-v41 OMP_NUM_THREADS=1 build/bench/v41_forward_bench
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "model/state.h"
#include "model/v41/model.h"

namespace deepinfer::v41 {
namespace {

V41Model* Model() {
  static std::unique_ptr<V41Model> m = [] {
    std::unique_ptr<V41Model> r;
    const char* dir = std::getenv("DEEPINFER_TINY_DIR");
    if (!dir || !*dir) return r;
    V41Options opt;
    opt.engram_token_map_file = std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/golden-tiny-v41/engram_token_map.i32";
    return V41Model::Load(dir, opt);
  }();
  return m.get();
}

std::vector<int32_t> Tokens(int64_t n) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(3 + (i * 7919) % 127997);
  return t;
}

struct SeqState {
  StateGeometry geo;
  std::unique_ptr<DenseStateArena> arena;
  std::vector<int32_t> table;
  SequenceStateView view;
  explicit SeqState(V41Model* m, int64_t max_tokens) : geo(m->geometry(16)) {
    const int64_t blocks = geo.BlocksForTokens(max_tokens);
    arena = std::make_unique<DenseStateArena>(geo, 1, blocks);
    for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>(b));
    view = arena->View(0, table.data(), blocks);
  }
};

void Call(V41Model* m, SeqState& s, const int32_t* t, int64_t len, int64_t start, ForwardOutput* out) {
  ForwardBatch b;
  ForwardSeq q;
  q.tokens = t;
  q.len = len;
  q.start_pos = start;
  q.state = s.view;
  b.seqs.push_back(q);
  m->Forward(b, out);
}

// Whole-prompt prefill of state.range(0) tokens (logits of the last one).
void BM_Prefill(benchmark::State& state) {
  V41Model* m = Model();
  if (!m) {
    state.SkipWithError("DEEPINFER_TINY_DIR is not set");
    return;
  }
  const int64_t n = state.range(0);
  const auto toks = Tokens(n);
  SeqState s(m, n);
  ForwardOutput out;
  for (auto _ : state) Call(m, s, toks.data(), n, 0, &out);
  // items_per_second = prefill tokens per second; its inverse is the time per token.
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Prefill)->Arg(33)->Arg(300)->Unit(benchmark::kMillisecond);

// One decode step after a prefill of state.range(0) tokens (logits included).
void BM_DecodeStep(benchmark::State& state) {
  V41Model* m = Model();
  if (!m) {
    state.SkipWithError("DEEPINFER_TINY_DIR is not set");
    return;
  }
  const int64_t n = state.range(0);
  const auto toks = Tokens(n + 1);
  SeqState s(m, n + 1);
  ForwardOutput out;
  Call(m, s, toks.data(), n, 0, &out);
  // Re-running the step at the same position rewrites the same state rows, so
  // every iteration is the same decode step.
  for (auto _ : state) Call(m, s, toks.data() + n, 1, n, &out);
}
BENCHMARK(BM_DecodeStep)->Arg(33)->Arg(300)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace deepinfer::v41

BENCHMARK_MAIN();
