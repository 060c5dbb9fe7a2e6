// deepinfer/structured/constraint.h — the request fields that ask for
// structured output, and their compilation (with a cache).
//
// Fields (OpenAI and vLLM names; at most one constraint per request):
//   response_format {"type": "text"}                         no constraint
//   response_format {"type": "json_object"}                  any JSON object  (chat)
//   response_format {"type": "json_schema", "json_schema": {"name", "schema",
//                    "strict", "description"}}               JSON Schema      (chat)
//   guided_json (schema object or JSON text), guided_regex, guided_choice
//   (list of strings), guided_grammar (GBNF)                  vLLM, older names
//   structured_outputs {json | regex | choice | grammar | json_object: true}
//                                                            vLLM; also accepts
//     disable_fallback, disable_any_whitespace, disable_additional_properties
//     (booleans: the engine always behaves as if the last two were true)
// Unsupported: structured_outputs.whitespace_pattern / structural_tag,
// guided_whitespace_pattern, a schema / grammar / regex over kMaxConstraintBytes.
//
// Errors: Error kInvalidArgument whose message starts with the field
// ("guided_regex: ..."); ConstraintSpec::field names the top-level field for
// the HTTP error's "param".
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "structured/matcher.h"

namespace deepinfer::structured {

inline constexpr size_t kMaxConstraintBytes = 512 * 1024;

struct ConstraintSpec {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar, kToolCalls };
  Kind kind = Kind::kJsonObject;
  std::string text;    // schema JSON / regex / GBNF / choice list JSON / tool-call spec JSON
  std::string field;   // the request field, e.g. "response_format"
  std::string what;    // the field path used in messages, e.g. "response_format.json_schema.schema"
  // Thinking mode: the output starts with reasoning ending in "</think>"; the
  // constraint applies to what follows.
  bool after_reasoning = false;
};

// Reads the fields listed above from a request body. `chat`: response_format
// is allowed (the completions endpoint rejects non-text response_format like
// vLLM). Returns nullopt when the request asks for no constraint.
std::optional<ConstraintSpec> ParseConstraintFields(const nlohmann::ordered_json& body, bool chat);

// Compiles (or finds in the process-wide cache, keyed by kind + text + flags,
// at most 64 entries) the grammar of a constraint. Throws Error naming spec.what.
std::shared_ptr<CompiledGrammar> CompileConstraint(const ConstraintSpec& spec);

// Builds the grammar without the cache (bench, tests).
Grammar BuildGrammar(const ConstraintSpec& spec);

// Adds to `g` a rule matching any bytes that do not contain `marker`, followed
// by `marker` (the reasoning before "</think>").
Element TextThenMarker(Grammar& g, const std::string& marker);

}  // namespace deepinfer::structured
