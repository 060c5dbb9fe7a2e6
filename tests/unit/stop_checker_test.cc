// Tests for sampling/stop_checker.h: stop strings split across 1, 2 and 3
// tokens, streaming and non-streaming, include_stop_str_in_output, holding
// back (never emitting) a possible stop string, min_tokens, a randomized
// comparison with a brute-force reference over every way of chunking the
// text, and the token-level finish conditions.
#include "sampling/stop_checker.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"

namespace deepinfer {
namespace {

struct RunResult {
  std::string text;          // everything emitted (Append + final Flush)
  bool stopped = false;
  int stop_index = -1;
  size_t stopped_at_token = 0;  // 1-based token index of the match
  bool emitted_prefix_ok = true;  // emitted text was always a prefix of `expected`
};

// Feeds the token texts one by one (streaming); Flush()es at the end if no
// stop string matched. `expected` is used to check every intermediate state.
RunResult Stream(StopChecker& sc, const std::vector<std::string>& tokens, const std::string& expected,
                 int64_t first_token_number = 1) {
  RunResult r;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const StopUpdate u = sc.Append(tokens[i], first_token_number + static_cast<int64_t>(i));
    r.text += u.text;
    if (expected.compare(0, r.text.size(), r.text) != 0) r.emitted_prefix_ok = false;
    if (u.stopped) {
      r.stopped = true;
      r.stop_index = u.stop_index;
      r.stopped_at_token = i + 1;
      return r;
    }
  }
  r.text += sc.Flush();
  return r;
}

std::string Concat(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& t : v) s += t;
  return s;
}

TEST(StopChecker, StopStringSplitAcrossOneTwoThreeTokens) {
  const std::vector<std::vector<std::string>> splits = {
      {"Hello", " world ", "STOP", " trailing"},         // 1 token
      {"Hello", " world ", "ST", "OP", " trailing"},     // 2 tokens
      {"Hello", " world S", "T", "OP trail", "ing"},     // 3 tokens, starts and ends mid-token
  };
  const size_t stop_token[] = {3, 4, 4};
  for (bool include : {false, true}) {
    const std::string expected = include ? "Hello world STOP" : "Hello world ";
    for (size_t k = 0; k < splits.size(); ++k) {
      // Streaming.
      StopChecker sc({"STOP"}, include);
      const RunResult r = Stream(sc, splits[k], expected);
      EXPECT_TRUE(r.stopped) << k;
      EXPECT_EQ(r.stop_index, 0);
      EXPECT_EQ(r.stopped_at_token, stop_token[k]) << k;
      EXPECT_EQ(r.text, expected) << "split " << k << " include " << include;
      EXPECT_TRUE(r.emitted_prefix_ok) << "emitted text that was not part of the output, split " << k;
      EXPECT_EQ(sc.stop_reason(), std::optional<std::string>("STOP"));
      // Non-streaming: the whole text at once gives the same output.
      StopChecker whole({"STOP"}, include);
      const StopUpdate u = whole.Append(Concat(splits[k]), 1);
      EXPECT_TRUE(u.stopped);
      EXPECT_EQ(u.text, expected);
    }
  }
}

TEST(StopChecker, HoldsBackAPossibleStopStringAndReleasesIt) {
  StopChecker sc({"STOP"}, false);
  StopUpdate u = sc.Append("abcST", 1);
  EXPECT_EQ(u.text, "abc");
  EXPECT_EQ(sc.held_bytes(), 2u);
  u = sc.Append("A", 2);  // "STA" cannot start "STOP"; "A" cannot either
  EXPECT_EQ(u.text, "STA");
  EXPECT_EQ(sc.held_bytes(), 0u);
  u = sc.Append("S", 3);
  EXPECT_EQ(u.text, "");
  EXPECT_FALSE(u.stopped);
  // The request ends for another reason (EOS, length): held text is released.
  EXPECT_EQ(sc.Flush(), "S");
  EXPECT_EQ(sc.Flush(), "");
}

TEST(StopChecker, IncludeStopStrDoesNotHoldBack) {
  StopChecker sc({"STOP"}, true);
  EXPECT_EQ(sc.Append("abcST", 1).text, "abcST");
  const StopUpdate u = sc.Append("OPxyz", 2);
  EXPECT_TRUE(u.stopped);
  EXPECT_EQ(u.text, "OP");  // the stop string completes; text after it is dropped
}

TEST(StopChecker, EarliestEndingStopWinsThenTheLongest) {
  // "ab" and "b" both end at the same byte: the longer one (earlier start) wins,
  // whatever the chunking.
  for (const auto& split : std::vector<std::vector<std::string>>{{"xab"}, {"xa", "b"}, {"x", "a", "bc"}}) {
    StopChecker sc({"b", "ab"}, false);
    const RunResult r = Stream(sc, split, "x");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.stop_index, 1);
    EXPECT_EQ(r.text, "x");
  }
  // "\n\n" ends before "END" ends.
  StopChecker sc({"END", "\n\n"}, false);
  const StopUpdate u = sc.Append("one\n\ntwo END", 1);
  EXPECT_EQ(u.stop_index, 1);
  EXPECT_EQ(u.text, "one");
}

TEST(StopChecker, SelfOverlappingStopString) {
  StopChecker sc({"aab"}, false);
  const RunResult r = Stream(sc, {"a", "a", "a", "b", "zzz"}, "a");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "a");
  EXPECT_TRUE(r.emitted_prefix_ok);
}

