#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "sampling/philox.h"

namespace deepinfer {
namespace {

using u128 = unsigned __int128;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kBlock = 1024;  // ids per block of the two-level draw

// NaN or +Inf (−Inf is a legal "impossible token" logit).
inline bool BadLogit(float v) { return std::isnan(v) || v == std::numeric_limits<float>::infinity(); }

std::string Who(const SamplingState& st) {
  if (!st.request_id().empty()) return fmt::format("request '{}'", st.request_id());
  return fmt::format("request with seed {}", st.seed());
}

// round(v · 2^32) for v in [0, 1]; v · 2^32 is exact in double, llround is exact.
inline uint64_t Frac32(double v) { return static_cast<uint64_t>(std::llround(v * 4294967296.0)); }

// One pass over a row: the max, and the first NaN/+Inf id (−1 if none).
struct RowScan {
  float max = kNegInf;
  int64_t bad = -1;
};
RowScan ScanRow(const float* x, int64_t V) {
  RowScan r;
  bool bad = false;
  float m = kNegInf;
  for (int64_t i = 0; i < V; ++i) {
    const float v = x[i];
    bad |= (v != v) | (v == std::numeric_limits<float>::infinity());
    m = v > m ? v : m;
  }
  r.max = m;
  if (bad)
    for (int64_t i = 0; i < V; ++i)
      if (BadLogit(x[i])) {
        r.bad = i;
        break;
      }
  return r;
}

// Per-thread scratch, sized to the vocabulary on first use.
struct Scratch {
  std::vector<float> x;          // processed logits
  std::vector<uint64_t> q;       // fixed-point weights (0 = not drawable)
  std::vector<uint8_t> keep;     // survives top_k / min_p / top_p
  std::vector<float> tmp;        // top-k selection
  std::vector<std::pair<uint64_t, int32_t>> pairs;  // top-p boundary bucket
  std::vector<uint64_t> blocks;  // block sums
  std::vector<float> key;        // logprob ordering key
  std::vector<int32_t> idx;      // top-N selection
};
Scratch& ThreadScratch() {
  thread_local Scratch s;
  return s;
}

// The k-th largest of the values x[i] with keep[i] (counting repeats); k >= 1
// and at most the number of kept values.
float KthLargest(const float* x, const uint8_t* keep, int64_t V, int64_t k, std::vector<float>& tmp) {
  tmp.clear();
  if (k <= 256) {  // a min-heap of the k largest so far: mostly one compare per id
    auto gt = std::greater<float>();
    for (int64_t i = 0; i < V; ++i) {
      if (!keep[i]) continue;
      const float v = x[i];
      if (static_cast<int64_t>(tmp.size()) < k) {
        tmp.push_back(v);
        std::push_heap(tmp.begin(), tmp.end(), gt);
      } else if (v > tmp.front()) {
        std::pop_heap(tmp.begin(), tmp.end(), gt);
        tmp.back() = v;
        std::push_heap(tmp.begin(), tmp.end(), gt);
      }
    }
    return tmp.front();
  }
  for (int64_t i = 0; i < V; ++i)
    if (keep[i]) tmp.push_back(x[i]);
  std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(), std::greater<float>());
  return tmp[static_cast<size_t>(k - 1)];
}

// top_p on fixed-point weights: the smallest q kept by "Σ_{kept j: q_j > q_i}
// q_j < t·Q / 2^32". Exact. Weights are bucketed by bit width (one pass);
// buckets that are wholly kept or wholly dropped are decided from their sums,
// and only the bucket holding the boundary is sorted.
uint64_t TopPCutoff(const uint64_t* q, const uint8_t* keep, int64_t V, uint64_t t, int S,
                    std::vector<std::pair<uint64_t, int32_t>>& pairs) {
  uint64_t mass[65] = {};
  uint64_t total = 0;
  for (int64_t i = 0; i < V; ++i)
    if (keep[i]) {
      mass[std::bit_width(q[i])] += q[i];
      total += q[i];
    }
  const u128 thr = static_cast<u128>(t) * total;
  uint64_t above = 0;      // Σ of weights in the buckets above the current one
  uint64_t cutoff = 0;     // smallest weight known to be kept
  for (int b = S + 1; b >= 1; --b) {
    if (mass[b] == 0) continue;
    if ((static_cast<u128>(above) << 32) >= thr) break;  // this and lower buckets: dropped
    if ((static_cast<u128>(above + mass[b]) << 32) < thr) {  // wholly kept
      above += mass[b];
      cutoff = uint64_t{1} << (b - 1);  // every weight in bucket b is >= this
      continue;
    }
    // The boundary is in bucket b: walk its weights in descending order; equal
    // weights are kept or dropped together.
    pairs.clear();
    for (int64_t i = 0; i < V; ++i)
      if (keep[i] && static_cast<int>(std::bit_width(q[i])) == b) pairs.emplace_back(q[i], static_cast<int32_t>(i));
    std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& c) { return a.first > c.first; });
    for (size_t g = 0; g < pairs.size();) {
      const uint64_t qv = pairs[g].first;
      if (!((static_cast<u128>(above) << 32) < thr)) break;
      cutoff = qv;
      while (g < pairs.size() && pairs[g].first == qv) above += pairs[g++].first;
    }
    break;
  }
  // Weight 0 is never kept (its "above" is the whole total, and t <= 2^32).
  return std::max<uint64_t>(cutoff, 1);
}

