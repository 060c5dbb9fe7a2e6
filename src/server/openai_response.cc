// deepinfer/server/openai_response.cc — see openai_api.h: the response side of the OpenAI API
// (ReasoningSplitter, ResponseBuilder: choices, logprobs, usage, SSE chunks); the request side is
// openai_api.cc. Field names and shapes follow OpenAI's API reference and vLLM's extensions.
#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Reasoning split

namespace {
constexpr std::string_view kThinkEnd = "</think>";
}

ReasoningSplitter::Delta ReasoningSplitter::Push(std::string_view text) {
  Delta d;
  if (!in_reasoning_) {
    d.content.assign(text);
    return d;
  }
  std::string buf = held_;
  buf.append(text);
  held_.clear();
  const size_t pos = buf.find(kThinkEnd);
  if (pos != std::string::npos) {
    d.reasoning = buf.substr(0, pos);
    d.content = buf.substr(pos + kThinkEnd.size());
    in_reasoning_ = false;
    return d;
  }
  // Hold back the longest suffix that is a proper prefix of "</think>".
  size_t hold = 0;
  for (size_t k = std::min(buf.size(), kThinkEnd.size() - 1); k > 0; --k) {
    if (std::string_view(buf).substr(buf.size() - k) == kThinkEnd.substr(0, k)) {
      hold = k;
      break;
    }
  }
  d.reasoning = buf.substr(0, buf.size() - hold);
  held_ = buf.substr(buf.size() - hold);
  return d;
}

ReasoningSplitter::Delta ReasoningSplitter::Flush() {
  Delta d;
  if (in_reasoning_) d.reasoning = std::move(held_);
  held_.clear();
  return d;
}

// ---------------------------------------------------------------------------
// Responses

ResponseBuilder::ResponseBuilder(const ParsedRequest& req, const ModelInfo& info, std::string id, int64_t created)
    : req_(req), info_(info), id_(std::move(id)), created_(created) {
  const bool chat = req.endpoint == Endpoint::kChat;
  for (int c = 0; c < req.num_choices(); ++c) choices_.emplace_back(chat && req.thinking, chat && req.tools, req.v41);
}

ResponseBuilder::~ResponseBuilder() = default;

