// Grammar engine tests: regex / JSON Schema / GBNF / choice compile to the
// expected languages, bad constraints are errors naming the construct, masks
// over a vocabulary allow exactly the tokens that keep the automaton alive
// (checked against a brute-force oracle), random walks over the masks always
// produce valid outputs, masks are independent of cache history, and the DSML
// output parser never leaks a marker into content whatever the chunking.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "structured/constraint.h"
#include "structured/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::structured {
namespace {

using OJson = nlohmann::ordered_json;
using K = ConstraintSpec::Kind;

std::shared_ptr<CompiledGrammar> Compile(K kind, const std::string& text) {
  ConstraintSpec s;
  s.kind = kind;
  s.text = text;
  s.what = "test";
  return std::make_shared<CompiledGrammar>(BuildGrammar(s), "test");
}

bool Matches(CompiledGrammar& g, const std::string& text) {
  auto c = g.InitialConfig();
  return g.Advance(&c, text) && g.Accepts(c);
}

std::string ErrorOf(K kind, const std::string& text) {
  try {
    Compile(kind, text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StructuredRegex, Language) {
  auto g = Compile(K::kRegex, "[a-c]{2,3}x|yz+");
  for (const char* ok : {"abx", "cccx", "yz", "yzzz"}) EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad : {"ax", "aaaax", "y", "abxy", "", "dbx"}) EXPECT_FALSE(Matches(*g, bad)) << bad;
  auto d = Compile(K::kRegex, "^\\d{3}-[^a-z\\n]\\.(?:foo|ba(r|z))?\\u00e9$");
  EXPECT_TRUE(Matches(*d, "123-Q.foo\xC3\xA9"));
  EXPECT_TRUE(Matches(*d, "123-\xE2\x82\xAC.\xC3\xA9"));  // € is one character of [^a-z\n]
  EXPECT_FALSE(Matches(*d, "123-q.\xC3\xA9"));
  EXPECT_FALSE(Matches(*d, "123-\xE2\x82.\xC3\xA9"));  // a truncated character is not a character
  auto dot = Compile(K::kRegex, ".{2}");
  EXPECT_TRUE(Matches(*dot, "\xF0\x9F\x98\x80z"));
  EXPECT_FALSE(Matches(*dot, "a\n"));
}

TEST(StructuredRegex, ErrorsNameTheConstruct) {
  EXPECT_NE(ErrorOf(K::kRegex, "(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "a(?=b)").find("lookaround"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "(ab").find("missing ')'"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "ab)").find("unmatched ')'"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "a{3,1}").find("maximum below minimum"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "*a").find("quantifier without"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "a\\bb").find("\\b"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "a{1000000}").find("100000"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kRegex, "(a)\\1").find("test: invalid or unsupported regular expression at offset 3: backreferences"),
            std::string::npos);
}

TEST(StructuredGbnf, LanguageAndErrors) {
  const std::string arith = R"G(
    # arithmetic
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= num | "(" expr ")"
    num  ::= [0-9]+
  )G";
  auto g = Compile(K::kGrammar, arith);
  for (const char* ok : {"1", "12+3", "(1-2)+30", "((7))"}) EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad : {"", "1+", "(1", "a", "1++2"}) EXPECT_FALSE(Matches(*g, bad)) << bad;
  auto u = Compile(K::kGrammar, "root ::= [^\\x00-\\x7F]{2} \"\\u00e9\" .?");
  EXPECT_TRUE(Matches(*u, "\xC3\xA0\xE4\xB8\x80\xC3\xA9"));
  EXPECT_FALSE(Matches(*u, "a\xC3\xA0\xC3\xA9"));
  EXPECT_NE(ErrorOf(K::kGrammar, "root ::= a\na ::= a \"x\" | \"y\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kGrammar, "root ::= missing").find("\"missing\" is used but never defined"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kGrammar, "start ::= \"x\"").find("no \"root\""), std::string::npos);
  EXPECT_NE(ErrorOf(K::kGrammar, "root ::= \"x").find("unterminated string literal at line 1"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kGrammar, "root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
}

TEST(StructuredChoice, Language) {
  auto g = Compile(K::kChoice, R"(["yes", "no", "n/a"])");
  EXPECT_TRUE(Matches(*g, "yes"));
  EXPECT_TRUE(Matches(*g, "n/a"));
  EXPECT_FALSE(Matches(*g, "ye"));
  EXPECT_FALSE(Matches(*g, "nope"));
}

TEST(StructuredJson, SchemaLanguage) {
  const std::string schema = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 5},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
      "kind": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/k"}]}
    },
    "required": ["name", "age"],
    "additionalProperties": false,
    "$defs": {"k": {"const": "x"}}
  })";
  auto g = Compile(K::kJsonSchema, schema);
  for (const char* ok : {R"({"name": "ab", "age": -12})", R"({"name": "\u00e9\n", "age": 0, "tags": []})",
                         R"({"name": "a", "age": 3, "tags": ["a", "b"], "kind": null})",
                         R"({"name": "a", "age": 3, "kind": "x"})"})
    EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad : {R"({"age": 1, "name": "a"})",       // order is the schema's
                          R"({"name": "", "age": 1})",         // minLength
                          R"({"name": "abcdef", "age": 1})",   // maxLength
                          R"({"name": "a", "age": 01})",       // leading zero
                          R"({"name": "a", "age": 1.5})",      // integer
                          R"({"name": "a", "age": 1, "tags": ["a", "b", "a"]})",
                          R"({"name": "a"})", R"({"name":"a", "age": 1})", R"({"name": "\ud800", "age": 1})"})
    EXPECT_FALSE(Matches(*g, bad)) << bad;
}

