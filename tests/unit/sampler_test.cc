// Tests for sampling/sampler.h: statistical correctness (chi-square against
// the exact target distribution, computed here in long double from the
// definitions), the fixed-point algorithm against a plain re-implementation,
// edge cases, greedy/tie rules and the bitmask on a 129280-id vocabulary,
// NaN/Inf isolation, batch/thread invariance, and logprobs.
#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "base/parallel.h"
#include "sampling/philox.h"

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------- statistics
// Regularized upper incomplete gamma Q(a, x): power series for P when
// x < a + 1, Lentz's continued fraction for Q otherwise.
double GammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefactor = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double ap = a, term = 1.0 / a, sum = term;
    for (int n = 0; n < 10000; ++n) {
      ap += 1.0;
      term *= x / ap;
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
    }
    return 1.0 - sum * std::exp(log_prefactor);
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1.0) < 1e-16) break;
  }
  return std::exp(log_prefactor) * h;
}
double ChiSquarePValue(double chi2, int dof) { return GammaQ(dof / 2.0, chi2 / 2.0); }

TEST(ChiSquare, PValuesMatchTables) {
  // Critical values at p = 0.05 / 0.001 from standard chi-square tables.
  EXPECT_NEAR(ChiSquarePValue(3.841459, 1), 0.05, 1e-6);
  EXPECT_NEAR(ChiSquarePValue(18.307038, 10), 0.05, 1e-6);
  EXPECT_NEAR(ChiSquarePValue(29.588298, 10), 0.001, 1e-7);
  EXPECT_NEAR(ChiSquarePValue(124.342113, 100), 0.05, 1e-6);
  // dof 2: Q(1, x/2) = exp(−x/2) exactly.
  for (double x : {0.5, 2.0, 7.0, 30.0}) EXPECT_NEAR(ChiSquarePValue(x, 2), std::exp(-x / 2), 1e-12);
}

// Chi-square p-value of `counts` (n draws) against probabilities p. Ids with
// p = 0 must never occur (checked exactly). Cells with expected count < 5 are
// pooled.
double ChiSquareP(const std::vector<int64_t>& counts, const std::vector<long double>& p, int64_t n,
                  int* dof_out = nullptr) {
  EXPECT_EQ(counts.size(), p.size());
  double chi2 = 0.0;
  int cells = 0;
  long double pooled_e = 0;
  int64_t pooled_o = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " has probability 0 but was drawn";
      continue;
    }
    const long double e = p[i] * n;
    if (e < 5) {
      pooled_e += e;
      pooled_o += counts[i];
      continue;
    }
    chi2 += static_cast<double>((counts[i] - e) * (counts[i] - e) / e);
    ++cells;
  }
  if (pooled_e > 0) {
    chi2 += static_cast<double>((pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e);
    ++cells;
  }
  const int dof = cells - 1;
  if (dof_out) *dof_out = dof;
  EXPECT_GE(dof, 1);
  return ChiSquarePValue(chi2, dof);
}

// The target distribution from the definitions in sampler.h, in long double:
// p ∝ exp((x − max)/T) over x > −inf; min_p: p_i >= min_p · p_max; top_k: x_i
// >= k-th largest x; top_p on the remainder: keep i iff the mass of strictly
// more probable kept ids is < top_p. `margin_ok` is cleared when a top_p
// decision is within 1e-9 of its threshold (the test would be ill-posed).
std::vector<long double> TargetDistribution(const std::vector<float>& x, double T, int64_t top_k,
                                            double top_p, double min_p, bool* margin_ok = nullptr) {
  const size_t V = x.size();
  long double m = -INFINITY;
  for (float v : x) m = std::max<long double>(m, v);
  std::vector<long double> w(V, 0);
  std::vector<char> keep(V, 0);
  for (size_t i = 0; i < V; ++i)
    if (x[i] != kNegInf) {
      keep[i] = 1;
      w[i] = std::exp(((long double)x[i] - m) / (long double)T);
    }
  if (min_p > 0)
    for (size_t i = 0; i < V; ++i)
      if (keep[i] && w[i] < (long double)min_p) keep[i] = 0;
  size_t n_keep = std::count(keep.begin(), keep.end(), 1);
  if (top_k > 1 && static_cast<size_t>(top_k) < n_keep) {
    std::vector<float> vals;
    for (size_t i = 0; i < V; ++i)
      if (keep[i]) vals.push_back(x[i]);
    std::sort(vals.begin(), vals.end(), std::greater<float>());
    const float t = vals[top_k - 1];
    for (size_t i = 0; i < V; ++i)
      if (keep[i] && x[i] < t) keep[i] = 0;
  }
  if (top_p < 1) {
    long double Z = 0;
    for (size_t i = 0; i < V; ++i)
      if (keep[i]) Z += w[i];
    std::vector<char> keep2 = keep;
    for (size_t i = 0; i < V; ++i) {
      if (!keep[i]) continue;
      long double above = 0;
      for (size_t j = 0; j < V; ++j)
        if (keep[j] && w[j] > w[i]) above += w[j];
      above /= Z;
      if (margin_ok && std::fabs((double)(above - top_p)) < 1e-9) *margin_ok = false;
      keep2[i] = above < top_p;
    }
    keep = keep2;
  }
  long double Z = 0;
  for (size_t i = 0; i < V; ++i)
    if (keep[i]) Z += w[i];
  std::vector<long double> p(V, 0);
  for (size_t i = 0; i < V; ++i)
    if (keep[i]) p[i] = w[i] / Z;
  return p;
}

