#include "structured/constraint.h"

#include <list>
#include <mutex>

#include <fmt/format.h>

#include "base/error.h"
#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "structured/regex.h"
#include "structured/tool_calls.h"

namespace deepinfer::structured {

using OJson = nlohmann::ordered_json;

namespace {

[[noreturn]] void Bad(const std::string& field, const std::string& msg) {
  Fail(ErrorKind::kInvalidArgument, "{}: {}", field, msg);
}

const OJson* Get(const OJson& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string SchemaText(const OJson& v, const std::string& what) {
  if (v.is_string()) {
    try {
      return OJson::parse(v.get<std::string>()).dump();
    } catch (const OJson::exception& e) {
      Bad(what, fmt::format("not valid JSON text: {}", e.what()));
    }
  }
  if (!v.is_object() && !v.is_boolean()) Bad(what, fmt::format("expected a JSON Schema object, found {}", v.type_name()));
  return v.dump();
}

std::string ChoiceText(const OJson& v, const std::string& what) {
  if (!v.is_array() || v.empty()) Bad(what, "expected a non-empty list of strings");
  for (size_t i = 0; i < v.size(); ++i)
    if (!v[i].is_string()) Bad(fmt::format("{}[{}]", what, i), fmt::format("expected a string, found {}", v[i].type_name()));
  return v.dump();
}

std::string StringText(const OJson& v, const std::string& what) {
  if (!v.is_string()) Bad(what, fmt::format("expected a string, found {}", v.type_name()));
  if (v.get<std::string>().empty()) Bad(what, "must not be empty");
  return v.get<std::string>();
}

void Set(std::optional<ConstraintSpec>* out, ConstraintSpec spec) {
  if (*out)
    Bad(spec.field, fmt::format("only one structured-output constraint is allowed per request ({} is set too)",
                                (*out)->field));
  if (spec.text.size() > kMaxConstraintBytes)
    Bad(spec.what, fmt::format("the constraint is {} bytes, more than the {} allowed", spec.text.size(),
                               kMaxConstraintBytes));
  *out = std::move(spec);
}

}  // namespace

std::optional<ConstraintSpec> ParseConstraintFields(const OJson& body, bool chat) {
  std::optional<ConstraintSpec> out;
  using K = ConstraintSpec::Kind;
  if (const OJson* rf = Get(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      Bad("response_format", "expected an object with a string \"type\"");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "text") {
    } else if (!chat) {
      Bad("response_format", fmt::format("type \"{}\" is only supported by /v1/chat/completions; use guided_json or "
                                         "structured_outputs here", type));
    } else if (type == "json_object") {
      Set(&out, {K::kJsonObject, "", "response_format", "response_format", false});
    } else if (type == "json_schema") {
      const OJson* js = Get(*rf, "json_schema");
      if (!js || !js->is_object()) Bad("response_format", "type \"json_schema\" needs a \"json_schema\" object");
      if (const OJson* name = Get(*js, "name"); name && !name->is_string())
        Bad("response_format", "json_schema.name must be a string");
      if (const OJson* strict = Get(*js, "strict"); strict && !strict->is_boolean())
        Bad("response_format", "json_schema.strict must be true or false");
      const OJson* schema = Get(*js, "schema");
      if (!schema) Bad("response_format", "json_schema.schema is required");
      Set(&out, {K::kJsonSchema, SchemaText(*schema, "response_format.json_schema.schema"), "response_format",
                 "response_format.json_schema.schema", false});
    } else {
      Bad("response_format", fmt::format("type \"{}\" is not supported (text, json_object, json_schema)", type));
    }
  }
  if (const OJson* v = Get(body, "guided_json")) Set(&out, {K::kJsonSchema, SchemaText(*v, "guided_json"), "guided_json", "guided_json", false});
  if (const OJson* v = Get(body, "guided_regex")) Set(&out, {K::kRegex, StringText(*v, "guided_regex"), "guided_regex", "guided_regex", false});
  if (const OJson* v = Get(body, "guided_choice")) Set(&out, {K::kChoice, ChoiceText(*v, "guided_choice"), "guided_choice", "guided_choice", false});
  if (const OJson* v = Get(body, "guided_grammar")) Set(&out, {K::kGrammar, StringText(*v, "guided_grammar"), "guided_grammar", "guided_grammar", false});
  if (Get(body, "guided_whitespace_pattern"))
    Bad("guided_whitespace_pattern", "is not supported (the JSON output form is fixed: see docs/structured.md)");
  if (const OJson* so = Get(body, "structured_outputs")) {
    if (!so->is_object()) Bad("structured_outputs", fmt::format("expected an object, found {}", so->type_name()));
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string& k = it.key();
      const OJson& v = it.value();
      const std::string what = "structured_outputs." + k;
      if (v.is_null()) continue;
      if (k == "json") Set(&out, {K::kJsonSchema, SchemaText(v, what), "structured_outputs", what, false});
      else if (k == "regex") Set(&out, {K::kRegex, StringText(v, what), "structured_outputs", what, false});
      else if (k == "choice") Set(&out, {K::kChoice, ChoiceText(v, what), "structured_outputs", what, false});
      else if (k == "grammar") Set(&out, {K::kGrammar, StringText(v, what), "structured_outputs", what, false});
      else if (k == "json_object") {
        if (!v.is_boolean()) Bad(what, "expected true or false");
        if (v.get<bool>()) Set(&out, {K::kJsonObject, "", "structured_outputs", what, false});
      } else if (k == "disable_fallback" || k == "disable_any_whitespace" || k == "disable_additional_properties") {
        if (!v.is_boolean()) Bad(what, "expected true or false");
      } else if (k == "whitespace_pattern" || k == "structural_tag") {
        Bad(what, "is not supported by this engine");
      } else {
        Bad(what, "unknown field (expected json, regex, choice, grammar, json_object)");
      }
    }
  }
  return out;
}

Element TextThenMarker(Grammar& g, const std::string& m) {
  const size_t L = m.size();
  // KMP failure function.
  std::vector<size_t> fail(L + 1, 0);
  for (size_t i = 1, k = 0; i < L; ++i) {
    while (k > 0 && m[i] != m[k]) k = fail[k];
    if (m[i] == m[k]) ++k;
    fail[i + 1] = k;
  }
  auto next = [&](size_t k, uint8_t b) {
    while (k > 0 && static_cast<uint8_t>(m[k]) != b) k = fail[k];
    return static_cast<uint8_t>(m[k]) == b ? k + 1 : 0;
  };
  std::vector<int> rules(L);
  for (size_t k = 0; k < L; ++k) rules[k] = g.NewRule(fmt::format("before_marker{}", k));
  for (size_t k = 0; k < L; ++k) {
    std::vector<ByteSet> to(L + 1);
    for (int b = 0; b < 256; ++b) to[next(k, static_cast<uint8_t>(b))].Add(static_cast<uint8_t>(b));
    for (size_t j = 0; j <= L; ++j) {
      if (to[j] == ByteSet{}) continue;
      if (j == L) g.AddAlt(rules[k], {g.Bytes(to[j])});
      else g.AddAlt(rules[k], {g.Bytes(to[j]), g.Ref(rules[j])});
    }
  }
  return g.Ref(rules[0]);
}

Grammar BuildGrammar(const ConstraintSpec& spec) {
  using K = ConstraintSpec::Kind;
  Grammar g;
  const int root = g.NewRule("root");
  Seq body;
  if (spec.after_reasoning) body.push_back(TextThenMarker(g, "</think>"));
  switch (spec.kind) {
    case K::kJsonSchema: {
      OJson schema;
      try {
        schema = OJson::parse(spec.text);
      } catch (const OJson::exception& e) {
        Bad(spec.what, fmt::format("not valid JSON: {}", e.what()));
      }
      JsonSchemaCompiler c(g, schema, spec.what);
      body.push_back(c.Root());
      break;
    }
    case K::kJsonObject: {
      const OJson empty = OJson::object();
      JsonSchemaCompiler c(g, empty, spec.what);
      body.push_back(c.AnyObject());
      break;
    }
    case K::kRegex:
      body.push_back(CompileRegex(g, spec.text, RegexMode::kFullMatch, nullptr, spec.what));
      break;
    case K::kChoice: {
      const OJson list = OJson::parse(spec.text);
      std::vector<Seq> alts;
      for (const OJson& s : list) alts.push_back(g.Literal(s.get<std::string>()));
      body.push_back(g.Choice(alts, "choice"));
      break;
    }
    case K::kGrammar: {
      Grammar inner;
      // GBNF rule names are the user's: parse into the same grammar under its own root.
      CompileGbnf(g, spec.text, spec.what);
      (void)inner;
      body.push_back(g.Ref(g.RuleByName("root")));
      break;
    }
    case K::kToolCalls:
      body.push_back(ToolCallGrammar(g, OJson::parse(spec.text), spec.what));
      break;
  }
  g.AddAlt(root, body);
  g.SetRoot(root);
  g.Finish(spec.what);
  return g;
}

namespace {
struct CacheEntry {
  std::string key;
  std::shared_ptr<CompiledGrammar> grammar;
};
std::mutex g_cache_mu;
std::list<CacheEntry> g_cache;  // most recent first
constexpr size_t kCacheEntries = 64;
}  // namespace

std::shared_ptr<CompiledGrammar> CompileConstraint(const ConstraintSpec& spec) {
  const std::string key = fmt::format("{}|{}|{}", static_cast<int>(spec.kind), spec.after_reasoning ? 1 : 0, spec.text);
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    for (auto it = g_cache.begin(); it != g_cache.end(); ++it)
      if (it->key == key) {
        g_cache.splice(g_cache.begin(), g_cache, it);
        return g_cache.front().grammar;
      }
  }
  auto compiled = std::make_shared<CompiledGrammar>(BuildGrammar(spec), spec.what);
  compiled->InitialConfig();  // reports a constraint that matches nothing now, not at the first step
  std::lock_guard<std::mutex> lock(g_cache_mu);
  g_cache.push_front({key, compiled});
  if (g_cache.size() > kCacheEntries) g_cache.pop_back();
  return compiled;
}

}  // namespace deepinfer::structured
