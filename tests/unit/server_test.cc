// Server tests: the OpenAI schema (parsing, validation, response and SSE
// formats), the reasoning split, the Prometheus text, and the whole HTTP
// server in-process over a fake model backend (a real Engine, a real
// tokenizer, real sockets on 127.0.0.1). The end-to-end suite with the
// official `openai` client on the tiny checkpoint is tests/cli/server_e2e.sh.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "deepinfer/engine.h"
#include "engine/backend.h"
#include "http_client_testing.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "structured/matcher.h"
#include "tokenizer/tiny_tokenizer_files.h"
#include "tokenizer/tokenizer.h"

#include "server_testing.h"

namespace deepinfer::server {
namespace {

using json = nlohmann::json;
// Runs fn and returns the ApiError it throws (fails the test if none).
template <typename F>
ApiError Catch(F&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "", "");
}

// ---------------------------------------------------------------------------
// Pure parts

TEST(ReasoningSplitter, SplitsAtThinkEndAcrossPieces) {
  ReasoningSplitter s(true);
  auto a = s.Push("let me see <");
  EXPECT_EQ(a.reasoning, "let me see ");  // "<" is held: it may start "</think>"
  EXPECT_EQ(a.content, "");
  auto b = s.Push("/thi");
  EXPECT_EQ(b.reasoning, "");
  auto c = s.Push("nk>The answer");
  EXPECT_EQ(c.reasoning, "");
  EXPECT_EQ(c.content, "The answer");
  EXPECT_FALSE(s.in_reasoning());
  EXPECT_EQ(s.Push(" is 4 </think>").content, " is 4 </think>");  // only the first one splits
}

TEST(ReasoningSplitter, ReleasesAFalseStartAndFlushes) {
  ReasoningSplitter s(true);
  EXPECT_EQ(s.Push("a </th").reasoning, "a ");
  EXPECT_EQ(s.Push("ing").reasoning, "</thing");
  EXPECT_EQ(s.Push("x</").reasoning, "x");
  auto f = s.Flush();
  EXPECT_EQ(f.reasoning, "</");
  EXPECT_EQ(f.content, "");
  ReasoningSplitter off(false);
  EXPECT_EQ(off.Push("a </think> b").content, "a </think> b");
}

TEST(Metrics, PrometheusTextHasCumulativeBucketsAndLabels) {
  ServerMetrics m;
  m.ObserveTimeToFirstToken(0.003);
  m.ObserveTimeToFirstToken(0.05);
  m.ObserveTimeToFirstToken(5000);
  m.CountFinished("stop");
  m.CountFinished("abort");
  m.CountFinished("abort");
  EngineStats s;
  s.num_running = 2;
  s.num_kv_blocks = 64;
  s.num_kv_blocks_used = 16;
  s.generation_tokens_total = 99;
  const std::string t = m.Render(s, "a\"b");
  EXPECT_NE(t.find("deepinfer_num_requests_running{model_name=\"a\\\"b\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("deepinfer_kv_cache_usage_perc{model_name=\"a\\\"b\"} 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("deepinfer_generation_tokens_total{model_name=\"a\\\"b\"} 99\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE deepinfer_time_to_first_token_seconds histogram\n"), std::string::npos);
  EXPECT_NE(t.find("deepinfer_time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"0.001\"} 0\n"),
            std::string::npos);
  EXPECT_NE(t.find("deepinfer_time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"0.005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("deepinfer_time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"0.06\"} 2\n"),
            std::string::npos);
  EXPECT_NE(t.find("deepinfer_time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"2560\"} 2\n"),
            std::string::npos);
  EXPECT_NE(t.find("deepinfer_time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"+Inf\"} 3\n"),
            std::string::npos);
  EXPECT_NE(t.find("deepinfer_time_to_first_token_seconds_count{model_name=\"a\\\"b\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("deepinfer_time_to_first_token_seconds_sum{model_name=\"a\\\"b\"} 5000.053\n"), std::string::npos);
  EXPECT_NE(t.find("deepinfer_request_success_total{model_name=\"a\\\"b\",finished_reason=\"abort\"} 2\n"),
            std::string::npos);
}

TEST(OpenAiParse, CompletionFieldsAndDefaults) {
  const ModelInfo info = Info();
  ParsedRequest r = ParseCompletionRequest(
      json::parse(R"({"model":"tiny","prompt":["Hello","world"],"n":2,"seed":7,"temperature":0.5,
                     "logprobs":3,"stop":"x","stream":true,"stream_options":{"include_usage":true}})"),
      info);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], SharedTokenizer().Encode("Hello"));
  EXPECT_EQ(r.num_choices(), 4);
  EXPECT_EQ(r.params.max_tokens, 16);  // OpenAI's completions default
  EXPECT_EQ(r.params.temperature, 0.5);
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage && r.want_logprobs);
  auto g = r.ToGenerateRequests("cmpl-1");
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].params.seed, 7);
  EXPECT_EQ(g[1].params.seed, 8);  // vLLM: seed + j within a prompt
  EXPECT_EQ(g[2].params.seed, 7);
  EXPECT_EQ(*g[3].prompt_token_ids, SharedTokenizer().Encode("world"));
  EXPECT_EQ(g[3].request_id, "cmpl-1-3");
}

