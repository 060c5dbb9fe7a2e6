#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include <fmt/format.h>

#include "base/json_field.h"
#include "server/chat_tools.h"
#include "structured/constraint.h"
#include "structured/tool_calls.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"
#include "vision/image_source.h"

namespace deepinfer::server {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Errors

json ErrorBody(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (e.param) err["param"] = *e.param;
  if (e.code) err["code"] = *e.code;
  return json{{"error", err}};
}

void BadRequest(const std::string& message, std::optional<std::string> param, std::optional<std::string> code) {
  throw ApiError(400, "invalid_request_error", message, std::move(param), std::move(code));
}

namespace {

const std::set<std::string>& RequestFields() {
  static const std::set<std::string> k = {
      "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
      "logit_bias", "seed", "max_tokens", "min_tokens", "stop", "stop_token_ids", "include_stop_str_in_output",
      "ignore_eos", "logprobs", "prompt_logprobs", "prompt", "messages", "top_logprobs", "max_completion_tokens",
      "n", "stream", "stream_options", "echo", "model", "reasoning_effort", "chat_template_kwargs",
      "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
      "guided_whitespace_pattern", "tools", "tool_choice"};
  return k;
}

// The request field a library message starts with ("top_p must be ...",
// "stop[2]: ...", "request cmpl-x-0: prompt ..."), if any.
std::optional<std::string> LeadingField(std::string_view msg) {
  if (msg.rfind("request ", 0) == 0) {
    const size_t colon = msg.find(": ");
    if (colon != std::string_view::npos) msg = msg.substr(colon + 2);
  }
  size_t i = 0;
  while (i < msg.size() && ((msg[i] >= 'a' && msg[i] <= 'z') || msg[i] == '_')) ++i;
  const std::string f(msg.substr(0, i));
  if (RequestFields().count(f)) return f;
  return std::nullopt;
}

}  // namespace

ApiError FromLibraryError(const Error& e, std::optional<std::string> param_hint) {
  const bool client = e.kind() == ErrorKind::kInvalidArgument || e.kind() == ErrorKind::kOutOfRange;
  // A rank of the parallel job is gone: the service is down, not the request wrong.
  if (e.kind() == ErrorKind::kUnavailable) return ApiError(503, "server_error", e.what(), std::nullopt, "engine_unavailable");
  if (!client) return ApiError(500, "server_error", e.what());
  std::optional<std::string> param = LeadingField(e.what());
  if (!param) param = std::move(param_hint);
  return ApiError(400, "invalid_request_error", e.what(), std::move(param));
}

json ParseJsonBody(const std::string& body) {
  if (body.empty()) BadRequest("the request body is empty; expected a JSON object");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    // nlohmann names the byte position and, for bad bytes, "ill-formed UTF-8".
    BadRequest(fmt::format("the request body is not valid JSON (UTF-8): {}", e.what()));
  } catch (const json::exception& e) {  // e.g. a number too large for a double (1e400)
    BadRequest(fmt::format("the request body cannot be read as JSON: {}", e.what()));
  }
  if (!j.is_object()) BadRequest(fmt::format("the request body must be a JSON object, found {}", j.type_name()));
  return j;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string NewRequestId(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

void CheckModel(const json& body, const ModelInfo& info) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_string()) BadRequest(fmt::format("model: expected a string, found {}", it->type_name()), "model");
  const std::string m = it->get<std::string>();
  for (const auto& name : info.served_model_names)
    if (m == name) return;
  // 400 as the server issue's edge-validation table has it (OpenAI and vLLM
  // answer 404 here; the body and code are theirs).
  throw ApiError(400, "invalid_request_error", fmt::format("The model `{}` does not exist.", m), "model",
                 "model_not_found");
}

// ---------------------------------------------------------------------------
// Request parsing

namespace {

const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool GetBool(const json& body, const char* key, bool dflt) {
  const json* v = Field(body, key);
  if (!v) return dflt;
  if (!v->is_boolean()) BadRequest(fmt::format("{}: expected true or false, found {}", key, v->type_name()), key);
  return v->get<bool>();
}

int64_t GetInt(const json& body, const char* key, int64_t dflt) {
  const json* v = Field(body, key);
  if (!v) return dflt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      BadRequest(fmt::format("{}: integer out of range", key), key);
    return v->get<int64_t>();
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) return static_cast<int64_t>(d);
  }
  BadRequest(fmt::format("{}: expected an integer, found {}", key, v->is_number() ? Dump(*v) : v->type_name()), key);
}