TEST(StructuredJson, RecursionFormatsAndPattern) {
  auto tree = Compile(K::kJsonSchema, R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "boolean"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}}})");
  EXPECT_TRUE(Matches(*tree, R"({"v": true, "kids": [{"v": false}, {"v": true, "kids": [{"v": false}]}]})"));
  EXPECT_FALSE(Matches(*tree, R"({"v": true, "kids": [{}]})"));
}

TEST(StructuredJson, Formats) {
  auto g = Compile(K::kJsonSchema, R"({"type": "object", "properties": {
      "d": {"type": "string", "format": "date"}, "u": {"type": "string", "format": "uuid"},
      "p": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"}, "q": {"type": "string", "pattern": "ab"}},
      "required": ["d", "u", "p", "q"]})");
  EXPECT_TRUE(Matches(*g, R"({"d": "2024-02-28", "u": "123e4567-e89b-12d3-a456-426614174000", "p": "AB12", "q": "xaby"})"));
  EXPECT_FALSE(Matches(*g, R"({"d": "2024-02-30", "u": "123e4567-e89b-12d3-a456-426614174000", "p": "AB12", "q": "ab"})"));
  EXPECT_FALSE(Matches(*g, R"({"d": "2024-02-28", "u": "123e4567-e89b-12d3-a456-426614174000", "p": "A12", "q": "ab"})"));
  EXPECT_FALSE(Matches(*g, R"({"d": "2024-02-28", "u": "123e4567-e89b-12d3-a456-426614174000", "p": "AB12", "q": "a"})"));
}

TEST(StructuredJson, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"type": "integer", "minimum": 0})").find("unsupported JSON Schema keyword \"minimum\" (at /)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"type": "object", "properties": {"a": {"type": "string", "format": "ipv4"}}})")
                .find("format \"ipv4\" is not supported (supported: date, time, date-time, uuid, email) (at /properties/a/format)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"type": "array", "prefixItems": []})").find("\"prefixItems\""), std::string::npos);
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"$ref": "http://x/y"})").find("only local references"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"$ref": "#/$defs/none"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"type": "strin"})").find("unknown type \"strin\""), std::string::npos);
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"type": "string", "maxLength": 100000000})").find("too large"), std::string::npos);
  EXPECT_NE(ErrorOf(K::kJsonSchema, R"({"type": "string", "pattern": "(a"})").find("pattern at /pattern"), std::string::npos);
}