TEST(OpenAiParse, ChatTranslatesLogprobsAndMaxCompletionTokens) {
  const ModelInfo info = Info();
  const std::string body =
      R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":2,
          "max_completion_tokens":9,"max_tokens":100,"chat_template_kwargs":{"thinking":true}})";
  ParsedRequest r = ParseChatRequest(json::parse(body), nlohmann::ordered_json::parse(body), info);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_TRUE(r.thinking);
  const std::string rendered = SharedTokenizer().Decode(r.prompts[0]);
  EXPECT_NE(rendered.find("<｜User｜>Hi<｜Assistant｜><think>"), std::string::npos) << rendered;
  // Without max tokens, chat may use the rest of the context.
  const std::string b2 = R"({"messages":[{"role":"user","content":"Hi"}]})";
  EXPECT_FALSE(ParseChatRequest(json::parse(b2), nlohmann::ordered_json::parse(b2), info).params.max_tokens);
}

TEST(OpenAiParse, ErrorsNameTheField) {
  const ModelInfo info = Info();
  auto comp = [&](const char* body) { return Catch([&] { ParseCompletionRequest(json::parse(body), info); }); };
  auto chat = [&](const char* body) {
    return Catch([&] { ParseChatRequest(json::parse(body), nlohmann::ordered_json::parse(body), info); });
  };
  ApiError e = comp(R"({"prompt":"a","temperature":"hot"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "temperature");
  EXPECT_EQ(e.type, "invalid_request_error");
  e = comp(R"({"prompt":"a","top_p":1.5})");
  EXPECT_EQ(e.param, "top_p");
  EXPECT_NE(std::string(e.what()).find("1.5"), std::string::npos);
  e = comp(R"({"prompt":"a","model":"gpt-4"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "model_not_found");
  e = comp(R"({"prompt":""})");
  EXPECT_EQ(e.param, "prompt");
  e = comp(R"({"prompt":[]})");
  EXPECT_EQ(e.param, "prompt");
  e = comp(R"({"prompt":[1, 200000]})");
  EXPECT_NE(std::string(e.what()).find("200000"), std::string::npos);
  e = comp(R"({"prompt":"a b c","max_tokens":510})");
  EXPECT_EQ(e.code, "context_length_exceeded");
  const std::string m = e.what();
  const size_t n = SharedTokenizer().Encode("a b c").size();
  EXPECT_NE(m.find("512"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(n) + " in the prompt"), std::string::npos) << m;
  EXPECT_NE(m.find("510"), std::string::npos) << m;
  e = comp(R"({"prompt":"a","n":0})");
  EXPECT_EQ(e.param, "n");
  e = comp(R"({"prompt":"a","stream_options":{"include_usage":true}})");
  EXPECT_EQ(e.param, "stream_options");
  e = comp(R"({"prompt":"a","logprobs":21})");
  EXPECT_EQ(e.param, "logprobs");
  e = comp(R"({"prompt":"a","suffix":"b"})");
  EXPECT_EQ(e.param, "suffix");
  e = chat(R"({"messages":[]})");
  EXPECT_EQ(e.param, "messages");
  e = chat(R"({"messages":[{"role":"wizard","content":"x"}]})");
  EXPECT_EQ(e.param, "messages");
  e = chat(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})");
  EXPECT_EQ(e.param, "top_logprobs");
  e = chat(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})");
  EXPECT_EQ(e.param, "max_completion_tokens");
  EXPECT_EQ(Catch([] { ParseJsonBody("{\"prompt\": \"\xff\"}"); }).status, 400);
  EXPECT_EQ(Catch([] { ParseJsonBody("[1,2]"); }).status, 400);
}

