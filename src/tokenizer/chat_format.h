// deepinfer/tokenizer/chat_format.h — DeepSeek-V4 / V4.1 chat prompt rendering.
//
// Source of the format. DeepSeek-V4 and V4.1 ship no Jinja chat template; the
// model repositories carry a self-contained Python encoder instead, and this
// is a port of its encode_messages():
//   * V4:   encoding/encoding_dsv4.py of deepseek-ai/DeepSeek-V4-Flash;
//   * V4.1: encoding/encoding.py of deepseek-ai/DeepSeek-V4.1-Flash (its README:
//     numeric reasoning effort "low"/"high"/"max" → 50/75/100, default "high";
//     spaced DSML tags "<｜DSML｜ calls>"; "<｜System｜>" token; mid-conversation
//     system messages). The copy used is the one vendored "unmodified" in
//     ztxz16/fastllm (tools/fastllm_pytools/encoding_dsv41.py); the official
//     test_encoding.py's literal expectations are in the unit test too.
//   Doubt, stated: other ports carry a different V4.1 revision (sglang's
//   encoding_dsv41.py maps low/high/xhigh/max to 25/50/75/100, default 50, and
//   accepts a "developer" role; the official README of a later revision adds
//   tool namespaces). We follow the official README/tests above; namespaces
//   are not implemented (a tool with "namespace" is an error).
// tests/data/chat/expected.json holds the official encoders' output for the
// conversations of tools/chat/chat_cases.json (tools/chat/make_chat_expected.py).
//
// The format, V4.1 (V4 differs as noted):
//   BOS, then per message —
//   system:    "<｜System｜>" (V4: nothing) + content [+ "\n\n" + tools block]
//              [+ "\n\n## Response Format:..."]; a system message after index 0
//              gets its own "<｜System｜>" and, if last, the generation header.
//   user:      "<｜User｜>" + content (consecutive user/tool messages merge,
//              joined by "\n\n"; tool results are "<tool_result>…</tool_result>"
//              blocks, sorted by the preceding assistant's tool_call order).
//   assistant: [reasoning + "</think>"] + content [+ "\n\n" + DSML tool calls]
//              + "<｜end▁of▁sentence｜>" (no EOS with "wo_eos": true).
//   After a user message that is last or followed by the assistant:
//   "<｜Assistant｜>" + "<think>" (thinking) or "</think>" (chat).
//   Thinking mode, V4.1: "<｜System｜>Reasoning Effort: N (range 1-100, ...)\n\n"
//   at the very start. Reasoning of turns before the last user message is
//   dropped unless drop_thinking is false or any message defines tools.
//   V4 also has a "developer" role (rendered like user) and only
//   reasoning_effort "max" adds a prefix.
//
// add_generation_prompt = false (not in the official encoder, which always
// adds it) leaves out the "<｜Assistant｜>" + think token after the last
// message. Exactly one BOS: the prompt starts with the BOS string and is then
// tokenized WITHOUT adding special tokens (EncodeChat).
//
// Special tokens come only from the template: EncodeChat tokenizes the text
// that came from the request (content, reasoning_content, tool results,
// tool-call names and arguments, tool schemas, response_format) with no
// added-token matching, so a message containing "<｜Assistant｜>" or
// "<｜end▁of▁sentence｜>" gets those characters as ordinary BPE tokens and can
// not forge a turn. (V4.1's image placeholder from an image block stays the
// marker; typed into text it is refused.) RenderChat's string is the same
// either way; only the ids of such text differ from tokenizing it whole.
//
// Messages are OpenAI-style JSON objects: role, content (string, or for V4.1 a
// list of {"type": "text"|"image_url"|"image", ...} parts; images become
// "<｜deepseek_image｜>"), reasoning_content, tool_calls
// [{id, type, function: {name, arguments}}], tool_call_id (role "tool"),
// tools (OpenAI tool list, on a system message), response_format, task,
// wo_eos. JSON inside the prompt is written exactly as Python's json.dumps
// (", " / ": " separators, non-ASCII kept, Python float repr).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

enum class ChatEncoding { kDeepseekV4, kDeepseekV41 };

// "deepseek_v4" → V4, "deepseek_v41" → V4.1; Error(kInvalidArgument) otherwise.
ChatEncoding ChatEncodingForModelType(std::string_view model_type);

struct ChatOptions {
  ChatEncoding encoding = ChatEncoding::kDeepseekV41;
  bool thinking = false;              // thinking_mode "thinking" (true) or "chat"
  bool add_generation_prompt = true;
  bool drop_thinking = true;
  // null = default. V4.1: integer 1..100 or "low"/"high"/"max". V4: "high" or "max".
  nlohmann::ordered_json reasoning_effort;
  bool add_bos = true;
};

// Renders the prompt. Throws Error(kInvalidArgument) naming the message index
// and field for malformed input (unknown role, wrong types, an image
// placeholder typed into text, invalid reasoning effort, ...).
std::string RenderChat(const nlohmann::ordered_json& messages, const ChatOptions& options);

// The rendered prompt and the byte ranges of it that came from the request.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> plain_ranges;  // [begin, end), sorted
};
RenderedChat RenderChatPieces(const nlohmann::ordered_json& messages, const ChatOptions& options);

// RenderChatPieces, then tokenizer.EncodeAppend(text, ids, plain_ranges): the
// template's markers are tokens, request text never is (no BOS/EOS added).
std::vector<int32_t> EncodeChat(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                const ChatOptions& options);

// EncodeChat for a model with a vision tower: every image placeholder the
// renderer wrote for an image block ("<｜deepseek_image｜>"; image blocks are
// the only source, ProcessImages refuses it in text) becomes the single id
// `image_token_id` (config image_token_id), whatever the tokenizer's spelling
// of that id; the text between is encoded as EncodeChat does. *num_images
// receives the number of placeholders (image blocks in the messages, in order).
std::vector<int32_t> EncodeChatWithImages(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                          const ChatOptions& options, int32_t image_token_id, int* num_images);

// Python's json.dumps(value, ensure_ascii=False).
std::string PyJsonDumps(const nlohmann::ordered_json& value);

}  // namespace deepinfer