std::vector<float> SpreadLogits(int V) {
  std::vector<float> x(V);
  for (int i = 0; i < V; ++i) x[i] = static_cast<float>(2.5 * std::sin(i * 1.3) + 0.05 * i);
  return x;
}

// n draws from one state at consecutive output positions.
std::vector<int64_t> DrawCounts(const Sampler& sampler, const std::vector<float>& logits,
                                const SamplingParams& params, int64_t seed, int64_t n) {
  SamplingState st(params, seed, static_cast<int64_t>(logits.size()));
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = sampler.Sample(logits, st).token_id;
    ++counts[t];
    st.Accept(t);
  }
  return counts;
}

constexpr int64_t kDraws = 100000;

struct ChiCase {
  const char* name;
  double temperature;
  int64_t top_k;
  double top_p;
  double min_p;
};

TEST(SamplerStatistics, ChiSquareAgainstExactDistribution) {
  const int V = 32;
  const std::vector<float> x = SpreadLogits(V);
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  const ChiCase cases[] = {
      {"temperature 1", 1.0, -1, 1.0, 0.0},
      {"temperature 0.6", 0.6, -1, 1.0, 0.0},
      {"temperature 2.5", 2.5, 0, 1.0, 0.0},
      {"top_k 6 at T 1.3", 1.3, 6, 1.0, 0.0},
      {"top_p 0.7", 1.0, -1, 0.7, 0.0},
      {"min_p 0.08", 1.0, -1, 1.0, 0.08},
      {"combined", 0.9, 12, 0.85, 0.03},
  };
  int64_t seed = 1000;
  for (const ChiCase& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    bool margin_ok = true;
    const auto target = TargetDistribution(x, c.temperature, c.top_k, c.top_p, c.min_p, &margin_ok);
    ASSERT_TRUE(margin_ok) << c.name;
    const auto counts = DrawCounts(sampler, x, p, seed++, kDraws);
    int dof = 0;
    const double pv = ChiSquareP(counts, target, kDraws, &dof);
    EXPECT_GT(pv, 0.001) << c.name << " (dof " << dof << ")";
    // The filters really removed something where they should.
    const int support = static_cast<int>(std::count_if(target.begin(), target.end(),
                                                       [](long double v) { return v > 0; }));
    if (c.top_k > 1 || c.top_p < 1 || c.min_p > 0) {
      EXPECT_LT(support, V) << c.name;
    }
  }
}

TEST(SamplerStatistics, NegativeControlDetectsAFivePercentTemperatureError) {
  // The same kind of sample tested against a slightly wrong target must fail:
  // shows that the chi-square test above has power.
  const int V = 32;
  const std::vector<float> x = SpreadLogits(V);
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  const auto counts = DrawCounts(sampler, x, p, 77, kDraws);
  EXPECT_GT(ChiSquareP(counts, TargetDistribution(x, 1.0, -1, 1.0, 0.0), kDraws), 0.001);
  EXPECT_LT(ChiSquareP(counts, TargetDistribution(x, 1.05, -1, 1.0, 0.0), kDraws), 1e-6);
}

TEST(SamplerStatistics, ChiSquareWithPenaltiesAndLogitBias) {
  const int V = 32;
  const std::vector<float> raw = SpreadLogits(V);
  SamplingParams p;
  p.temperature = 0.8;
  p.repetition_penalty = 1.4;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.7;
  p.logit_bias = {{3, 2.0}, {7, -1.5}, {20, 0.25}};
  const std::vector<int32_t> prompt = {1, 2, 3, 30, 30};
  const std::vector<int32_t> history = {5, 5, 5, 9, 20, 3, 31};
  // Expected processed logits, from vLLM's formulas in fp32.
  std::vector<float> x = raw;
  for (const auto& [id, b] : p.logit_bias) x[id] = x[id] + static_cast<float>(b);
  std::vector<int> count(V, 0);
  std::vector<char> seen(V, 0);
  for (int32_t t : prompt) seen[t] = 1;
  for (int32_t t : history) seen[t] = 1, ++count[t];
  const float r = 1.4f, f = 0.5f, pp = 0.7f;
  for (int i = 0; i < V; ++i) {
    if (seen[i]) x[i] = x[i] > 0 ? x[i] / r : x[i] * r;
    if (count[i] > 0) {
      x[i] = x[i] - f * static_cast<float>(count[i]);
      x[i] = x[i] - pp;
    }
  }
  const auto target = TargetDistribution(x, p.temperature, -1, 1.0, 0.0);
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  // Keep the history fixed: one fresh state per draw, seeds 0..n−1.
  std::vector<int64_t> counts(V, 0);
  for (int64_t s = 0; s < kDraws; ++s) {
    SamplingState st(p, s, V, prompt);
    for (int32_t t : history) st.Accept(t);
    ++counts[sampler.Sample(raw, st).token_id];
  }
  EXPECT_GT(ChiSquareP(counts, target, kDraws), 0.001);
  // And the penalties moved the distribution: the unpenalised target fails.
  EXPECT_LT(ChiSquareP(counts, TargetDistribution(raw, p.temperature, -1, 1.0, 0.0), kDraws), 1e-6);
}