namespace {

double Logprob(float v) {
  // JSON has no infinities; vLLM reports -9999.0 for -inf.
  if (std::isinf(v) && v < 0) return -9999.0;
  if (!std::isfinite(v)) return -9999.0;
  return static_cast<double>(v);
}

// Characters (code points) of UTF-8 text: OpenAI's and vLLM's text_offset unit.
int64_t Utf8Chars(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string TokenText(const Tokenizer* tok, int32_t id) {
  if (!tok) return fmt::format("token_id:{}", id);
  try {
    return tok->Decode(std::vector<int32_t>{id});
  } catch (const Error&) {
    return fmt::format("token_id:{}", id);
  }
}

json TokenBytesJson(const Tokenizer* tok, int32_t id) {
  json b = json::array();
  if (!tok) return b;
  try {
    for (unsigned char ch : tok->TokenBytes(id)) b.push_back(static_cast<int>(ch));
  } catch (const Error&) {
  }
  return b;
}

}  // namespace

json ResponseBuilder::CompletionLogprobs(int64_t* text_offset, const std::vector<LogprobsEntry>& entries) const {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const LogprobsEntry& e : entries) {
    const std::string t = TokenText(info_.tokenizer, e.chosen.token_id);
    tokens.push_back(t);
    token_logprobs.push_back(Logprob(e.chosen.logprob));
    json d = json::object();
    for (const TokenLogprob& x : e.top) d[TokenText(info_.tokenizer, x.token_id)] = Logprob(x.logprob);
    if (!d.contains(t)) d[t] = Logprob(e.chosen.logprob);
    top.push_back(d);
    offsets.push_back(*text_offset);
    *text_offset += Utf8Chars(t);
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json ResponseBuilder::EchoLogprobs(const std::vector<int32_t>& prompt, bool text_prompt,
                                   const std::vector<std::optional<LogprobsEntry>>& pl,
                                   const std::vector<LogprobsEntry>& generated) const {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  const int64_t n = req_.params.logprobs.value_or(0);
  // text_offset indexes the echoed text: the special tokens the tokenizer put
  // before a text prompt (BOS) are not in that text and take no characters.
  size_t skip = 0;
  if (info_.tokenizer && text_prompt) {
    const std::vector<int32_t>& pre = info_.tokenizer->prefix_special_ids();
    if (!pre.empty() && prompt.size() >= pre.size() && std::equal(pre.begin(), pre.end(), prompt.begin())) skip = pre.size();
  }
  int64_t offset = 0;
  for (size_t p = 0; p < prompt.size(); ++p) {
    const std::string t = TokenText(info_.tokenizer, prompt[p]);
    tokens.push_back(t);
    offsets.push_back(offset);
    if (p >= skip) offset += Utf8Chars(t);
    if (p >= pl.size() || !pl[p]) {  // the first token has no context
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    const LogprobsEntry& e = *pl[p];
    token_logprobs.push_back(Logprob(e.chosen.logprob));
    json d = json::object();
    for (size_t k = 0; k < e.top.size() && (n < 0 || static_cast<int64_t>(k) < n); ++k)
      d[TokenText(info_.tokenizer, e.top[k].token_id)] = Logprob(e.top[k].logprob);
    if (!d.contains(t)) d[t] = Logprob(e.chosen.logprob);
    top.push_back(d);
  }
  json gen = CompletionLogprobs(&offset, generated);
  auto append = [](json& to, json& from) {
    for (json& x : from) to.push_back(std::move(x));
  };
  append(tokens, gen["tokens"]);
  append(token_logprobs, gen["token_logprobs"]);
  append(top, gen["top_logprobs"]);
  append(offsets, gen["text_offset"]);
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json ResponseBuilder::PromptLogprobsJson(const std::vector<std::optional<LogprobsEntry>>& entries,
                                         std::optional<int64_t> top) const {
  // vLLM: [null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}, ...]; each dict holds the
  // top-N ids and the prompt token itself.
  json arr = json::array();
  for (const auto& e : entries) {
    if (!e) {
      arr.push_back(nullptr);
      continue;
    }
    json d = json::object();
    auto put = [&](const TokenLogprob& x) {
      d[std::to_string(x.token_id)] = json{
          {"logprob", Logprob(x.logprob)}, {"rank", x.rank}, {"decoded_token", TokenText(info_.tokenizer, x.token_id)}};
    };
    put(e->chosen);
    for (size_t k = 0; k < e->top.size() && (!top || *top < 0 || static_cast<int64_t>(k) < *top); ++k) put(e->top[k]);
    arr.push_back(d);
  }
  return arr;
}

const std::vector<std::optional<LogprobsEntry>>& ResponseBuilder::PromptLogprobsOf(size_t choice) const {
  return choices_.at(choice / static_cast<size_t>(req_.n) * static_cast<size_t>(req_.n)).prompt_logprobs;
}

json ResponseBuilder::ChatLogprobs(const std::vector<LogprobsEntry>& entries) const {
  json content = json::array();
  for (const LogprobsEntry& e : entries) {
    json top = json::array();
    for (const TokenLogprob& x : e.top)
      top.push_back(json{{"token", TokenText(info_.tokenizer, x.token_id)},
                         {"logprob", Logprob(x.logprob)},
                         {"bytes", TokenBytesJson(info_.tokenizer, x.token_id)}});
    content.push_back(json{{"token", TokenText(info_.tokenizer, e.chosen.token_id)},
                           {"logprob", Logprob(e.chosen.logprob)},
                           {"bytes", TokenBytesJson(info_.tokenizer, e.chosen.token_id)},
                           {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

ResponseBuilder::ChoiceDelta ResponseBuilder::Apply(Choice& c, ChoiceOutput& o) {
  RequestOutput& out = o.out;
  if (req_.echo_only) {  // scoring: the one token the engine ran is not part of the answer
    out.new_text.clear();
    out.new_token_ids.clear();
    out.new_logprobs.clear();
    out.stop_reason.reset();
  }
  ChoiceDelta d;
  auto take = [&](structured::OutputParser::Delta p) {
    d.reasoning += p.reasoning;
    d.content += p.content;
    for (auto& call : p.calls) {
      // "call_" + 24 hex digits, unique per call (OpenAI's form).
      static thread_local std::mt19937_64 rng{std::random_device{}()};
      const std::string id = fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
      const json tc = {{"id", id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
      c.tool_calls.push_back(tc);
      json streamed = tc;
      streamed["index"] = c.tool_calls.size() - 1;
      d.tool_calls.push_back(streamed);
    }
  };
  take(c.parser.Push(out.new_text));
  c.token_ids.insert(c.token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
  if (req_.want_logprobs) c.logprobs.insert(c.logprobs.end(), out.new_logprobs.begin(), out.new_logprobs.end());
  if ((req_.want_prompt_logprobs || req_.echo_logprobs) && !out.prompt_logprobs.empty())
    c.prompt_logprobs = std::move(out.prompt_logprobs);
  if (out.finished && !c.finished) {
    c.cached_tokens = out.num_cached_tokens;
    take(c.parser.Flush());
    c.finished = true;
    ++num_finished_;
    c.finish_reason = out.finish_reason;
    if (c.finish_reason == "stop" && !c.tool_calls.empty()) c.finish_reason = "tool_calls";
    if (out.stop_reason) {
      if (std::holds_alternative<std::string>(*out.stop_reason)) c.stop_reason = std::get<std::string>(*out.stop_reason);
      else c.stop_reason = std::get<int64_t>(*out.stop_reason);
    }
    if (out.finish_reason == "error" && !error_)
      error_ = ApiError(500, "server_error",
                        fmt::format("the engine failed on this request: {}", out.error.empty() ? "unknown error" : out.error));
  }
  c.content += d.content;
  c.reasoning += d.reasoning;
  return d;
}

json ResponseBuilder::ChunkBase() const {
  return json{{"id", id_},
              {"object", req_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", info_.served_model_names.at(0)}};
}

std::string ResponseBuilder::Event(const json& chunk) const { return "data: " + Dump(chunk) + "\n\n"; }

json ResponseBuilder::Usage() const {
  int64_t prompt = 0, completion = 0;
  for (const auto& p : req_.prompts) prompt += static_cast<int64_t>(p.size());
  for (const Choice& c : choices_) completion += static_cast<int64_t>(c.token_ids.size());
  // OpenAI's prompt_tokens_details.cached_tokens: prompt tokens served from
  // the prefix cache (the first choice of each prompt; with n > 1 the others
  // share its prompt).
  int64_t cached = 0;
  for (size_t i = 0; i < choices_.size(); i += static_cast<size_t>(std::max(1, req_.n))) cached += choices_[i].cached_tokens;
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string ResponseBuilder::Prologue() {
  if (req_.endpoint != Endpoint::kChat) return "";
  std::string ev;
  for (size_t i = 0; i < choices_.size(); ++i) {
    json chunk = ChunkBase();
    chunk["choices"] = json::array({json{{"index", i},
                                         {"delta", json{{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
    ev += Event(chunk);
  }
  return ev;
}

std::string ResponseBuilder::OnStreamOutput(ChoiceOutput&& o) {
  Choice& c = choices_.at(static_cast<size_t>(o.index));
  if (c.finished) return "";
  std::vector<LogprobsEntry> new_lp = req_.want_logprobs ? o.out.new_logprobs : std::vector<LogprobsEntry>{};
  const bool first = !c.started;
  c.started = true;
  ChoiceDelta d = Apply(c, o);
  if (c.finish_reason == "error") return "";  // the caller sends the error event
  json choice = {{"index", o.index}};
  bool any = c.finished || !new_lp.empty();
  if (req_.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      // Per call: a header delta (id, type, name, empty arguments), then the arguments fragment.
      json list = json::array();
      for (const json& tc : d.tool_calls) {
        list.push_back(json{{"index", tc["index"]},
                            {"id", tc["id"]},
                            {"type", "function"},
                            {"function", {{"name", tc["function"]["name"]}, {"arguments", ""}}}});
        list.push_back(json{{"index", tc["index"]}, {"function", {{"arguments", tc["function"]["arguments"]}}}});
      }
      delta["tool_calls"] = list;
    }
    any |= !delta.empty();
    choice["delta"] = delta;
    choice["logprobs"] = new_lp.empty() ? json(nullptr) : ChatLogprobs(new_lp);
  } else {
    std::string text = d.content;
    if (first && req_.echo) {
      const std::string& p = req_.prompt_texts.at(static_cast<size_t>(o.index / req_.n));
      text = p + text;
      c.text_offset += Utf8Chars(p);
    }
    any |= !text.empty();
    choice["text"] = text;
    choice["logprobs"] = new_lp.empty() ? json(nullptr) : CompletionLogprobs(&c.text_offset, new_lp);
  }
  if (!any) return "";
  choice["finish_reason"] = c.finished ? json(c.finish_reason) : json(nullptr);
  choice["stop_reason"] = c.finished ? c.stop_reason : json(nullptr);
  json chunk = ChunkBase();
  chunk["choices"] = json::array({choice});
  if (req_.continuous_usage_stats) chunk["usage"] = Usage();
  return Event(chunk);
}

std::string ResponseBuilder::Epilogue() {
  std::string ev;
  if (req_.include_usage) {
    json chunk = ChunkBase();
    chunk["choices"] = json::array();
    chunk["usage"] = Usage();
    ev += Event(chunk);
  }
  ev += "data: [DONE]\n\n";
  return ev;
}

void ResponseBuilder::OnOutput(ChoiceOutput&& o) {
  Choice& c = choices_.at(static_cast<size_t>(o.index));
  if (c.finished) return;
  c.started = true;
  Apply(c, o);
}

json ResponseBuilder::Final() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json ch = {{"index", i}};
    if (req_.endpoint == Endpoint::kChat) {
      json msg = {{"role", "assistant"}, {"content", c.content}};
      if (req_.thinking) msg["reasoning_content"] = c.reasoning;
      if (req_.tools) {
        msg["tool_calls"] = c.tool_calls;
        if (c.content.empty() && !c.tool_calls.empty()) msg["content"] = nullptr;
      }
      ch["message"] = msg;
      ch["logprobs"] = req_.want_logprobs ? ChatLogprobs(c.logprobs) : json(nullptr);
    } else {
      std::string text = c.content;
      int64_t offset = 0;
      const size_t prompt = i / static_cast<size_t>(req_.n);
      if (req_.echo) {
        const std::string& p = req_.prompt_texts.at(prompt);
        text = p + text;
        offset = Utf8Chars(p);
      }
      ch["text"] = text;
      if (req_.echo_logprobs) ch["logprobs"] = EchoLogprobs(req_.prompts.at(prompt), req_.prompt_is_text.at(prompt),
                                                        PromptLogprobsOf(i), c.logprobs);
      else ch["logprobs"] = req_.want_logprobs ? CompletionLogprobs(&offset, c.logprobs) : json(nullptr);
      if (req_.want_prompt_logprobs)
        ch["prompt_logprobs"] = PromptLogprobsJson(PromptLogprobsOf(i), req_.prompt_logprobs_top);
    }
    ch["finish_reason"] = c.finished ? json(c.finish_reason) : json(nullptr);
    ch["stop_reason"] = c.stop_reason;
    choices.push_back(ch);
  }
  json res = {{"id", id_},
              {"object", req_.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
              {"created", created_},
              {"model", info_.served_model_names.at(0)},
              {"choices", choices},
              {"usage", Usage()}};
  // Chat (vLLM): one prompt, so prompt_logprobs sits at the top level of the response.
  if (req_.endpoint == Endpoint::kChat && req_.want_prompt_logprobs && !choices_.empty())
    res["prompt_logprobs"] = PromptLogprobsJson(PromptLogprobsOf(0), req_.prompt_logprobs_top);
  return res;
}

}  // namespace deepinfer::server