// The logprobs entry for ordering key `key` (−inf = removed), chosen id, top N.
// value(i) gives the reported value (double) of id i.
template <class ValueFn>
LogprobsEntry BuildLogprobs(const float* key, int64_t V, int32_t chosen, int64_t num_top,
                            ValueFn value, std::vector<int32_t>& idx) {
  LogprobsEntry e;
  const float kc = key[chosen];
  int64_t above = 0;
  for (int64_t i = 0; i < V; ++i) above += key[i] > kc;
  e.chosen = TokenLogprob{chosen, static_cast<float>(value(chosen)), above + 1};
  const int64_t n = num_top < 0 ? V : std::min<int64_t>(num_top, V);
  if (n == 0) return e;
  // "a ranks before b": larger key, then lower id.
  auto better = [key](int32_t a, int32_t b) {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
  };
  idx.clear();
  if (n <= 64) {  // a heap whose front is the worst of the n best so far
    for (int64_t i = 0; i < V; ++i) {
      const int32_t id = static_cast<int32_t>(i);
      if (static_cast<int64_t>(idx.size()) < n) {
        idx.push_back(id);
        std::push_heap(idx.begin(), idx.end(), better);
      } else if (better(id, idx.front())) {
        std::pop_heap(idx.begin(), idx.end(), better);
        idx.back() = id;
        std::push_heap(idx.begin(), idx.end(), better);
      }
    }
    std::sort(idx.begin(), idx.end(), better);
  } else {
    idx.resize(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), better);
    idx.resize(static_cast<size_t>(n));
  }
  e.top.reserve(static_cast<size_t>(n));
  // Ranks: equal keys share the rank of the first (1 + number strictly above).
  int64_t rank = 1;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t id = idx[j];
    if (j > 0 && key[id] != key[idx[j - 1]]) rank = j + 1;
    e.top.push_back(TokenLogprob{id, static_cast<float>(value(id)), rank});
  }
  return e;
}

// log Σ exp((x_i − m) / scale) over ids with x_i > −inf, in id order.
double LogSumExpShifted(const float* x, int64_t V, double m, double scale) {
  double s = 0.0;
  for (int64_t i = 0; i < V; ++i)
    if (x[i] != kNegInf) s += DeterministicExp(((double)x[i] - m) / scale);
  return std::log(s);
}

}  // namespace

