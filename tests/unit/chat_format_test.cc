// DeepSeek-V4 / V4.1 chat rendering. Expected strings:
//  * tests/data/chat/expected.json — produced by running DeepSeek's official
//    Python encoders (V4 encoding_dsv4.py, V4.1 encoding.py) on
//    tools/chat/chat_cases.json with tools/chat/make_chat_expected.py;
//  * literal expectations of the official V4.1 encoding/test_encoding.py.
#include <algorithm>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tokenizer/chat_format.h"
#include "tokenizer_testing.h"

namespace deepinfer {
namespace {

using Json = nlohmann::ordered_json;

const std::string kEffort75 =
    "<｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
std::string Effort(int b) {
  return "<｜System｜>Reasoning Effort: " + std::to_string(b) +
         " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
}

ChatOptions V41(bool thinking) {
  ChatOptions o;
  o.encoding = ChatEncoding::kDeepseekV41;
  o.thinking = thinking;
  return o;
}

TEST(ChatFormat, MatchesOfficialEncoders) {
  const Json cases = Json::parse(testing::ReadAll(std::string(DEEPINFER_TEST_DATA) + "/chat/expected.json"));
  ASSERT_GE(cases.size(), 40u);
  size_t v4 = 0, v41 = 0;
  for (const Json& c : cases) {
    ChatOptions o;
    o.encoding = c["encoding"] == "v4" ? ChatEncoding::kDeepseekV4 : ChatEncoding::kDeepseekV41;
    o.thinking = c["thinking_mode"] == "thinking";
    o.drop_thinking = c["drop_thinking"].get<bool>();
    o.reasoning_effort = c["reasoning_effort"];
    (o.encoding == ChatEncoding::kDeepseekV4 ? v4 : v41)++;
    EXPECT_EQ(RenderChat(c["messages"], o), c["expected"].get<std::string>())
        << c["name"] << " " << c["encoding"] << " " << c["thinking_mode"];
  }
  EXPECT_GT(v4, 15u);
  EXPECT_GT(v41, 20u);
}

// From the official V4.1 test_encoding.py.
TEST(ChatFormat, OfficialV41TestLiterals) {
  const Json q = Json::parse(R"([{"role": "user", "content": "question"}])");
  for (auto [effort, budget] : std::vector<std::pair<Json, int>>{
           {Json(), 75}, {"low", 50}, {"high", 75}, {"max", 100}, {1, 1}, {42, 42}, {100, 100}}) {
    ChatOptions o = V41(true);
    o.reasoning_effort = effort;
    EXPECT_EQ(RenderChat(q, o), "<｜begin▁of▁sentence｜>" + Effort(budget) + "<｜User｜>question<｜Assistant｜><think>")
        << effort.dump();
  }
  {
    ChatOptions o = V41(false);
    o.reasoning_effort = "max";
    EXPECT_EQ(RenderChat(Json::parse(R"([{"role": "user", "content": "hello"}])"), o),
              "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜></think>");
  }
  EXPECT_EQ(RenderChat(Json::parse(R"([{"role": "system", "content": "You are a helpful assistant."},
                                       {"role": "user", "content": "hello"}])"),
                       V41(false)),
            "<｜begin▁of▁sentence｜><｜System｜>You are a helpful assistant.<｜User｜>hello<｜Assistant｜></think>");
  {
    ChatOptions o = V41(true);
    o.reasoning_effort = 88;
    EXPECT_EQ(RenderChat(Json::parse(R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
                                         {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                                         {"role": "system", "content": "mid sys"}])"),
                         o),
              "<｜begin▁of▁sentence｜>" + Effort(88) +
                  "sys<｜User｜>q1<｜Assistant｜></think>a1<｜end▁of▁sentence｜><｜System｜>mid sys<｜Assistant｜><think>");
  }
  {
    const std::string tool_call_output =
        "  reason  </think>summary\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"lookup\">\n"
        "<｜DSML｜ parameter name=\"query\" string=\"true\">value</｜DSML｜ parameter>\n"
        "<｜DSML｜ parameter name=\"limit\" string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
        "</｜DSML｜ calls><｜end▁of▁sentence｜>";
    const Json msgs = Json::parse(R"([{"role": "user", "content": "question"},
        {"role": "assistant", "reasoning_content": "  reason  ", "content": "summary", "tool_calls": [
          {"type": "function", "function": {"name": "lookup", "arguments": "{\"query\":\"value\",\"limit\":2}"}}]}])");
    EXPECT_EQ(RenderChat(msgs, V41(true)),
              "<｜begin▁of▁sentence｜>" + kEffort75 + "<｜User｜>question<｜Assistant｜><think>" + tool_call_output);
  }
  {
    const std::string p = RenderChat(Json::parse(R"([{"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"}, {"role": "user", "content": "q2"}])"),
                                     V41(true));
    EXPECT_NE(p.find("<｜User｜>q1<｜Assistant｜></think>a1<｜end▁of▁sentence｜>"), std::string::npos);
    EXPECT_EQ(p.find("r1"), std::string::npos);
    EXPECT_TRUE(p.ends_with("<｜User｜>q2<｜Assistant｜><think>"));
  }
  {
    const std::string p =
        RenderChat(Json::parse(R"([{"role": "user", "content": "classify me", "task": "query"}])"), V41(false));
    EXPECT_TRUE(p.ends_with("classify me<｜query｜>"));
    EXPECT_EQ(p.find("<｜Assistant｜>"), std::string::npos);
  }
  EXPECT_EQ(RenderChat(Json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "inspect"},
                                       {"type": "image_url", "image_url": {"url": "/unused/image.png"}}]}])"),
                       V41(false)),
            "<｜begin▁of▁sentence｜><｜User｜>inspect\n\n<｜deepseek_image｜><｜Assistant｜></think>");
}