void RejectIfSet(const json& body, const char* key, const char* why) {
  if (Field(body, key)) BadRequest(fmt::format("{} is not supported: {}", key, why), key);
}

// Fields common to both endpoints; fills n/stream/stream_options.
void ParseCommon(const json& body, ParsedRequest* r) {
  const int64_t n = GetInt(body, "n", 1);
  if (n < 1 || n > kMaxChoices) BadRequest(fmt::format("n must be in [1, {}], got {}", kMaxChoices, n), "n");
  r->n = static_cast<int>(n);
  r->stream = GetBool(body, "stream", false);
  if (const json* so = Field(body, "stream_options")) {
    if (!so->is_object())
      BadRequest(fmt::format("stream_options: expected an object, found {}", so->type_name()), "stream_options");
    if (!r->stream) BadRequest("stream_options is only allowed when stream is true", "stream_options");
    r->include_usage = GetBool(*so, "include_usage", false);
    r->continuous_usage_stats = GetBool(*so, "continuous_usage_stats", false);
  }
  if (const json* u = Field(body, "user"); u && !u->is_string())
    BadRequest(fmt::format("user: expected a string, found {}", u->type_name()), "user");
  if (!GetBool(body, "skip_special_tokens", true))
    BadRequest("skip_special_tokens = false is not supported", "skip_special_tokens");
  if (const json* b = Field(body, "best_of")) {
    const int64_t best_of = GetInt(body, "best_of", 1);
    if (best_of != n)
      BadRequest(fmt::format("best_of is not supported (it must equal n = {}), got {}", n, b->dump()), "best_of");
  }
}

SamplingParams ParseSampling(const json& sampling_fields, const ModelInfo& info, const SamplingParams& defaults,
                             const char* logprobs_param) {
  SamplingLimits limits;
  limits.vocab_size = info.vocab_size;
  limits.max_logprobs = info.max_logprobs;
  try {
    return SamplingParams::FromJson(sampling_fields, defaults, limits);
  } catch (const Error& e) {
    ApiError a = FromLibraryError(e);
    if (a.param == std::optional<std::string>("logprobs")) a.param = logprobs_param;
    throw a;
  }
}

// Structured output (structured/constraint.h): compiled here, in the HTTP
// thread, so a bad or oversized constraint is a 400 before anything is queued.
void ParseConstraint(const nlohmann::ordered_json& ordered_body, bool chat, bool thinking, ParsedRequest* r) {
  std::optional<structured::ConstraintSpec> spec;
  try {
    spec = structured::ParseConstraintFields(ordered_body, chat);
  } catch (const Error& e) {
    throw FromLibraryError(e);
  }
  if (!spec) return;
  spec->after_reasoning = thinking;
  try {
    r->constraint = structured::CompileConstraint(*spec);
  } catch (const Error& e) {
    throw FromLibraryError(e, spec->field);
  }
}

// prompt_logprobs (vLLM extension): the value itself is checked by the sampler
// fields (integer, -1 or [0, max_logprobs]); like vLLM, not with streaming.
void CheckPromptLogprobs(ParsedRequest* r) {
  r->want_prompt_logprobs = r->params.prompt_logprobs.has_value();
  if (r->want_prompt_logprobs && r->stream)
    BadRequest("prompt_logprobs is not available when stream is true; send the request with stream false",
               "prompt_logprobs");
}

void CheckContext(const ParsedRequest& r, const ModelInfo& info, const char* prompt_param) {
  for (const auto& p : r.prompts) {
    const int64_t np = static_cast<int64_t>(p.size());
    if (r.params.max_tokens) {
      const int64_t total = np + *r.params.max_tokens;
      if (total > info.max_model_len)
        BadRequest(fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} "
                               "in the {}, {} for the completion (max_tokens)). Please reduce the length of the {} or "
                               "the completion.",
                               info.max_model_len, total, np, prompt_param, *r.params.max_tokens, prompt_param),
                   prompt_param, "context_length_exceeded");
    } else if (np >= info.max_model_len) {
      BadRequest(fmt::format("This model's maximum context length is {} tokens. However, your {} has {} tokens, which "
                             "leaves no room for the completion. Please reduce the length of the {}.",
                             info.max_model_len, prompt_param, np, prompt_param),
                 prompt_param, "context_length_exceeded");
    }
  }
}

