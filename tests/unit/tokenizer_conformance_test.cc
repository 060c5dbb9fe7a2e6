// Conformance of the C++ tokenizer with the independent JavaScript
// implementation (@lenml/tokenizers 3.7.2) on tests/data/tokenizer/
// conformance.jsonl (regenerate with tools/tokenizer/make_conformance.js):
// identical ids on every text, exact round trip, and the streaming
// detokenizer reproducing Decode for every way of feeding the ids.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/detokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_testing.h"

namespace deepinfer {
namespace {

struct Case {
  std::string name, text;
  std::vector<int32_t> ids;
};

const std::vector<Case>& Corpus() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> out;
    const std::string data = testing::ReadAll(std::string(DEEPINFER_TEST_DATA) + "/tokenizer/conformance.jsonl");
    size_t pos = 0;
    while (pos < data.size()) {
      size_t nl = data.find('\n', pos);
      if (nl == std::string::npos) nl = data.size();
      if (nl > pos) {
        const auto j = nlohmann::json::parse(data.substr(pos, nl - pos));
        out.push_back({j["name"].get<std::string>(), j["text"].get<std::string>(),
                       j["ids"].get<std::vector<int32_t>>()});
      }
      pos = nl + 1;
    }
    return out;
  }();
  return cases;
}

TEST(TokenizerConformance, CorpusIsThere) {
  EXPECT_GT(Corpus().size(), 500u);
  size_t brown = 0, random = 0;
  for (const Case& c : Corpus()) {
    brown += c.name.rfind("brown/", 0) == 0;
    random += c.name.rfind("random/", 0) == 0;
  }
  EXPECT_GT(brown, 30u);
  EXPECT_GE(random, 400u);
}

TEST(TokenizerConformance, IdenticalIdsToJavaScript) {
  const Tokenizer& tok = testing::V3Tokenizer();
  size_t mismatches = 0, total_ids = 0;
  for (const Case& c : Corpus()) {
    const std::vector<int32_t> ids = tok.Encode(c.text, /*add_special_tokens=*/false);
    total_ids += ids.size();
    if (ids != c.ids) {
      ++mismatches;
      size_t k = 0;
      while (k < ids.size() && k < c.ids.size() && ids[k] == c.ids[k]) ++k;
      ADD_FAILURE() << c.name << ": ids differ from the JS oracle at index " << k << " (ours "
                    << (k < ids.size() ? ids[k] : -1) << ", JS " << (k < c.ids.size() ? c.ids[k] : -1) << ")";
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(total_ids, 100000u);
}

TEST(TokenizerConformance, RoundTripIsExact) {
  const Tokenizer& tok = testing::V3Tokenizer();
  for (const Case& c : Corpus()) {
    EXPECT_EQ(tok.Decode(c.ids), c.text) << c.name;
    // With BOS added, decoding without special tokens gives the text back too.
    const auto with_bos = tok.Encode(c.text, true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], tok.bos_id()) << c.name;
    EXPECT_EQ(tok.Decode(with_bos), "<｜begin▁of▁sentence｜>" + c.text) << c.name;
  }
}

TEST(TokenizerConformance, StreamingEqualsDecodeForEverySplit) {
  const Tokenizer& tok = testing::V3Tokenizer();
  std::mt19937 rng(7);
  for (const Case& c : Corpus()) {
    const std::string full = tok.Decode(c.ids);
    // Token by token.
    {
      IncrementalDetokenizer d(tok);
      std::string s;
      for (int32_t id : c.ids) {
        const std::string piece = d.Push(id);
        ASSERT_EQ(utf8::FirstInvalid(piece), std::string_view::npos) << c.name;
        s += piece;
      }
      s += d.Flush();
      ASSERT_EQ(s, full) << c.name;
    }
    // Every prompt/generation split point (sampled for long texts), with the
    // generated part fed in random chunks.
    const size_t n = c.ids.size();
    std::vector<size_t> splits;
    if (n <= 120) {
      for (size_t k = 0; k <= n; ++k) splits.push_back(k);
    } else {
      for (int r = 0; r < 40; ++r) splits.push_back(rng() % (n + 1));
    }
    for (size_t k : splits) {
      IncrementalDetokenizer d(tok);
      std::string s = d.Prime(std::span<const int32_t>(c.ids.data(), k));
      size_t i = k;
      while (i < n) {
        const size_t len = std::min<size_t>(n - i, 1 + rng() % 5);
        s += d.Push(std::span<const int32_t>(c.ids.data() + i, len));
        i += len;
      }
      s += d.Flush();
      ASSERT_EQ(s, full) << c.name << " split at " << k;
    }
  }
}

}  // namespace
}  // namespace deepinfer