TEST(ChatFormat, InvalidInputIsAnError) {
  const Json q = Json::parse(R"([{"role": "user", "content": "question"}])");
  for (const Json& bad : {Json(-1), Json(0), Json(101), Json("medium"), Json(true), Json(1.5)}) {
    ChatOptions o = V41(true);
    o.reasoning_effort = bad;
    EXPECT_THROW(RenderChat(q, o), Error) << bad.dump();
  }
  EXPECT_THROW(RenderChat(Json::parse(R"([{"role": "user", "content": "hi <｜deepseek_image｜>"}])"), V41(false)),
               Error);
  EXPECT_THROW(RenderChat(Json::parse(R"([{"role": "developer", "content": "x"}])"), V41(false)), Error);
  EXPECT_THROW(RenderChat(Json::parse(R"([{"role": "wizard", "content": "x"}])"), V41(false)), Error);
  EXPECT_THROW(RenderChat(Json::parse(R"({"role": "user"})"), V41(false)), Error);
  try {
    RenderChat(Json::parse(R"([{"role": "user", "content": "a"}, {"role": "system", "content": 5}])"), V41(false));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat message 1"), std::string::npos) << e.what();
  }
  // Errors name the field the caller wrote.
  auto message = [](const char* msgs) {
    try {
      RenderChat(Json::parse(msgs), V41(false));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"([{"role": "user", "content": 5}])"),
            "chat message 0: \"content\" must be a string or a list of content blocks, found number");
  EXPECT_EQ(message(R"([{"role": "user", "content": {"a": 1}}])"),
            "chat message 0: \"content\" must be a string or a list of content blocks, found object");
  EXPECT_EQ(message(R"([{"role": "user", "content": null}])"),
            "chat message 0: \"content\" is null (give a string or a list of content blocks)");
  EXPECT_EQ(message(R"([{"content": "x"}])"), "chat message 0: \"role\" is missing");
  EXPECT_EQ(message(R"([{"role": 1, "content": "x"}])"), "chat message 0: \"role\" must be a string, found number");
  EXPECT_EQ(message(R"([{"role": "assistant", "content": null}, {"role": "user", "content": "x"}])"), "no error");
  ChatOptions v4;
  v4.encoding = ChatEncoding::kDeepseekV4;
  v4.reasoning_effort = 50;
  EXPECT_THROW(RenderChat(q, v4), Error);
  EXPECT_EQ(ChatEncodingForModelType("deepseek_v41"), ChatEncoding::kDeepseekV41);
  EXPECT_EQ(ChatEncodingForModelType("deepseek_v4"), ChatEncoding::kDeepseekV4);
  EXPECT_THROW(ChatEncodingForModelType("llama"), Error);
}

