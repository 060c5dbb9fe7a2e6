// deepinfer/server/openai_api.h — the OpenAI API schema: request parsing and
// validation, and the response / SSE chunk formats. No HTTP here (http_server.h
// carries these over the transport of http_transport.h), so everything is unit-testable.
//
// Requests. POST /v1/completions and POST /v1/chat/completions with OpenAI's
// field names plus vLLM's sampler extensions (top_k, min_p,
// repetition_penalty, min_tokens, stop_token_ids, ignore_eos,
// include_stop_str_in_output, seed). Supported:
//   completions: model, prompt (string | [string] | [int] | [[int]]), n,
//     max_tokens (default 16), stream, stream_options {include_usage,
//     continuous_usage_stats}, logprobs (int: top-N per token), echo, stop,
//     seed, user, prompt_logprobs (vLLM extension, below), and the sampler
//     fields (sampling_params.h). Special-token text inside a prompt string
//     is parsed as those tokens (as vLLM, which tokenizes the prompt with
//     add_special_tokens and no split_special_tokens); send token ids to
//     control the ids exactly.
//   Prompt scoring (OpenAI's legacy API, vLLM; what lm-evaluation-harness
//     sends): echo = true with logprobs = N returns the prompt's tokens first
//     in choices[i].logprobs — tokens, token_logprobs (null for the first
//     token), top_logprobs (null for the first, else the top N and the token
//     itself), text_offset — then the generated ones. The prompt's values are
//     the prompt_logprobs machinery's (the raw log_softmax of the previous
//     position's logits; identical bits to prompt_logprobs), computed once per
//     prompt. max_tokens = 0 is allowed with echo only: nothing is generated
//     (the engine runs one token that is not returned; completion_tokens 0,
//     finish_reason "length"). Not with stream = true (400 naming echo).
//   text_offset counts characters (Unicode code points of the decoded text,
//     as OpenAI and vLLM), not bytes, and indexes the returned text: the BOS
//     the tokenizer puts before a text prompt is listed but takes no
//     characters (a token-id prompt's echo is its decoded text, BOS included).
//   chat: model, messages (rendered with the DeepSeek V4/V4.1 chat format,
//     chat_format.h), n, max_completion_tokens / max_tokens (default: up to
//     the context), stream, stream_options, logprobs (bool) + top_logprobs,
//     stop, seed, user, reasoning_effort, chat_template_kwargs {thinking,
//     reasoning_effort, drop_thinking}, add_generation_prompt, the sampler
//     fields, prompt_logprobs. Thinking mode (chat_template_kwargs.thinking,
//     or the server's default): the generated text up to "</think>" is
//     returned as message.reasoning_content (delta.reasoning_content when
//     streaming), the rest as content.
// prompt_logprobs = N (vLLM extension; an integer, -1 = whole vocabulary, within
//   --max-logprobs; not allowed with stream = true): completions return
//   choices[i].prompt_logprobs, chat the top-level prompt_logprobs, in vLLM's
//   format: one element per prompt token, null for the first, else
//   {"<token id>": {"logprob", "rank", "decoded_token"}} holding the top-N ids
//   and the prompt token itself (raw log_softmax; -inf as -9999.0).
// Structured output (both endpoints; response_format json_object /
// json_schema on chat only): response_format, guided_json / guided_regex /
// guided_choice / guided_grammar, structured_outputs — compiled while parsing
// (structured/constraint.h) into ParsedRequest::constraint. Tool calling
// (chat): tools, tool_choice, parallel_tool_calls (chat_tools.h); the output
// is split by structured::OutputParser into reasoning_content, content and
// message.tool_calls / delta.tool_calls, finish_reason "tool_calls".
// docs/structured.md lists what is supported and the errors.
// Unknown fields are ignored (vLLM's behaviour). Fields this engine cannot
// honour are rejected with 400 rather than ignored: suffix, best_of != n,
// functions (send tools), skip_special_tokens = false,
// continue_final_message = true, echo with logprobs and stream.
//
// n > 1: one engine request per choice; with a seed, choice j of a prompt uses
// seed + j (vLLM's parallel sampling). Several prompts: choice index =
// prompt_index * n + j. At most kMaxChoices choices per request.
//
// Errors (ApiError → HTTP status + {"error": {"message", "type", "param",
// "code"}}):
//   400 invalid_request_error  malformed JSON / invalid UTF-8 / not an object,
//       wrong field types, out-of-range values, empty prompt or messages,
//       prompt + max_tokens over max_model_len (code
//       "context_length_exceeded"; the message names the prompt's token count,
//       max_tokens and max_model_len), unsupported fields;
//   404 invalid_request_error, code "model_not_found": a model other than the
//       served name (vLLM and OpenAI both answer 404; the body is OpenAI's);
//   401, 405, 431, 503 (http_server.h), 500 server_error (engine-side failure).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "deepinfer/engine.h"
#include "server/engine_loop.h"
#include "structured/tool_calls.h"
#include "vision/image.h"
#include "tokenizer/chat_format.h"

