// Tests for sampling/sampling_params.h: vLLM defaults, range validation with
// messages naming the field and the range, JSON parsing (types, nulls,
// defaults from a base), ToJson round trip, and seeds.
#include "sampling/sampling_params.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace deepinfer {
namespace {

using nlohmann::json;

// Runs f, expects Error(kInvalidArgument) whose message contains every needle.
template <class F>
void ExpectInvalid(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << *needles.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    for (const char* n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
  }
}

TEST(SamplingParams, DefaultsAreVllms) {
  const SamplingParams p;
  EXPECT_EQ(p.temperature, 1.0);
  EXPECT_EQ(p.top_p, 1.0);
  EXPECT_EQ(p.top_k, -1);
  EXPECT_EQ(p.min_p, 0.0);
  EXPECT_EQ(p.presence_penalty, 0.0);
  EXPECT_EQ(p.frequency_penalty, 0.0);
  EXPECT_EQ(p.repetition_penalty, 1.0);
  EXPECT_TRUE(p.logit_bias.empty());
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_EQ(p.max_tokens, std::optional<int64_t>(16));
  EXPECT_EQ(p.min_tokens, 0);
  EXPECT_TRUE(p.stop.empty());
  EXPECT_TRUE(p.stop_token_ids.empty());
  EXPECT_FALSE(p.include_stop_str_in_output);
  EXPECT_FALSE(p.ignore_eos);
  EXPECT_FALSE(p.logprobs.has_value());
  EXPECT_FALSE(p.prompt_logprobs.has_value());
  EXPECT_NO_THROW(p.Validate());
  EXPECT_FALSE(p.IsGreedy());
}

TEST(SamplingParams, ValidateNamesFieldAndRange) {
  auto with = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    return p;
  };
  const SamplingLimits lim{100, 20};
  const std::vector<std::pair<SamplingParams, std::vector<const char*>>> cases = {
      {with([](auto& p) { p.temperature = -0.1; }), {"temperature", "[0, +inf)", "-0.1"}},
      {with([](auto& p) { p.temperature = NAN; }), {"temperature", "nan"}},
      {with([](auto& p) { p.temperature = INFINITY; }), {"temperature", "finite"}},
      {with([](auto& p) { p.top_p = 0.0; }), {"top_p", "(0, 1]", "got 0"}},
      {with([](auto& p) { p.top_p = 1.5; }), {"top_p", "(0, 1]", "1.5"}},
      {with([](auto& p) { p.top_k = -2; }), {"top_k", "-1 or 0", "-2"}},
      {with([](auto& p) { p.min_p = 1.5; }), {"min_p", "[0, 1]"}},
      {with([](auto& p) { p.presence_penalty = 2.5; }), {"presence_penalty", "[-2, 2]", "2.5"}},
      {with([](auto& p) { p.frequency_penalty = -3; }), {"frequency_penalty", "[-2, 2]", "-3"}},
      {with([](auto& p) { p.repetition_penalty = 0; }), {"repetition_penalty", "(0, +inf)"}},
      {with([](auto& p) { p.logit_bias = {{5, 150.0}}; }), {"logit_bias", "[-100, 100]", "150"}},
      {with([](auto& p) { p.logit_bias = {{100, 1.0}}; }), {"logit_bias", "[0, 100)", "100"}},
      {with([](auto& p) { p.logit_bias = {{-1, 1.0}}; }), {"logit_bias", "-1"}},
      {with([](auto& p) { p.max_tokens = 0; }), {"max_tokens", "at least 1", "0"}},
      {with([](auto& p) { p.min_tokens = -1; }), {"min_tokens", ">= 0"}},
      {with([](auto& p) { p.min_tokens = 17; }), {"min_tokens", "max_tokens=16", "17"}},
      {with([](auto& p) { p.stop = {"a", ""}; }), {"stop", "empty", "stop[1]"}},
      {with([](auto& p) { p.stop_token_ids = {5, 100}; }), {"stop_token_ids", "[0, 100)", "100"}},
      {with([](auto& p) { p.logprobs = 21; }), {"logprobs", "[0, 20]", "21"}},
      {with([](auto& p) { p.logprobs = -2; }), {"logprobs", "-1", "-2"}},
      {with([](auto& p) { p.logprobs = -1; }), {"logprobs", "max_logprobs"}},  // 100 ids > 20
      {with([](auto& p) { p.prompt_logprobs = 50; }), {"prompt_logprobs", "[0, 20]", "50"}},
  };
  for (const auto& [p, needles] : cases) {
    try {
      p.Validate(lim);
      ADD_FAILURE() << "no error; expected one mentioning " << needles[0];
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      for (const char* n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
    }
  }
  // Boundary values that are allowed.
  SamplingParams ok;
  ok.temperature = 0;
  ok.top_p = 1;
  ok.top_k = 0;
  ok.min_p = 1;
  ok.presence_penalty = -2;
  ok.frequency_penalty = 2;
  ok.repetition_penalty = 0.01;
  ok.logit_bias = {{0, -100.0}, {99, 100.0}};
  ok.max_tokens.reset();
  ok.min_tokens = 1000;
  ok.stop_token_ids = {0, 99};
  ok.logprobs = 20;
  ok.prompt_logprobs = 0;
  EXPECT_NO_THROW(ok.Validate(lim));
  EXPECT_TRUE(ok.IsGreedy());
  ok.logprobs = -1;  // whole vocabulary: allowed when max_logprobs is unlimited
  EXPECT_NO_THROW(ok.Validate(SamplingLimits{100, -1}));
  // Without a known vocabulary, token ids are only checked for sign.
  SamplingParams big;
  big.logit_bias = {{1000000, 1.0}};
  EXPECT_NO_THROW(big.Validate());
}

TEST(SamplingParams, FromJsonReadsAnInputLine) {
  const json line = json::parse(
      R"({"prompt": "hi", "seed": 7, "temperature": 0.8, "top_p": 0.9, "stop": ["\n\n"], "logprobs": 5,
          "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5,
          "repetition_penalty": 1.1, "logit_bias": {"50256": -100, "7": 2.5}, "max_tokens": 64,
          "min_tokens": 2, "stop_token_ids": [1, 2], "include_stop_str_in_output": true,
          "ignore_eos": true, "prompt_logprobs": 0, "something_else": {"x": 1}})");
  const SamplingParams p = SamplingParams::FromJson(line);
  EXPECT_EQ(p.seed, std::optional<int64_t>(7));
  EXPECT_EQ(p.temperature, 0.8);
  EXPECT_EQ(p.top_p, 0.9);
  EXPECT_EQ(p.stop, std::vector<std::string>({"\n\n"}));
  EXPECT_EQ(p.logprobs, std::optional<int64_t>(5));
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.min_p, 0.05);
  EXPECT_EQ(p.presence_penalty, 0.5);
  EXPECT_EQ(p.frequency_penalty, -0.5);
  EXPECT_EQ(p.repetition_penalty, 1.1);
  EXPECT_EQ(p.logit_bias, (std::map<int64_t, double>{{50256, -100.0}, {7, 2.5}}));
  EXPECT_EQ(p.max_tokens, std::optional<int64_t>(64));
  EXPECT_EQ(p.min_tokens, 2);
  EXPECT_EQ(p.stop_token_ids, std::vector<int64_t>({1, 2}));
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.prompt_logprobs, std::optional<int64_t>(0));
}

