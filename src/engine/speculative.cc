#include "engine/speculative.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace deepinfer {

namespace {

constexpr const char* kFlag = "--speculative-config";

int ReadInt(const nlohmann::json& j, const char* field) {
  const nlohmann::json& v = j.at(field);
  if (!v.is_number_integer())
    Fail(ErrorKind::kInvalidArgument, "{}: field '{}' must be an integer, got {}", kFlag, field, v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < 0 || x > 1024)
    Fail(ErrorKind::kInvalidArgument, "{}: field '{}' = {} is out of range [0, 1024]", kFlag, field, x);
  return static_cast<int>(x);
}

}  // namespace

SpeculativeConfig ParseSpeculativeConfig(const std::string& text) {
  SpeculativeConfig c;
  if (text.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    Fail(ErrorKind::kInvalidArgument, "{}: not valid JSON ({}): {}", kFlag, e.what(), text);
  }
  if (!j.is_object()) Fail(ErrorKind::kInvalidArgument, "{}: expected a JSON object, got {}", kFlag, j.dump());
  for (const auto& [key, value] : j.items()) {
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_min" &&
        key != "prompt_lookup_max")
      Fail(ErrorKind::kInvalidArgument,
           "{}: unknown field '{}' (known: method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)",
           kFlag, key);
  }
  if (!j.contains("method") || !j["method"].is_string())
    Fail(ErrorKind::kInvalidArgument, "{}: field 'method' (a string: \"ngram\", \"mtp\" or \"dspark\") is required",
         kFlag);
  c.method = j["method"].get<std::string>();
  if (c.method != "ngram" && c.method != "mtp" && c.method != "dspark")
    Fail(ErrorKind::kInvalidArgument, "{}: unknown method '{}' (expected \"ngram\", \"mtp\" or \"dspark\")", kFlag,
         c.method);
  if (!j.contains("num_speculative_tokens"))
    Fail(ErrorKind::kInvalidArgument, "{}: field 'num_speculative_tokens' is required", kFlag);
  c.num_speculative_tokens = ReadInt(j, "num_speculative_tokens");
  if (c.num_speculative_tokens < 1)
    Fail(ErrorKind::kInvalidArgument, "{}: num_speculative_tokens must be >= 1, got {}", kFlag,
         c.num_speculative_tokens);
  const bool has_min = j.contains("prompt_lookup_min"), has_max = j.contains("prompt_lookup_max");
  if (c.method != "ngram" && (has_min || has_max))
    Fail(ErrorKind::kInvalidArgument, "{}: prompt_lookup_min/max apply to method \"ngram\" only", kFlag);
  if (has_min) c.prompt_lookup_min = ReadInt(j, "prompt_lookup_min");
  if (has_max) c.prompt_lookup_max = ReadInt(j, "prompt_lookup_max");
  if (c.method == "ngram") {
    // vLLM: either bound alone sets both.
    if (has_min && !has_max) c.prompt_lookup_max = c.prompt_lookup_min;
    if (has_max && !has_min) c.prompt_lookup_min = c.prompt_lookup_max;
    if (!has_min && !has_max) c.prompt_lookup_max = c.prompt_lookup_min;
    if (c.prompt_lookup_min < 1)
      Fail(ErrorKind::kInvalidArgument, "{}: prompt_lookup_min must be >= 1, got {}", kFlag, c.prompt_lookup_min);
    if (c.prompt_lookup_max < c.prompt_lookup_min)
      Fail(ErrorKind::kInvalidArgument, "{}: prompt_lookup_max ({}) must be >= prompt_lookup_min ({})", kFlag,
           c.prompt_lookup_max, c.prompt_lookup_min);
  }
  return c;
}

void ValidateSpeculativeConfig(const SpeculativeConfig& spec, const ModelConfig& cfg) {
  if (!spec.enabled()) return;
  if (spec.num_speculative_tokens + 1 > cfg.window_size)
    Fail(ErrorKind::kInvalidArgument,
         "{}: num_speculative_tokens {} + 1 rows exceed the model's sliding_window {} (rollback needs distinct ring "
         "slots)",
         kFlag, spec.num_speculative_tokens, cfg.window_size);
  if (spec.method == "mtp") {
    if (cfg.arch != Arch::kDeepseekV4 || cfg.n_mtp_layers == 0)
      Fail(ErrorKind::kInvalidArgument,
           "{}: method \"mtp\" needs a deepseek_v4 model with an MTP block (num_nextn_predict_layers > 0); this model "
           "is {} with {} MTP layers{}",
           kFlag, cfg.model_type, cfg.n_mtp_layers,
           cfg.arch == Arch::kDeepseekV4 ? "" : " (V4.1's mtp.* layers are the DSpark drafter: use \"dspark\")");
    if (spec.num_speculative_tokens != 1)
      Fail(ErrorKind::kInvalidArgument,
           "{}: method \"mtp\" drafts one token per step (the one MTP layer): num_speculative_tokens must be 1, got {}",
           kFlag, spec.num_speculative_tokens);
  }
  if (spec.method == "dspark") {
    if (cfg.n_mtp_layers == 0 || cfg.dspark_block_size < 2)
      Fail(ErrorKind::kInvalidArgument,
           "{}: method \"dspark\" needs a model with a DSpark drafter (num_nextn_predict_layers > 0 and "
           "dspark_block_size >= 2); this model ({}) has none",
           kFlag, cfg.model_type);
    if (spec.num_speculative_tokens > cfg.dspark_block_size - 1)
      Fail(ErrorKind::kInvalidArgument, "{}: num_speculative_tokens {} exceeds dspark_block_size - 1 = {}", kFlag,
           spec.num_speculative_tokens, cfg.dspark_block_size - 1);
  }
}

DraftProposal NgramProposer::Propose(std::span<const int32_t> tokens, int max_drafts) const {
  DraftProposal out;
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  if (max_drafts < 1) return out;
  for (int n = max_n_; n >= min_n_; --n) {
    if (n >= n_tok) continue;  // the pattern needs an earlier occurrence
    const int32_t* pat = tokens.data() + n_tok - n;
    // Most recent earlier occurrence: start i < n_tok - n.
    for (int64_t i = n_tok - n - 1; i >= 0; --i) {
      if (!std::equal(pat, pat + n, tokens.data() + i)) continue;
      const int64_t from = i + n;  // tokens after the match
      const int64_t count = std::min<int64_t>(max_drafts, n_tok - from);
      out.ids.assign(tokens.begin() + from, tokens.begin() + from + count);
      return out;
    }
  }
  return out;
}

std::unique_ptr<Proposer> MakeProposer(const SpeculativeConfig& spec) {
  if (spec.method == "ngram") return std::make_unique<NgramProposer>(spec.prompt_lookup_min, spec.prompt_lookup_max);
  Fail(ErrorKind::kInvalidArgument, "{}: method \"{}\" has no token-level proposer (it is a model drafter)", kFlag,
       spec.method);
}

}  // namespace deepinfer