namespace deepinfer::server {

inline constexpr int kMaxChoices = 256;  // prompts × n per request

// An error answered to the client.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::optional<std::string> param = {},
           std::optional<std::string> code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;  // "invalid_request_error", "server_error", ...
  std::optional<std::string> param;
  std::optional<std::string> code;
};

// {"error": {"message", "type", "param", "code"}} (param/code null when unset).
nlohmann::json ErrorBody(const ApiError& e);
// 400 invalid_request_error.
[[noreturn]] void BadRequest(const std::string& message, std::optional<std::string> param = {},
                             std::optional<std::string> code = {});
// A deepinfer::Error from validation below the server (sampler, chat renderer,
// tokenizer, engine Submit) as a 400 (kInvalidArgument/kOutOfRange) or 500;
// `param` is the field the message starts with when it is a request field.
ApiError FromLibraryError(const Error& e, std::optional<std::string> param_hint = {});

// Parses a request body: must be valid UTF-8 JSON holding an object. Throws
// ApiError 400 otherwise (the message says where parsing failed).
nlohmann::json ParseJsonBody(const std::string& body);

// What the parser needs to know about the served model.
struct ModelInfo {
  std::vector<std::string> served_model_names;  // [0] is reported in responses
  const Tokenizer* tokenizer = nullptr;
  std::string model_type;
  int64_t max_model_len = 0;
  int64_t max_logprobs = 20;
  int64_t vocab_size = 0;
  // Bytes of the longest token's text (0 = unknown). A prompt of B bytes has
  // at least ceil(B / max_token_bytes) tokens, so text far over max_model_len
  // is refused before it is tokenized.
  int64_t max_token_bytes = 0;
  nlohmann::json default_sampling = nlohmann::json::object();  // the serve command's sampling flags
  bool default_thinking = false;
  // Vision (docs/vision.md): chat image blocks are accepted when set; each
  // becomes image_token_id's span (prompt_tokens and /tokenize count it).
  bool vision = false;
  int32_t image_token_id = -1;
  vision::VisionGeometry vision_geometry;
};

// Checks "model" (absent/null = the served model). Throws 400 for a non-string,
// 400 model_not_found for another name.
void CheckModel(const nlohmann::json& body, const ModelInfo& info);

enum class Endpoint { kCompletions, kChat };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<std::vector<int32_t>> prompts;  // token ids, one per prompt
  std::vector<std::string> prompt_texts;      // for echo (completions)
  std::vector<bool> prompt_is_text;           // completions: prompt i was a string (else token ids)
  SamplingParams params;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;
  bool echo = false;
  bool echo_only = false;       // echo with max_tokens 0: the engine's one token is not returned
  bool echo_logprobs = false;   // echo + logprobs: the prompt's logprobs lead choices[i].logprobs
  std::optional<int64_t> prompt_logprobs_top;  // the prompt_logprobs N the client asked for (may be
                                               // below params.prompt_logprobs when echo needs more)
  bool thinking = false;        // chat: split reasoning_content
  bool want_logprobs = false;   // params.logprobs is set
  bool want_prompt_logprobs = false;  // params.prompt_logprobs is set
  bool tools = false;           // chat: parse DSML tool calls from the output
  bool v41 = true;              // chat: DSML spelling of DeepSeek-V4.1 (else V4)
  // Structured output / forced tool call, compiled (structured/constraint.h).
  std::shared_ptr<structured::CompiledGrammar> constraint;
  // Chat images (prompts[0]'s spans), decoded and preprocessed while parsing.
  std::vector<std::shared_ptr<const vision::PreparedImage>> images;
  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
  // One engine request per choice (see "n > 1" above).
  std::vector<GenerateRequest> ToGenerateRequests(const std::string& request_id) const;
};

ParsedRequest ParseCompletionRequest(const nlohmann::json& body, const ModelInfo& info);
// The same with the body also parsed with key order kept (JSON Schema
// properties are generated in the order written).
ParsedRequest ParseCompletionRequest(const nlohmann::json& body, const nlohmann::ordered_json& ordered_body,
                                     const ModelInfo& info);
// The chat rendering options of a chat request body (add_generation_prompt,
// chat_template_kwargs.thinking / enable_thinking / drop_thinking,
// reasoning_effort), validated; used by /v1/chat/completions and by
// /tokenize with messages so both render the same prompt. Throws ApiError 400
// naming the field.
ChatOptions ChatOptionsFor(const nlohmann::json& body, const nlohmann::ordered_json& ordered_body,
                           const ModelInfo& info);
// `ordered_body` is the same body parsed with key order kept (the chat
// renderer writes tool arguments in the order given).
ParsedRequest ParseChatRequest(const nlohmann::json& body, const nlohmann::ordered_json& ordered_body,
                               const ModelInfo& info);