std::vector<int32_t> TokenIds(const json& arr, const ModelInfo& info, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& x = arr[i];
    if (!x.is_number_integer())
      BadRequest(fmt::format("{}[{}]: expected a token id (integer), found {}", name, i,
                             x.is_number() ? Dump(x) : x.type_name()),
                 "prompt");
    const int64_t t = x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX
                                                                                                     : x.get<int64_t>();
    if (t < 0 || (info.vocab_size > 0 && t >= info.vocab_size))
      BadRequest(fmt::format("{}[{}] = {} is outside the vocabulary [0, {})", name, i, t, info.vocab_size), "prompt");
    ids.push_back(static_cast<int32_t>(t));
  }
  return ids;
}

// Refuses `bytes` of prompt text that cannot fit max_model_len whatever the
// tokenization (every token covers at most max_token_bytes bytes), without
// spending time tokenizing it.
void CheckTextFits(size_t bytes, const ModelInfo& info, const char* param) {
  if (info.max_token_bytes <= 0 || info.max_model_len <= 0) return;
  const int64_t at_least = (static_cast<int64_t>(bytes) + info.max_token_bytes - 1) / info.max_token_bytes;
  if (at_least > info.max_model_len)
    throw ApiError(400, "invalid_request_error",
                   fmt::format("This model's maximum context length is {} tokens; the {} bytes of text in {} are at "
                               "least {} tokens.",
                               info.max_model_len, bytes, param, at_least),
                   std::string(param), std::string("context_length_exceeded"));
}

size_t StringBytes(const json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().size();
  size_t n = 0;
  if (j.is_array() || j.is_object())
    for (const auto& e : j) n += StringBytes(e);
  return n;
}

std::vector<int32_t> EncodeText(const std::string& text, const ModelInfo& info, const char* param) {
  if (!info.tokenizer) BadRequest("this model directory has no tokenizer.json: send token ids instead of text", param);
  CheckTextFits(text.size(), info, param);
  try {
    return info.tokenizer->Encode(text, /*add_special_tokens=*/true);
  } catch (const Error& e) {
    throw FromLibraryError(e, param);
  }
}

}  // namespace

ParsedRequest ParseCompletionRequest(const json& body, const ModelInfo& info) {
  return ParseCompletionRequest(body, nlohmann::ordered_json(body), info);
}