// Text that cannot fit max_model_len whatever its tokenization (more bytes
// than max_model_len × the longest token) is refused before tokenizing.
TEST(OpenAiParse, OverlongTextIsRefusedBeforeTokenizing) {
  ModelInfo info = Info();
  info.max_model_len = 10;
  info.max_token_bytes = 4;
  auto comp = [&](const std::string& prompt) {
    return Catch([&] { ParseCompletionRequest(json{{"prompt", prompt}, {"max_tokens", 1}}, info); });
  };
  ApiError e = comp(std::string(41, 'x'));
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(std::string(e.what()).find("41 bytes"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("at least 11 tokens"), std::string::npos) << e.what();
  // 40 bytes may fit: it is tokenized and judged by its real length.
  const std::string forty(40, 'x');
  const int64_t n = static_cast<int64_t>(SharedTokenizer().Encode(forty).size());
  if (n + 1 > 10) {
    e = comp(forty);
    EXPECT_NE(std::string(e.what()).find(std::to_string(n) + " in the prompt"), std::string::npos) << e.what();
  }
  // Chat: the bytes of every string in messages count.
  const json chat = {{"messages", {{{"role", "user"}, {"content", std::string(30, 'y')}},
                                   {{"role", "user"}, {"content", std::string(11, 'z')}}}}};
  e = Catch([&] { ParseChatRequest(chat, nlohmann::ordered_json::parse(chat.dump()), info); });
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "messages");
}

TEST(OpenAiParse, PromptLogprobs) {
  const ModelInfo info = Info();
  auto comp = [&](const char* body) { return ParseCompletionRequest(json::parse(body), info); };
  auto comp_err = [&](const char* body) { return Catch([&] { comp(body); }); };
  ParsedRequest r = comp(R"({"prompt":"a b","prompt_logprobs":2,"n":2})");
  EXPECT_TRUE(r.want_prompt_logprobs);
  EXPECT_EQ(r.params.prompt_logprobs, std::optional<int64_t>(2));
  // Choices of one prompt share prompt_logprobs: only the first computes them.
  const auto gens = r.ToGenerateRequests("cmpl-x");
  ASSERT_EQ(gens.size(), 2u);
  EXPECT_EQ(gens[0].params.prompt_logprobs, std::optional<int64_t>(2));
  EXPECT_FALSE(gens[1].params.prompt_logprobs.has_value());
  EXPECT_FALSE(comp(R"({"prompt":"a"})").want_prompt_logprobs);
  for (const char* bad : {R"({"prompt":"a","prompt_logprobs":50})", R"({"prompt":"a","prompt_logprobs":-2})",
                          R"({"prompt":"a","prompt_logprobs":"x"})", R"({"prompt":"a","prompt_logprobs":1,"stream":true})"}) {
    ApiError e = comp_err(bad);
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.param, "prompt_logprobs") << bad << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("prompt_logprobs"), std::string::npos) << e.what();
  }

  // Response: vLLM's format, copied to every choice of the prompt.
  ResponseBuilder b(r, info, "cmpl-x", 1);
  LogprobsEntry e;
  e.chosen = TokenLogprob{5, -1.5f, 3};
  e.top = {TokenLogprob{7, -0.5f, 1}, TokenLogprob{9, -1.0f, 2}};
  ChoiceOutput o0;
  o0.index = 0;
  o0.out.new_token_ids = {11};
  o0.out.finished = true;
  o0.out.finish_reason = "length";
  o0.out.prompt_logprobs = {std::nullopt, e};
  ChoiceOutput o1 = o0;
  o1.index = 1;
  o1.out.prompt_logprobs.clear();
  b.OnOutput(std::move(o1));
  b.OnOutput(std::move(o0));
  const json f = b.Final();
  const auto text = [](int32_t id) { return SharedTokenizer().Decode(std::vector<int32_t>{id}); };
  const json want = json::array(
      {nullptr, json{{"5", {{"logprob", -1.5}, {"rank", 3}, {"decoded_token", text(5)}}},
                     {"7", {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", text(7)}}},
                     {"9", {{"logprob", -1.0}, {"rank", 2}, {"decoded_token", text(9)}}}}});
  EXPECT_EQ(f["choices"][0]["prompt_logprobs"], want) << f.dump();
  EXPECT_EQ(f["choices"][1]["prompt_logprobs"], want) << f.dump();

  // Chat: accepted, and reported at the top level.
  const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],"prompt_logprobs":0})";
  ParsedRequest c = ParseChatRequest(json::parse(body), nlohmann::ordered_json::parse(body), info);
  EXPECT_TRUE(c.want_prompt_logprobs);
  ResponseBuilder cb(c, info, "chatcmpl-x", 1);
  ChoiceOutput co;
  co.out.finished = true;
  co.out.finish_reason = "length";
  co.out.prompt_logprobs = {std::nullopt, e};
  cb.OnOutput(std::move(co));
  EXPECT_EQ(cb.Final()["prompt_logprobs"], want);
  const std::string sbody = R"({"messages":[{"role":"user","content":"Hi"}],"prompt_logprobs":0,"stream":true})";
  EXPECT_EQ(Catch([&] { ParseChatRequest(json::parse(sbody), nlohmann::ordered_json::parse(sbody), info); }).param,
            "prompt_logprobs");
}

