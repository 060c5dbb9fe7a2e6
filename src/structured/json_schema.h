// deepinfer/structured/json_schema.h — JSON Schema → grammar.
//
// Supported (draft 2020-12 subset, what OpenAI's strict mode and vLLM accept):
//   type: object | array | string | number | integer | boolean | null, or a list
//   of them; properties, required, additionalProperties (false, true, absent;
//   a schema only when there are no properties: a map); items, minItems,
//   maxItems; minLength, maxLength; pattern (search semantics, ECMAScript
//   syntax, regex.h); format: date, time, date-time, uuid, email; enum, const;
//   anyOf, oneOf (as anyOf: branches should not overlap), allOf with one
//   schema; $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion
//   allowed); annotations (title, description, default, examples, $schema, $id,
//   $comment, deprecated, readOnly, writeOnly) are ignored. A schema with no
//   type (and none of enum/const/anyOf/$ref) accepts any JSON value.
// Anything else — a keyword not listed, pattern combined with minLength /
// maxLength / format, another format, non-local $ref — is Error
// kInvalidArgument naming the keyword and its JSON pointer. Nothing is
// silently ignored.
//
// Output form (the "whitespace rule"): the JSON is written on one line with
// Python json.dumps' separators — ", " between items and ": " after keys, no
// other whitespace — properties in the schema's order (required ones always,
// optional ones may be left out). Strings: any character but " \ and control
// characters, or the escapes \" \\ \/ \b \f \n \r \t \uXXXX (no surrogate
// escapes); lengths count characters. Numbers: -?(0|[1-9][0-9]{0,15}) with an
// optional fraction of 1..16 digits and exponent of 1..2 digits (so every number is finite as a double) (integers: no
// fraction or exponent) — bounded so a generation always terminates.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace deepinfer::structured {

class JsonSchemaCompiler {
 public:
  // `root` is the whole schema document ($ref targets are resolved in it);
  // `what` names the field in errors ("response_format.json_schema.schema").
  JsonSchemaCompiler(Grammar& g, const nlohmann::ordered_json& root, std::string what);
  // A JSON value valid against `schema` (at JSON pointer `path`).
  Element Value(const nlohmann::ordered_json& schema, const std::string& path);
  // The root schema.
  Element Root() { return Value(root_, ""); }
  // A string's characters WITHOUT quotes or escaping, each not in `excluded`
  // (used for DSML string parameters, which are written as is): honours
  // minLength/maxLength/pattern/format/enum/const of a string schema.
  Element RawString(const nlohmann::ordered_json& schema, const std::string& path, const CodepointRanges& excluded);

  // Any JSON value / any JSON object, in the output form above.
  Element AnyValue();
  Element AnyObject();

 private:
  Element ValueOfType(const nlohmann::ordered_json& schema, const std::string& type, const std::string& path);
  Element Object(const nlohmann::ordered_json& schema, const std::string& path);
  Element Array(const nlohmann::ordered_json& schema, const std::string& path);
  Element String(const nlohmann::ordered_json& schema, const std::string& path, bool raw,
                 const CodepointRanges& allowed);
  Element Number(bool integer);
  Element Literal(const nlohmann::ordered_json& value);
  Element JsonChar();
  Element JsonString();
  Element Ref(const std::string& ref, const std::string& path);
  void CheckKeywords(const nlohmann::ordered_json& schema, const std::string& path);
  [[noreturn]] void Bad(const std::string& path, const std::string& msg) const;

  Grammar& g_;
  const nlohmann::ordered_json& root_;
  std::string what_;
  std::map<std::string, int> refs_;
  int any_value_ = -1, any_object_ = -1;
  Element json_char_{}, json_string_{};
  bool have_json_char_ = false, have_json_string_ = false;
  int depth_ = 0;
};

// Dumps a JSON value in the output form (", " and ": " separators, UTF-8 kept).
std::string DumpJsonLikeOutput(const nlohmann::ordered_json& value);

}  // namespace deepinfer::structured
