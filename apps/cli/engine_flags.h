// Engine and sampling flags shared by `deepinfer generate` and `deepinfer serve`
// (vLLM's engine-argument names; OpenAI/vLLM sampling names).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "deepinfer/engine.h"

namespace deepinfer::cli {

// CLI11 check: an integer >= 0 (message "must be >= 0, got X").
inline CLI::Validator NonNegativeInt() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long x = std::stoll(v, &used);
          if (used == v.size() && x >= 0) return {};
        } catch (const std::exception&) {
        }
        return "must be an integer >= 0, got " + v;
      },
      "INT>=0");
}

struct EngineFlags {
  EngineArgs args;
  std::string kv_cache_memory;  // "4GiB", "512MiB", or bytes
  std::string prefill_buckets, decode_buckets, logprobs_mode = "raw_logprobs";
  // Turns the parsed strings into args; throws Error naming the flag.
  EngineArgs Resolve() const;
};
void AddEngineFlags(CLI::App* cmd, EngineFlags* f);

// Sampling defaults given on the command line. Only flags the user set end up
// in the JSON, so per-request fields and SamplingParams defaults fill the rest.
struct SamplingFlags {
  nlohmann::json given = nlohmann::json::object();
};
void AddSamplingFlags(CLI::App* cmd, SamplingFlags* f);

// "1,2,4" → {1,2,4}; throws Error naming `flag` on a bad list.
std::vector<int64_t> ParseIntList(const std::string& s, const char* flag);
// "4GiB" / "512MiB" / "1000000" → bytes; throws Error naming `flag`.
int64_t ParseBytes(const std::string& s, const char* flag);

}  // namespace deepinfer::cli