// Tool calls: the DSML block of the output becomes message.tool_calls and
// delta.tool_calls whatever the chunking; streamed argument fragments
// concatenate to the final arguments; finish_reason "tool_calls".
TEST(OpenAiResponse, ToolCallsStreamedAndFinalAgreeAtEveryCut) {
  const ModelInfo info = Info();
  const std::string body = R"({"messages":[{"role":"user","content":"Weather?"}],"stream":true,
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"}}}}}]})";
  const ParsedRequest r = ParseChatRequest(json::parse(body), nlohmann::ordered_json::parse(body), info);
  ASSERT_TRUE(r.tools);
  ASSERT_FALSE(r.constraint);  // "auto": not constrained
  // The tools are in the prompt.
  EXPECT_NE(SharedTokenizer().Decode(r.prompts[0]).find("\"name\": \"get_weather\""), std::string::npos);
  const std::string text =
      "Sure.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" "
      "string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  for (size_t cut = 0; cut <= text.size(); cut += 3) {
    ResponseBuilder stream(r, info, "chatcmpl-x", 1);
    ResponseBuilder whole(r, info, "chatcmpl-x", 1);
    std::string events = stream.Prologue();
    const std::vector<std::string> pieces = {text.substr(0, cut), text.substr(cut)};
    for (size_t i = 0; i < pieces.size(); ++i) {
      ChoiceOutput o;
      o.out.new_text = pieces[i];
      o.out.new_token_ids = {static_cast<int32_t>(100 + i)};
      if (i + 1 == pieces.size()) {
        o.out.finished = true;
        o.out.finish_reason = "stop";
      }
      ChoiceOutput o2 = o;
      events += stream.OnStreamOutput(std::move(o));
      whole.OnOutput(std::move(o2));
    }
    const json fin = whole.Final();
    const json& msg = fin["choices"][0]["message"];
    ASSERT_EQ(fin["choices"][0]["finish_reason"], "tool_calls");
    ASSERT_EQ(msg["content"], "Sure.");
    ASSERT_EQ(msg["tool_calls"].size(), 1u);
    ASSERT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
    ASSERT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
    std::string content, args, name, finish;
    size_t pos = 0;
    while ((pos = events.find("data: ", pos)) != std::string::npos) {
      const size_t end = events.find("\n\n", pos);
      const json c = json::parse(events.substr(pos + 6, end - pos - 6));
      pos = end;
      const json& d = c["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const json& tc : d["tool_calls"]) {
          EXPECT_EQ(tc["index"], 0);
          if (tc["function"].contains("name")) name += tc["function"]["name"].get<std::string>();
          args += tc["function"]["arguments"].get<std::string>();
        }
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    ASSERT_EQ(content, "Sure.") << cut;
    ASSERT_EQ(name, "get_weather") << cut;
    ASSERT_EQ(args, R"({"city":"Paris"})") << cut;
    ASSERT_EQ(finish, "tool_calls") << cut;
  }
}

