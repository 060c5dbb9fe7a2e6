#include "structured/json_schema.h"

#include <set>

#include <fmt/format.h>

#include "base/error.h"
#include "structured/regex.h"

namespace deepinfer::structured {

using OJson = nlohmann::ordered_json;

namespace {

const std::set<std::string>& KnownKeywords() {
  static const std::set<std::string> k = {
      "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
      "maxLength", "pattern", "format", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
      // annotations
      "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
      "writeOnly"};
  return k;
}

// Characters a JSON string may hold without escaping.
const CodepointRanges& JsonPlainChars() {
  static const CodepointRanges r = NormalizeRanges({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}});
  return r;
}

std::string Ptr(const std::string& path, const std::string& key) {
  std::string k;
  for (char c : key) {
    if (c == '~') k += "~0";
    else if (c == '/') k += "~1";
    else k += c;
  }
  return path + "/" + k;
}

int64_t NonNegInt(const OJson& s, const char* key, const std::string& path, int64_t dflt, bool* present = nullptr) {
  if (present) *present = false;
  auto it = s.find(key);
  if (it == s.end()) return dflt;
  const OJson& v = *it;
  double d = -1;
  if (v.is_number_integer()) d = static_cast<double>(v.get<int64_t>());
  else if (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))
    d = v.get<double>();
  else
    Fail(ErrorKind::kInvalidArgument, "{}: \"{}\" must be a non-negative integer", path.empty() ? "/" : path, key);
  if (d < 0) Fail(ErrorKind::kInvalidArgument, "{}: \"{}\" must be a non-negative integer", path.empty() ? "/" : path, key);
  if (present) *present = true;
  return static_cast<int64_t>(d);
}

}  // namespace

std::string DumpJsonLikeOutput(const OJson& v) {
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += OJson(it.key()).dump(-1, ' ', false) + ": " + DumpJsonLikeOutput(it.value());
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      out += DumpJsonLikeOutput(v[i]);
    }
    return out + "]";
  }
  return v.dump(-1, ' ', false);
}

JsonSchemaCompiler::JsonSchemaCompiler(Grammar& g, const OJson& root, std::string what)
    : g_(g), root_(root), what_(std::move(what)) {}

void JsonSchemaCompiler::Bad(const std::string& path, const std::string& msg) const {
  Fail(ErrorKind::kInvalidArgument, "{}: {} (at {})", what_, msg, path.empty() ? "/" : path);
}

void JsonSchemaCompiler::CheckKeywords(const OJson& schema, const std::string& path) {
  for (auto it = schema.begin(); it != schema.end(); ++it)
    if (!KnownKeywords().count(it.key()))
      Bad(path, fmt::format("unsupported JSON Schema keyword \"{}\"", it.key()));
}

Element JsonSchemaCompiler::JsonChar() {
  if (have_json_char_) return json_char_;
  const Element plain = g_.Utf8Set(JsonPlainChars());
  ByteSet esc1;
  for (char c : std::string("\"\\/bfnrt")) esc1.Add(static_cast<uint8_t>(c));
  ByteSet hex, hex_no_d, d, lo8;
  hex.AddRange('0', '9');
  hex.AddRange('a', 'f');
  hex.AddRange('A', 'F');
  hex_no_d = hex;
  hex_no_d = ByteSet{};
  hex_no_d.AddRange('0', '9');
  hex_no_d.AddRange('a', 'c');
  hex_no_d.AddRange('e', 'f');
  hex_no_d.AddRange('A', 'C');
  hex_no_d.AddRange('E', 'F');
  d.Add('d');
  d.Add('D');
  lo8.AddRange('0', '7');
  const Element h = g_.Bytes(hex);
  json_char_ = g_.Choice({{plain},
                          {g_.Byte('\\'), g_.Bytes(esc1)},
                          {g_.Byte('\\'), g_.Byte('u'), g_.Bytes(hex_no_d), h, h, h},
                          {g_.Byte('\\'), g_.Byte('u'), g_.Bytes(d), g_.Bytes(lo8), h, h}},
                         "json_char");
  have_json_char_ = true;
  return json_char_;
}

