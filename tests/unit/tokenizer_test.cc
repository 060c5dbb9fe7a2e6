// Tokenizer behaviour not covered by the JS conformance corpus: the Oniguruma
// `\s` semantics (where the JS port and raw PCRE2 differ), errors, special
// tokens, lookups, the streaming detokenizer's partial characters, and a small
// hand-written tokenizer.json (lstrip/rstrip, TemplateProcessing, rejects).
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include <gtest/gtest.h>

#include "base/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/utf8.h"
#include "tokenizer_testing.h"

namespace deepinfer {
namespace {

using Ids = std::vector<int32_t>;

Ids Cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(Tokenizer, Basics) {
  const Tokenizer& tok = testing::V3Tokenizer();
  EXPECT_EQ(tok.size(), 128815);
  EXPECT_EQ(tok.vocab_size_without_added(), 128000);
  EXPECT_EQ(tok.added_tokens().size(), 818u);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 1);  // tokenizer_config pad_token = the EOS string
  EXPECT_EQ(tok.Encode("Hello world! 12345 你好世界 <｜User｜>hi", false),
            (Ids{19923, 2058, 3, 223, 6895, 1883, 223, 30594, 3427, 223, 128803, 6366}));  // JS oracle
  EXPECT_EQ(tok.Encode("Hello"), (Ids{0, 19923}));  // one BOS (LlamaTokenizerFast add_bos_token)
  EXPECT_EQ(tok.Encode("", true), (Ids{0}));
  EXPECT_TRUE(tok.Encode("", false).empty());
  EXPECT_EQ(tok.TokenToId("<｜User｜>"), 128803);
  EXPECT_EQ(tok.TokenToId("Hello"), 19923);
  EXPECT_EQ(tok.TokenToId("Ġworld"), 2058);  // vocab strings are in the byte-level alphabet
  EXPECT_FALSE(tok.TokenToId("no such token").has_value());
  EXPECT_EQ(tok.IdToToken(2058), "Ġworld");
  EXPECT_EQ(tok.TokenBytes(2058), " world");
  EXPECT_TRUE(tok.IsSpecial(0));
  EXPECT_TRUE(tok.IsAdded(128803));
  EXPECT_FALSE(tok.IsSpecial(128803));  // <｜User｜> is added but not special
  EXPECT_FALSE(tok.IsAdded(2058));
}

TEST(Tokenizer, DecodeSkipsOnlySpecialTokens) {
  const Tokenizer& tok = testing::V3Tokenizer();
  const Ids ids = tok.Encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜end▁of▁sentence｜>", false);
  EXPECT_EQ(ids, (Ids{0, 128803, 6366, 1}));
  EXPECT_EQ(tok.Decode(ids), "<｜begin▁of▁sentence｜><｜User｜>hi<｜end▁of▁sentence｜>");
  EXPECT_EQ(tok.Decode(ids, /*skip_special_tokens=*/true), "<｜User｜>hi");
}

TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheOffset) {
  const Tokenizer& tok = testing::V3Tokenizer();
  try {
    tok.Encode(std::string("abc\xE4\xB8", 5));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("byte offset 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok.Encode(std::string("\xC0\x80")), Error);       // overlong
  EXPECT_THROW(tok.Encode(std::string("\xED\xA0\x80")), Error);   // surrogate
  EXPECT_THROW(tok.Encode(std::string("\xF4\x90\x80\x80")), Error);  // > U+10FFFF
}

TEST(Tokenizer, UnknownIdIsAnError) {
  const Tokenizer& tok = testing::V3Tokenizer();
  EXPECT_THROW(tok.Decode(Ids{5, 128815}), Error);
  EXPECT_THROW(tok.Decode(Ids{-1}), Error);
  EXPECT_THROW(tok.TokenBytes(200000), Error);
}

TEST(Tokenizer, DecodeIsLossyLikeHuggingFace) {
  const Tokenizer& tok = testing::V3Tokenizer();
  // 你 = E4 BD A0: byte-level BPE can split it; a lone lead byte decodes to U+FFFD.
  const auto e4 = tok.TokenToId("ä");  // the byte-level character for byte 0xE4
  ASSERT_TRUE(e4.has_value());
  EXPECT_EQ(tok.Decode(Ids{*e4}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.Decode(Ids{*e4, *tok.TokenToId("a")}), "\xEF\xBF\xBD" "a");
}

// Oniguruma's \s is Unicode White_Space. The JS port (JS \s) differs on U+0085
// and U+FEFF; PCRE2's UCP \s on U+180E. Expected ids follow Oniguruma: the
// texts are built so that the pieces differ between the two semantics.
TEST(Tokenizer, WhitespaceFollowsOniguruma) {
  const Tokenizer& tok = testing::V3Tokenizer();
  auto enc = [&](const std::string& s) { return tok.Encode(s, false); };
  // U+0085 is \s in Oniguruma (not in JS): " \u0085" is one `\s+(?!\S)` piece,
  // where the JS port (ids in the comments) splits " " | "\u0085\n".
  EXPECT_EQ(enc("x \u0085\n"), (Ids{90, 1203, 230, 201}));  // JS: 90 223 129 230 201
  EXPECT_EQ(enc("a \u0085"), (Ids{67, 1203, 230}));          // JS: 67 223 129 230
  EXPECT_EQ(enc("x \u0085\n"), Cat({enc("x"), enc(" \u0085"), enc("\n")}));
  EXPECT_EQ(enc("a\u0085 \n"), Cat({enc("a"), enc("\u0085 \n")}));
  // U+FEFF and U+180E are not \s (JS: U+FEFF is; PCRE2's raw UCP \s: U+180E is).
  EXPECT_EQ(enc("a\uFEFF\n"), Cat({enc("a"), enc("\uFEFF"), enc("\n")}));
  EXPECT_EQ(enc("x \uFEFF y"), Cat({enc("x"), enc(" "), enc("\uFEFF"), enc(" y")}));
  EXPECT_EQ(enc("a\u180E\n"), Cat({enc("a"), enc("\u180E"), enc("\n")}));
  EXPECT_EQ(enc("x \u180E"), Cat({enc("x"), enc(" "), enc("\u180E")}));
  // Round trips hold regardless.
  for (const char* s : {"x\u0085\u0085 y", "\uFEFFbom", "\u180E \u180E"}) EXPECT_EQ(tok.Decode(enc(s)), s);
}

TEST(RegexSplit, OnigRewrite) {
  using tokenizer_internal::OnigToPcre2;
  EXPECT_EQ(OnigToPcre2(R"(\s+(?!\S)|\s+)"), R"([^\S\x{180E}]+(?![\S\x{180E}])|[^\S\x{180E}]+)");
  EXPECT_EQ(OnigToPcre2(R"([\s\p{L}]\s)"), R"([\s\p{L}][^\S\x{180E}])");  // inside a class: unchanged
  EXPECT_EQ(OnigToPcre2(R"([]\s]\\s)"), R"([]\s]\\s)");                   // ']' first is literal; "\\s" is not \s
}

TEST(Detokenizer, PromptEndingMidCharacter) {
  const Tokenizer& tok = testing::V3Tokenizer();
  // Find a character that BPE splits into several tokens.
  std::string ch;
  Ids ids;
  for (const char* c : {"𓀀", "𝄞", "🀄", "𐌰", "ꙮ"}) {
    ids = tok.Encode(c, false);
    if (ids.size() >= 2) { ch = c; break; }
  }
  ASSERT_FALSE(ch.empty()) << "no multi-token character found";
  const Ids all = Cat({tok.Encode("Look: ", false), ids, tok.Encode(" done", false)});
  const size_t split = tok.Encode("Look: ", false).size() + 1;  // prompt ends inside the character
  IncrementalDetokenizer d(tok);
  const std::string primed = d.Prime(std::span<const int32_t>(all.data(), split));
  EXPECT_EQ(primed, "Look: ");
  EXPECT_GT(d.pending_bytes(), 0u);
  std::string emitted;
  for (size_t i = split; i < all.size(); ++i) {
    const std::string piece = d.Push(all[i]);
    EXPECT_EQ(utf8::FirstInvalid(piece), std::string_view::npos);
    emitted += piece;
  }
  emitted += d.Flush();
  EXPECT_EQ(emitted, ch + " done");
  EXPECT_EQ(primed + emitted, tok.Decode(all));
}

TEST(Detokenizer, TruncatedCharacterFlushesAsReplacement) {
  const Tokenizer& tok = testing::V3Tokenizer();
  const auto e4 = *tok.TokenToId("ä");
  IncrementalDetokenizer d(tok);
  EXPECT_EQ(d.Push(*tok.TokenToId("a")), "a");
  EXPECT_EQ(d.Push(e4), "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.pending_bytes(), 0u);
  // A broken sequence is emitted as U+FFFD as soon as it is known to be broken.
  EXPECT_EQ(d.Push(e4), "");
  EXPECT_EQ(d.Push(*tok.TokenToId("a")), "\xEF\xBF\xBD" "a");
}

TEST(Detokenizer, SkipSpecialTokens) {
  const Tokenizer& tok = testing::V3Tokenizer();
  const Ids ids = tok.Encode("<｜begin▁of▁sentence｜>Hi<｜User｜>x<｜end▁of▁sentence｜>", false);
  IncrementalDetokenizer d(tok, /*skip_special_tokens=*/true);
  std::string s;
  for (int32_t id : ids) s += d.Push(id);
  s += d.Flush();
  EXPECT_EQ(s, tok.Decode(ids, true));
  EXPECT_EQ(s, "Hi<｜User｜>x");
  EXPECT_THROW(d.Push(999999), Error);
}

// Random valid UTF-8 over the whole code space (any scalar value, including
// unassigned ones and the characters kept out of the JS corpus): the round
// trip is exact and streaming equals Decode. Random bytes: Encode accepts
// exactly the valid ones.
TEST(Tokenizer, RandomTextProperties) {
  const Tokenizer& tok = testing::V3Tokenizer();
  std::mt19937 rng(12345);
  for (int k = 0; k < 300; ++k) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      const uint32_t r = rng() % 10;
      char32_t cp;
      if (r < 3) cp = 0x20 + rng() % 0x5F;
      else if (r < 4) cp = " \t\r\n"[rng() % 4];
      else if (r < 6) cp = rng() % 0x800;
      else if (r < 8) cp = rng() % 0x10000;
      else cp = rng() % 0x110000;
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
      utf8::Append(s, cp);
    }
    const Ids ids = tok.Encode(s, false);
    ASSERT_EQ(tok.Decode(ids), s);
    IncrementalDetokenizer d(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += d.Push(id);
    streamed += d.Flush();
    ASSERT_EQ(streamed, s);
  }
  for (int k = 0; k < 2000; ++k) {
    std::string b(1 + rng() % 8, '\0');
    for (char& c : b) c = static_cast<char>(rng() % 256);
    const bool valid = utf8::FirstInvalid(b) == std::string_view::npos;
    ASSERT_EQ(valid, utf8::DecodeLossy(b) == b);
    if (valid) ASSERT_EQ(tok.Decode(tok.Encode(b, false)), b);
    else ASSERT_THROW(tok.Encode(b, false), Error);
  }
}

// A hand-written tokenizer.json: tiny vocabulary, lstrip/rstrip added tokens,
// TemplateProcessing post-processor, no tokenizer_config.
class SmallTokenizer : public ::testing::Test {
 protected:
  static std::filesystem::path Dir() {
    return std::filesystem::temp_directory_path() / ("deepinfer_small_tok_" + std::to_string(::getpid()));
  }
  // The files written by the suite's tests go with it.
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(Dir(), ec);
  }
  static std::filesystem::path Write(const std::string& name, const std::string& json) {
    const auto dir = Dir();
    std::filesystem::create_directories(dir);
    const auto p = dir / name;
    std::ofstream(p) << json;
    return p;
  }
  static std::string Vocab() {
    // All 256 byte-level characters, then a few merges' results.
    std::string v = "{";
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      utf8::Append(ch, byte_level_cp(b));
      if (ch == "\"") ch = "\\\"";
      if (ch == "\\") ch = "\\\\";
      v += "\"" + ch + "\": " + std::to_string(b) + ",";
    }
    v += "\"ab\": 256, \"abc\": 257, \"Ġa\": 258}";
    return v;
  }
  static char32_t byte_level_cp(int b) {
    int n = 0;
    for (int x = 0; x < 256; ++x) {
      const bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(x) : static_cast<char32_t>(256 + n++);
      if (x == b) return cp;
    }
    return 0;
  }
  static std::string Json(const std::string& added, const std::string& post) {
    return R"({"version": "1.0", "normalizer": null,
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s?[^\\s]+|\\s+"}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
      "post_processor": )" + post + R"(, "decoder": {"type": "ByteLevel"},
      "added_tokens": )" + added + R"(,
      "model": {"type": "BPE", "vocab": )" + Vocab() + R"(, "merges": ["a b", ["ab", "c"], "Ġ a"]}})";
  }
};

