// deepinfer/structured/tool_calls.h — the output side of DeepSeek's DSML tool
// calls: a streaming parser of the generated text into reasoning, content and
// tool calls, and the grammar that forces a well-formed call.
//
// DSML, as the chat format renders it (chat_format.cc; V4.1 spelling, V4 in
// brackets):
//   <｜DSML｜ calls>                                   [<｜DSML｜tool_calls>]
//   <｜DSML｜ invoke name="NAME">                      [<｜DSML｜invoke ...>]
//   <｜DSML｜ parameter name="P" string="true">VALUE</｜DSML｜ parameter>
//   ...                                                (one line per parameter)
//   </｜DSML｜ invoke>
//   </｜DSML｜ calls>
// string="true": VALUE is the string as is; string="false": VALUE is JSON.
//
// OutputParser is ONE state machine over the text stream: reasoning (thinking
// mode, until "</think>"), content, and tool-call blocks. Any marker may arrive
// split across pieces at any byte: text that might be the start of a marker
// is held back until the next piece decides it, so no marker byte ever reaches
// content. A calls block that starts while still in reasoning (the model
// skipped "</think>") ends the reasoning. Malformed DSML (unexpected text
// inside a block, a missing attribute, an unterminated block at the end) is
// returned as content from the first byte that could not be parsed: nothing
// is lost and nothing throws. Tool calls already completed stay tool calls.
// Each call is reported once, when its </invoke> arrives, with its arguments
// as a JSON object text (compact, keys in the order written).
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace deepinfer::structured {

struct DsmlMarkers {
  std::string block_open, block_close, invoke_open, invoke_close, param_open, param_close;
  static DsmlMarkers For(bool v41);
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON object text
};

class OutputParser {
 public:
  // thinking: the text starts in reasoning. tools: parse DSML calls blocks
  // (false: everything after reasoning is content). v41: DSML spelling.
  OutputParser(bool thinking, bool tools, bool v41 = true);
  struct Delta {
    std::string reasoning, content;
    std::vector<ParsedToolCall> calls;
    bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  };
  Delta Push(std::string_view text);
  Delta Flush();  // end of the stream: releases every held byte
  bool in_reasoning() const { return state_ == State::kReasoning; }
  int num_calls() const { return num_calls_; }

 private:
  enum class State { kReasoning, kContent, kBlock };
  void Run(Delta* d, bool final);
  bool ParseBlockItem(Delta* d, bool final);  // false: need more text
  void Malformed(Delta* d);

  DsmlMarkers m_;
  bool tools_;
  State state_;
  std::string buf_;  // unconsumed text
  std::string block_prefix_;  // consumed text of the current block not yet part of a call
  int num_calls_ = 0;
};

// The grammar of a DSML calls block for tool_choice "required" or a named
// tool. spec: {"v41": bool, "parallel": bool, "tools": [{"name", "parameters"}]}.
// String-typed parameters are written as is (characters other than '<'); the
// others as JSON per their schema (json_schema.h). Errors name `what`.
Element ToolCallGrammar(Grammar& g, const nlohmann::ordered_json& spec, const std::string& what);

}  // namespace deepinfer::structured