TEST(OpenAiParse, StructuredOutputFields) {
  const ModelInfo info = Info();
  auto chat = [&](const std::string& b) { return ParseChatRequest(json::parse(b), nlohmann::ordered_json::parse(b), info); };
  const ParsedRequest a = chat(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
      "json_schema":{"name":"n","schema":{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}}}})");
  ASSERT_TRUE(a.constraint);
  auto c = a.constraint->InitialConfig();
  EXPECT_TRUE(a.constraint->Advance(&c, R"({"b": 1, "a": "x"})"));  // properties in the order written
  EXPECT_TRUE(a.constraint->Accepts(c));
  EXPECT_EQ(a.ToGenerateRequests("id")[0].constraint, a.constraint);
  const ParsedRequest forced = chat(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required",
      "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]})");
  ASSERT_TRUE(forced.constraint);
  auto fc = forced.constraint->InitialConfig();
  EXPECT_TRUE(forced.constraint->Advance(&fc, "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"));
  EXPECT_TRUE(forced.constraint->IsTerminal(fc));
  auto err = [&](const std::string& b) {
    try {
      chat(b);
    } catch (const ApiError& e) {
      return std::string(e.param.value_or("")) + " | " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":3}}]})"),
            "tools | tools[0].function.parameters must be an object (a JSON Schema), found number");
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})"),
            "tool_choice | tool_choice: unknown tool \"g\" (tools defines: f)");
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"guided_regex":"(a"})"),
            "guided_regex | guided_regex: invalid or unsupported regular expression at offset 2: missing ')'");
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"integer","maximum":3}}}})"),
            "response_format | response_format.json_schema.schema: unsupported JSON Schema keyword \"maximum\" (at /)");
}

