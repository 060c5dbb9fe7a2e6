#include "sampling/stop_checker.h"

#include <algorithm>

#include "base/error.h"

namespace deepinfer {

StopChecker::StopChecker(std::vector<std::string> stop, bool include_stop_str_in_output,
                         int64_t min_tokens)
    : stop_(std::move(stop)), include_(include_stop_str_in_output), min_tokens_(min_tokens) {
  for (size_t i = 0; i < stop_.size(); ++i) {
    if (stop_[i].empty())
      Fail(ErrorKind::kInvalidArgument, "stop cannot contain an empty string (stop[{}])", i);
    max_len_ = std::max(max_len_, stop_[i].size());
  }
}

StopChecker::StopChecker(const SamplingParams& params)
    : StopChecker(params.stop, params.include_stop_str_in_output, params.min_tokens) {}

StopUpdate StopChecker::Append(std::string_view delta, int64_t num_output_tokens) {
  if (stopped_)
    Fail(ErrorKind::kInternal, "StopChecker::Append called after stop string \"{}\" matched",
         stop_[static_cast<size_t>(stop_index_)]);
  StopUpdate u;
  std::string buf = window_;
  buf.append(delta);
  const size_t base = window_.size();      // delta starts here
  const size_t unemitted = base - held_;   // first byte not yet emitted

  // A match must end inside the delta (earlier ends were examined before).
  if (num_output_tokens > min_tokens_ && !stop_.empty()) {
    for (size_t e = base + 1; e <= buf.size(); ++e) {
      int best = -1;
      size_t best_len = 0;
      for (size_t i = 0; i < stop_.size(); ++i) {
        const std::string& s = stop_[i];
        if (s.size() <= e && s.size() > best_len && buf.compare(e - s.size(), s.size(), s) == 0) {
          best = static_cast<int>(i);
          best_len = s.size();
        }
      }
      if (best < 0) continue;
      const size_t start = e - best_len;
      // Without include, the held-back suffix covers every partial match, so
      // the stop string never begins in text already emitted.
      DI_CHECK(include_ || start >= unemitted);
      const size_t to = include_ ? e : start;
      if (to > unemitted) u.text = buf.substr(unemitted, to - unemitted);
      u.stopped = true;
      u.stop_index = best;
      stopped_ = true;
      stop_index_ = best;
      held_ = 0;
      window_.clear();
      return u;
    }
  }

  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  if (!include_ && max_len_ > 1) {
    for (size_t len = std::min(max_len_ - 1, buf.size()); len > 0 && hold == 0; --len)
      for (const std::string& s : stop_)
        if (s.size() > len && buf.compare(buf.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
  }
  DI_CHECK(buf.size() - hold >= unemitted);
  u.text = buf.substr(unemitted, buf.size() - hold - unemitted);
  held_ = hold;
  const size_t keep = max_len_ > 0 ? max_len_ - 1 : 0;
  window_ = buf.size() > keep ? buf.substr(buf.size() - keep) : std::move(buf);
  return u;
}

std::string StopChecker::Flush() {
  std::string out = window_.substr(window_.size() - held_);
  held_ = 0;
  return out;
}

std::optional<std::string> StopChecker::stop_reason() const {
  if (!stopped_) return std::nullopt;
  return stop_[static_cast<size_t>(stop_index_)];
}

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
  }
  return "";
}

TokenStop CheckTokenStop(const SamplingParams& params, std::span<const int32_t> eos_token_ids,
                         int32_t last_token_id, int64_t num_output_tokens, int64_t num_tokens,
                         int64_t max_model_len) {
  TokenStop r;
  if ((params.max_tokens && num_output_tokens >= *params.max_tokens) ||
      (max_model_len > 0 && num_tokens >= max_model_len)) {
    r.reason = FinishReason::kLength;
    return r;
  }
  if (!params.ignore_eos &&
      std::find(eos_token_ids.begin(), eos_token_ids.end(), last_token_id) != eos_token_ids.end()) {
    r.reason = FinishReason::kStop;
    return r;
  }
  for (int64_t id : params.stop_token_ids)
    if (id == last_token_id) {
      r.reason = FinishReason::kStop;
      r.stop_token_id = last_token_id;
      return r;
    }
  return r;
}

}  // namespace deepinfer