// A byte-level test vocabulary: single bytes plus multi-byte tokens.
std::vector<std::string> TestVocab() {
  std::vector<std::string> v = {""};  // id 0 = EOS
  for (int b = 1; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\": ", "\", \"", "true", "false", "null", "\"}", "}", "[\"", "\"]", "ab", "abc", "12",
                        "345", ", ", "name", "age", "tags", "kind", "\xC3\xA9", "\xE2\x82", "\xAC", "x\"", "\"x"})
    v.push_back(t);
  return v;
}

std::vector<int32_t> Allowed(const std::vector<uint32_t>& w) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < w.size() * 32; ++i)
    if ((w[i / 32] >> (i % 32)) & 1) out.push_back(static_cast<int32_t>(i));
  return out;
}

TEST(StructuredMask, EqualsBruteForceAndWalksStayValid) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 4}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["ab", "x"]}, "maxItems": 3}, "kind": {"type": ["boolean", "null"]}},
      "required": ["name", "tags"], "additionalProperties": false})";
  auto g = Compile(K::kJsonSchema, schema);
  TokenVocab vocab(TestVocab(), {0});
  std::mt19937_64 rng(7);
  std::vector<uint32_t> words(static_cast<size_t>(vocab.num_words()));
  for (int walk = 0; walk < 40; ++walk) {
    Matcher m(g, &vocab);
    auto config = g->InitialConfig();
    std::string out;
    for (int step = 0; step < 200 && !m.finished(); ++step) {
      m.FillMask(words);
      const std::vector<int32_t> allowed = Allowed(words);
      // Oracle: a token is allowed iff feeding its bytes keeps the automaton alive (EOS iff accepting).
      for (int32_t id = 0; id < vocab.vocab_size(); ++id) {
        bool expect;
        if (id == 0) {
          expect = g->Accepts(config);
        } else {
          auto c = config;
          expect = g->Advance(&c, vocab.token_bytes(id));
        }
        ASSERT_EQ(expect, std::binary_search(allowed.begin(), allowed.end(), id))
            << "token " << id << " after " << out;
      }
      ASSERT_FALSE(allowed.empty()) << out;
      // Prefer EOS late so walks end.
      int32_t tok = allowed[rng() % allowed.size()];
      if (allowed[0] == 0 && (step > 60 || rng() % 3 == 0)) tok = 0;
      ASSERT_TRUE(m.AcceptToken(tok));
      if (tok != 0) {
        out += vocab.token_bytes(tok);
        ASSERT_TRUE(g->Advance(&config, vocab.token_bytes(tok)));
      }
    }
    if (!m.finished()) continue;
    const auto j = nlohmann::json::parse(out);  // throws if invalid
    EXPECT_TRUE(j.contains("name") && j["name"].is_string());
    EXPECT_LE(j["tags"].size(), 3u);
    if (j.contains("age")) {
      EXPECT_TRUE(j["age"].is_number_integer()) << out;
    }
  }
}

TEST(StructuredMask, IndependentOfCacheHistory) {
  const std::string re = "(ab|x)*c{1,3}";
  auto warm = Compile(K::kRegex, re);
  auto cold = Compile(K::kRegex, re);
  TokenVocab vocab(TestVocab(), {0});
  std::vector<uint32_t> a(static_cast<size_t>(vocab.num_words())), b(a.size());
  // Warm one grammar's caches with unrelated prefixes.
  for (const char* p : {"abab", "xxc", "abxcc"}) {
    auto c = warm->InitialConfig();
    ASSERT_TRUE(warm->Advance(&c, p));
    warm->FillMask(c, vocab, a);
  }
  for (const char* p : {"", "ab", "xabc", "abcc"}) {
    auto cw = warm->InitialConfig(), cc = cold->InitialConfig();
    ASSERT_TRUE(warm->Advance(&cw, p));
    ASSERT_TRUE(cold->Advance(&cc, p));
    warm->FillMask(cw, vocab, a);
    cold->FillMask(cc, vocab, b);
    EXPECT_EQ(a, b) << p;
  }
}