TEST(ChatFormat, GenerationPromptCanBeLeftOut) {
  const Json msgs = Json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])");
  ChatOptions o = V41(false);
  EXPECT_EQ(RenderChat(msgs, o), "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>U<｜Assistant｜></think>");
  o.add_generation_prompt = false;
  EXPECT_EQ(RenderChat(msgs, o), "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>U");
  o.thinking = true;
  EXPECT_EQ(RenderChat(msgs, o), "<｜begin▁of▁sentence｜>" + kEffort75 + "S<｜User｜>U");
  // Only the final header goes: earlier turns keep theirs.
  const Json two = Json::parse(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "c"}])");
  o.thinking = false;
  EXPECT_EQ(RenderChat(two, o),
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜><｜User｜>c");
}

TEST(ChatFormat, ExactlyOneBosAfterTokenization) {
  const Tokenizer& tok = testing::V3Tokenizer();
  const Json msgs = Json::parse(R"([{"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
      {"role": "user", "content": "Bye"}])");
  for (bool thinking : {false, true})
    for (ChatEncoding e : {ChatEncoding::kDeepseekV4, ChatEncoding::kDeepseekV41}) {
      ChatOptions o;
      o.encoding = e;
      o.thinking = thinking;
      const std::vector<int32_t> ids = EncodeChat(tok, msgs, o);
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids[0], tok.bos_id());
      EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.bos_id()), 1);
      EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.TokenToId("<｜User｜>")), 2);
      EXPECT_EQ(tok.Decode(ids), RenderChat(msgs, o));
    }
}

// Request text never becomes a special (or any added) token: a message whose
// content is the literal text of every added token renders each as ordinary
// tokens — exactly one BOS, and the added-token ids are those of the template
// alone. Text without such matches tokenizes as the whole rendered string does.
TEST(ChatFormat, ContentNeverProducesSpecialTokens) {
  const Tokenizer& tok = testing::V3Tokenizer();
  std::string all;
  for (const AddedToken& t : tok.added_tokens())
    if (t.content != "<｜deepseek_image｜>") all += t.content + " ";
  ASSERT_GT(tok.added_tokens().size(), 800u);
  auto conversation = [](const std::string& text, bool v41) {
    Json m = Json::array();
    m.push_back(Json{{"role", "system"}, {"content", text}});
    m.push_back(Json{{"role", "user"}, {"content", text}});
    m.push_back(Json{{"role", "assistant"}, {"content", text}, {"reasoning_content", text}});
    Json block = Json::object();
    block["type"] = "text";
    block["text"] = text;
    Json blocks = Json::array();
    blocks.push_back(block);
    Json last = Json::object();
    last["role"] = "user";
    last["content"] = blocks;
    if (v41) m.push_back(last);  // (content blocks are V4.1's)
    else m.push_back(Json{{"role", "user"}, {"content", text}});
    return m;
  };
  auto added_ids = [&](const std::vector<int32_t>& ids) {
    std::vector<int32_t> out;
    for (int32_t id : ids)
      if (tok.IsAdded(id)) out.push_back(id);
    return out;
  };
  for (bool thinking : {false, true})
    for (ChatEncoding e : {ChatEncoding::kDeepseekV4, ChatEncoding::kDeepseekV41}) {
      ChatOptions o;
      o.encoding = e;
      o.thinking = thinking;
      o.drop_thinking = false;
      const bool v41 = e == ChatEncoding::kDeepseekV41;
      const Json forged = conversation(all, v41);
      const std::vector<int32_t> ids = EncodeChat(tok, forged, o);
      EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.bos_id()), 1);
      const std::vector<int32_t> template_only = added_ids(EncodeChat(tok, conversation("x", v41), o));
      EXPECT_EQ(added_ids(ids), template_only) << "an added token came from content";
      EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.TokenToId("<｜User｜>")), 2);
      EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.TokenToId("<｜Assistant｜>")),
                std::count(template_only.begin(), template_only.end(), *tok.TokenToId("<｜Assistant｜>")));
      EXPECT_EQ(tok.Decode(ids), RenderChat(forged, o));  // the same text, as characters
      // Ordinary text: the same ids as tokenizing the rendered string whole.
      const Json plain = conversation("Hello there, how are you?", v41);
      EXPECT_EQ(EncodeChat(tok, plain, o), tok.Encode(RenderChat(plain, o), /*add_special_tokens=*/false));
    }
}