Element JsonSchemaCompiler::JsonString() {
  if (have_json_string_) return json_string_;
  json_string_ = g_.Choice({{g_.Byte('"'), g_.Repeat({JsonChar()}, 0, -1, "chars"), g_.Byte('"')}}, "string");
  have_json_string_ = true;
  return json_string_;
}

Element JsonSchemaCompiler::Number(bool integer) {
  ByteSet digit, nz;
  digit.AddRange('0', '9');
  nz.AddRange('1', '9');
  const Element D = g_.Bytes(digit);
  Seq intpart = {g_.Choice({{g_.Byte('0')}, {g_.Bytes(nz), g_.Repeat({D}, 0, 15, "digits")}}, "int")};
  Seq s = {g_.Repeat({g_.Byte('-')}, 0, 1, "minus")};
  s.insert(s.end(), intpart.begin(), intpart.end());
  if (!integer) {
    ByteSet e, sign;
    e.Add('e');
    e.Add('E');
    sign.Add('+');
    sign.Add('-');
    s.push_back(g_.Repeat({g_.Byte('.'), g_.Repeat({D}, 1, 16, "frac")}, 0, 1, "fraction"));
    s.push_back(g_.Repeat({g_.Bytes(e), g_.Repeat({g_.Bytes(sign)}, 0, 1, "sign"), g_.Repeat({D}, 1, 2, "exp")}, 0, 1,
                          "exponent"));
  }
  return g_.Choice({s}, integer ? "integer" : "number");
}

Element JsonSchemaCompiler::Literal(const OJson& value) {
  return g_.Choice({g_.Literal(DumpJsonLikeOutput(value))}, "literal");
}

Element JsonSchemaCompiler::AnyValue() {
  if (any_value_ >= 0) return g_.Ref(any_value_);
  any_value_ = g_.NewRule("value");
  const Element v = g_.Ref(any_value_);
  const Element str = JsonString();
  // object
  any_object_ = g_.NewRule("object");
  const Element member = g_.Choice({{str, g_.Byte(':'), g_.Byte(' '), v}}, "member");
  Seq more = g_.Literal(", ");
  more.push_back(member);
  g_.AddAlt(any_object_, {g_.Byte('{'), g_.Byte('}')});
  g_.AddAlt(any_object_, {g_.Byte('{'), member, g_.Repeat(more, 0, -1, "members"), g_.Byte('}')});
  const int arr = g_.NewRule("array");
  Seq more_v = g_.Literal(", ");
  more_v.push_back(v);
  g_.AddAlt(arr, {g_.Byte('['), g_.Byte(']')});
  g_.AddAlt(arr, {g_.Byte('['), v, g_.Repeat(more_v, 0, -1, "elements"), g_.Byte(']')});
  g_.AddAlt(any_value_, {g_.Ref(any_object_)});
  g_.AddAlt(any_value_, {g_.Ref(arr)});
  g_.AddAlt(any_value_, {str});
  g_.AddAlt(any_value_, {Number(false)});
  g_.AddAlt(any_value_, g_.Literal("true"));
  g_.AddAlt(any_value_, g_.Literal("false"));
  g_.AddAlt(any_value_, g_.Literal("null"));
  return v;
}

Element JsonSchemaCompiler::AnyObject() {
  AnyValue();
  return g_.Ref(any_object_);
}

Element JsonSchemaCompiler::Ref(const std::string& ref, const std::string& path) {
  if (auto it = refs_.find(ref); it != refs_.end()) return g_.Ref(it->second);
  if (ref.empty() || ref[0] != '#')
    Bad(path, fmt::format("$ref \"{}\" is not supported (only local references such as \"#/$defs/name\")", ref));
  const OJson* target = &root_;
  if (ref.size() > 1) {
    if (ref[1] != '/') Bad(path, fmt::format("$ref \"{}\": anchors are not supported", ref));
    try {
      target = &root_.at(OJson::json_pointer(ref.substr(1)));
    } catch (const OJson::exception&) {
      Bad(path, fmt::format("$ref \"{}\" does not resolve in the schema", ref));
    }
  }
  const int r = g_.NewRule("ref");
  refs_[ref] = r;
  g_.AddAlt(r, {Value(*target, ref.substr(1))});
  return g_.Ref(r);
}