// Prompt scoring: echo + logprobs (+ max_tokens 0) as OpenAI's legacy API and
// vLLM: the prompt's entries (first null) from the prompt_logprobs machinery,
// text_offset in characters into the echoed text.
TEST(OpenAiParse, EchoLogprobsScoring) {
  const ModelInfo info = Info();
  auto comp = [&](const char* body) { return ParseCompletionRequest(json::parse(body), info); };
  ParsedRequest r = comp(R"({"prompt":"héllo wörld","echo":true,"logprobs":2,"max_tokens":0})");
  EXPECT_TRUE(r.echo_only && r.echo_logprobs);
  EXPECT_EQ(r.params.max_tokens, 1);  // the engine runs one token, not returned
  EXPECT_EQ(r.params.prompt_logprobs, std::optional<int64_t>(2));
  EXPECT_FALSE(r.want_prompt_logprobs);
  // An explicit prompt_logprobs: the engine computes the larger N; each field gets its own.
  ParsedRequest both = comp(R"({"prompt":"a","echo":true,"logprobs":1,"prompt_logprobs":3,"max_tokens":2})");
  EXPECT_FALSE(both.echo_only);
  EXPECT_EQ(both.params.prompt_logprobs, std::optional<int64_t>(3));
  EXPECT_EQ(both.prompt_logprobs_top, std::optional<int64_t>(3));
  auto err = [&](const char* body) { return Catch([&] { comp(body); }); };
  EXPECT_EQ(err(R"({"prompt":"a","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(err(R"({"prompt":"a","echo":true,"logprobs":1,"stream":true})").param, "echo");
  EXPECT_EQ(err(R"({"prompt":"a","echo":true,"max_tokens":0,"min_tokens":1})").param, "min_tokens");

  // Response: prompt tokens first; the generated token of a max_tokens-0 request is dropped.
  const std::vector<int32_t>& p = r.prompts[0];
  ASSERT_GE(p.size(), 3u);
  ResponseBuilder b(r, info, "cmpl-s", 1);
  ChoiceOutput o;
  o.out.new_token_ids = {42};
  o.out.new_text = "zz";
  o.out.new_logprobs = {LogprobsEntry{TokenLogprob{42, -0.1f, 1}, {}}};
  o.out.finished = true;
  o.out.finish_reason = "length";
  o.out.prompt_logprobs.push_back(std::nullopt);
  for (size_t k = 1; k < p.size(); ++k) {
    LogprobsEntry e;
    e.chosen = TokenLogprob{p[k], -1.0f - static_cast<float>(k), 5};
    e.top = {TokenLogprob{7, -0.25f, 1}, TokenLogprob{9, -0.5f, 2}, TokenLogprob{11, -0.75f, 3}};
    o.out.prompt_logprobs.push_back(e);
  }
  b.OnOutput(std::move(o));
  const json f = b.Final();
  const json& c = f["choices"][0];
  EXPECT_EQ(c["text"], "héllo wörld");
  EXPECT_EQ(f["usage"]["completion_tokens"], 0);
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), p.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  const auto text = [](int32_t id) { return SharedTokenizer().Decode(std::vector<int32_t>{id}); };
  for (size_t k = 1; k < p.size(); ++k) {
    EXPECT_EQ(lp["token_logprobs"][k], static_cast<double>(-1.0f - static_cast<float>(k)));
    EXPECT_EQ(lp["top_logprobs"][k].size(), 3u) << lp["top_logprobs"][k].dump();  // top 2 + the token itself
    EXPECT_EQ(lp["top_logprobs"][k][text(7)], -0.25);
  }
  // text_offset: code points into the echoed text; the BOS added to a text prompt takes none.
  const std::u32string chars = U"héllo wörld";
  int64_t want = 0;
  for (size_t k = 0; k < p.size(); ++k) {
    EXPECT_EQ(lp["text_offset"][k], want) << k;
    if (k >= SharedTokenizer().prefix_special_ids().size()) {
      const std::string t = lp["tokens"][k];
      for (unsigned char ch : t) want += (ch & 0xC0) != 0x80;
    }
  }
  EXPECT_EQ(want, static_cast<int64_t>(chars.size()));
}

TEST(OpenAiResponse, StreamChunksAndFinalAgree) {
  const ModelInfo info = Info();
  const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"thinking":true},
                                "stream":true,"stream_options":{"include_usage":true}})";
  ParsedRequest r = ParseChatRequest(json::parse(body), nlohmann::ordered_json::parse(body), info);
  ResponseBuilder stream(r, info, "chatcmpl-x", 123);
  ResponseBuilder whole(r, info, "chatcmpl-x", 123);
  const std::vector<std::string> pieces = {"I think", " so</th", "ink>Yes", "."};
  std::string events = stream.Prologue();
  for (size_t i = 0; i < pieces.size(); ++i) {
    ChoiceOutput o;
    o.out.new_text = pieces[i];
    o.out.new_token_ids = {static_cast<int32_t>(100 + i)};
    if (i + 1 == pieces.size()) {
      o.out.finished = true;
      o.out.finish_reason = "stop";
    }
    ChoiceOutput o2 = o;
    events += stream.OnStreamOutput(std::move(o));
    whole.OnOutput(std::move(o2));
  }
  ASSERT_TRUE(stream.done());
  events += stream.Epilogue();
  // Reassemble the SSE stream.
  std::string reasoning, content, finish;
  json usage;
  size_t pos = 0;
  int n_events = 0;
  bool saw_done = false;
  while ((pos = events.find("data: ", pos)) != std::string::npos) {
    const size_t end = events.find("\n\n", pos);
    const std::string data = events.substr(pos + 6, end - pos - 6);
    pos = end;
    ++n_events;
    if (data == "[DONE]") {
      saw_done = true;
      continue;
    }
    json c = json::parse(data);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], "chatcmpl-x");
    if (c["choices"].empty()) {
      usage = c["usage"];
      continue;
    }
    const json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(saw_done);
  EXPECT_EQ(reasoning, "I think so");
  EXPECT_EQ(content, "Yes.");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(usage["completion_tokens"], 4);
  EXPECT_EQ(usage["prompt_tokens"], r.prompts[0].size());
  const json f = whole.Final();
  EXPECT_EQ(f["object"], "chat.completion");
  EXPECT_EQ(f["choices"][0]["message"]["reasoning_content"], "I think so");
  EXPECT_EQ(f["choices"][0]["message"]["content"], "Yes.");
  EXPECT_EQ(f["usage"]["total_tokens"], r.prompts[0].size() + 4);
}


TEST(HttpServer, HealthIs503WhileLoadingThen200) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  ServerFixture f({}, [&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
    return OpenFake();
  });
  auto c = f.Client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  int status = 0;
  json e = PostJson(c, "/v1/completions", R"({"prompt":"a"})", &status);
  EXPECT_EQ(status, 503);
  EXPECT_EQ(e["error"]["code"], "model_loading");
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_TRUE(f.WaitReady());
}

TEST(HttpServer, LoadFailureStopsTheServerWithTheMessage) {
  ServerFixture f({}, []() -> std::unique_ptr<Engine> {
    Fail(ErrorKind::kNotFound, "model directory /nowhere does not exist");
  });
  f.Shutdown();  // Run() returns by itself; Stop() is harmless
  EXPECT_NE(f.run_error().find("/nowhere does not exist"), std::string::npos) << f.run_error();
}

