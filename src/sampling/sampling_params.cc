#include "sampling/sampling_params.h"

#include <cmath>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace deepinfer {
namespace {

[[noreturn]] void Bad(const std::string& msg) { throw Error(ErrorKind::kInvalidArgument, msg); }

// Formats a double for messages: shortest round-trip form.
std::string Num(double v) { return fmt::format("{}", v); }

void CheckTokenId(const char* field, int64_t id, const SamplingLimits& limits) {
  if (id < 0 || (limits.vocab_size > 0 && id >= limits.vocab_size)) {
    if (limits.vocab_size > 0)
      Bad(fmt::format("{} token id must be in [0, {}), got {}", field, limits.vocab_size, id));
    Bad(fmt::format("{} token id must be >= 0, got {}", field, id));
  }
}

void CheckLogprobCount(const char* field, int64_t n, const SamplingLimits& limits) {
  if (n < -1) Bad(fmt::format("{} must be -1 (whole vocabulary) or >= 0, got {}", field, n));
  if (limits.max_logprobs < 0) return;  // no limit
  // -1 means the whole vocabulary (vLLM); it counts as vocab_size (unknown → unlimited).
  const int64_t wanted = n == -1 ? (limits.vocab_size > 0 ? limits.vocab_size
                                                          : std::numeric_limits<int64_t>::max())
                                 : n;
  if (wanted > limits.max_logprobs)
    Bad(fmt::format("{} must be in [0, {}] (the engine's max_logprobs), got {}", field,
                    limits.max_logprobs, n));
}

// ---- JSON readers: each names the field in its error.
const char* TypeName(const nlohmann::json& v) { return v.type_name(); }

double ReadNumber(const nlohmann::json& v, const char* field) {
  if (!v.is_number()) Bad(fmt::format("{}: expected a number, found {}", field, TypeName(v)));
  return v.get<double>();
}

int64_t ReadInt(const nlohmann::json& v, const char* field) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        Bad(fmt::format("{}: integer {} is out of the int64 range", field, u));
      return static_cast<int64_t>(u);
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // Accept integral floats (5.0) strictly inside the int64 range. A float
    // equal to -2^63 can only come from a literal below INT64_MIN (such as
    // -9223372036854775809, rounded): INT64_MIN itself parses as an integer.
    if (std::isfinite(d) && d == std::floor(d) && d > -9.2233720368547758e18 &&
        d < 9.2233720368547758e18)
      return static_cast<int64_t>(d);
    Bad(fmt::format("{}: expected an integer, found {}", field, Num(d)));
  }
  Bad(fmt::format("{}: expected an integer, found {}", field, TypeName(v)));
}

bool ReadBool(const nlohmann::json& v, const char* field) {
  if (!v.is_boolean()) Bad(fmt::format("{}: expected true or false, found {}", field, TypeName(v)));
  return v.get<bool>();
}

std::vector<std::string> ReadStop(const nlohmann::json& v) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
    return out;
  }
  if (!v.is_array())
    Bad(fmt::format("stop: expected a string or a list of strings, found {}", TypeName(v)));
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      Bad(fmt::format("stop[{}]: expected a string, found {}", i, TypeName(v[i])));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::vector<int64_t> ReadIdList(const nlohmann::json& v, const char* field) {
  if (!v.is_array()) Bad(fmt::format("{}: expected a list of integers, found {}", field, TypeName(v)));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string name = fmt::format("{}[{}]", field, i);
    out.push_back(ReadInt(v[i], name.c_str()));
  }
  return out;
}

std::map<int64_t, double> ReadLogitBias(const nlohmann::json& v) {
  if (!v.is_object())
    Bad(fmt::format("logit_bias: expected an object {{\"token id\": bias}}, found {}", TypeName(v)));
  std::map<int64_t, double> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    // A decimal token id: optional '-', then digits only (the range is Validate's job).
    size_t start = (!key.empty() && key[0] == '-') ? 1 : 0;
    bool ok = key.size() > start && key.size() - start <= 18;
    for (size_t i = start; ok && i < key.size(); ++i) ok = key[i] >= '0' && key[i] <= '9';
    if (!ok) Bad(fmt::format("logit_bias: key \"{}\" is not a decimal token id", key));
    const int64_t id = std::stoll(key);
    const std::string name = fmt::format("logit_bias[\"{}\"]", key);
    out[id] = ReadNumber(it.value(), name.c_str());
  }
  return out;
}

}  // namespace