TEST(StructuredMask, RealVocabulary) {
  const char* dir = std::getenv("DEEPINFER_TINY_DIR");
  if (!dir) GTEST_SKIP() << "DEEPINFER_TINY_DIR not set";
  Tokenizer tok = Tokenizer::Load(dir);
  TokenVocab vocab(tok, 129280, {tok.eos_id()});
  auto g = Compile(K::kJsonSchema, R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})");
  Matcher m(g, &vocab);
  std::vector<uint32_t> w(static_cast<size_t>(vocab.num_words()));
  m.FillMask(w);
  const auto allowed = Allowed(w);
  ASSERT_FALSE(allowed.empty());
  for (int32_t id : allowed) {
    const std::string& b = vocab.token_bytes(id);
    ASSERT_TRUE(std::string(R"({"ok": true})").rfind(b, 0) == 0 || std::string(R"({"ok": false})").rfind(b, 0) == 0) << b;
  }
  // Walk the whole value: the only continuation at the end is EOS.
  for (const std::string piece : {"{\"", "ok", "\": ", "true", "}"}) {
    auto ids = tok.Encode(piece, false);
    for (int32_t id : ids) ASSERT_TRUE(m.AcceptToken(id)) << piece;
  }
  m.FillMask(w);
  EXPECT_EQ(Allowed(w), std::vector<int32_t>{tok.eos_id()});
  EXPECT_TRUE(m.AcceptToken(tok.eos_id()));
}

TEST(StructuredThinking, ReasoningThenConstraint) {
  ConstraintSpec s{K::kChoice, R"(["A", "B"])", "guided_choice", "guided_choice", true};
  CompiledGrammar g(BuildGrammar(s), "t");
  EXPECT_TRUE(Matches(g, "hmm </think< x</think>A"));
  EXPECT_TRUE(Matches(g, "</think>B"));
  EXPECT_FALSE(Matches(g, "x</think>C"));
  EXPECT_FALSE(Matches(g, "A"));
}

TEST(StructuredConstraintFields, ParseAndErrors) {
  auto spec = ParseConstraintFields(OJson::parse(R"({"guided_regex": "a+"})"), false);
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->kind, K::kRegex);
  EXPECT_FALSE(ParseConstraintFields(OJson::parse(R"({"response_format": {"type": "text"}})"), true));
  auto err = [](const char* body, bool chat) {
    try {
      ParseConstraintFields(OJson::parse(body), chat);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(R"({"guided_regex": "a", "guided_choice": ["x"]})", false).find("only one"), std::string::npos);
  EXPECT_NE(err(R"({"guided_choice": [1]})", false).find("guided_choice[0]: expected a string"), std::string::npos);
  EXPECT_NE(err(R"({"response_format": {"type": "json_object"}})", false).find("only supported by /v1/chat"), std::string::npos);
  EXPECT_NE(err(R"({"response_format": {"type": "json_schema"}})", true).find("needs a \"json_schema\""), std::string::npos);
  EXPECT_NE(err(R"({"structured_outputs": {"regexp": "a"}})", false).find("structured_outputs.regexp: unknown"), std::string::npos);
  EXPECT_NE(err(R"({"guided_json": "{bad"})", false).find("guided_json: not valid JSON"), std::string::npos);
  std::string big(kMaxConstraintBytes + 10, 'a');
  EXPECT_NE(err(("{\"guided_regex\": \"" + big + "\"}").c_str(), false).find("more than"), std::string::npos);
  // Compile errors name the field.
  ConstraintSpec bad{K::kJsonSchema, R"({"type": "object", "patternProperties": {}})", "response_format",
                     "response_format.json_schema.schema", false};
  try {
    CompileConstraint(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("response_format.json_schema.schema: unsupported JSON Schema keyword \"patternProperties\""),
              std::string::npos)
        << e.what();
  }
  // The cache returns the same compiled grammar for the same text.
  ConstraintSpec a{K::kRegex, "[0-9]+", "guided_regex", "guided_regex", false};
  EXPECT_EQ(CompileConstraint(a).get(), CompileConstraint(a).get());
}

// ---------------------------------------------------------------------------
// DSML output parser

struct Collected {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
};

Collected RunParser(bool thinking, const std::vector<std::string>& pieces) {
  OutputParser p(thinking, true);
  Collected c;
  auto take = [&](OutputParser::Delta d) {
    c.reasoning += d.reasoning;
    c.content += d.content;
    for (auto& x : d.calls) c.calls.push_back(x);
  };
  for (const auto& s : pieces) take(p.Push(s));
  take(p.Flush());
  return c;
}

const std::string kCallText =
    "Let me check.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
    "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"noop\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";

TEST(DsmlParser, WholeText) {
  const Collected c = RunParser(true, {"thinking about it</think>" + kCallText});
  EXPECT_EQ(c.reasoning, "thinking about it");
  EXPECT_EQ(c.content, "Let me check.");
  ASSERT_EQ(c.calls.size(), 2u);
  EXPECT_EQ(c.calls[0].name, "get_weather");
  EXPECT_EQ(c.calls[0].arguments, R"({"city":"Paris","days":3})");
  EXPECT_EQ(c.calls[1].name, "noop");
  EXPECT_EQ(c.calls[1].arguments, "{}");
}

TEST(DsmlParser, EveryCutOfEveryMarker) {
  const std::string text = "r</think>" + kCallText;
  const Collected whole = RunParser(true, {text});
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Collected c = RunParser(true, {text.substr(0, cut), text.substr(cut)});
    ASSERT_EQ(c.reasoning, whole.reasoning) << cut;
    ASSERT_EQ(c.content, whole.content) << cut;
    ASSERT_EQ(c.calls.size(), whole.calls.size()) << cut;
    for (size_t k = 0; k < c.calls.size(); ++k) {
      ASSERT_EQ(c.calls[k].name, whole.calls[k].name);
      ASSERT_EQ(c.calls[k].arguments, whole.calls[k].arguments);
    }
  }
  // Byte by byte, too.
  std::vector<std::string> bytes;
  for (char ch : text) bytes.emplace_back(1, ch);
  const Collected b = RunParser(true, bytes);
  EXPECT_EQ(b.content, whole.content);
  EXPECT_EQ(b.calls.size(), 2u);
}