TEST(HttpServer, ABusyPortIsAnErrorNamingIt) {
  ServerFixture first;
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = first.port();
  o.served_model_names = {"tiny"};
  bool factory_called = false;
  HttpServer second(o, [&] {
    factory_called = true;
    return OpenFake();
  });
  try {
    second.Bind();
    ADD_FAILURE() << "a second server bound the same port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << e.what();
  }
  EXPECT_FALSE(factory_called);  // nothing is loaded when the port cannot be bound
}

TEST(HttpServer, CompletionsAreReproducibleAndRespectN) {
  ServerFixture f;
  ASSERT_TRUE(f.WaitReady());
  auto c = f.Client();
  int status = 0;
  const std::string body = R"({"model":"tiny","prompt":"The cat","max_tokens":12,"seed":5,"n":3,"logprobs":2})";
  json a = PostJson(c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << a.dump();
  json b = PostJson(c, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200);
  ASSERT_EQ(a["choices"].size(), 3u);
  EXPECT_EQ(a["object"], "text_completion");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a["choices"][i]["index"], i);
    EXPECT_EQ(a["choices"][i]["text"], b["choices"][i]["text"]);
    EXPECT_EQ(a["choices"][i]["finish_reason"], "length");
    EXPECT_EQ(a["choices"][i]["logprobs"]["tokens"].size(), 12u);
    EXPECT_EQ(a["choices"][i]["logprobs"]["top_logprobs"][0].size() >= 2, true);
  }
  EXPECT_NE(a["choices"][0]["text"], a["choices"][1]["text"]);  // seeds 5 and 6 differ
  EXPECT_EQ(a["usage"]["completion_tokens"], 36);
  // A single request with seed 6 reproduces choice 1.
  json one = PostJson(c, "/v1/completions", R"({"prompt":"The cat","max_tokens":12,"seed":6})", &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(one["choices"][0]["text"], a["choices"][1]["text"]);
  // The engine is idle again: nothing running, no blocks held.
  const EngineStats s = f.server().loop().Stats();
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_kv_blocks_used, 0);
  EXPECT_EQ(s.generation_tokens_total, 36 + 36 + 12);
}

TEST(HttpServer, StreamingEqualsNonStreaming) {
  ServerFixture f;
  ASSERT_TRUE(f.WaitReady());
  auto c = f.Client();
  int status = 0;
  json whole = PostJson(c, "/v1/chat/completions",
                        R"({"messages":[{"role":"user","content":"Hello"}],"max_tokens":20,"seed":1})", &status);
  ASSERT_EQ(status, 200) << whole.dump();
  std::string sse;
  auto r = c.Post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"Hello"}],"max_tokens":20,"seed":1,"stream":true,
                      "stream_options":{"include_usage":true}})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::string content;
  json usage;
  size_t pos = 0;
  std::string last;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    last = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (last == "[DONE]") break;
    json ch = json::parse(last);
    if (ch["choices"].empty()) usage = ch["usage"];
    else if (ch["choices"][0]["delta"].contains("content")) content += ch["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(last, "[DONE]");
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(usage, whole["usage"]);
}


// Streams, then closes the socket mid-stream.
void StreamThenDisconnect(int port, const std::string& body, std::string* got_out) {
  const int fd = OpenStream(port, body, got_out);
  ASSERT_GE(fd, 0) << *got_out;
  close(fd);
}