TEST(StopChecker, Utf8StopString) {
  StopChecker sc({"é!"}, false);
  const RunResult r = Stream(sc, {"caf", "é", "!", " more"}, "caf");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "caf");
}

TEST(StopChecker, MinTokensIgnoresEarlierStopStrings) {
  // vLLM: stop strings count only in text of output token number > min_tokens.
  StopChecker sc({"X"}, false, 2);
  StopUpdate u = sc.Append("X", 1);
  EXPECT_FALSE(u.stopped);
  EXPECT_EQ(u.text, "X");
  u = sc.Append("aX", 2);
  EXPECT_FALSE(u.stopped);
  EXPECT_EQ(u.text, "aX");
  u = sc.Append("bXc", 3);
  EXPECT_TRUE(u.stopped);
  EXPECT_EQ(u.text, "b");
  // A stop string that starts before min_tokens is reached but ends after it counts.
  SamplingParams p;
  p.stop = {"STOP"};
  p.min_tokens = 1;
  StopChecker sp(p);
  EXPECT_EQ(sp.Append("xST", 1).text, "x");
  const StopUpdate v = sp.Append("OP", 2);
  EXPECT_TRUE(v.stopped);
  EXPECT_EQ(v.text, "");
}

TEST(StopChecker, Errors) {
  EXPECT_THROW(StopChecker({"ok", ""}, false), Error);
  StopChecker sc({"s"}, false);
  EXPECT_TRUE(sc.Append("xs", 1).stopped);
  EXPECT_THROW(sc.Append("more", 2), Error);
  EXPECT_EQ(sc.Flush(), "");
  // No stop strings: everything passes straight through.
  StopChecker none(std::vector<std::string>{}, false);
  EXPECT_EQ(none.Append("abc", 1).text, "abc");
  EXPECT_EQ(none.held_bytes(), 0u);
}

// Brute-force reference on the whole text: the first end position of any stop
// string (longest at that position, then lowest index).
RunResult Reference(const std::string& text, const std::vector<std::string>& stop, bool include) {
  RunResult r;
  for (size_t e = 1; e <= text.size(); ++e) {
    int best = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < stop.size(); ++i)
      if (stop[i].size() <= e && stop[i].size() > best_len &&
          text.compare(e - stop[i].size(), stop[i].size(), stop[i]) == 0)
        best = static_cast<int>(i), best_len = stop[i].size();
    if (best >= 0) {
      r.stopped = true;
      r.stop_index = best;
      r.text = text.substr(0, include ? e : e - best_len);
      return r;
    }
  }
  r.text = text;
  return r;
}

TEST(StopChecker, RandomChunkingsMatchTheWholeTextReference) {
  std::mt19937 rng(12345);
  const std::vector<std::string> stop = {"abc", "cab", "bb", "aaaa"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int len = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < len; ++i) text += "abc"[rng() % 3];
    std::vector<std::string> tokens;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 4;
      tokens.push_back(text.substr(i, n));
      i += n;
    }
    for (bool include : {false, true}) {
      const RunResult ref = Reference(text, stop, include);
      StopChecker sc(stop, include);
      const RunResult got = Stream(sc, tokens, ref.text);
      ASSERT_EQ(got.text, ref.text) << text << " include " << include;
      ASSERT_EQ(got.stopped, ref.stopped) << text;
      ASSERT_EQ(got.stop_index, ref.stop_index) << text;
      ASSERT_TRUE(got.emitted_prefix_ok) << text;
    }
  }
}

TEST(TokenStop, FollowsVllmOrder) {
  SamplingParams p;
  p.max_tokens = 5;
  p.stop_token_ids = {42};
  const std::vector<int32_t> eos = {2};
  EXPECT_EQ(CheckTokenStop(p, eos, 7, 1, 10, 0).reason, FinishReason::kNone);
  EXPECT_EQ(CheckTokenStop(p, eos, 2, 1, 10, 0).reason, FinishReason::kStop);
  const TokenStop s = CheckTokenStop(p, eos, 42, 1, 10, 0);
  EXPECT_EQ(s.reason, FinishReason::kStop);
  EXPECT_EQ(s.stop_token_id, std::optional<int32_t>(42));
  EXPECT_FALSE(CheckTokenStop(p, eos, 2, 1, 10, 0).stop_token_id.has_value());
  // Length is checked first (vLLM v1 check_stop), also when the token is EOS.
  EXPECT_EQ(CheckTokenStop(p, eos, 2, 5, 10, 0).reason, FinishReason::kLength);
  EXPECT_EQ(CheckTokenStop(p, eos, 7, 2, 100, 100).reason, FinishReason::kLength);
  EXPECT_EQ(CheckTokenStop(p, eos, 7, 2, 99, 100).reason, FinishReason::kNone);
  p.ignore_eos = true;
  EXPECT_EQ(CheckTokenStop(p, eos, 2, 1, 10, 0).reason, FinishReason::kNone);
  p.max_tokens.reset();
  EXPECT_EQ(CheckTokenStop(p, eos, 7, 1000000, 1000010, 0).reason, FinishReason::kNone);
  EXPECT_STREQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_STREQ(FinishReasonName(FinishReason::kStop), "stop");
}

}  // namespace
}  // namespace deepinfer