TEST(SamplerStatistics, ChiSquareAcrossManyBlocks) {
  // 40 candidates spread over 3 blocks of 1024 ids (two-level draw; the last
  // block partial), the rest −inf. 5·10^4 draws keep this test under a second.
  const int V = 2900;
  const int64_t kBlockDraws = 50000;
  std::vector<float> x(V, kNegInf);
  for (int j = 0; j < 40; ++j) x[5 + 73 * j] = static_cast<float>(1.5 * std::cos(j * 0.7));
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  p.top_p = 0.95;
  bool margin_ok = true;
  const auto target = TargetDistribution(x, 1.0, -1, 0.95, 0.0, &margin_ok);
  ASSERT_TRUE(margin_ok);
  const auto counts = DrawCounts(sampler, x, p, 4242, kBlockDraws);
  EXPECT_GT(ChiSquareP(counts, target, kBlockDraws), 0.001);
  // Mass in each block matches too (blocks 0, 1, 2).
  for (int b = 0; b < 3; ++b) {
    long double pe = 0;
    int64_t o = 0;
    for (int i = b * 1024; i < std::min(V, (b + 1) * 1024); ++i) pe += target[i], o += counts[i];
    EXPECT_GT(pe, 0.2) << "block " << b;
    EXPECT_NEAR(static_cast<double>(o), static_cast<double>(pe * kBlockDraws),
                5 * std::sqrt(static_cast<double>(pe * kBlockDraws)))
        << "block " << b;
  }
}

// ---------------------------------------------------------------- algorithm
// A plain single-level re-implementation of the documented fixed-point
// algorithm (sampler.h), using DeterministicExp: the sampler must pick the
// same id for every draw.
int32_t DocumentedDraw(const std::vector<float>& x, const SamplingParams& p, int64_t seed,
                       uint64_t pos) {
  using u128 = unsigned __int128;
  const int64_t V = static_cast<int64_t>(x.size());
  int S = 63;
  for (uint64_t v = static_cast<uint64_t>(V); v; v >>= 1) --S;
  float m = kNegInf;
  for (float v : x) m = std::max(m, v);
  std::vector<uint64_t> q(V, 0);
  std::vector<char> keep(V, 0);
  for (int64_t i = 0; i < V; ++i)
    if (x[i] != kNegInf) {
      keep[i] = 1;
      q[i] = static_cast<uint64_t>(
          DeterministicExp(((double)x[i] - (double)m) / p.temperature) * std::ldexp(1.0, S));
    }
  const uint64_t qmax = uint64_t{1} << S;
  if (p.min_p > 0) {
    const uint64_t tm = static_cast<uint64_t>(std::llround(p.min_p * 4294967296.0));
    for (int64_t i = 0; i < V; ++i)
      if (keep[i] && (u128(q[i]) << 32) < u128(tm) * qmax) keep[i] = 0;
  }
  if (p.top_k > 1) {
    std::vector<float> v;
    for (int64_t i = 0; i < V; ++i)
      if (keep[i]) v.push_back(x[i]);
    if (p.top_k < static_cast<int64_t>(v.size())) {
      std::sort(v.begin(), v.end(), std::greater<float>());
      for (int64_t i = 0; i < V; ++i)
        if (keep[i] && x[i] < v[p.top_k - 1]) keep[i] = 0;
    }
  }
  if (p.top_p < 1) {
    const uint64_t t = std::max<uint64_t>(1, std::llround(p.top_p * 4294967296.0));
    u128 Q = 0;
    for (int64_t i = 0; i < V; ++i)
      if (keep[i]) Q += q[i];
    // above(v) = Σ of kept weights strictly greater than v, from a sorted copy.
    std::vector<uint64_t> w;
    for (int64_t i = 0; i < V; ++i)
      if (keep[i]) w.push_back(q[i]);
    std::sort(w.begin(), w.end(), std::greater<uint64_t>());
    std::vector<u128> prefix(w.size() + 1, 0);
    for (size_t j = 0; j < w.size(); ++j) prefix[j + 1] = prefix[j] + w[j];
    for (int64_t i = 0; i < V; ++i) {
      if (!keep[i]) continue;
      const size_t n_greater = static_cast<size_t>(
          std::lower_bound(w.begin(), w.end(), q[i], std::greater<uint64_t>()) - w.begin());
      keep[i] = (prefix[n_greater] << 32) < u128(t) * Q;
    }
  }
  uint64_t Q = 0;
  for (int64_t i = 0; i < V; ++i)
    if (keep[i]) Q += q[i];
  uint64_t r = static_cast<uint64_t>((u128(PhiloxUniform64(seed, pos)) * Q) >> 64);
  for (int64_t i = 0; i < V; ++i) {
    const uint64_t qi = keep[i] ? q[i] : 0;
    if (r < qi) return static_cast<int32_t>(i);
    r -= qi;
  }
  return -1;
}

