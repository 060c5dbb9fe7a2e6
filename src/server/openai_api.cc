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