Element JsonSchemaCompiler::Value(const OJson& schema, const std::string& path) {
  if (++depth_ > 200) Bad(path, "the schema nests deeper than 200 levels");
  struct DepthGuard {
    int* d;
    ~DepthGuard() { --*d; }
  } guard{&depth_};
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return AnyValue();
    Bad(path, "the schema false matches nothing");
  }
  if (!schema.is_object()) Bad(path, fmt::format("a schema must be an object or a boolean, found {}", schema.type_name()));
  CheckKeywords(schema, path);
  if (auto it = schema.find("$ref"); it != schema.end()) {
    if (!it->is_string()) Bad(path, "\"$ref\" must be a string");
    for (auto k = schema.begin(); k != schema.end(); ++k)
      if (k.key() != "$ref" && k.key() != "$defs" && k.key() != "definitions" && k.key() != "title" &&
          k.key() != "description" && k.key() != "$schema" && k.key() != "$id" && k.key() != "$comment" &&
          k.key() != "default" && k.key() != "examples")
        Bad(path, fmt::format("\"{}\" next to \"$ref\" is not supported", k.key()));
    return Ref(it->get<std::string>(), Ptr(path, "$ref"));
  }
  if (auto it = schema.find("const"); it != schema.end()) return Literal(*it);
  if (auto it = schema.find("enum"); it != schema.end()) {
    if (!it->is_array() || it->empty()) Bad(Ptr(path, "enum"), "\"enum\" must be a non-empty list");
    std::vector<Seq> alts;
    for (const OJson& v : *it) alts.push_back({Literal(v)});
    return g_.Choice(alts, "enum");
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (auto it = schema.find(k); it != schema.end()) {
      if (!it->is_array() || it->empty()) Bad(Ptr(path, k), fmt::format("\"{}\" must be a non-empty list", k));
      if (schema.contains("type") || schema.contains("properties"))
        Bad(path, fmt::format("\"{}\" next to \"type\"/\"properties\" is not supported: put them in each branch", k));
      std::vector<Seq> alts;
      for (size_t i = 0; i < it->size(); ++i) alts.push_back({Value((*it)[i], Ptr(Ptr(path, k), std::to_string(i)))});
      return g_.Choice(alts, k);
    }
  }
  if (auto it = schema.find("allOf"); it != schema.end()) {
    if (!it->is_array() || it->size() != 1)
      Bad(Ptr(path, "allOf"), "\"allOf\" is only supported with exactly one schema");
    return Value((*it)[0], Ptr(Ptr(path, "allOf"), "0"));
  }
  auto t = schema.find("type");
  if (t == schema.end()) {
    if (schema.contains("properties") || schema.contains("additionalProperties") || schema.contains("required"))
      return Object(schema, path);
    if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems"))
      return Array(schema, path);
    if (schema.contains("minLength") || schema.contains("maxLength") || schema.contains("pattern") ||
        schema.contains("format"))
      return String(schema, path, false, JsonPlainChars());
    return AnyValue();
  }
  if (t->is_string()) return ValueOfType(schema, t->get<std::string>(), path);
  if (t->is_array() && !t->empty()) {
    std::vector<Seq> alts;
    for (const OJson& x : *t) {
      if (!x.is_string()) Bad(Ptr(path, "type"), "\"type\" must be a string or a list of strings");
      alts.push_back({ValueOfType(schema, x.get<std::string>(), path)});
    }
    return g_.Choice(alts, "types");
  }
  Bad(Ptr(path, "type"), "\"type\" must be a string or a non-empty list of strings");
}

Element JsonSchemaCompiler::ValueOfType(const OJson& schema, const std::string& type, const std::string& path) {
  if (type == "object") return Object(schema, path);
  if (type == "array") return Array(schema, path);
  if (type == "string") return String(schema, path, false, JsonPlainChars());
  if (type == "number") return Number(false);
  if (type == "integer") return Number(true);
  if (type == "boolean") return g_.Choice({g_.Literal("true"), g_.Literal("false")}, "boolean");
  if (type == "null") return g_.Choice({g_.Literal("null")}, "null");
  Bad(Ptr(path, "type"), fmt::format("unknown type \"{}\"", type));
}