TEST(SamplerAlgorithm, MatchesThePlainDocumentedAlgorithm) {
  const int V = 2100;  // three blocks, the last one partial
  std::vector<float> x(V);
  for (int i = 0; i < V; ++i) x[i] = static_cast<float>(3.0 * std::sin(i * 0.37) * std::cos(i * 0.011));
  for (int i = 0; i < V; i += 7) x[i] = kNegInf;
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  const ChiCase cases[] = {{"plain", 1.0, -1, 1.0, 0.0},
                           {"hot top_p", 1.7, -1, 0.6, 0.0},
                           {"top_k", 0.8, 50, 1.0, 0.0},
                           {"all filters", 1.2, 300, 0.9, 0.01}};
  for (const ChiCase& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    SamplingState st(p, 99, V);
    for (int i = 0; i < 120; ++i) {
      const int32_t got = sampler.Sample(x, st).token_id;
      ASSERT_EQ(got, DocumentedDraw(x, p, 99, static_cast<uint64_t>(i))) << c.name << " draw " << i;
      st.Accept(got);
    }
  }
  // Heavily tied logits (7 distinct values): top_p groups of equal weight.
  std::vector<float> tied(V);
  for (int i = 0; i < V; ++i) tied[i] = static_cast<float>(std::round(3.0 * std::sin(i * 0.37)) * 0.5);
  for (double top_p : {0.05, 0.3, 0.5, 0.93}) {
    SamplingParams p;
    p.top_p = top_p;
    SamplingState st(p, 5, V);
    std::vector<char> seen(V, 0);
    for (int i = 0; i < 60; ++i) {
      const int32_t got = sampler.Sample(tied, st).token_id;
      ASSERT_EQ(got, DocumentedDraw(tied, p, 5, static_cast<uint64_t>(i))) << "top_p " << top_p;
      seen[got] = 1;
      st.Accept(got);
    }
    // top_p 0.05 keeps exactly the group of tied maxima (1.5).
    if (top_p == 0.05) {
      for (int i = 0; i < V; ++i) {
        if (seen[i]) {
          EXPECT_EQ(tied[i], 1.5f) << i;
        }
      }
    }
  }
}

TEST(SamplerAlgorithm, DeterministicExpIsAccurate) {
  EXPECT_EQ(DeterministicExp(0.0), 1.0);
  EXPECT_EQ(DeterministicExp(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(DeterministicExp(-1000.0), 0.0);
  double worst = 0;
  for (int i = 0; i < 700000; ++i) {  // down to −699.9997
    const double v = -i * 0.001 - i * 1e-9;
    worst = std::max(worst, std::fabs(DeterministicExp(v) / std::exp(v) - 1.0));
  }
  EXPECT_LT(worst, 1e-15);
}

// ---------------------------------------------------------------- edge cases
TEST(SamplerEdges, TopPTowardZeroKeepsOnlyTheMostProbable) {
  const int V = 32;
  std::vector<float> x = SpreadLogits(V);
  const int32_t top = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  p.top_p = 1e-9;
  auto counts = DrawCounts(sampler, x, p, 5, 2000);
  EXPECT_EQ(counts[top], 2000);
  // Two tied maxima: both kept (the rule keeps ties together), nothing else.
  x[3] = x[top];
  counts = DrawCounts(sampler, x, p, 6, 4000);
  EXPECT_EQ(counts[3] + counts[top], 4000);
  EXPECT_NEAR(counts[3], 2000, 5 * std::sqrt(1000.0));
}

TEST(SamplerEdges, TinyTemperatureIsArgmax) {
  const int V = 32;
  std::vector<float> x = SpreadLogits(V);
  const int32_t top = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  x[(top + 1) % V] = x[top] - 0.01f;  // a close runner-up
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  for (double t : {1e-4, 1e-300}) {
    SamplingParams p;
    p.temperature = t;
    EXPECT_EQ(DrawCounts(sampler, x, p, 8, 2000)[top], 2000) << "T " << t;
  }
  // At T = 0.01 the runner-up (e^−1 relative) does appear.
  SamplingParams p;
  p.temperature = 0.01;
  const auto counts = DrawCounts(sampler, x, p, 8, 4000);
  EXPECT_GT(counts[(top + 1) % V], 0);
  EXPECT_EQ(counts[top] + counts[(top + 1) % V], 4000);
}

TEST(SamplerEdges, AllMinusInfButOne) {
  const int V = 64;
  std::vector<float> x(V, kNegInf);
  x[13] = -5.0f;
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  p.top_k = 5;
  p.top_p = 0.5;
  p.min_p = 0.5;
  p.logprobs = 2;
  SamplingState st(p, 3, V);
  for (int i = 0; i < 200; ++i) {
    const SampleResult r = sampler.Sample(x, st);
    ASSERT_EQ(r.token_id, 13);
    EXPECT_EQ(r.logprobs->chosen.logprob, 0.0f);
    EXPECT_EQ(r.logprobs->chosen.rank, 1);
    st.Accept(r.token_id);
  }
}

std::vector<uint32_t> MaskAllowing(int64_t V, std::initializer_list<int32_t> ids) {
  std::vector<uint32_t> m(static_cast<size_t>((V + 31) / 32), 0);
  for (int32_t id : ids) m[id / 32] |= 1u << (id % 32);
  return m;
}

TEST(SamplerEdges, MaskedOutEverythingButOne) {
  const int V = 100;
  std::vector<float> x = SpreadLogits(V);
  const int32_t lowest = static_cast<int32_t>(std::min_element(x.begin(), x.end()) - x.begin());
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  for (double t : {0.0, 1.0}) {
    SamplingParams p;
    p.temperature = t;
    SamplingState st(p, 11, V);
    st.SetTokenBitmask(MaskAllowing(V, {lowest}));
    for (int i = 0; i < 100; ++i) {
      ASSERT_EQ(sampler.Sample(x, st).token_id, lowest);
      st.Accept(lowest);
    }
  }
}

TEST(SamplerEdges, EverythingMaskedFailsWithAClearError) {
  const int V = 40;
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingState st(SamplingParams{}, 1, V, {}, "req-7");
  st.SetTokenBitmask(std::vector<uint32_t>(2, 0));
  try {
    sampler.Sample(SpreadLogits(V), st);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("req-7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no token can be sampled"), std::string::npos) << e.what();
  }
  EXPECT_THROW(st.SetTokenBitmask(std::vector<uint32_t>(1, 0)), Error);  // wrong word count
}

TEST(SamplerEdges, NanOrPlusInfFailsNamingTheToken) {
  const int V = 16;
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingState st(SamplingParams{}, 1, V, {}, "r1");
  std::vector<float> x = SpreadLogits(V);
  x[4] = std::numeric_limits<float>::quiet_NaN();
  try {
    sampler.Sample(x, st);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN at token id 4"), std::string::npos) << e.what();
  }
  x[4] = std::numeric_limits<float>::infinity();
  try {
    sampler.Sample(x, st);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("+Inf at token id 4"), std::string::npos) << e.what();
  }
  // Greedy requests are checked too.
  SamplingParams g;
  g.temperature = 0;
  SamplingState sg(g, 1, V);
  EXPECT_THROW(sampler.Sample(x, sg), Error);
  // A repetition penalty that overflows a logit to +Inf is reported, not sampled.
  SamplingParams rp;
  rp.repetition_penalty = 1e-3;
  std::vector<float> big = SpreadLogits(V);
  big[2] = 3e38f;
  const std::vector<int32_t> prompt = {2};
  SamplingState sr(rp, 1, V, prompt);
  EXPECT_THROW(sampler.Sample(big, sr), Error);
  // Wrong row length.
  EXPECT_THROW(sampler.Sample(std::vector<float>(V + 1, 0.0f), st), Error);
}

