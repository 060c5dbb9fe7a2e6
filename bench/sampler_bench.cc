// Sampler cost per row on DeepSeek's vocabulary (129280 ids): greedy fast
// path, plain temperature sampling, top_p, top_k, penalties + bitmask, and
// raw logprobs. Logits resemble an LM head's: a few high values, a long tail.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "sampling/sampler.h"

namespace deepinfer {
namespace {

constexpr int64_t kVocab = 129280;

std::vector<float> LmLikeLogits() {
  std::vector<float> x(kVocab);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (auto& v : x) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const double u = (s >> 11) * (1.0 / 9007199254740992.0);
    v = static_cast<float>(-8.0 + 6.0 * std::sqrt(-2.0 * std::log(1.0 - u)) * 0.7);  // long right tail
  }
  for (int i = 0; i < 20; ++i) x[(i * 7919) % kVocab] = 18.0f - i * 0.4f;
  return x;
}

void Run(benchmark::State& bs, const SamplingParams& p, LogprobsMode mode = LogprobsMode::kRawLogprobs,
         bool mask = false) {
  const std::vector<float> x = LmLikeLogits();
  Sampler sampler(SamplerConfig{kVocab, {1}, mode});
  std::vector<int32_t> prompt(2000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 104729) % kVocab);
  SamplingState st(p, 7, kVocab, prompt);
  if (mask) {
    std::vector<uint32_t> m((kVocab + 31) / 32, 0xFFFF0FFFu);
    st.SetTokenBitmask(m);
  }
  for (auto _ : bs) {
    const SampleResult r = sampler.Sample(x, st);
    benchmark::DoNotOptimize(r.token_id);
    st.Accept(r.token_id);
  }
}

void BM_Greedy(benchmark::State& s) {
  SamplingParams p;
  p.temperature = 0;
  Run(s, p);
}
void BM_Temperature(benchmark::State& s) {
  SamplingParams p;
  p.temperature = 0.7;
  Run(s, p);
}
void BM_TopP(benchmark::State& s) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.95;
  Run(s, p);
}
void BM_TopK(benchmark::State& s) {
  SamplingParams p;
  p.top_k = 50;
  Run(s, p);
}
void BM_PenaltiesAndBitmask(benchmark::State& s) {
  SamplingParams p;
  p.repetition_penalty = 1.1;
  p.frequency_penalty = 0.2;
  p.presence_penalty = 0.2;
  Run(s, p, LogprobsMode::kRawLogprobs, true);
}
void BM_RawLogprobs5(benchmark::State& s) {
  SamplingParams p;
  p.logprobs = 5;
  Run(s, p);
}

BENCHMARK(BM_Greedy);
BENCHMARK(BM_Temperature);
BENCHMARK(BM_TopP);
BENCHMARK(BM_TopK);
BENCHMARK(BM_PenaltiesAndBitmask);
BENCHMARK(BM_RawLogprobs5);

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();
