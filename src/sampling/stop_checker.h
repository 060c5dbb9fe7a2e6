// deepinfer/sampling/stop_checker.h — when a request stops, and what text may
// be shown before it does.
//
// 1. StopChecker: incremental stop-string matching on detokenized text
//    (vLLM's `stop` / `include_stop_str_in_output`). Feed it each text delta
//    produced by the detokenizer; it returns the text that is safe to emit now.
//
//    Holding back. Without include_stop_str_in_output, the longest suffix of
//    the text seen so far that is a proper prefix of some stop string is held
//    back (it could still become a stop string, whose text must never be
//    shown); it is released as soon as it can no longer start a match, or by
//    Flush() when the request ends for another reason. With
//    include_stop_str_in_output the stop string is part of the output, so
//    nothing is held back.
//
//    Matching rule (independent of how the text is split into deltas): the
//    request stops at the first position in the text where some stop string
//    ends; if several end there, the longest one (earliest start) wins, and
//    among equal strings the lowest index in `stop`. The output is the text
//    before that occurrence (plus the stop string itself with
//    include_stop_str_in_output); everything after it is discarded.
//    vLLM differs only when several stop strings match in one delta (it takes
//    the first in list order).
//
//    min_tokens (vLLM): a stop string counts only if it ends in text produced
//    by output token number > min_tokens (1-based); earlier occurrences are
//    ordinary text.
//
//    Streaming and non-streaming use the same object: a non-streaming caller
//    concatenates what Append/Flush return. Matching is on bytes (UTF-8
//    stop strings against UTF-8 text; the detokenizer only emits complete
//    characters, and a held-back suffix always starts at a character boundary
//    because a stop string starts with one).
//
// 2. CheckTokenStop: token-level finish conditions, in vLLM v1's order
//    (vllm/v1/core/sched/utils.py check_stop): length first, then EOS (unless
//    ignore_eos), then stop_token_ids. min_tokens needs no check here: the
//    sampler blocks EOS and stop_token_ids until min_tokens tokens exist.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/sampling_params.h"

namespace deepinfer {

struct StopUpdate {
  std::string text;        // safe to emit now (may be empty)
  bool stopped = false;    // a stop string matched: the request is finished
  int stop_index = -1;     // index into `stop` of the matched string, or -1
};

class StopChecker {
 public:
  // Stop strings must be non-empty (Error(kInvalidArgument) naming stop[i]).
  StopChecker(std::vector<std::string> stop, bool include_stop_str_in_output,
              int64_t min_tokens = 0);
  // From a request's parameters (stop, include_stop_str_in_output, min_tokens).
  explicit StopChecker(const SamplingParams& params);

  // `delta`: the text the detokenizer produced for output token number
  // `num_output_tokens` (1-based count of output tokens including this one).
  // Throws Error(kInternal) if called after a stop string matched.
  StopUpdate Append(std::string_view delta, int64_t num_output_tokens);

  // The request finished for another reason (EOS, stop token, length, abort):
  // returns the held-back text, which can no longer become a stop string.
  // Returns "" after a stop-string match.
  std::string Flush();

  bool stopped() const { return stopped_; }
  // The matched stop string (vLLM's stop_reason), if any.
  std::optional<std::string> stop_reason() const;
  // Bytes currently held back.
  size_t held_bytes() const { return held_; }

 private:
  std::vector<std::string> stop_;
  bool include_;
  int64_t min_tokens_;
  size_t max_len_ = 0;    // longest stop string
  std::string window_;    // last (max_len_ − 1) bytes of text seen (matching context)
  size_t held_ = 0;       // bytes at the end of window_ not yet emitted
  bool stopped_ = false;
  int stop_index_ = -1;
};

enum class FinishReason { kNone, kStop, kLength };
const char* FinishReasonName(FinishReason r);  // "", "stop", "length" (OpenAI finish_reason)

struct TokenStop {
  FinishReason reason = FinishReason::kNone;
  std::optional<int32_t> stop_token_id;  // set when a stop_token_ids entry matched
};

// Called after `last_token_id` was accepted. num_output_tokens includes it;
// num_tokens = prompt + output tokens; max_model_len <= 0 = no context limit.
TokenStop CheckTokenStop(const SamplingParams& params, std::span<const int32_t> eos_token_ids,
                         int32_t last_token_id, int64_t num_output_tokens, int64_t num_tokens,
                         int64_t max_model_len);

}  // namespace deepinfer
