// deepinfer/server/chat_tools.h — the request side of tool calling on
// /v1/chat/completions: tools, tool_choice, parallel_tool_calls (OpenAI's
// fields), validated.
//
//   tools                [{"type": "function", "function": {"name", "description",
//                         "parameters" (a JSON Schema object), "strict"}}]
//   tool_choice          "none" | "auto" (default with tools) | "required" |
//                        {"type": "function", "function": {"name"}}
//   parallel_tool_calls  bool, default true
// "required" and a named tool constrain generation to a well-formed DSML call
// (structured/tool_calls.h) whose arguments match the tool's schema; "auto"
// leaves the choice to the model and parses whatever calls it writes.
// Errors: ApiError 400 naming the field (param "tools" / "tool_choice" /
// "parallel_tool_calls").
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

namespace deepinfer::server {

struct ToolsRequest {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // as given (empty: none)
  bool parse_calls = false;  // tools given and tool_choice != "none"
  // The tool-call grammar spec (structured::ToolCallGrammar) when the call is forced.
  std::optional<nlohmann::ordered_json> forced;
};

ToolsRequest ParseTools(const nlohmann::ordered_json& body, bool v41);

}  // namespace deepinfer::server