Element JsonSchemaCompiler::Object(const OJson& schema, const std::string& path) {
  const OJson empty = OJson::object();
  const OJson* props = &empty;
  if (auto it = schema.find("properties"); it != schema.end()) {
    if (!it->is_object()) Bad(Ptr(path, "properties"), "\"properties\" must be an object");
    props = &*it;
  }
  std::set<std::string> required;
  if (auto it = schema.find("required"); it != schema.end()) {
    if (!it->is_array()) Bad(Ptr(path, "required"), "\"required\" must be a list of strings");
    for (const OJson& r : *it) {
      if (!r.is_string()) Bad(Ptr(path, "required"), "\"required\" must be a list of strings");
      if (!props->contains(r.get<std::string>()))
        Bad(Ptr(path, "required"), fmt::format("required property \"{}\" is not in \"properties\"", r.get<std::string>()));
      required.insert(r.get<std::string>());
    }
  }
  bool additional_any = true;
  const OJson* additional_schema = nullptr;
  if (auto it = schema.find("additionalProperties"); it != schema.end()) {
    if (it->is_boolean()) additional_any = it->get<bool>();
    else if (it->is_object()) additional_schema = &*it;
    else Bad(Ptr(path, "additionalProperties"), "\"additionalProperties\" must be a boolean or a schema");
  }
  if (props->empty()) {
    if (additional_schema) {  // a map: string keys, values of the schema
      const Element v = Value(*additional_schema, Ptr(path, "additionalProperties"));
      const Element member = g_.Choice({{JsonString(), g_.Byte(':'), g_.Byte(' '), v}}, "member");
      Seq more = g_.Literal(", ");
      more.push_back(member);
      return g_.Choice({{g_.Byte('{'), g_.Byte('}')},
                        {g_.Byte('{'), member, g_.Repeat(more, 0, -1, "members"), g_.Byte('}')}},
                       "map");
    }
    if (additional_any) return AnyObject();
    return g_.Choice({g_.Literal("{}")}, "empty_object");
  }
  if (additional_schema)
    Bad(Ptr(path, "additionalProperties"), "an \"additionalProperties\" schema next to \"properties\" is not supported");
  // Properties in order; F(i, first) = the members from i on, `first` = none written yet.
  struct Prop {
    std::string key;
    Element value;
    bool required;
  };
  std::vector<Prop> list;
  for (auto it = props->begin(); it != props->end(); ++it)
    list.push_back({it.key(), Value(it.value(), Ptr(Ptr(path, "properties"), it.key())), required.count(it.key()) > 0});
  const size_t n = list.size();
  // rule ids: f[i][first]
  std::vector<std::array<int, 2>> f(n + 1);
  for (size_t i = 0; i <= n; ++i)
    for (int first = 0; first < 2; ++first) f[i][first] = g_.NewRule(fmt::format("props{}", i));
  for (int first = 0; first < 2; ++first) g_.AddAlt(f[n][first], {});
  for (size_t i = n; i-- > 0;) {
    for (int first = 0; first < 2; ++first) {
      Seq with = first ? Seq{} : g_.Literal(", ");
      Seq key = g_.Literal(OJson(list[i].key).dump(-1, ' ', false) + ": ");
      with.insert(with.end(), key.begin(), key.end());
      with.push_back(list[i].value);
      with.push_back(g_.Ref(f[i + 1][0]));
      g_.AddAlt(f[i][first], with);
      if (!list[i].required) g_.AddAlt(f[i][first], {g_.Ref(f[i + 1][first])});
    }
  }
  return g_.Choice({{g_.Byte('{'), g_.Ref(f[0][1]), g_.Byte('}')}}, "object");
}

Element JsonSchemaCompiler::Array(const OJson& schema, const std::string& path) {
  Element item;
  if (auto it = schema.find("items"); it != schema.end()) item = Value(*it, Ptr(path, "items"));
  else item = AnyValue();
  const int64_t min = NonNegInt(schema, "minItems", path, 0);
  bool has_max = false;
  const int64_t max = NonNegInt(schema, "maxItems", path, -1, &has_max);
  if (has_max && max < min) Bad(path, fmt::format("maxItems {} is below minItems {}", max, min));
  std::vector<Seq> alts;
  if (min == 0) alts.push_back(g_.Literal("[]"));
  if (!has_max || max >= 1) {
    Seq more = g_.Literal(", ");
    more.push_back(item);
    const int64_t rest_min = min > 0 ? min - 1 : 0;
    const int64_t rest_max = has_max ? max - 1 : -1;
    alts.push_back({g_.Byte('['), item, g_.Repeat(more, rest_min, rest_max, "items"), g_.Byte(']')});
  }
  return g_.Choice(alts, "array");
}