TEST(DsmlParser, CallWithoutClosingThink) {
  const Collected c = RunParser(true, {"I should call a tool.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"noop\">\n\n"
                                       "</｜DSML｜ invoke>\n</｜DSML｜ calls>"});
  EXPECT_EQ(c.reasoning, "I should call a tool.\n\n");
  EXPECT_EQ(c.content, "");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].name, "noop");
}

TEST(DsmlParser, MalformedIsContentAndNothingIsLost) {
  const std::vector<std::string> bad = {
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"x\">\n<｜DSML｜ parameter name=\"a\" string=\"maybe\">1</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      "<｜DSML｜ calls>\nhello",
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"x\">\n<｜DSML｜ parameter name=\"a\"",
      "<｜DSML｜ calls><｜DSML｜ invoke name=\"\">\n</｜DSML｜ invoke>",
      "text <｜DSML｜ call",
  };
  for (const std::string& text : bad) {
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      const Collected c = RunParser(false, {text.substr(0, cut), text.substr(cut)});
      ASSERT_TRUE(c.calls.empty()) << text;
      // Whitespace before a block start is dropped; everything else comes back.
      std::string expect = text;
      if (text.rfind("text ", 0) == 0) expect = text;
      ASSERT_EQ(c.content, expect) << cut << " " << text;
    }
  }
  // A good call followed by garbage: the call stays a call, the garbage is content.
  const Collected c = RunParser(false, {"<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"x\">\n</｜DSML｜ invoke>\noops"});
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.content, "\noops");
}

TEST(DsmlParser, ToolGrammarAcceptsWhatTheParserReads) {
  OJson spec = OJson::parse(R"({"v41": true, "parallel": true, "tools": [{"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer"}},
       "required": ["city"]}}]})");
  ConstraintSpec s{K::kToolCalls, spec.dump(), "tool_choice", "tool_choice", false};
  CompiledGrammar g(BuildGrammar(s), "t");
  const std::string one =
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
      "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  EXPECT_TRUE(Matches(g, one));
  const Collected c = RunParser(false, {one});
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].arguments, R"({"city":"Paris","days":3})");
  EXPECT_FALSE(Matches(g, "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"other\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"));
  EXPECT_FALSE(Matches(g, "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"));
}

}  // namespace
}  // namespace deepinfer::structured