TEST(SamplingParams, FromJsonOverridesDefaultsFieldByField) {
  SamplingParams base;
  base.temperature = 0.5;
  base.seed = 3;
  base.stop = {"x"};
  base.max_tokens = 100;
  SamplingParams p = SamplingParams::FromJson(json::parse(R"({"top_k": 5})"), base);
  EXPECT_EQ(p.temperature, 0.5);
  EXPECT_EQ(p.top_k, 5);
  EXPECT_EQ(p.seed, std::optional<int64_t>(3));
  EXPECT_EQ(p.stop, std::vector<std::string>({"x"}));
  // null: "none" for nullable fields, "default" for the others.
  p = SamplingParams::FromJson(
      json::parse(R"({"seed": null, "max_tokens": null, "temperature": null, "stop": null})"), base);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_FALSE(p.max_tokens.has_value());
  EXPECT_EQ(p.temperature, 0.5);
  EXPECT_TRUE(p.stop.empty());
  // A single stop string; an integral float for an integer field.
  p = SamplingParams::FromJson(json::parse(R"({"stop": "END", "top_k": 5.0, "seed": -9})"));
  EXPECT_EQ(p.stop, std::vector<std::string>({"END"}));
  EXPECT_EQ(p.top_k, 5);
  EXPECT_EQ(p.seed, std::optional<int64_t>(-9));
}