TEST(ChatFormat, PythonJsonDumps) {
  EXPECT_EQ(PyJsonDumps(Json::parse(R"({"b": 1, "a": [1.0, 1e-07, 1e22, -0.25, 0.1, 1e16, 1e15, 0.0001, 1e-05,
      123456.789, 5e-324, 1.7976931348623157e308, -0.0, 2.5e-5, 100.0, 1234567890123456789.0, 12345678901234567890,
      -3, true, null], "c": {}, "d": []})")),
            "{\"b\": 1, \"a\": [1.0, 1e-07, 1e+22, -0.25, 0.1, 1e+16, 1000000000000000.0, 0.0001, 1e-05, 123456.789, "
            "5e-324, 1.7976931348623157e+308, -0.0, 2.5e-05, 100.0, 1.2345678901234568e+18, 12345678901234567890, -3, "
            "true, null], \"c\": {}, \"d\": []}");
  EXPECT_EQ(PyJsonDumps(Json("x\u0001\u007f\u00e9\u2028\"\\ \b\f\n\r\t")),
            "\"x\\u0001\u007f\u00e9\u2028\\\"\\\\ \\b\\f\\n\\r\\t\"");
}

// V4 takes string content only: OpenAI's list of text blocks renders as the texts joined by "\n"
// (vLLM's "string" content format), the same prompt as that string; other block types are an error.
TEST(ChatFormat, V4ListContentOfTextBlocksIsItsJoinedText) {
  ChatOptions v4;
  v4.encoding = ChatEncoding::kDeepseekV4;
  v4.add_generation_prompt = true;
  const Json blocks = Json::parse(
      R"([{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}])");
  const Json flat = Json::parse(R"([{"role": "user", "content": "Hello\nthere"}])");
  EXPECT_EQ(RenderChat(blocks, v4), RenderChat(flat, v4));
  EXPECT_NE(RenderChat(blocks, v4).find("Hello\nthere"), std::string::npos);
  auto message = [&](const char* text) {
    try {
      RenderChat(Json::parse(text), v4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])"),
            "chat message 0: \"content\"[0]: content block type \"image_url\" is not supported by this model (text only)");
  EXPECT_EQ(message(R"([{"role": "user", "content": [{"type": "text", "text": 3}]}])"),
            "chat message 0: \"content\"[0].text must be a string");
  EXPECT_EQ(message(R"([{"role": "user", "content": [{"type": {"a": 1}}]}])"),
            "chat message 0: \"content\"[0]: content block type \"\" is not supported by this model (text only)");
}

}  // namespace
}  // namespace deepinfer
