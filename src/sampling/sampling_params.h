// deepinfer/sampling/sampling_params.h — the per-request sampling parameters,
// with OpenAI / vLLM field names, defaults and ranges.
//
// Field names, defaults and allowed ranges follow vLLM's SamplingParams
// (vllm/sampling_params.py, _verify_args) and the OpenAI completions API:
//
//   field                       type / default    allowed
//   temperature                 double 1.0        [0, +inf), finite; 0 = greedy
//   top_p                       double 1.0        (0, 1]; 1 = off
//   top_k                       int   -1          -1 or 0 = off, or >= 1; 1 = greedy
//   min_p                       double 0.0        [0, 1]; 0 = off
//   presence_penalty            double 0.0        [-2, 2]
//   frequency_penalty           double 0.0        [-2, 2]
//   repetition_penalty          double 1.0        (0, +inf), finite; 1 = off
//   logit_bias                  {id: bias} {}     ids in [0, vocab), bias in [-100, 100]
//   seed                        int64 or null     any int64; null = the engine draws one
//   max_tokens                  int or null 16    >= 1; null = up to the model's context
//   min_tokens                  int 0             [0, max_tokens]
//   stop                        [string] []       no empty string (JSON: a string or a list)
//   stop_token_ids              [int] []          ids in [0, vocab)
//   include_stop_str_in_output  bool false
//   ignore_eos                  bool false
//   logprobs                    int or null       null = none; -1 = whole vocabulary;
//                                                 else [0, max_logprobs] (top-N per output token)
//   prompt_logprobs             int or null       same range as logprobs
//
// vLLM deviation: vLLM raises temperatures in (0, 0.01) to 0.01 to avoid
// NaN/Inf in its fp32 softmax. DeepInfer's sampler computes the distribution
// in double and fixed point (sampler.h), so tiny temperatures are exact and
// are used as given; only temperature == 0 is greedy.
//
// Errors: Validate() and FromJson() throw deepinfer::Error(kInvalidArgument)
// with a one-line message that names the field, the allowed range and the
// value found. The HTTP server maps these to a 400.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer {

// Model/engine facts the range checks need. vocab_size 0 = unknown (token-id
// range checks are skipped). max_logprobs is vLLM's --max-logprobs engine
// argument (default 20); -1 = no limit.
struct SamplingLimits {
  int64_t vocab_size = 0;
  int64_t max_logprobs = 20;
};

struct SamplingParams {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = -1;
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::map<int64_t, double> logit_bias;  // token id → additive bias
  std::optional<int64_t> seed;
  std::optional<int64_t> max_tokens = 16;
  int64_t min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  std::optional<int64_t> logprobs;
  std::optional<int64_t> prompt_logprobs;

  // True when the token is chosen by argmax (temperature 0 or top_k 1); ties
  // go to the lowest token id.
  bool IsGreedy() const { return temperature == 0.0 || top_k == 1; }

  // Throws Error(kInvalidArgument) naming the first field out of range, e.g.
  // "top_p must be in (0, 1], got 1.5".
  void Validate(const SamplingLimits& limits = {}) const;

  // Reads the fields above from a JSON object, starting from `defaults` (so a
  // per-request line overrides command-line defaults field by field). A
  // missing key or a JSON null keeps the default (for seed, max_tokens,
  // logprobs and prompt_logprobs, null means "none"). Keys not listed above
  // are ignored (they are the caller's business). Wrong types throw
  // Error(kInvalidArgument) naming the field, e.g.
  // "temperature: expected a number, found string". Integers may be written
  // as integral numbers (5.0). logit_bias keys are decimal token ids
  // ("50256"). The result is validated with Validate(limits).
  static SamplingParams FromJson(const nlohmann::json& j, const SamplingParams& defaults,
                                 const SamplingLimits& limits = {});
  static SamplingParams FromJson(const nlohmann::json& j);  // defaults = SamplingParams{}

  // Every field as JSON, with the names above (seed/max_tokens/logprobs/
  // prompt_logprobs are null when unset). FromJson(ToJson()) round-trips.
  nlohmann::json ToJson() const;
};

// A fresh seed for a request that gave none, from std::random_device: uniform
// in [0, 2^53 - 1], so it survives a JSON round trip through an IEEE double
// (JavaScript clients). The engine stores it in the request's SamplingState
// and reports it with the output so the output can be replayed.
int64_t FreshSeed();

// params.seed if set, else FreshSeed().
int64_t ResolveSeed(const SamplingParams& params);

}  // namespace deepinfer