TEST(SamplingParams, FromJsonRejectsWrongTypes) {
  auto parse = [](const char* text) { return SamplingParams::FromJson(json::parse(text)); };
  ExpectInvalid([&] { parse(R"({"temperature": "hot"})"); }, {"temperature", "expected a number", "string"});
  ExpectInvalid([&] { parse(R"({"top_p": true})"); }, {"top_p", "expected a number", "boolean"});
  ExpectInvalid([&] { parse(R"({"top_k": 2.5})"); }, {"top_k", "expected an integer", "2.5"});
  ExpectInvalid([&] { parse(R"({"max_tokens": "10"})"); }, {"max_tokens", "expected an integer"});
  ExpectInvalid([&] { parse(R"({"stop": 5})"); }, {"stop", "string or a list of strings"});
  ExpectInvalid([&] { parse(R"({"stop": ["a", 3]})"); }, {"stop[1]", "expected a string"});
  ExpectInvalid([&] { parse(R"({"stop_token_ids": [1, "2"]})"); }, {"stop_token_ids[1]", "integer"});
  ExpectInvalid([&] { parse(R"({"stop_token_ids": 3})"); }, {"stop_token_ids", "list of integers"});
  ExpectInvalid([&] { parse(R"({"logit_bias": {"abc": 1}})"); }, {"logit_bias", "\"abc\"", "token id"});
  ExpectInvalid([&] { parse(R"({"logit_bias": {"5": "x"}})"); }, {"logit_bias[\"5\"]", "number"});
  ExpectInvalid([&] { parse(R"({"logit_bias": [1, 2]})"); }, {"logit_bias", "object"});
  ExpectInvalid([&] { parse(R"({"ignore_eos": 1})"); }, {"ignore_eos", "true or false"});
  ExpectInvalid([&] { parse(R"({"logprobs": true})"); }, {"logprobs", "integer", "boolean"});
  ExpectInvalid([&] { parse(R"({"seed": 18446744073709551615})"); }, {"seed", "int64"});
  ExpectInvalid([&] { parse(R"({"seed": -9223372036854775809})"); }, {"seed", "expected an integer"});
  EXPECT_EQ(parse(R"({"seed": -9223372036854775808})").seed, std::optional<int64_t>(INT64_MIN));
  EXPECT_EQ(parse(R"({"seed": 5.0})").seed, std::optional<int64_t>(5));
  ExpectInvalid([&] { parse(R"([1, 2])"); }, {"sampling parameters", "object"});
  // Types right, values out of range: Validate's message.
  ExpectInvalid([&] { parse(R"({"top_p": 0})"); }, {"top_p", "(0, 1]"});
  ExpectInvalid([&] { parse(R"({"stop": [""]})"); }, {"stop", "empty"});
  ExpectInvalid([&] { SamplingParams::FromJson(json::parse(R"({"logprobs": 30})"), SamplingParams{}, {0, 20}); },
                {"logprobs", "[0, 20]"});
  ExpectInvalid([&] { SamplingParams::FromJson(json::parse(R"({"stop_token_ids": [70]})"), SamplingParams{}, {64, 20}); },
                {"stop_token_ids", "[0, 64)"});
}

TEST(SamplingParams, ToJsonRoundTrips) {
  SamplingParams p;
  p.temperature = 0.25;
  p.top_k = 3;
  p.logit_bias = {{4, -2.5}};
  p.seed = 1234567890123LL;
  p.max_tokens.reset();
  p.stop = {"a", "bc"};
  p.stop_token_ids = {9};
  p.logprobs = 2;
  const json j = p.ToJson();
  EXPECT_EQ(j["seed"], 1234567890123LL);
  EXPECT_TRUE(j["max_tokens"].is_null());
  EXPECT_EQ(j["logit_bias"]["4"], -2.5);
  const SamplingParams q = SamplingParams::FromJson(j);
  EXPECT_EQ(q.ToJson(), j);
  EXPECT_EQ(q.logit_bias, p.logit_bias);
  EXPECT_EQ(q.seed, p.seed);
  EXPECT_FALSE(q.max_tokens.has_value());
}

TEST(Seeds, FreshSeedsAreJsonSafeAndVary) {
  std::set<int64_t> seen;
  for (int i = 0; i < 32; ++i) {
    const int64_t s = FreshSeed();
    EXPECT_GE(s, 0);
    EXPECT_LT(s, int64_t{1} << 53);
    EXPECT_EQ(static_cast<int64_t>(static_cast<double>(s)), s);  // exact as a double
    seen.insert(s);
  }
  EXPECT_GT(seen.size(), 30u);
  SamplingParams p;
  p.seed = -42;
  EXPECT_EQ(ResolveSeed(p), -42);
  p.seed.reset();
  EXPECT_GE(ResolveSeed(p), 0);
}

}  // namespace
}  // namespace deepinfer
