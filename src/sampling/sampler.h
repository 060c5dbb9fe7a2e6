// deepinfer/sampling/sampler.h — exactly reproducible token sampling.
//
// Contract: the token chosen for a request depends only on
//   (logits row, SamplingParams, seed, output position, token history, bitmask)
// and never on the batch slot, the batch size, the thread count, the rank or
// the machine (any IEEE-754 binary64 platform without fused multiply-add in
// the code below; see "Platform independence").
//
// ---------------------------------------------------------------------------
// Processing order (vLLM v1, vllm/v1/sample/sampler.py; the structured-output
// bitmask is applied by vLLM's model runner before the sampler)
//
//   raw logits (fp32 [vocab])
//     ├─ raw logprobs / raw logits are taken here (LogprobsMode kRaw*)
//   1. token bitmask        disallowed ids → −inf            (structured output)
//   2. min_tokens           while num_output_tokens < min_tokens, the EOS ids and
//                           stop_token_ids → −inf
//   3. logit_bias           x += float(bias)                  (fp32 add)
//   4. penalties            (fp32, vLLM's formulas and order)
//        repetition_penalty r, ids seen in prompt or output: x > 0 ? x / r : x · r
//        frequency_penalty  f, ids in output with count c:   x −= float(f) · float(c)
//        presence_penalty   p, ids in output:                x −= float(p)
//   5. greedy               temperature == 0 or top_k == 1: argmax, ties → lowest id
//   6. temperature          d_i = (double(x_i) − double(m)) / T   (m = max x)
//   7. fixed-point weights  q_i = floor(Exp(d_i) · 2^S)  (below)
//   8. min_p                keep q_i · 2^32 >= round(min_p · 2^32) · q_max
//   9. top_k                keep x_i >= (k-th largest x)  (ties at the k-th value kept, as vLLM;
//                           evaluated before step 7, which it commutes with, so that
//                           weights are only computed for the survivors)
//  10. top_p                keep i iff Σ_{kept j: q_j > q_i} q_j < top_p · Q
//                           (Q = Σ kept q; exact: compared as 128-bit integers with
//                           top_p rounded to a multiple of 2^-32, at least 2^-32)
//  11. draw                 two-level fixed-point inverse CDF (below)
//     └─ processed logprobs / logits are taken here (LogprobsMode kProcessed*)
//
// Notes on the order. The bitmask and min_tokens only write −inf, so they
// commute with 3–4. min_p (a ratio to the top probability) and top_k are both
// "keep an upper set of the ranking" filters and commute; only top_p depends
// on what was removed before it (vLLM v1 applies min_p, then top_k, then
// top_p on the renormalised remainder; vLLM v0 applied min_p last). Every
// comparison in 8–10 is an exact integer comparison, so a filter decision
// cannot differ between machines.
//
// Differences from vLLM, all deliberate: ties at a top_p boundary are kept or
// dropped together (the issue's rule: "keep a token while the sum of the
// probabilities strictly larger than it is below top_p"); greedy and top_k = 1
// break ties by lowest id (torch.argmax/topk do not specify); temperatures in
// (0, 0.01) are not raised to 0.01 (see sampling_params.h).
//
// ---------------------------------------------------------------------------
// Fixed-point two-level sampling (steps 6, 7, 11)
//
//   S = 63 − bit_width(vocab_size)       (46 for DeepSeek's 129280), so
//                                        Σ_i q_i <= vocab · 2^S < 2^63.
//   q_i = floor(Exp(d_i) · 2^S)          d_i <= 0, Exp(0) = 1 exactly, so the top
//                                        token has q = 2^S; tokens with
//                                        Exp(d_i) < 2^−S get q = 0 and cannot be
//                                        drawn (their total mass is below
//                                        vocab · 2^−S relative to the top token:
//                                        < 2^−29 for 129280 ids).
//   Blocks of 1024 consecutive ids: B_b = Σ_{i in block b} q_i (kept ids only),
//   Q = Σ_b B_b. Integer sums are exact, so any summation order (threads, a GPU
//   tree reduction) gives the same Q and B_b.
//   u = PhiloxUniform64(seed, output position, draw 0)        (philox.h)
//   r = floor(u · Q / 2^64)              (128-bit product; r in [0, Q))
//   block: the b with Σ_{c<b} B_c <= r < Σ_{c<=b} B_c; then within block b the id
//   with the same rule on the running sum of q. Token i is chosen with
//   probability q_i / Q up to an absolute error below 2^−64.
//
// Platform independence of the float → fixed conversion. Steps 1–4 are single
// IEEE fp32 operations (correctly rounded everywhere). Step 6 is one double
// subtraction and one double division. Exp is NOT libm's exp (whose last bit
// may differ between libm versions and between CPU and GPU): it is
// DeterministicExp below, a fixed sequence of IEEE double additions,
// multiplications and an exact power-of-two scaling, so with round-to-nearest
// and no operation fusing (this project compiles with -ffp-contract=off; a
// CUDA port must use __dadd_rn/__dmul_rn or -fmad=false) every machine gets
// the same bits, hence the same q_i, the same filters and the same token.
// Residual risk, stated honestly: (a) a platform that evaluates double
// expressions in extended precision (x87) or fuses them would differ — not the
// targets here; (b) the logits themselves must be bit-identical, which is the
// forward pass's job; (c) DeterministicExp differs from the true exponential by
// a few ulp (relative ~1e−15), a bias of that size in the target distribution.
//
// Logprobs are reported values, not decisions: log-sum-exp in double with
// DeterministicExp, a fixed summation order and libm's log (identical on one
// machine whatever the batch), rounded to float.
//
// ---------------------------------------------------------------------------
// Errors. A row containing NaN or +Inf (−Inf is allowed: "impossible token"),
// a row whose processing leaves no token (everything masked), or processing
// that overflows (e.g. repetition_penalty pushing a logit to +Inf) makes
// Sample() throw Error naming the request (state.request_id()), the output
// position, the reason and the token id. SampleBatch() catches it for that row
// only; the other rows are sampled normally.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "sampling/sampling_params.h"