ParsedRequest ParseCompletionRequest(const json& body, const nlohmann::ordered_json& ordered_body, const ModelInfo& info) {
  CheckModel(body, info);
  ParsedRequest r;
  r.endpoint = Endpoint::kCompletions;
  ParseCommon(body, &r);
  RejectIfSet(body, "tools", "tool calling is only available on /v1/chat/completions");
  ParseConstraint(ordered_body, /*chat=*/false, /*thinking=*/false, &r);
  RejectIfSet(body, "suffix", "insertion (fill-in-the-middle) is not implemented");
  r.echo = GetBool(body, "echo", false);
  // Scoring (echo with max_tokens 0): the engine needs one token to run the
  // prompt; it is not returned.
  json sampling_fields = body;
  if (const json* mt = Field(body, "max_tokens"); mt && mt->is_number_integer() && mt->get<int64_t>() == 0) {
    if (!r.echo) BadRequest("max_tokens must be at least 1 (0 is allowed with echo = true, to score the prompt)",
                            "max_tokens");
    if (GetInt(body, "min_tokens", 0) > 0) BadRequest("min_tokens must be 0 when max_tokens is 0", "min_tokens");
    r.echo_only = true;
    sampling_fields["max_tokens"] = 1;
  }
  // prompt: string | [string] | [int] | [[int]]
  const json* p = Field(body, "prompt");
  if (!p) BadRequest("prompt is required", "prompt");
  if (p->is_string()) {
    const std::string s = p->get<std::string>();
    if (s.empty()) BadRequest("prompt must not be empty", "prompt");
    r.prompt_texts.push_back(s);
    r.prompts.push_back(EncodeText(s, info, "prompt"));
    r.prompt_is_text.push_back(true);
  } else if (p->is_array()) {
    if (p->empty()) BadRequest("prompt must not be empty", "prompt");
    if ((*p)[0].is_number()) {
      r.prompts.push_back(TokenIds(*p, info, "prompt"));
      r.prompt_texts.emplace_back();
      r.prompt_is_text.push_back(false);
    } else {
      for (size_t i = 0; i < p->size(); ++i) {
        const json& e = (*p)[i];
        const std::string name = fmt::format("prompt[{}]", i);
        if (e.is_string()) {
          if (!(*p)[0].is_string())
            BadRequest(fmt::format("{}: a prompt list must be all strings or all token-id lists, not both", name),
                       "prompt");
          const std::string s = e.get<std::string>();
          if (s.empty()) BadRequest(fmt::format("{} must not be empty", name), "prompt");
          r.prompt_texts.push_back(s);
          r.prompts.push_back(EncodeText(s, info, "prompt"));
          r.prompt_is_text.push_back(true);
        } else if (e.is_array()) {
          if (e.empty()) BadRequest(fmt::format("{} must not be empty", name), "prompt");
          if (!(*p)[0].is_array())
            BadRequest(fmt::format("{}: a prompt list must be all strings or all token-id lists, not both", name),
                       "prompt");
          r.prompts.push_back(TokenIds(e, info, name));
          r.prompt_texts.emplace_back();
          r.prompt_is_text.push_back(false);
        } else {
          BadRequest(fmt::format("{}: expected a string or a list of token ids, found {}", name, e.type_name()),
                     "prompt");
        }
      }
    }
  } else {
    BadRequest(fmt::format("prompt: expected a string, a list of strings or a list of token ids, found {}",
                           p->type_name()),
               "prompt");
  }
  if (static_cast<int64_t>(r.prompts.size()) * r.n > kMaxChoices)
    BadRequest(fmt::format("{} prompts x n = {} gives {} choices; at most {} are allowed per request", r.prompts.size(),
                           r.n, r.prompts.size() * r.n, kMaxChoices),
               "n");
  // Token-id prompts have no text to echo: decode them.
  if (r.echo) {
    for (size_t i = 0; i < r.prompts.size(); ++i)
      if (r.prompt_texts[i].empty() && info.tokenizer) r.prompt_texts[i] = info.tokenizer->Decode(r.prompts[i]);
  }
  SamplingParams defaults = SamplingParams::FromJson(info.default_sampling);
  r.params = ParseSampling(sampling_fields, info, defaults, "logprobs");
  r.want_logprobs = r.params.logprobs.has_value();
  CheckPromptLogprobs(&r);
  r.prompt_logprobs_top = r.params.prompt_logprobs;
  if (r.echo && r.want_logprobs) {
    if (r.stream)
      BadRequest("echo with logprobs is not available when stream is true (the prompt's logprobs come whole); send "
                 "the request with stream false",
                 "echo");
    // The prompt's logprobs come from the prompt_logprobs machinery, once:
    // enough top ids for both echo's logprobs and an explicit prompt_logprobs.
    r.echo_logprobs = true;
    const int64_t want = *r.params.logprobs;
    const auto& pl = r.params.prompt_logprobs;
    r.params.prompt_logprobs = (pl && (*pl < 0 || want < 0)) ? -1 : std::max<int64_t>(want, pl.value_or(0));
  }
  CheckContext(r, info, "prompt");
  return r;
}

ChatOptions ChatOptionsFor(const json& body, const nlohmann::ordered_json& ordered_body, const ModelInfo& info) {
  ChatOptions chat;
  try {
    chat.encoding = ChatEncodingForModelType(info.model_type);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_request_error", e.what(), "model");
  }
  chat.thinking = info.default_thinking;
  chat.add_generation_prompt = GetBool(body, "add_generation_prompt", true);
  const nlohmann::ordered_json* effort = nullptr;
  if (const json* kw = Field(body, "chat_template_kwargs")) {
    if (!kw->is_object())
      BadRequest(fmt::format("chat_template_kwargs: expected an object, found {}", kw->type_name()),
                 "chat_template_kwargs");
    if (kw->contains("thinking") && !(*kw)["thinking"].is_null())
      chat.thinking = GetBool(*kw, "thinking", chat.thinking);
    else if (kw->contains("enable_thinking") && !(*kw)["enable_thinking"].is_null())
      chat.thinking = GetBool(*kw, "enable_thinking", chat.thinking);
    chat.drop_thinking = GetBool(*kw, "drop_thinking", true);
    const auto& okw = ordered_body["chat_template_kwargs"];
    if (okw.contains("reasoning_effort") && !okw["reasoning_effort"].is_null()) effort = &okw["reasoning_effort"];
  }
  if (ordered_body.contains("reasoning_effort") && !ordered_body["reasoning_effort"].is_null())
    effort = &ordered_body["reasoning_effort"];
  if (effort) chat.reasoning_effort = *effort;
  return chat;
}