TEST_F(SmallTokenizer, StripTemplateAndMerges) {
  const auto p = Write("t1.json", Json(
      R"([{"id": 300, "content": "<L>", "lstrip": true, "special": true},
          {"id": 301, "content": "<R>", "rstrip": true, "special": false},
          {"id": 302, "content": "<S>", "special": true}])",
      R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<S>", "type_id": 0}},
          {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<L>", "type_id": 0}}]})"));
  const Tokenizer tok = Tokenizer::FromFiles(p, {});
  EXPECT_EQ(tok.size(), 303);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.Encode("abc", false), (Ids{257}));
  EXPECT_EQ(tok.Encode("abc"), (Ids{302, 257, 300}));
  EXPECT_EQ(tok.Encode(" a", false), (Ids{258}));
  EXPECT_EQ(tok.Encode("ab  <L>c", false), (Ids{256, 300, 'c'}));   // lstrip swallows the spaces
  EXPECT_EQ(tok.Encode("c<R>  ab", false), (Ids{'c', 301, 256}));   // rstrip too
  EXPECT_EQ(tok.Encode("c <S> ab", false), (Ids{'c', ' ', 302, ' ', 256}));  // (a,b) ranks before (Ġ,a)
  EXPECT_EQ(tok.Decode(tok.Encode("x <L> y<R> z")), "<S>x<L> y<R>z<L>");
}