namespace deepinfer {

// Which values `logprobs` reports (vLLM's --logprobs-mode, engine-wide).
enum class LogprobsMode {
  kRawLogprobs,        // log_softmax of the raw logits (default)
  kRawLogits,          // the raw logits
  kProcessedLogprobs,  // log_softmax over the tokens kept by steps 1–10 of the
                       // logits after temperature (−inf for removed tokens);
                       // greedy rows: log_softmax of the step-4 logits
  kProcessedLogits,    // x_i / float(T) (fp32) for kept tokens, −inf otherwise;
                       // greedy rows: the step-4 logits
};
const char* LogprobsModeName(LogprobsMode mode);  // "raw_logprobs", ...
// Parses vLLM's spelling; throws Error(kInvalidArgument) naming logprobs_mode.
LogprobsMode ParseLogprobsMode(const std::string& name);

// Per-request sampling state. The engine creates one when a request is
// admitted and keeps it for the request's lifetime (also across preemption:
// or rebuild it from (params, seed, prompt) and Accept() the output tokens).
class SamplingState {
 public:
  // `params` is validated (Validate with vocab_size, no logprob limit);
  // prompt ids must be in [0, vocab_size). `seed` is the resolved seed
  // (ResolveSeed). `request_id` is only used in error messages.
  SamplingState(SamplingParams params, int64_t seed, int64_t vocab_size,
                std::span<const int32_t> prompt_token_ids = {}, std::string request_id = "");

  const SamplingParams& params() const { return params_; }
  int64_t seed() const { return seed_; }
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& request_id() const { return request_id_; }
  // Number of output tokens accepted so far = output position of the next draw.
  int64_t num_output_tokens() const { return num_output_tokens_; }

  // Records a generated token: updates penalty counts, advances the output
  // position. Throws Error(kOutOfRange) for an id outside [0, vocab_size).
  void Accept(int32_t token_id);