ParsedRequest ParseChatRequest(const json& body, const nlohmann::ordered_json& ordered_body, const ModelInfo& info) {
  CheckModel(body, info);
  ParsedRequest r;
  r.endpoint = Endpoint::kChat;
  ParseCommon(body, &r);
  if (const json* t = Field(body, "functions"); t && !(t->is_array() && t->empty()))
    BadRequest("functions (the deprecated form of tools) is not supported: send tools", "functions");
  if (GetBool(body, "continue_final_message", false))
    BadRequest("continue_final_message is not supported", "continue_final_message");
  const json* msgs = Field(body, "messages");
  if (!msgs) BadRequest("messages is required", "messages");
  if (!msgs->is_array()) BadRequest(fmt::format("messages: expected a list, found {}", msgs->type_name()), "messages");
  if (msgs->empty()) BadRequest("messages must not be empty", "messages");
  for (size_t i = 0; i < msgs->size(); ++i)
    if (!(*msgs)[i].is_object())
      BadRequest(fmt::format("messages[{}]: expected an object, found {}", i, (*msgs)[i].type_name()), "messages");
  if (!info.tokenizer) BadRequest("this model directory has no tokenizer.json: chat needs one", "messages");

  const ChatOptions chat = ChatOptionsFor(body, ordered_body, info);
  r.thinking = chat.thinking;
  r.v41 = chat.encoding == ChatEncoding::kDeepseekV41;
  // tools / tool_choice: rendered into the prompt (on the first system message);
  // "required" or a named tool constrain the output to a DSML call.
  const ToolsRequest tools = ParseTools(ordered_body, r.v41);
  r.tools = tools.parse_calls;
  nlohmann::ordered_json messages = ordered_body["messages"];
  if (!tools.tools.empty()) {
    if (!messages.empty() && messages[0].is_object() && StringField(messages[0], "role") == "system" &&
        !messages[0].contains("tools")) {
      messages[0]["tools"] = tools.tools;
    } else {
      nlohmann::ordered_json sys = {{"role", "system"}, {"content", ""}, {"tools", tools.tools}};
      messages.insert(messages.begin(), sys);
    }
  }
  ParseConstraint(ordered_body, /*chat=*/true, r.thinking, &r);
  if (tools.forced) {
    if (r.constraint)
      BadRequest("tool_choice \"required\" or a named tool cannot be combined with response_format / guided_* / "
                 "structured_outputs",
                 "tool_choice");
    structured::ConstraintSpec spec;
    spec.kind = structured::ConstraintSpec::Kind::kToolCalls;
    spec.text = tools.forced->dump();
    spec.field = "tools";
    spec.what = "tools";
    spec.after_reasoning = r.thinking;
    try {
      r.constraint = structured::CompileConstraint(spec);
    } catch (const Error& e) {
      throw FromLibraryError(e, "tools");
    }
  }
  // Lower bound: the bytes of the messages' content (always rendered; roles
  // become special tokens, reasoning may be dropped, so neither is counted).
  if (const json* m = Field(body, "messages"); m && m->is_array()) {
    size_t content_bytes = 0;
    for (const json& msg : *m)
      if (msg.is_object() && msg.contains("content")) content_bytes += StringBytes(msg["content"]);
    CheckTextFits(content_bytes, info, "messages");
  }
  r.prompts.push_back(EncodeChatPrompt(body, messages, chat, info, &r.images));
  r.prompt_texts.emplace_back();
  if (static_cast<int64_t>(r.prompts.size()) * r.n > kMaxChoices) BadRequest("too many choices", "n");

  // Chat names → sampler names: logprobs (bool) + top_logprobs → logprobs (int);
  // max_completion_tokens (preferred) / max_tokens → max_tokens.
  json fields = body;
  const bool want_logprobs = GetBool(body, "logprobs", false);
  fields.erase("logprobs");
  fields.erase("top_logprobs");
  if (const json* tl = Field(body, "top_logprobs")) {
    const int64_t k = GetInt(body, "top_logprobs", 0);
    (void)tl;
    if (!want_logprobs) BadRequest("top_logprobs requires logprobs to be true", "top_logprobs");
    if (k < 0 || (info.max_logprobs >= 0 && k > info.max_logprobs))
      BadRequest(fmt::format("top_logprobs must be in [0, {}], got {}", info.max_logprobs, k), "top_logprobs");
    fields["logprobs"] = k;
  } else if (want_logprobs) {
    fields["logprobs"] = 0;
  }
  const char* max_param = "max_tokens";
  if (const json* mct = Field(body, "max_completion_tokens")) {
    fields["max_tokens"] = *mct;
    max_param = "max_completion_tokens";
  }
  SamplingParams defaults = SamplingParams::FromJson(info.default_sampling);
  if (!info.default_sampling.contains("max_tokens")) defaults.max_tokens.reset();  // chat: up to the context
  try {
    r.params = ParseSampling(fields, info, defaults, "top_logprobs");
  } catch (ApiError& a) {
    if (a.param == std::optional<std::string>("max_tokens")) a.param = max_param;
    throw;
  }
  r.want_logprobs = r.params.logprobs.has_value();
  CheckPromptLogprobs(&r);
  CheckContext(r, info, "messages");
  return r;
}

