// Test helpers: bit-exact comparison of logprobs entries and prompt_logprobs
// lists (engine_test, prompt_logprobs_tiny_test).
#pragma once

#include <cstring>
#include <optional>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::test_util {

using PromptLp = std::vector<std::optional<LogprobsEntry>>;

// Same token, same rank, and the same logprob bits.
inline bool SameLp(const TokenLogprob& x, const TokenLogprob& y) {
  return x.token_id == y.token_id && std::memcmp(&x.logprob, &y.logprob, sizeof(float)) == 0 && x.rank == y.rank;
}

inline bool SameEntry(const LogprobsEntry& a, const LogprobsEntry& b) {
  if (!SameLp(a.chosen, b.chosen) || a.top.size() != b.top.size()) return false;
  for (size_t i = 0; i < a.top.size(); ++i)
    if (!SameLp(a.top[i], b.top[i])) return false;
  return true;
}

// Same length, null at the same positions, every entry bit-identical.
inline bool SamePromptLp(const PromptLp& a, const PromptLp& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].has_value() != b[i].has_value()) return false;
    if (a[i] && !SameEntry(*a[i], *b[i])) return false;
  }
  return true;
}

}  // namespace deepinfer::test_util