// The chat prompt's ids as the engine runs them: rendered (image blocks as
// image_token_id when info.vision), each image's span expanded; images
// decoded and preprocessed into *images. Throws ApiError 400 naming the field
// (a non-data: URL, an undecodable / empty / too large image, too many
// images, images for a model without a vision tower).
std::vector<int32_t> EncodeChatPrompt(const nlohmann::json& body, const nlohmann::ordered_json& messages,
                                      const ChatOptions& chat, const ModelInfo& info,
                                      std::vector<std::shared_ptr<const vision::PreparedImage>>* images);

// Splits generated text into reasoning and content at the first "</think>".
// Streaming-safe: a suffix that may be the start of "</think>" is held back
// until the next piece (or Flush) decides it.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool thinking) : in_reasoning_(thinking) {}
  struct Delta {
    std::string reasoning, content;
  };
  Delta Push(std::string_view text);
  Delta Flush();
  bool in_reasoning() const { return in_reasoning_; }

 private:
  bool in_reasoning_;
  std::string held_;
};

// Builds the responses of one request from the engine's outputs: either SSE
// events (stream) or one final JSON object.
class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& req, const ModelInfo& info, std::string id, int64_t created);
  ~ResponseBuilder();

  // Streaming. Prologue(): the events sent before any output (chat: one
  // {"role": "assistant", "content": ""} delta per choice). OnStreamOutput():
  // the events for one engine output (possibly empty). Epilogue(): the usage
  // chunk (if stream_options.include_usage) and "data: [DONE]".
  std::string Prologue();
  std::string OnStreamOutput(ChoiceOutput&& o);
  std::string Epilogue();
  // Non-streaming: accumulate, then Final().
  void OnOutput(ChoiceOutput&& o);
  nlohmann::json Final() const;

  bool done() const { return num_finished_ == static_cast<int>(choices_.size()); }
  // The first engine-side failure ("error" finish), as a 500 server_error.
  const std::optional<ApiError>& error() const { return error_; }
  const std::string& id() const { return id_; }

 private:
  struct Choice {
    Choice(bool thinking, bool tools, bool v41) : parser(thinking, tools, v41) {}
    structured::OutputParser parser;  // reasoning / content / DSML tool calls
    std::string content, reasoning;
    nlohmann::json tool_calls = nlohmann::json::array();  // OpenAI's message.tool_calls
    std::vector<int32_t> token_ids;
    std::vector<LogprobsEntry> logprobs;
    std::vector<std::optional<LogprobsEntry>> prompt_logprobs;  // first choice of each prompt only
    bool started = false;
    bool finished = false;
    std::string finish_reason;
    nlohmann::json stop_reason;  // null, string or int
    int64_t text_offset = 0;     // completions logprobs: offset of the next token's text
    int64_t cached_tokens = 0;   // prompt tokens from the prefix cache (set when finished)
  };
  std::string Event(const nlohmann::json& chunk) const;
  nlohmann::json Usage() const;
  nlohmann::json ChunkBase() const;
  // Applies o to the choice; returns the content / reasoning text and the tool
  // calls that are new (calls get their id and index here).
  struct ChoiceDelta {
    std::string reasoning, content;
    nlohmann::json tool_calls = nlohmann::json::array();
  };
  ChoiceDelta Apply(Choice& c, ChoiceOutput& o);
  nlohmann::json CompletionLogprobs(int64_t* text_offset, const std::vector<LogprobsEntry>& entries) const;
  // Echo + logprobs: the prompt's entries (the first null), then the generated ones.
  nlohmann::json EchoLogprobs(const std::vector<int32_t>& prompt, bool text_prompt,
                              const std::vector<std::optional<LogprobsEntry>>& pl,
                              const std::vector<LogprobsEntry>& generated) const;
  nlohmann::json ChatLogprobs(const std::vector<LogprobsEntry>& entries) const;
  // `top`: at most this many of each entry's top ids (all when unset or -1).
  nlohmann::json PromptLogprobsJson(const std::vector<std::optional<LogprobsEntry>>& entries,
                                    std::optional<int64_t> top = std::nullopt) const;
  // The prompt_logprobs of choice `choice`'s prompt (computed by its first choice).
  const std::vector<std::optional<LogprobsEntry>>& PromptLogprobsOf(size_t choice) const;

  const ParsedRequest& req_;
  const ModelInfo& info_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
  int num_finished_ = 0;
  std::optional<ApiError> error_;
};

// JSON serialisation used for every response (invalid UTF-8 replaced, never thrown).
std::string Dump(const nlohmann::json& j);

// "cmpl-" / "chatcmpl-" + 32 random hex digits.
std::string NewRequestId(const char* prefix);

}  // namespace deepinfer::server