// ---------------------------------------------------------------- greedy, big vocab
constexpr int64_t kBigVocab = 129280;

std::vector<float> BigLogits(uint64_t salt) {
  std::vector<float> x(kBigVocab);
  uint64_t s = salt;
  for (auto& v : x) {  // xorshift, values in [−5, 5)
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = static_cast<float>((s >> 11) * (1.0 / 9007199254740992.0) * 10.0 - 5.0);
  }
  return x;
}

TEST(SamplerGreedy, TiesGoToTheLowestIdOnTheFullVocabulary) {
  std::vector<float> x = BigLogits(1);
  x[70000] = x[129279] = x[5000] = 9.0f;
  Sampler sampler(SamplerConfig{kBigVocab, {1}, LogprobsMode::kRawLogprobs});
  SamplingParams t0;
  t0.temperature = 0;
  SamplingParams k1;
  k1.temperature = 0.8;
  k1.top_k = 1;
  for (const SamplingParams& p : {t0, k1}) {
    SamplingState st(p, 123, kBigVocab);
    EXPECT_EQ(sampler.Sample(x, st).token_id, 5000);
  }
  // A unique maximum in the last (partial) block.
  x[70000] = x[5000] = 8.0f;
  SamplingState st(t0, 1, kBigVocab);
  EXPECT_EQ(sampler.Sample(x, st).token_id, 129279);
  // Penalties apply before greedy: repetition penalty 2 halves 9.0 → 4.5.
  SamplingParams rp = t0;
  rp.repetition_penalty = 2.0;
  const std::vector<int32_t> prompt = {129279};
  SamplingState sr(rp, 1, kBigVocab, prompt);
  EXPECT_EQ(sampler.Sample(x, sr).token_id, 5000);  // 8.0 at 5000 and 70000: lowest id
}