  // Structured-output mask for the next Sample() call(s): ceil(vocab/32)
  // uint32 words, bit (id % 32) of word (id / 32) set = id allowed (xgrammar's
  // layout). Copied. Throws Error(kInvalidArgument) on a wrong word count.
  void SetTokenBitmask(std::span<const uint32_t> words);
  void ClearTokenBitmask() { bitmask_.clear(); }
  const std::vector<uint32_t>& token_bitmask() const { return bitmask_; }

  // Penalty bookkeeping (read by the sampler).
  bool uses_repetition_penalty() const { return params_.repetition_penalty != 1.0; }
  bool uses_count_penalties() const {
    return params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0;
  }
  const std::vector<int32_t>& seen_token_ids() const { return seen_ids_; }  // prompt ∪ output
  const std::unordered_map<int32_t, int64_t>& output_counts() const { return output_counts_; }

 private:
  void MarkSeen(int32_t id);

  SamplingParams params_;
  int64_t seed_;
  int64_t vocab_size_;
  std::string request_id_;
  int64_t num_output_tokens_ = 0;
  std::vector<uint32_t> bitmask_;
  std::vector<uint64_t> seen_bits_;  // only when repetition_penalty != 1
  std::vector<int32_t> seen_ids_;
  std::unordered_map<int32_t, int64_t> output_counts_;  // only when count penalties are on
};

struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;  // in the sampler's LogprobsMode
  int64_t rank = 0;      // 1 + number of ids ranked strictly above it: by raw logit
                         // (raw modes) or by processed logit, removed ids last
};

// logprobs of one position: the chosen (sampled or prompt) token and the top-N
// ids by value, descending, ties by lowest id (N = all ids for −1).
struct LogprobsEntry {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

struct SampleResult {
  int32_t token_id = -1;
  std::optional<LogprobsEntry> logprobs;  // set iff params.logprobs is set
};

struct SampleOutcome {
  SampleResult result;
  std::optional<Error> error;  // set: this row failed, `result` is meaningless
  bool ok() const { return !error.has_value(); }
};

struct SamplerConfig {
  int64_t vocab_size = 0;               // logits row length, in [1, 2^31 − 1]
  std::vector<int32_t> eos_token_ids;   // blocked while min_tokens is not reached
  LogprobsMode logprobs_mode = LogprobsMode::kRawLogprobs;
};

class Sampler {
 public:
  // Throws Error(kInvalidArgument) for a bad vocab size or EOS id.
  explicit Sampler(SamplerConfig config);
  const SamplerConfig& config() const { return config_; }

  // Samples the token at output position state.num_output_tokens() from one
  // fp32 logits row of vocab_size entries. Pure: the state is not modified
  // (call state.Accept(token) to commit). Thread-safe (per-thread scratch).
  // Throws Error as described in "Errors".
  SampleResult Sample(std::span<const float> logits, const SamplingState& state) const;

  // One row per state: row r is logits + r · row_stride (row_stride >=
  // vocab_size floats). Rows are independent (OpenMP over rows); a failing row
  // gets its error in outcome.error and never affects another row.
  std::vector<SampleOutcome> SampleBatch(const float* logits, int64_t row_stride,
                                         std::span<const SamplingState* const> states) const;

  // prompt_logprobs for one prompt position: raw log_softmax of `logits` (the
  // row predicting the next prompt token), the logprob and rank of
  // `next_token_id`, and the top `num_top` ids (−1 = all). Always raw
  // (vLLM computes prompt logprobs from the raw logits). Throws on NaN/+Inf.
  LogprobsEntry PromptLogprobs(std::span<const float> logits, int32_t next_token_id,
                               int64_t num_top) const;

 private:
  SamplerConfig config_;
  int fixed_point_shift_;  // S above
};

// The sampler's exponential for x <= 0 (see "Platform independence"):
// x = k·ln2 + r (Cody–Waite, |r| <= ln2/2), a degree-13 Taylor polynomial in
// Horner form, then an exact scaling by 2^k. Returns 0 for x < −700 or x =
// −inf, 1 for x = 0. Relative error vs the true exp below 1e−15 on [−700, 0].
// Undefined for x > 0 or NaN (the sampler never passes them).
double DeterministicExp(double x);

}  // namespace deepinfer