void SamplingParams::Validate(const SamplingLimits& limits) const {
  // Comparisons are written so that NaN fails them.
  if (!(temperature >= 0.0) || !std::isfinite(temperature))
    Bad(fmt::format("temperature must be in [0, +inf) and finite, got {}", Num(temperature)));
  if (!(top_p > 0.0 && top_p <= 1.0))
    Bad(fmt::format("top_p must be in (0, 1], got {}", Num(top_p)));
  if (top_k < -1 || top_k > std::numeric_limits<int32_t>::max())
    Bad(fmt::format("top_k must be -1 or 0 (off) or in [1, 2^31-1], got {}", top_k));
  if (!(min_p >= 0.0 && min_p <= 1.0))
    Bad(fmt::format("min_p must be in [0, 1], got {}", Num(min_p)));
  if (!(presence_penalty >= -2.0 && presence_penalty <= 2.0))
    Bad(fmt::format("presence_penalty must be in [-2, 2], got {}", Num(presence_penalty)));
  if (!(frequency_penalty >= -2.0 && frequency_penalty <= 2.0))
    Bad(fmt::format("frequency_penalty must be in [-2, 2], got {}", Num(frequency_penalty)));
  if (!(repetition_penalty > 0.0) || !std::isfinite(repetition_penalty))
    Bad(fmt::format("repetition_penalty must be in (0, +inf) and finite, got {}",
                    Num(repetition_penalty)));
  for (const auto& [id, bias] : logit_bias) {
    CheckTokenId("logit_bias", id, limits);
    if (!(bias >= -100.0 && bias <= 100.0))
      Bad(fmt::format("logit_bias value for token {} must be in [-100, 100], got {}", id, Num(bias)));
  }
  if (max_tokens && *max_tokens < 1)
    Bad(fmt::format("max_tokens must be at least 1 (or null), got {}", *max_tokens));
  if (min_tokens < 0) Bad(fmt::format("min_tokens must be >= 0, got {}", min_tokens));
  if (max_tokens && min_tokens > *max_tokens)
    Bad(fmt::format("min_tokens must be in [0, max_tokens={}], got {}", *max_tokens, min_tokens));
  for (size_t i = 0; i < stop.size(); ++i)
    if (stop[i].empty()) Bad(fmt::format("stop cannot contain an empty string (stop[{}])", i));
  for (int64_t id : stop_token_ids) CheckTokenId("stop_token_ids", id, limits);
  if (logprobs) CheckLogprobCount("logprobs", *logprobs, limits);
  if (prompt_logprobs) CheckLogprobCount("prompt_logprobs", *prompt_logprobs, limits);
}

SamplingParams SamplingParams::FromJson(const nlohmann::json& j, const SamplingParams& defaults,
                                        const SamplingLimits& limits) {
  if (!j.is_object())
    Bad(fmt::format("sampling parameters: expected a JSON object, found {}", TypeName(j)));
  SamplingParams p = defaults;
  auto get = [&](const char* key) -> const nlohmann::json* {
    auto it = j.find(key);
    if (it == j.end()) return nullptr;
    return &*it;
  };
  // Non-nullable fields: null keeps the default.
  auto number = [&](const char* key, double& dst) {
    if (const auto* v = get(key); v && !v->is_null()) dst = ReadNumber(*v, key);
  };
  auto integer = [&](const char* key, int64_t& dst) {
    if (const auto* v = get(key); v && !v->is_null()) dst = ReadInt(*v, key);
  };
  auto boolean = [&](const char* key, bool& dst) {
    if (const auto* v = get(key); v && !v->is_null()) dst = ReadBool(*v, key);
  };
  // Nullable fields: null means "none".
  auto opt_integer = [&](const char* key, std::optional<int64_t>& dst) {
    if (const auto* v = get(key)) {
      if (v->is_null())
        dst.reset();
      else
        dst = ReadInt(*v, key);
    }
  };

  number("temperature", p.temperature);
  number("top_p", p.top_p);
  integer("top_k", p.top_k);
  number("min_p", p.min_p);
  number("presence_penalty", p.presence_penalty);
  number("frequency_penalty", p.frequency_penalty);
  number("repetition_penalty", p.repetition_penalty);
  if (const auto* v = get("logit_bias"); v && !v->is_null()) p.logit_bias = ReadLogitBias(*v);
  opt_integer("seed", p.seed);
  opt_integer("max_tokens", p.max_tokens);
  integer("min_tokens", p.min_tokens);
  if (const auto* v = get("stop")) p.stop = v->is_null() ? std::vector<std::string>{} : ReadStop(*v);
  if (const auto* v = get("stop_token_ids"))
    p.stop_token_ids = v->is_null() ? std::vector<int64_t>{} : ReadIdList(*v, "stop_token_ids");
  boolean("include_stop_str_in_output", p.include_stop_str_in_output);
  boolean("ignore_eos", p.ignore_eos);
  if (const auto* v = get("logprobs"); v && v->is_boolean())
    Bad("logprobs: expected an integer (number of top logprobs per token) or null, found boolean "
        "(the chat API's boolean logprobs/top_logprobs pair is mapped by the server)");
  opt_integer("logprobs", p.logprobs);
  opt_integer("prompt_logprobs", p.prompt_logprobs);

  p.Validate(limits);
  return p;
}

SamplingParams SamplingParams::FromJson(const nlohmann::json& j) {
  return FromJson(j, SamplingParams{}, SamplingLimits{});
}

nlohmann::json SamplingParams::ToJson() const {
  nlohmann::json j;
  auto opt = [](const std::optional<int64_t>& v) -> nlohmann::json {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  j["temperature"] = temperature;
  j["top_p"] = top_p;
  j["top_k"] = top_k;
  j["min_p"] = min_p;
  j["presence_penalty"] = presence_penalty;
  j["frequency_penalty"] = frequency_penalty;
  j["repetition_penalty"] = repetition_penalty;
  nlohmann::json bias = nlohmann::json::object();
  for (const auto& [id, b] : logit_bias) bias[std::to_string(id)] = b;
  j["logit_bias"] = bias;
  j["seed"] = opt(seed);
  j["max_tokens"] = opt(max_tokens);
  j["min_tokens"] = min_tokens;
  j["stop"] = stop;
  j["stop_token_ids"] = stop_token_ids;
  j["include_stop_str_in_output"] = include_stop_str_in_output;
  j["ignore_eos"] = ignore_eos;
  j["logprobs"] = opt(logprobs);
  j["prompt_logprobs"] = opt(prompt_logprobs);
  return j;
}

int64_t FreshSeed() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();  // each at least 32 bits of entropy (unsigned int)
  const uint64_t bits = ((hi & 0xFFFFFFFFu) << 32) | (lo & 0xFFFFFFFFu);
  return static_cast<int64_t>(bits & ((uint64_t{1} << 53) - 1));
}

int64_t ResolveSeed(const SamplingParams& params) { return params.seed ? *params.seed : FreshSeed(); }

}  // namespace deepinfer