// ------------------------------------------------------------------ exp
double DeterministicExp(double x) {
  if (!(x >= -700.0)) return 0.0;
  // x = k·ln2 + r. k = x/ln2 rounded to nearest by the 1.5·2^52 trick (exact
  // IEEE round-to-nearest-even, no libm call). ln2 is split into hi (30
  // significant bits, so k·hi is exact for |k| < 2^23) and lo; hi + lo = ln 2
  // to 1.2e−26. |r| <= ln2/2 + 2^−40.
  constexpr double kInvLn2 = 0x1.71547652b82fep0;
  constexpr double kLn2Hi = 0x1.62e42feep-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  constexpr double kRound = 0x1.8p52;
  const double kd = (x * kInvLn2 + kRound) - kRound;
  const double r = (x - kd * kLn2Hi) - kd * kLn2Lo;
  // Degree-13 Taylor polynomial, Horner form; coefficient n is 1/n!, one
  // correctly rounded division of exact integers (evaluated at compile time).
  constexpr double kFact[14] = {1.0,         1.0,          2.0,         6.0,
                                24.0,        120.0,        720.0,       5040.0,
                                40320.0,     362880.0,     3628800.0,   39916800.0,
                                479001600.0, 6227020800.0};
  double p = 1.0 / kFact[13];
  for (int n = 12; n >= 1; --n) p = p * r + 1.0 / kFact[n];
  p = p * r + 1.0;
  // · 2^k, k in [−1010, 0]: 2^k is a normal double built from its bits, and
  // p · 2^k (p in [0.7, 1.42]) is normal, so the product is exact.
  const int64_t k = static_cast<int64_t>(kd);
  double scale;
  const uint64_t bits = static_cast<uint64_t>(k + 1023) << 52;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// ------------------------------------------------------------------ modes
const char* LogprobsModeName(LogprobsMode mode) {
  switch (mode) {
    case LogprobsMode::kRawLogprobs: return "raw_logprobs";
    case LogprobsMode::kRawLogits: return "raw_logits";
    case LogprobsMode::kProcessedLogprobs: return "processed_logprobs";
    case LogprobsMode::kProcessedLogits: return "processed_logits";
  }
  return "?";
}

LogprobsMode ParseLogprobsMode(const std::string& name) {
  for (LogprobsMode m : {LogprobsMode::kRawLogprobs, LogprobsMode::kRawLogits,
                         LogprobsMode::kProcessedLogprobs, LogprobsMode::kProcessedLogits})
    if (name == LogprobsModeName(m)) return m;
  Fail(ErrorKind::kInvalidArgument,
       "logprobs_mode must be one of raw_logprobs, raw_logits, processed_logprobs, "
       "processed_logits; got \"{}\"",
       name);
}

// ------------------------------------------------------------------ state
SamplingState::SamplingState(SamplingParams params, int64_t seed, int64_t vocab_size,
                             std::span<const int32_t> prompt_token_ids, std::string request_id)
    : params_(std::move(params)), seed_(seed), vocab_size_(vocab_size),
      request_id_(std::move(request_id)) {
  if (vocab_size < 1 || vocab_size > std::numeric_limits<int32_t>::max())
    Fail(ErrorKind::kInvalidArgument, "vocab_size must be in [1, 2^31-1], got {}", vocab_size);
  params_.Validate(SamplingLimits{vocab_size, -1});
  if (uses_repetition_penalty()) seen_bits_.assign(static_cast<size_t>((vocab_size + 63) / 64), 0);
  for (size_t i = 0; i < prompt_token_ids.size(); ++i) {
    const int32_t id = prompt_token_ids[i];
    if (id < 0 || id >= vocab_size)
      Fail(ErrorKind::kOutOfRange, "prompt token {} is {}, outside the vocabulary [0, {})", i, id,
           vocab_size);
    if (uses_repetition_penalty()) MarkSeen(id);
  }
}

void SamplingState::MarkSeen(int32_t id) {
  uint64_t& w = seen_bits_[static_cast<size_t>(id) >> 6];
  const uint64_t bit = uint64_t{1} << (id & 63);
  if (!(w & bit)) {
    w |= bit;
    seen_ids_.push_back(id);
  }
}

void SamplingState::Accept(int32_t token_id) {
  if (token_id < 0 || token_id >= vocab_size_)
    Fail(ErrorKind::kOutOfRange, "accepted token {} is outside the vocabulary [0, {})", token_id,
         vocab_size_);
  if (uses_repetition_penalty()) MarkSeen(token_id);
  if (uses_count_penalties()) ++output_counts_[token_id];
  ++num_output_tokens_;
}

void SamplingState::SetTokenBitmask(std::span<const uint32_t> words) {
  const size_t want = static_cast<size_t>((vocab_size_ + 31) / 32);
  if (words.size() != want)
    Fail(ErrorKind::kInvalidArgument, "token bitmask has {} words, expected ceil({}/32) = {}",
         words.size(), vocab_size_, want);
  bitmask_.assign(words.begin(), words.end());
}

// ------------------------------------------------------------------ sampler
Sampler::Sampler(SamplerConfig config) : config_(std::move(config)) {
  const int64_t V = config_.vocab_size;
  if (V < 1 || V > std::numeric_limits<int32_t>::max())
    Fail(ErrorKind::kInvalidArgument, "sampler vocab_size must be in [1, 2^31-1], got {}", V);
  for (int32_t id : config_.eos_token_ids)
    if (id < 0 || id >= V)
      Fail(ErrorKind::kInvalidArgument, "eos_token_id {} is outside the vocabulary [0, {})", id, V);
  fixed_point_shift_ = 63 - static_cast<int>(std::bit_width(static_cast<uint64_t>(V)));
}

SampleResult Sampler::Sample(std::span<const float> logits, const SamplingState& st) const {
  const int64_t V = config_.vocab_size;
  if (static_cast<int64_t>(logits.size()) != V)
    Fail(ErrorKind::kInvalidArgument, "{}: logits row has {} entries, expected vocab_size {}",
         Who(st), logits.size(), V);
  if (st.vocab_size() != V)
    Fail(ErrorKind::kInvalidArgument, "{}: sampling state built for vocab_size {}, sampler has {}",
         Who(st), st.vocab_size(), V);
  const SamplingParams& P = st.params();
  const int64_t pos = st.num_output_tokens();
  const float* raw = logits.data();
  const RowScan raw_scan = ScanRow(raw, V);
  if (raw_scan.bad >= 0)
    Fail(ErrorKind::kInternal, "{}: logits contain {} at token id {} (output position {})",
         Who(st), std::isnan(raw[raw_scan.bad]) ? "NaN" : "+Inf", raw_scan.bad, pos);

  Scratch& s = ThreadScratch();

  // ---- steps 1–4: processed logits x.
  const bool has_mask = !st.token_bitmask().empty();
  const bool block_stops = pos < P.min_tokens;
  const bool needs_copy = has_mask || block_stops || !P.logit_bias.empty() ||
                          st.uses_repetition_penalty() || st.uses_count_penalties();
  const float* x = raw;
  if (needs_copy) {
    s.x.assign(raw, raw + V);
    float* w = s.x.data();
    if (has_mask) {  // 1. bitmask
      const std::vector<uint32_t>& mask = st.token_bitmask();
      for (size_t wi = 0; wi < mask.size(); ++wi) {
        uint32_t word = mask[wi];
        if (word == 0xFFFFFFFFu) continue;
        const int64_t base = static_cast<int64_t>(wi) * 32;
        const int64_t end = std::min<int64_t>(base + 32, V);
        for (int64_t id = base; id < end; ++id)
          if (!((word >> (id - base)) & 1u)) w[id] = kNegInf;
      }
    }
    if (block_stops) {  // 2. min_tokens
      for (int32_t id : config_.eos_token_ids) w[id] = kNegInf;
      for (int64_t id : P.stop_token_ids) w[id] = kNegInf;
    }
    for (const auto& [id, bias] : P.logit_bias)  // 3. logit_bias (fp32 add)
      w[id] = w[id] + static_cast<float>(bias);
    if (st.uses_repetition_penalty()) {  // 4a. repetition
      const float r = static_cast<float>(P.repetition_penalty);
      for (int32_t id : st.seen_token_ids()) w[id] = w[id] > 0.0f ? w[id] / r : w[id] * r;
    }
    if (st.uses_count_penalties()) {  // 4b, 4c. frequency, presence
      const float f = static_cast<float>(P.frequency_penalty);
      const float p = static_cast<float>(P.presence_penalty);
      for (const auto& [id, count] : st.output_counts()) {
        w[id] = w[id] - f * static_cast<float>(count);
        w[id] = w[id] - p;
      }
    }
    x = w;
  }

  // Max (lowest id on ties) and a check that processing did not overflow.
  const RowScan scan = needs_copy ? ScanRow(x, V) : raw_scan;
  if (scan.bad >= 0)
    Fail(ErrorKind::kInvalidArgument,
         "{}: logit of token id {} became {} after logit_bias/penalties (output position {})",
         Who(st), scan.bad, std::isnan(x[scan.bad]) ? "NaN" : "+Inf", pos);
  const float m = scan.max;
  if (m == kNegInf)
    Fail(ErrorKind::kInvalidArgument,
         "{}: no token can be sampled at output position {}: every token id has logit -inf after "
         "the bitmask, min_tokens and logit_bias",
         Who(st), pos);

  SampleResult res;
  const bool greedy = P.IsGreedy();
  if (greedy) {  // 5. greedy: the lowest id holding the max
    int64_t i = 0;
    while (x[i] != m) ++i;
    res.token_id = static_cast<int32_t>(i);
  } else {
    s.keep.resize(static_cast<size_t>(V));
    uint8_t* keep = s.keep.data();
    int64_t n_keep = 0;
    for (int64_t i = 0; i < V; ++i) {
      keep[i] = x[i] != kNegInf;
      n_keep += keep[i];
    }
    // ---- 9. top_k: keep x >= k-th largest x (ties kept). It commutes with
    // min_p (both keep an upper set of the same ranking), so it runs first and
    // the weights below are only computed for the survivors.
    if (P.top_k > 1 && P.top_k < n_keep) {
      const float t = KthLargest(x, keep, V, P.top_k, s.tmp);
      for (int64_t i = 0; i < V; ++i) keep[i] &= !(x[i] < t);
    }
    // ---- steps 6–7: temperature and fixed-point weights.
    const double T = P.temperature;
    const double md = static_cast<double>(m);
    const int S = fixed_point_shift_;
    const double scale = std::ldexp(1.0, S);
    // Exp(d) < 2^−(S+1) for d below this, so q = 0 without evaluating Exp.
    const double d_zero = -(S + 1) * 0.6931471805599453 - 1.0;
    s.q.resize(static_cast<size_t>(V));
    uint64_t* q = s.q.data();
    for (int64_t i = 0; i < V; ++i) {
      q[i] = 0;
      if (!keep[i]) continue;
      const double d = ((double)x[i] - md) / T;
      if (d < d_zero) continue;
      q[i] = static_cast<uint64_t>(DeterministicExp(d) * scale);
    }
    const uint64_t q_max = uint64_t{1} << S;  // q of the max token: Exp(0) = 1
    // ---- 8. min_p: q_i / q_max >= min_p.
    if (P.min_p > 0.0) {
      const u128 thr = static_cast<u128>(Frac32(P.min_p)) * q_max;
      for (int64_t i = 0; i < V; ++i)
        if (keep[i] && (static_cast<u128>(q[i]) << 32) < thr) keep[i] = 0;
    }
    // ---- 10. top_p: keep i iff Σ_{kept j: q_j > q_i} q_j < top_p · Q.
    if (P.top_p < 1.0) {
      const uint64_t cutoff =
          TopPCutoff(q, keep, V, std::max<uint64_t>(1, Frac32(P.top_p)), S, s.pairs);
      for (int64_t i = 0; i < V; ++i) keep[i] &= q[i] >= cutoff;
    }
    // ---- 11. two-level fixed-point draw.
    const int64_t nb = (V + kBlock - 1) / kBlock;
    s.blocks.assign(static_cast<size_t>(nb), 0);
    uint64_t Q = 0;
    for (int64_t b = 0; b < nb; ++b) {
      uint64_t sum = 0;
      const int64_t end = std::min<int64_t>((b + 1) * kBlock, V);
      for (int64_t i = b * kBlock; i < end; ++i) sum += keep[i] ? q[i] : 0;
      s.blocks[static_cast<size_t>(b)] = sum;
      Q += sum;
    }
    DI_CHECK(Q > 0);
    const uint64_t u = PhiloxUniform64(st.seed(), static_cast<uint64_t>(pos), 0, 0);
    uint64_t r = static_cast<uint64_t>((static_cast<u128>(u) * Q) >> 64);
    int64_t b = 0;
    while (r >= s.blocks[static_cast<size_t>(b)]) r -= s.blocks[static_cast<size_t>(b++)];
    int64_t id = b * kBlock;
    for (;; ++id) {
      const uint64_t qi = keep[id] ? q[id] : 0;
      if (r < qi) break;
      r -= qi;
    }
    res.token_id = static_cast<int32_t>(id);
  }

  if (!P.logprobs) return res;

  // ---- logprobs.
  const int64_t num_top = *P.logprobs;
  const LogprobsMode mode = config_.logprobs_mode;
  if (mode == LogprobsMode::kRawLogprobs || mode == LogprobsMode::kRawLogits) {
    const float rm = raw_scan.max;
    if (mode == LogprobsMode::kRawLogits) {
      res.logprobs = BuildLogprobs(raw, V, res.token_id, num_top,
                                   [raw](int64_t i) { return (double)raw[i]; }, s.idx);
    } else {
      const double rmd = rm;
      const double lse = LogSumExpShifted(raw, V, rmd, 1.0);
      res.logprobs = BuildLogprobs(raw, V, res.token_id, num_top,
                                   [raw, rmd, lse](int64_t i) {
                                     return raw[i] == kNegInf ? -HUGE_VAL
                                                              : ((double)raw[i] - rmd) - lse;
                                   },
                                   s.idx);
    }
    return res;
  }
  // Processed: key = x over kept ids, −inf elsewhere.
  s.key.assign(x, x + V);
  if (!greedy)
    for (int64_t i = 0; i < V; ++i)
      if (!s.keep[i]) s.key[i] = kNegInf;
  const float* key = s.key.data();
  const double T = greedy ? 1.0 : P.temperature;
  const double md = m;
  if (mode == LogprobsMode::kProcessedLogits) {
    const float Tf = static_cast<float>(P.temperature);
    res.logprobs = BuildLogprobs(key, V, res.token_id, num_top,
                                 [key, greedy, Tf](int64_t i) {
                                   if (key[i] == kNegInf) return -HUGE_VAL;
                                   return (double)(greedy ? key[i] : key[i] / Tf);
                                 },
                                 s.idx);
  } else {
    const double lse = LogSumExpShifted(key, V, md, T);
    res.logprobs = BuildLogprobs(key, V, res.token_id, num_top,
                                 [key, md, T, lse](int64_t i) {
                                   return key[i] == kNegInf ? -HUGE_VAL
                                                            : ((double)key[i] - md) / T - lse;
                                 },
                                 s.idx);
  }
  return res;
}

std::vector<SampleOutcome> Sampler::SampleBatch(const float* logits, int64_t row_stride,
                                                std::span<const SamplingState* const> states) const {
  const int64_t n = static_cast<int64_t>(states.size());
  std::vector<SampleOutcome> out(static_cast<size_t>(n));
  if (n > 0 && row_stride < config_.vocab_size)
    Fail(ErrorKind::kInvalidArgument, "SampleBatch: row_stride {} is smaller than vocab_size {}",
         row_stride, config_.vocab_size);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < n; ++r) {
    SampleOutcome& o = out[static_cast<size_t>(r)];
    try {
      if (states[r] == nullptr)
        Fail(ErrorKind::kInvalidArgument, "SampleBatch: row {} has no sampling state", r);
      o.result = Sample(std::span<const float>(logits + r * row_stride,
                                               static_cast<size_t>(config_.vocab_size)),
                        *states[r]);
    } catch (const Error& e) {
      o.error = e;
    } catch (const std::exception& e) {
      o.error = Error(ErrorKind::kInternal, fmt::format("sampling row {} failed: {}", r, e.what()));
    }
  }
  return out;
}