TEST(HttpServer, DisconnectMidStreamAbortsAndFreesBlocks) {
  ServerFixture f;
  ASSERT_TRUE(f.WaitReady());
  std::string got;
  StreamThenDisconnect(f.port(), R"({"prompt":"Once upon a time","max_tokens":480,"ignore_eos":true,"stream":true})",
                       &got);
  ASSERT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  // Wait (bounded) until the abort is counted and the blocks are back.
  const std::string aborted = "deepinfer_request_success_total{model_name=\"tiny\",finished_reason=\"abort\"} 1\n";
  const std::string no_blocks = "deepinfer_kv_cache_blocks_used{model_name=\"tiny\"} 0\n";
  const std::string none_running = "deepinfer_num_requests_running{model_name=\"tiny\"} 0\n";
  std::string body;
  bool freed = false;
  for (int i = 0; i < 400 && !freed; ++i) {
    auto m = f.Client().Get("/metrics");
    ASSERT_TRUE(m);
    body = m->body;
    freed = body.find(aborted) != std::string::npos && body.find(no_blocks) != std::string::npos &&
            body.find(none_running) != std::string::npos;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(freed) << got << "\n" << body;
  const EngineStats s = f.server().loop().Stats();
  EXPECT_EQ(s.num_kv_blocks_used, 0);
  EXPECT_GT(s.generation_tokens_total, 0);
  EXPECT_LT(s.generation_tokens_total, 480);  // stopped early
}

// Shutting down with a stream open: the stream ends with a shutting_down error
// event and [DONE] (not cut off), and Run() returns.
TEST(HttpServer, ShutdownEndsOpenStreamsVisibly) {
  ServerFixture f;
  ASSERT_TRUE(f.WaitReady());
  std::string got;
  const int fd =
      OpenStream(f.port(), R"({"prompt":"Once upon a time","max_tokens":480,"ignore_eos":true,"stream":true})", &got);
  ASSERT_GE(fd, 0) << got;
  char buf[4096];
  std::thread stopper([&] { f.Shutdown(); });
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    if (got.find("data: [DONE]") != std::string::npos) break;
  }
  close(fd);
  stopper.join();
  EXPECT_NE(got.find("\"code\":\"shutting_down\""), std::string::npos) << got.substr(got.size() > 600 ? got.size() - 600 : 0);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(got.find("\"finish_reason\":\"length\""), std::string::npos);  // it did not just run to the end
}

TEST(HttpServer, EngineFailureFailsOnlyThatRequest) {
  ServerFixture f;
  ASSERT_TRUE(f.WaitReady());
  int s1 = 0, s2 = 0;
  json bad, good;
  std::thread t([&] {
    auto c = f.Client();
    bad = PostJson(c, "/v1/completions", R"({"prompt":[5, 6, 129279],"max_tokens":5})", &s1);
  });
  auto c = f.Client();
  good = PostJson(c, "/v1/completions", R"({"prompt":"fine","max_tokens":5})", &s2);
  t.join();
  EXPECT_EQ(s1, 500);
  EXPECT_EQ(bad["error"]["type"], "server_error");
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("NaN"), std::string::npos) << bad.dump();
  EXPECT_EQ(s2, 200);
  EXPECT_EQ(good["usage"]["completion_tokens"], 5);
}

TEST(HttpServer, EdgeErrorsAndAuth) {
  ServerOptions o;
  o.api_key = "sekret";
  o.max_request_bytes = 4096;
  ServerFixture f(o);
  ASSERT_TRUE(f.WaitReady());
  auto c = f.Client();
  const http_testing::TestHeaders auth = {{"Authorization", "Bearer sekret"}};
  int status = 0;
  json e = PostJson(c, "/v1/completions", R"({"prompt":"a"})", &status);
  EXPECT_EQ(status, 401);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  e = PostJson(c, "/v1/completions", R"({"prompt":"a"})", &status, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(status, 401);
  e = PostJson(c, "/v1/completions", R"({"prompt": "a", )", &status, auth);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"].contains("param") && e["error"].contains("code"));
  e = PostJson(c, "/v1/completions", std::string(5000, ' ') + "{}", &status, auth);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["code"], "request_too_large");
  e = PostJson(c, "/v1/nothing", "{}", &status, auth);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(e["error"]["code"], "not_found");
  // Open routes.
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  e = PostJson(c, "/tokenize", R"({"prompt":"Hello world"})", &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(e["tokens"].get<std::vector<int32_t>>(), SharedTokenizer().Encode("Hello world"));
  EXPECT_EQ(e["count"], e["tokens"].size());
  json d = PostJson(c, "/detokenize", json{{"tokens", e["tokens"]}}.dump(), &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(d["prompt"], SharedTokenizer().Decode(e["tokens"].get<std::vector<int32_t>>()));
  e = PostJson(c, "/detokenize", R"({"tokens":[-1]})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "tokens");
  // Still serving.
  e = PostJson(c, "/v1/completions", R"({"prompt":"a","max_tokens":3})", &status, auth);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(e["usage"]["completion_tokens"], 3);
  auto models = c.Get("/v1/models", auth);
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
}

}  // namespace
}  // namespace deepinfer::server