TEST(SamplerGreedy, BitmaskOnTheFullVocabulary) {
  std::vector<float> x = BigLogits(2);
  // Allowed ids straddle block boundaries; disallowed ids get huge logits.
  const std::vector<int32_t> allowed = {3, 1023, 1024, 129279};
  for (int i = 0; i < kBigVocab; i += 1000) x[i] = 50.0f;
  x[3] = 0.0f, x[1023] = 0.5f, x[1024] = 1.0f, x[129279] = 1.5f;
  Sampler sampler(SamplerConfig{kBigVocab, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  SamplingState st(p, 31, kBigVocab);
  st.SetTokenBitmask(MaskAllowing(kBigVocab, {3, 1023, 1024, 129279}));
  std::vector<int64_t> counts(4, 0);
  for (int i = 0; i < 400; ++i) {
    const int32_t t = sampler.Sample(x, st).token_id;
    const auto it = std::find(allowed.begin(), allowed.end(), t);
    ASSERT_NE(it, allowed.end()) << "disallowed id " << t;
    ++counts[it - allowed.begin()];
    st.Accept(t);
  }
  for (int j = 0; j < 4; ++j) EXPECT_GT(counts[j], 20) << allowed[j];  // p >= 0.14 each
  // Greedy under the mask: the best allowed id.
  SamplingParams g;
  g.temperature = 0;
  SamplingState sg(g, 1, kBigVocab);
  sg.SetTokenBitmask(MaskAllowing(kBigVocab, {3, 1023, 1024, 129279}));
  EXPECT_EQ(sampler.Sample(x, sg).token_id, 129279);
  // Only the very last id allowed.
  SamplingState sl(p, 2, kBigVocab);
  sl.SetTokenBitmask(MaskAllowing(kBigVocab, {129279}));
  EXPECT_EQ(sampler.Sample(x, sl).token_id, 129279);
  sg.ClearTokenBitmask();
  EXPECT_EQ(x[sampler.Sample(x, sg).token_id], 50.0f);
}

TEST(SamplerParams, MinTokensBlocksEosAndStopTokenIds) {
  const int V = 16;
  std::vector<float> x(V, 0.0f);
  x[7] = 10.0f;  // EOS
  x[9] = 9.0f;   // a stop token id
  x[2] = 8.0f;
  Sampler sampler(SamplerConfig{V, {7}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 3;
  p.stop_token_ids = {9};
  SamplingState st(p, 1, V);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sampler.Sample(x, st).token_id, 2) << "position " << i;
    st.Accept(2);
  }
  EXPECT_EQ(sampler.Sample(x, st).token_id, 7);
}

TEST(SamplerParams, LogitBiasCanForceAToken) {
  const int V = 16;
  const std::vector<float> x = SpreadLogits(V);
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  p.logit_bias = {{11, 100.0}};
  EXPECT_EQ(DrawCounts(sampler, x, p, 3, 500)[11], 500);
  p.logit_bias = {{11, -100.0}};
  EXPECT_EQ(DrawCounts(sampler, x, p, 3, 2000)[11], 0);
}

// ---------------------------------------------------------------- invariance
uint64_t Mix(uint64_t z) {  // SplitMix64 finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Pseudo-logits for (request, step, previous token): a fixed function, so a
// divergence anywhere changes everything after it.
void FillLogits(float* row, int V, int req, int step, int32_t prev) {
  const uint64_t h = Mix((uint64_t(req) << 40) ^ (uint64_t(step) << 20) ^ uint64_t(prev + 1));
  for (int i = 0; i < V; ++i)
    row[i] = static_cast<float>((Mix(h ^ uint64_t(i)) >> 11) * (1.0 / 9007199254740992.0) * 8.0 - 4.0);
}

SamplingParams InvarianceParams(int req) {
  SamplingParams p;
  switch (req % 5) {
    case 0: p.temperature = 0.9; p.top_p = 0.9; p.logprobs = 3; break;
    case 1: p.temperature = 0; break;
    case 2: p.temperature = 1.2; p.top_k = 20; p.min_p = 0.02; break;
    case 3: p.repetition_penalty = 1.2; p.frequency_penalty = 0.3; p.presence_penalty = 0.2; break;
    case 4: p.temperature = 0.7; p.logit_bias = {{5, 1.0}}; p.logprobs = 0; break;
  }
  return p;
}

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

TEST(SamplerInvariance, AloneEqualsInABatchOfNineAtAnySlotAndThreadCount) {
  const int V = 512, kReqs = 9, kSteps = 50;
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  const std::vector<int32_t> prompt = {1, 2, 3};

  // Each request alone.
  std::vector<Trace> alone(kReqs);
  for (int r = 0; r < kReqs; ++r) {
    SamplingState st(InvarianceParams(r), 1000 + r, V, prompt);
    std::vector<float> row(V);
    int32_t prev = -1;
    for (int s = 0; s < kSteps; ++s) {
      FillLogits(row.data(), V, r, s, prev);
      const SampleResult res = sampler.Sample(row, st);
      alone[r].tokens.push_back(res.token_id);
      alone[r].logprobs.push_back(res.logprobs ? res.logprobs->chosen.logprob : 0.0f);
      st.Accept(res.token_id);
      prev = res.token_id;
    }
  }
  // All nine in one batch, slot order rotated every step, 1 and 2 threads.
  const int saved_threads = NumThreads();
  for (int threads : {1, 2}) {
    SetNumThreads(threads);
    std::vector<SamplingState> states;
    for (int r = 0; r < kReqs; ++r) states.emplace_back(InvarianceParams(r), 1000 + r, V, prompt);
    std::vector<int32_t> prev(kReqs, -1);
    std::vector<Trace> batched(kReqs);
    std::vector<float> logits(static_cast<size_t>(kReqs) * (V + 8));  // padded rows
    for (int s = 0; s < kSteps; ++s) {
      std::vector<const SamplingState*> order(kReqs);
      for (int slot = 0; slot < kReqs; ++slot) {
        const int r = (slot + s) % kReqs;
        order[slot] = &states[r];
        FillLogits(&logits[static_cast<size_t>(slot) * (V + 8)], V, r, s, prev[r]);
      }
      const auto out = sampler.SampleBatch(logits.data(), V + 8, order);
      for (int slot = 0; slot < kReqs; ++slot) {
        const int r = (slot + s) % kReqs;
        ASSERT_TRUE(out[slot].ok()) << out[slot].error->what();
        const SampleResult& res = out[slot].result;
        batched[r].tokens.push_back(res.token_id);
        batched[r].logprobs.push_back(res.logprobs ? res.logprobs->chosen.logprob : 0.0f);
        states[r].Accept(res.token_id);
        prev[r] = res.token_id;
      }
    }
    for (int r = 0; r < kReqs; ++r) {
      EXPECT_EQ(batched[r].tokens, alone[r].tokens) << "request " << r << ", " << threads << " threads";
      EXPECT_EQ(batched[r].logprobs, alone[r].logprobs) << "request " << r;
    }
  }
  SetNumThreads(saved_threads);
  // The runs are not trivially constant: sampled requests vary their tokens.
  std::vector<int32_t> distinct = alone[0].tokens;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_GT(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 30);
}

TEST(SamplerInvariance, ReplayFromHistoryContinuesIdentically) {
  // A preempted request rebuilt from (params, seed, prompt) plus Accept() of
  // its output continues with the same tokens.
  const int V = 256;
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  const SamplingParams p = InvarianceParams(3);  // penalties: history matters
  const std::vector<int32_t> prompt = {4, 4, 9};
  SamplingState st(p, 555, V, prompt);
  std::vector<int32_t> tokens;
  std::vector<float> row(V);
  for (int s = 0; s < 40; ++s) {
    FillLogits(row.data(), V, 0, s, s ? tokens.back() : -1);
    tokens.push_back(sampler.Sample(row, st).token_id);
    st.Accept(tokens.back());
  }
  SamplingState replay(p, 555, V, prompt);
  for (int s = 0; s < 20; ++s) replay.Accept(tokens[s]);
  for (int s = 20; s < 40; ++s) {
    FillLogits(row.data(), V, 0, s, tokens[s - 1]);
    ASSERT_EQ(sampler.Sample(row, replay).token_id, tokens[s]) << "step " << s;
    replay.Accept(tokens[s]);
  }
}

TEST(SamplerInvariance, SeedsAndPositionsChangeDraws) {
  const int V = 64;
  std::vector<float> x(V, 0.0f);  // uniform
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  auto run = [&](int64_t seed) {
    SamplingState st(SamplingParams{}, seed, V);
    std::vector<int32_t> t;
    for (int i = 0; i < 50; ++i) t.push_back(sampler.Sample(x, st).token_id), st.Accept(t.back());
    return t;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
  EXPECT_NE(run(7), run(-7));
}

TEST(SamplerInvariance, ABadRowFailsAloneInABatch) {
  const int V = 128;
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  std::vector<SamplingState> states;
  for (int r = 0; r < 4; ++r) states.emplace_back(InvarianceParams(r), 10 + r, V);
  std::vector<float> logits(4 * V);
  for (int r = 0; r < 4; ++r) FillLogits(&logits[r * V], V, r, 0, -1);
  logits[2 * V + 17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<const SamplingState*> ptrs = {&states[0], &states[1], &states[2], &states[3]};
  const auto out = sampler.SampleBatch(logits.data(), V, ptrs);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_FALSE(out[2].ok());
  EXPECT_NE(std::string(out[2].error->what()).find("NaN at token id 17"), std::string::npos);
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(out[r].ok());
    const std::span<const float> row(&logits[r * V], V);
    EXPECT_EQ(out[r].result.token_id, sampler.Sample(row, states[r]).token_id);
  }
  // A null state is a per-row error too.
  ptrs[1] = nullptr;
  const auto out2 = sampler.SampleBatch(logits.data(), V, ptrs);
  EXPECT_FALSE(out2[1].ok());
  EXPECT_TRUE(out2[0].ok());
}

// ---------------------------------------------------------------- logprobs
std::vector<long double> LogSoftmax(const std::vector<float>& x) {
  long double m = -INFINITY, s = 0;
  for (float v : x) m = std::max<long double>(m, v);
  for (float v : x)
    if (v != kNegInf) s += std::exp((long double)v - m);
  std::vector<long double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = x[i] == kNegInf ? -INFINITY : (long double)x[i] - m - std::log(s);
  return out;
}

TEST(SamplerLogprobs, SampledLogprobEqualsRawLogSoftmax) {
  const int V = 1000;
  std::vector<float> x(V);
  FillLogits(x.data(), V, 3, 3, 3);
  x[10] = kNegInf;
  const auto ref = LogSoftmax(x);
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;  // processing must not change raw logprobs
  p.temperature = 0.7;
  p.top_k = 40;
  p.repetition_penalty = 1.3;
  p.logit_bias = {{1, 3.0}};
  p.logprobs = 5;
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  SamplingState st(p, 21, V, prompt);
  // Order of the raw logits, ties by id, for ranks.
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
  for (int i = 0; i < 100; ++i) {
    const SampleResult r = sampler.Sample(x, st);
    ASSERT_TRUE(r.logprobs.has_value());
    EXPECT_NEAR(r.logprobs->chosen.logprob, (double)ref[r.token_id], 1e-5);
    EXPECT_EQ(r.logprobs->chosen.token_id, r.token_id);
    const int64_t rank = std::find(order.begin(), order.end(), r.token_id) - order.begin() + 1;
    EXPECT_EQ(r.logprobs->chosen.rank, rank);
    ASSERT_EQ(r.logprobs->top.size(), 5u);
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(r.logprobs->top[j].token_id, order[j]);
      EXPECT_NEAR(r.logprobs->top[j].logprob, (double)ref[order[j]], 1e-5);
      EXPECT_EQ(r.logprobs->top[j].rank, j + 1);
    }
    st.Accept(r.token_id);
  }
}

TEST(SamplerLogprobs, TopListBreaksTiesByLowestIdAndSharesRanks) {
  const int V = 10;
  std::vector<float> x = {0, 3, 1, 3, 2, 3, 0, 0, 0, 0};
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kRawLogprobs});
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 4;
  SamplingState st(p, 1, V);
  const SampleResult r = sampler.Sample(x, st);
  EXPECT_EQ(r.token_id, 1);
  ASSERT_EQ(r.logprobs->top.size(), 4u);
  const int32_t ids[] = {1, 3, 5, 4};
  const int64_t ranks[] = {1, 1, 1, 4};
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(r.logprobs->top[j].token_id, ids[j]);
    EXPECT_EQ(r.logprobs->top[j].rank, ranks[j]);
  }
  // logprobs = −1: the whole vocabulary; logprobs = 0: only the chosen token.
  p.logprobs = -1;
  SamplingState all(p, 1, V);
  EXPECT_EQ(sampler.Sample(x, all).logprobs->top.size(), static_cast<size_t>(V));
  p.logprobs = 0;
  SamplingState none(p, 1, V);
  const SampleResult r0 = sampler.Sample(x, none);
  EXPECT_TRUE(r0.logprobs->top.empty());
  EXPECT_NEAR(r0.logprobs->chosen.logprob, (double)LogSoftmax(x)[1], 1e-6);
  // No logprobs requested: none computed.
  SamplingState off(SamplingParams{}, 1, V);
  EXPECT_FALSE(sampler.Sample(x, off).logprobs.has_value());
}