std::vector<int32_t> EncodeChatPrompt(const json& body, const nlohmann::ordered_json& messages, const ChatOptions& chat,
                                      const ModelInfo& info,
                                      std::vector<std::shared_ptr<const vision::PreparedImage>>* images) {
  std::vector<int32_t> ids;
  int n_images = 0;
  try {
    if (info.vision) ids = EncodeChatWithImages(*info.tokenizer, messages, chat, info.image_token_id, &n_images);
    else ids = EncodeChat(*info.tokenizer, messages, chat);
  } catch (const Error& e) {
    const std::string m = e.what();
    throw FromLibraryError(e, m.find("reasoning effort") != std::string::npos ? "reasoning_effort" : "messages");
  }
  if (!info.vision) {
    // Image blocks render as the placeholder text; refuse them instead (no tower to run).
    const json* msgs = Field(body, "messages");
    if (msgs && msgs->is_array())
      for (size_t i = 0; i < msgs->size(); ++i) {
        const json& m = (*msgs)[i];
        if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
        for (size_t j = 0; j < m["content"].size(); ++j) {
          const json& b = m["content"][j];
          if (b.is_object() && (StringField(b, "type") == "image_url" || StringField(b, "type") == "image"))
            BadRequest(fmt::format("messages[{}].content[{}]: this model has no vision tower; images are not supported",
                                   i, j),
                       "messages");
        }
      }
    return ids;
  }
  if (n_images == 0) return ids;
  if (n_images > 16)
    BadRequest(fmt::format("messages: too many images ({}; at most 16 per request)", n_images), "messages");
  try {
    *images = vision::CollectImages(body["messages"], info.vision_geometry, /*allow_files=*/false);
  } catch (const Error& e) {
    BadRequest(e.what(), "messages");
  }
  if (static_cast<int>(images->size()) != n_images)
    BadRequest(fmt::format("messages: {} image blocks rendered but {} images read", n_images, images->size()),
               "messages");
  return vision::ExpandPlaceholders(ids, info.image_token_id, *images);
}

std::vector<GenerateRequest> ParsedRequest::ToGenerateRequests(const std::string& request_id) const {
  std::vector<GenerateRequest> out;
  out.reserve(static_cast<size_t>(num_choices()));
  for (int c = 0; c < num_choices(); ++c) {
    GenerateRequest g;
    g.prompt_token_ids = prompts[static_cast<size_t>(c / n)];
    g.params = params;
    // Every choice of a prompt has the same prompt_logprobs: only its first choice computes them
    // (ResponseBuilder copies them to the others).
    if (c % n != 0) g.params.prompt_logprobs.reset();
    if (params.seed) g.params.seed = static_cast<int64_t>(static_cast<uint64_t>(*params.seed) + static_cast<uint64_t>(c % n));
    g.request_id = fmt::format("{}-{}", request_id, c);
    g.constraint = constraint;
    if (c / n == 0) g.images = images;
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace deepinfer::server