TEST_F(SmallTokenizer, UnsupportedFeaturesAreRejected) {
  auto with = [&](const std::string& from, const std::string& to) {
    std::string j = Json("[]", "null");
    const size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    j.replace(at, from.size(), to);
    return Write("bad.json", j);
  };
  EXPECT_THROW(Tokenizer::FromFiles(with("\"normalizer\": null", R"("normalizer": {"type": "NFC"})"), {}), Error);
  EXPECT_THROW(Tokenizer::FromFiles(with("\"Isolated\"", "\"Removed\""), {}), Error);
  EXPECT_THROW(Tokenizer::FromFiles(with("\"type\": \"BPE\"", "\"type\": \"BPE\", \"byte_fallback\": true"), {}),
               Error);
  EXPECT_THROW(Tokenizer::FromFiles(with("\"merges\": [", "\"merges\": 5, \"m2\": ["), {}), Error);
  EXPECT_THROW(Tokenizer::FromFiles(with("\"vocab\": {", "\"vocab\": null, \"v2\": {"), {}), Error);
  EXPECT_THROW(Tokenizer::FromFiles(with("\"vocab\": {", "\"vocab\": [], \"v2\": {"), {}), Error);
  EXPECT_THROW(Tokenizer::FromFiles(with("\"merges\": [", "\"merges\": [[\"a\"], "), {}), Error);
  EXPECT_THROW(Tokenizer::FromFiles(with("\"version\"", "\"version\" \"1.0\", \"x\""), {}), Error);  // bad JSON
  EXPECT_THROW(Tokenizer::FromFiles(with("\"Ġ a\"", "\"Ġ b\""), {}), Error);  // merge result not in vocab
  EXPECT_THROW(Tokenizer::FromFiles(with("\\\\s?[^\\\\s]+|\\\\s+", "(unclosed"), {}), Error);
  try {
    Tokenizer::FromFiles("/nonexistent/tokenizer.json", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

}  // namespace
}  // namespace deepinfer