TEST(SamplerLogprobs, ProcessedModesReportTheSamplingDistribution) {
  const int V = 32;
  const std::vector<float> raw = SpreadLogits(V);
  SamplingParams p;
  p.temperature = 0.5;
  p.top_k = 8;
  p.presence_penalty = 0.5;
  p.logprobs = 8;
  const std::vector<int32_t> hist = {0, 1, 2};
  // Expected processed logits (fp32, vLLM formulas) and kept set.
  std::vector<float> x = raw;
  for (int32_t t : hist) x[t] = x[t] - 0.0f * 1.0f, x[t] = x[t] - 0.5f;
  const auto target = TargetDistribution(x, 0.5, 8, 1.0, 0.0);

  Sampler lp(SamplerConfig{V, {}, LogprobsMode::kProcessedLogprobs});
  Sampler lg(SamplerConfig{V, {}, LogprobsMode::kProcessedLogits});
  Sampler rl(SamplerConfig{V, {}, LogprobsMode::kRawLogits});
  SamplingState st(p, 9, V);
  for (int32_t t : hist) st.Accept(t);
  const SampleResult a = lp.Sample(raw, st);
  const SampleResult b = lg.Sample(raw, st);
  const SampleResult c = rl.Sample(raw, st);
  EXPECT_EQ(a.token_id, b.token_id);  // the mode never changes the draw
  EXPECT_EQ(a.token_id, c.token_id);
  ASSERT_GT(target[a.token_id], 0);
  EXPECT_NEAR(a.logprobs->chosen.logprob, std::log((double)target[a.token_id]), 1e-5);
  for (const TokenLogprob& t : a.logprobs->top) {
    if (target[t.token_id] > 0)
      EXPECT_NEAR(t.logprob, std::log((double)target[t.token_id]), 1e-5);
    else
      EXPECT_EQ(t.logprob, -std::numeric_limits<float>::infinity());
  }
  // Processed logits are exactly x / float(T) for kept ids.
  EXPECT_EQ(b.logprobs->chosen.logprob, x[b.token_id] / 0.5f);
  for (const TokenLogprob& t : b.logprobs->top) EXPECT_EQ(t.logprob, x[t.token_id] / 0.5f);
  EXPECT_EQ(c.logprobs->chosen.logprob, raw[c.token_id]);
  EXPECT_EQ(ParseLogprobsMode("processed_logprobs"), LogprobsMode::kProcessedLogprobs);
  EXPECT_THROW(ParseLogprobsMode("processed"), Error);
}