LogprobsEntry Sampler::PromptLogprobs(std::span<const float> logits, int32_t next_token_id,
                                      int64_t num_top) const {
  const int64_t V = config_.vocab_size;
  if (static_cast<int64_t>(logits.size()) != V)
    Fail(ErrorKind::kInvalidArgument, "prompt logits row has {} entries, expected vocab_size {}",
         logits.size(), V);
  if (next_token_id < 0 || next_token_id >= V)
    Fail(ErrorKind::kOutOfRange, "prompt token {} is outside the vocabulary [0, {})", next_token_id,
         V);
  if (num_top < -1) Fail(ErrorKind::kInvalidArgument, "prompt_logprobs must be >= -1, got {}", num_top);
  const float* raw = logits.data();
  float rm = kNegInf;
  for (int64_t i = 0; i < V; ++i) {
    if (BadLogit(raw[i]))
      Fail(ErrorKind::kInternal, "prompt logits contain {} at token id {}",
           std::isnan(raw[i]) ? "NaN" : "+Inf", i);
    rm = std::max(rm, raw[i]);
  }
  if (rm == kNegInf)
    Fail(ErrorKind::kInternal, "prompt logits are -inf for every token id");
  const double rmd = rm;
  const double lse = LogSumExpShifted(raw, V, rmd, 1.0);
  return BuildLogprobs(raw, V, next_token_id, num_top,
                       [raw, rmd, lse](int64_t i) {
                         return raw[i] == kNegInf ? -HUGE_VAL : ((double)raw[i] - rmd) - lse;
                       },
                       ThreadScratch().idx);
}

}  // namespace deepinfer