Element JsonSchemaCompiler::RawString(const OJson& schema, const std::string& path, const CodepointRanges& excluded) {
  CodepointRanges allowed = IntersectRanges(NormalizeRanges({{0x20, 0x10FFFF}, {'\n', '\n'}, {'\t', '\t'}}),
                                            ComplementRanges(NormalizeRanges(excluded)));
  return String(schema, path, true, allowed);
}

Element JsonSchemaCompiler::String(const OJson& schema, const std::string& path, bool raw,
                                   const CodepointRanges& allowed) {
  auto wrap = [&](Seq body) {
    if (raw) return g_.Choice({body}, "raw_string");
    Seq s{g_.Byte('"')};
    s.insert(s.end(), body.begin(), body.end());
    s.push_back(g_.Byte('"'));
    return g_.Choice({s}, "string");
  };
  if (raw) {  // enum/const of a raw string: the values as is
    auto literal_ok = [&](const OJson& v) {
      if (!v.is_string()) Bad(path, "a string parameter's enum/const values must be strings");
      return g_.Literal(v.get<std::string>());
    };
    if (auto it = schema.find("const"); it != schema.end()) return g_.Choice({literal_ok(*it)}, "raw_const");
    if (auto it = schema.find("enum"); it != schema.end() && it->is_array()) {
      std::vector<Seq> alts;
      for (const OJson& v : *it) alts.push_back(literal_ok(v));
      return g_.Choice(alts, "raw_enum");
    }
  }
  bool has_min = false, has_max = false;
  const int64_t min = NonNegInt(schema, "minLength", path, 0, &has_min);
  const int64_t max = NonNegInt(schema, "maxLength", path, -1, &has_max);
  if (has_max && max < min) Bad(path, fmt::format("maxLength {} is below minLength {}", max, min));
  const auto pat = schema.find("pattern");
  const auto fmt_it = schema.find("format");
  if (pat != schema.end()) {
    if (!pat->is_string()) Bad(Ptr(path, "pattern"), "\"pattern\" must be a string");
    if (has_min || has_max || fmt_it != schema.end())
      Bad(Ptr(path, "pattern"), "\"pattern\" together with minLength/maxLength/format is not supported");
    return wrap({CompileRegex(g_, pat->get<std::string>(), RegexMode::kSearch, &allowed,
                              fmt::format("{}: pattern at {}", what_, Ptr(path, "pattern")))});
  }
  if (fmt_it != schema.end()) {
    if (!fmt_it->is_string()) Bad(Ptr(path, "format"), "\"format\" must be a string");
    if (has_min || has_max) Bad(Ptr(path, "format"), "\"format\" together with minLength/maxLength is not supported");
    const std::string f = fmt_it->get<std::string>();
    static const std::map<std::string, std::string> kFormats = {
        {"date", "[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"},
        {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
        {"date-time",
         "[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)T"
         "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
        {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
        {"email", "[a-zA-Z0-9_+-]{1,32}(\\.[a-zA-Z0-9_+-]{1,32}){0,3}@([a-z0-9]{1,20}\\.){1,3}[a-z]{2,10}"},
    };
    auto it = kFormats.find(f);
    if (it == kFormats.end())
      Bad(Ptr(path, "format"),
          fmt::format("string format \"{}\" is not supported (supported: date, time, date-time, uuid, email)", f));
    return wrap({CompileRegex(g_, it->second, RegexMode::kFullMatch, &allowed, "format " + f)});
  }
  const Element ch = raw ? g_.Utf8Set(allowed) : (allowed == JsonPlainChars() ? JsonChar() : g_.Utf8Set(allowed));
  return wrap({g_.Repeat({ch}, min, has_max ? max : -1, "chars")});
}

}  // namespace deepinfer::structured