TEST(SamplerLogprobs, PromptLogprobsAreRawLogSoftmax) {
  const int V = 300;
  std::vector<float> x(V);
  FillLogits(x.data(), V, 1, 2, 3);
  const auto ref = LogSoftmax(x);
  Sampler sampler(SamplerConfig{V, {}, LogprobsMode::kProcessedLogprobs});  // mode is irrelevant
  const LogprobsEntry e = sampler.PromptLogprobs(x, 123, 3);
  EXPECT_EQ(e.chosen.token_id, 123);
  EXPECT_NEAR(e.chosen.logprob, (double)ref[123], 1e-5);
  ASSERT_EQ(e.top.size(), 3u);
  const int32_t best = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  EXPECT_EQ(e.top[0].token_id, best);
  EXPECT_NEAR(e.top[0].logprob, (double)ref[best], 1e-5);
  EXPECT_THROW(sampler.PromptLogprobs(x, V, 3), Error);
}

TEST(SamplerState, RejectsBadInput) {
  EXPECT_THROW(SamplingState(SamplingParams{}, 1, 0), Error);
  const std::vector<int32_t> bad_prompt = {5, 16};
  EXPECT_THROW(SamplingState(SamplingParams{}, 1, 16, bad_prompt), Error);
  SamplingParams p;
  p.logit_bias = {{16, 1.0}};
  EXPECT_THROW(SamplingState(p, 1, 16), Error);  // id outside the vocabulary
  SamplingState st(SamplingParams{}, 1, 16);
  EXPECT_THROW(st.Accept(16), Error);
  EXPECT_THROW(st.Accept(-1), Error);
  EXPECT_EQ(st.num_output_tokens(), 0);
  st.Accept(3);
  EXPECT_EQ(st.num_output_tokens(), 1);
  EXPECT_THROW(Sampler(SamplerConfig{16, {16}, LogprobsMode::kRawLogprobs}), Error);
  EXPECT_THROW(Sampler(SamplerConfig{0, {}, LogprobsMode::kRawLogprobs}), Error);
}

}  // namespace
}  // namespace deepinfer
