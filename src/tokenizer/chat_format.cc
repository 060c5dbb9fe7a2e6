#include "tokenizer/chat_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "base/error.h"
#include "base/json_field.h"

namespace deepinfer {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kSystem = "<｜System｜>";
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
constexpr std::string_view kImage = "<｜deepseek_image｜>";

const std::map<std::string, std::string>& TaskTokens() {
  static const std::map<std::string, std::string> m = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},  {"read_url", "<｜read_url｜>"}};
  return m;
}

constexpr std::string_view kResponseFormat =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

constexpr std::string_view kReasoningEffortMaxV4 =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

// The prompt being rendered, and the byte ranges of it that came from the
// request (message content, reasoning, tool results, tool-call names and
// arguments, tool schemas, response formats). EncodeChat tokenizes those
// ranges without added-token matching, so request text never becomes a role
// marker or any other special token; the template's own markers stay tokens.
class Prompt {
 public:
  explicit Prompt(bool v41) : v41_(v41) {}
  // The template's own text (markers included).
  Prompt& operator+=(std::string_view t) {
    text_ += t;
    return *this;
  }
  // Text from the request.
  void Plain(std::string_view t) {
    if (t.empty()) return;
    const size_t b = text_.size();
    text_ += t;
    if (!plain_.empty() && plain_.back().second == b) plain_.back().second = text_.size();
    else plain_.emplace_back(b, text_.size());
  }
  // Message content: as Plain(), except that in V4.1 an image placeholder is
  // the marker — there it can only come from an image block (ProcessImages
  // refuses the placeholder typed into text).
  void Content(std::string_view t) {
    while (v41_) {
      const size_t cut = t.find(kImage);
      if (cut == std::string_view::npos) break;
      Plain(t.substr(0, cut));
      text_ += kImage;
      t = t.substr(cut + kImage.size());
    }
    Plain(t);
  }
  void Append(const Prompt& p) {
    const size_t base = text_.size();
    text_ += p.text_;
    for (const auto& [b, e] : p.plain_) {
      if (!plain_.empty() && plain_.back().second == b + base) plain_.back().second = e + base;
      else plain_.emplace_back(b + base, e + base);
    }
  }
  bool v41() const { return v41_; }
  const std::string& text() const { return text_; }
  std::string& text() { return text_; }
  const std::vector<std::pair<size_t, size_t>>& plain() const { return plain_; }

 private:
  bool v41_;
  std::string text_;
  std::vector<std::pair<size_t, size_t>> plain_;
};

struct Dialect {
  bool v41;
  std::string_view block;   // DSML tool-calls block name
  std::string_view invoke;  // DSML invoke tag
  std::string_view param;   // DSML parameter tag
};
const Dialect kV4{false, "tool_calls", "invoke", "parameter"};
const Dialect kV41{true, " calls", " invoke", " parameter"};

void ToolsBlock(const Dialect& d, const std::string& schemas, Prompt& out) {
  const std::string b(d.block), i(d.invoke), p(d.param), t(kDsml);
  out += "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
         "writing a \"<" + t + b + ">\" block like the following:\n\n"
         "<" + t + b + ">\n"
         "<" + t + i + " name=\"$TOOL_NAME\">\n"
         "<" + t + p + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + t + p + ">\n"
         "...\n"
         "</" + t + i + ">\n"
         "<" + t + i + " name=\"$TOOL_NAME2\">\n"
         "...\n"
         "</" + t + i + ">\n"
         "</" + t + b + ">\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after </think> with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n";
  out.Plain(schemas);
  out += "\n\n"
         "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

// --- Python semantics helpers -------------------------------------------------

[[noreturn]] void Bad(size_t index, const std::string& what) {
  Fail(ErrorKind::kInvalidArgument, "chat message {}: {}", index, what);
}

const Json* Get(const Json& msg, const char* key) {  // msg.get(key); null → nullptr
  auto it = msg.find(key);
  return it == msg.end() || it->is_null() ? nullptr : &*it;
}

bool Truthy(const Json* v) {
  if (!v) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_string()) return !v->get_ref<const std::string&>().empty();
  if (v->is_array() || v->is_object()) return !v->empty();
  if (v->is_number_integer()) return v->get<int64_t>() != 0;
  if (v->is_number_float()) return v->get<double>() != 0.0;
  return true;
}

// `content or ""` for a value that must be a string.
std::string StrOr(const Json* v, size_t index, const char* field) {
  if (!Truthy(v)) return "";
  if (!v->is_string()) Bad(index, fmt::format("\"{}\" must be a string", field));
  return v->get<std::string>();
}

// str.format of a value: strings as is, None as "None".
std::string FormatStr(const Json* v, size_t index, const char* field) {
  if (!v) return "None";
  if (!v->is_string()) Bad(index, fmt::format("\"{}\" must be a string", field));
  return v->get<std::string>();
}

std::string Role(const Json& m) {
  const Json* r = Get(m, "role");
  return r && r->is_string() ? r->get<std::string>() : "";
}

// --- Python json.dumps ----------------------------------------------------------

void PyFloat(double v, std::string& out) {
  if (std::isnan(v)) { out += "NaN"; return; }
  if (std::isinf(v)) { out += v < 0 ? "-Infinity" : "Infinity"; return; }
  if (v == 0) { out += std::signbit(v) ? "-0.0" : "0.0"; return; }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), std::fabs(v), std::chars_format::scientific);
  const std::string s(buf, r.ptr);  // d[.ddd]e±XX, shortest round-trip digits
  const size_t epos = s.find('e');
  std::string digits = s.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int e = std::stoi(s.substr(epos + 1));
  if (v < 0) out += '-';
  const int n = static_cast<int>(digits.size());
  if (e >= -4 && e < 16) {
    const int decpt = e + 1;
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(decpt - n, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", e < 0 ? '-' : '+', std::abs(e));
  }
}

void PyString(const std::string& s, std::string& out) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += ch;
    }
  }
  out += '"';
}

void PyDump(const Json& v, std::string& out) {
  switch (v.type()) {
    case Json::value_t::null: out += "null"; break;
    case Json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case Json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case Json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case Json::value_t::number_float: PyFloat(v.get<double>(), out); break;
    case Json::value_t::string: PyString(v.get_ref<const std::string&>(), out); break;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const Json& x : v) {
        if (!first) out += ", ";
        first = false;
        PyDump(x, out);
      }
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        PyString(it.key(), out);
        out += ": ";
        PyDump(it.value(), out);
      }
      out += '}';
      break;
    }
    default: Fail(ErrorKind::kInvalidArgument, "cannot serialise a binary JSON value");
  }
}

// --- preprocessing ----------------------------------------------------------------

// V4 (encoding_dsv4 takes string content only): OpenAI's list content of text
// blocks becomes the texts joined by "\n" (vLLM's "string" content format);
// any other block type is an error naming it (V4 has no vision tower).
Json FlattenTextBlocks(const Json& messages) {
  Json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    Json& msg = out[i];
    for (const char* f : {"content", "reasoning_content"}) {
      auto it = msg.find(f);
      if (it == msg.end() || !it->is_array()) continue;
      std::string joined;
      for (size_t j = 0; j < it->size(); ++j) {
        const Json& b = (*it)[j];
        if (!b.is_object()) Bad(i, fmt::format("\"{}\"[{}]: content blocks must be objects", f, j));
        const std::string type = StringField(b, "type");
        if (type != "text")
          Bad(i, fmt::format("\"{}\"[{}]: content block type \"{}\" is not supported by this model (text only)", f,
                             j, type));
        const Json* t = Get(b, "text");
        if (t && !t->is_string()) Bad(i, fmt::format("\"{}\"[{}].text must be a string", f, j));
        if (j > 0) joined += "\n";
        joined += t ? t->get<std::string>() : "";
      }
      *it = joined;
    }
  }
  return out;
}

// V4.1 process_image_messages: list content → content_blocks, image blocks →
// placeholder text blocks, rejects the placeholder typed into text.
Json ProcessImages(const Json& messages) {
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    Json msg = messages[i];
    for (const char* f : {"content", "reasoning_content"}) {
      const Json* v = Get(msg, f);
      if (v && v->is_string() && v->get_ref<const std::string&>().find(kImage) != std::string::npos)
        Bad(i, fmt::format("\"{}\" contains the image token {}; images must be image content blocks", f, kImage));
    }
    if (const Json* c = Get(msg, "content"); c && c->is_array() && !msg.contains("content_blocks")) {
      msg["content_blocks"] = *c;
      msg.erase("content");
    }
    if (Truthy(Get(msg, "content_blocks"))) {
      Json blocks = Json::array();
      std::vector<std::string> texts;
      std::function<Json(const Json&)> process = [&](const Json& list) {
        Json nb = Json::array();
        for (const Json& b : list) {
          if (!b.is_object()) { nb.push_back(b); continue; }
          const std::string type = StringField(b, "type");
          if (type == "image" || type == "image_url") {
            bool has_source = false;
            if (type == "image_url") {
              const Json* u = Get(b, "image_url");
              has_source = u && ((u->is_string() && !u->get_ref<const std::string&>().empty()) ||
                                 (u->is_object() && Truthy(Get(*u, "url"))));
            } else {
              has_source = Truthy(Get(b, "source")) || Truthy(Get(b, "url")) || Truthy(Get(b, "data"));
            }
            if (!has_source) Bad(i, "image block does not contain a valid source");
            nb.push_back(Json{{"type", "text"}, {"text", std::string(kImage)}});
          } else if (type == "tool_result" && b.contains("content") && b["content"].is_array()) {
            Json c = b;
            c["content"] = process(b["content"]);
            nb.push_back(std::move(c));
          } else if (type == "text") {
            const Json* t = Get(b, "text");
            if (t && t->is_string() && t->get_ref<const std::string&>().find(kImage) != std::string::npos)
              Bad(i, fmt::format("text block contains the image token {}", kImage));
            nb.push_back(b);
          } else {
            nb.push_back(b);
          }
        }
        return nb;
      };
      msg["content_blocks"] = process(msg["content_blocks"]);
      const Json* c = Get(msg, "content");
      if (!(c && c->is_string())) {
        std::string joined;
        bool first = true;
        for (const Json& b : msg["content_blocks"]) {
          if (!b.is_object() || StringField(b, "type") != "text") continue;
          if (!first) joined += "\n\n";
          first = false;
          const Json* t = Get(b, "text");
          if (t && !t->is_string()) Bad(i, "text block \"text\" must be a string");
          joined += t ? t->get<std::string>() : "";
        }
        msg["content"] = joined;
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

Json MergeToolMessages(const Json& messages, bool v41) {
  Json merged = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& msg = messages[i];
    if (!msg.is_object()) Bad(i, "a message must be a JSON object");
    const std::string role = Role(msg);
    auto last_is_merged_user = [&] {
      return !merged.empty() && Role(merged.back()) == "user" && merged.back().contains("content_blocks");
    };
    if (role == "tool") {
      Json block = Json::object();
      block["type"] = "tool_result";
      block["tool_use_id"] = msg.contains("tool_call_id") ? msg["tool_call_id"] : Json("");
      block["content"] = msg.contains("content") ? msg["content"] : Json("");
      if (last_is_merged_user()) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back(Json{{"role", "user"}, {"content_blocks", Json::array({std::move(block)})}});
      }
    } else if (role == "user") {
      Json blocks;
      if (v41 && msg.contains("content_blocks") && !msg["content_blocks"].is_null()) {
        blocks = msg["content_blocks"];
      } else {
        blocks = Json::array({Json{{"type", "text"}, {"text", msg.contains("content") ? msg["content"] : Json("")}}});
      }
      if (last_is_merged_user() && !Get(merged.back(), "task")) {
        for (const Json& b : blocks) merged.back()["content_blocks"].push_back(b);
      } else if (v41) {
        Json nm = msg;
        nm["content_blocks"] = std::move(blocks);
        merged.push_back(std::move(nm));
      } else {
        Json nm = Json::object();
        nm["role"] = "user";
        nm["content"] = msg.contains("content") ? msg["content"] : Json("");
        nm["content_blocks"] = std::move(blocks);
        for (const char* k : {"task", "wo_eos", "mask"})
          if (msg.contains(k)) nm[k] = msg[k];
        merged.push_back(std::move(nm));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

void SortToolResults(Json& messages) {
  std::map<std::string, int> order;  // tool_call id → position in the last assistant's tool_calls
  for (Json& msg : messages) {
    const std::string role = Role(msg);
    if (role == "assistant" && Truthy(Get(msg, "tool_calls"))) {
      order.clear();
      int idx = 0;
      for (const Json& tc : msg["tool_calls"]) {
        std::string id;
        if (const Json* v = Get(tc, "id"); Truthy(v) && v->is_string()) id = v->get<std::string>();
        else if (const Json* f = Get(tc, "function"); f && f->is_object())
          if (const Json* w = Get(*f, "id"); w && w->is_string()) id = w->get<std::string>();
        if (!id.empty()) order[id] = idx;
        ++idx;
      }
    } else if (role == "user" && Truthy(Get(msg, "content_blocks"))) {
      std::vector<Json> tools;
      for (const Json& b : msg["content_blocks"])
        if (b.is_object() && StringField(b, "type") == "tool_result") tools.push_back(b);
      if (tools.size() > 1 && !order.empty()) {
        auto key = [&](const Json& b) {
          const Json* id = Get(b, "tool_use_id");
          if (!id || !id->is_string()) return 0;
          auto it = order.find(id->get<std::string>());
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tools.begin(), tools.end(), [&](const Json& a, const Json& b) { return key(a) < key(b); });
        size_t k = 0;
        for (Json& b : msg["content_blocks"])
          if (b.is_object() && StringField(b, "type") == "tool_result") b = tools[k++];
      }
    }
  }
}

int LastUserIndex(const Json& messages, bool v41) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const std::string r = Role(messages[i]);
    if (r == "user" || (!v41 && r == "developer") || (v41 && r == "system" && i > 0)) return i;
  }
  return -1;
}

Json DropThinking(const Json& messages, bool v41) {
  const int last = LastUserIndex(messages, v41);
  Json out = Json::array();
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const std::string r = Role(messages[i]);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" || r == "direct_search_results" ||
        i >= last) {
      out.push_back(messages[i]);
    } else if (r == "assistant") {
      Json m = messages[i];
      m.erase("reasoning_content");
      out.push_back(std::move(m));
    }  // developer and other roles before the last user message are dropped
  }
  return out;
}

// Tool-call arguments → DSML parameter lines.
void ArgumentsToDsml(const Dialect& d, const Json& arguments, size_t index, Prompt& out) {
  Json args;
  if (d.v41) {
    args = arguments;
    if (!args.is_object()) {
      for (int k = 0; k < 2 && args.is_string(); ++k) {
        try {
          args = Json::parse(args.get<std::string>());
        } catch (const Json::exception&) {
          break;
        }
      }
      if (!args.is_object()) args = Json{{"arguments", arguments}};
    }
  } else {
    bool ok = false;
    if (arguments.is_string()) {
      try {
        args = Json::parse(arguments.get<std::string>());
        ok = true;
      } catch (const Json::exception&) {
      }
    }
    if (!ok) args = Json{{"arguments", arguments}};
    if (!args.is_object()) Bad(index, "tool call arguments must be a JSON object");
  }
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    const bool is_str = it.value().is_string();
    out += fmt::format("<{}{} name=\"", kDsml, d.param);
    out.Plain(it.key());
    out += fmt::format("\" string=\"{}\">", is_str ? "true" : "false");
    out.Plain(is_str ? it.value().get<std::string>() : PyJsonDumps(it.value()));
    out += fmt::format("</{}{}>", kDsml, d.param);
  }
}

void RenderUserBlocks(const Json& blocks, size_t index, Prompt& out) {
  bool first = true;
  for (const Json& b : blocks) {
    if (!first) out += "\n\n";
    first = false;
    if (!b.is_object()) Bad(index, "content blocks must be objects");
    const std::string type = StringField(b, "type");
    if (type == "text") {
      const Json* t = Get(b, "text");
      if (!t && b.contains("text")) Bad(index, "text block \"text\" is null");
      if (t && !t->is_string()) Bad(index, "text block \"text\" must be a string");
      out.Content(t ? t->get<std::string>() : "");
    } else if (type == "tool_result") {
      std::string content;
      const Json* c = b.contains("content") ? &b["content"] : nullptr;
      if (c && c->is_array()) {
        bool f2 = true;
        for (const Json& x : *c) {
          if (!f2) content += "\n\n";
          f2 = false;
          const std::string t2 = x.is_object() ? StringField(x, "type") : "";
          if (t2 == "text") content += StringField(x, "text");
          else content += fmt::format("[Unsupported {}]", x.is_object() && x.contains("type") ? t2 : "None");  // all request text
        }
      } else if (!c) {
        content = "";
      } else if (c->is_null()) {
        content = "None";  // Python formats None
      } else if (c->is_string()) {
        content = c->get<std::string>();
      } else {
        Bad(index, "tool result content must be a string or a list of blocks");
      }
      out += "<tool_result>";
      out.Content(content);
      out += "</tool_result>";
    } else {
      out += "[Unsupported ";
      out.Plain(b.contains("type") && b["type"].is_string() ? type : "None");
      out += "]";
    }
  }
}

Prompt RenderMessage(size_t index, const Json& msgs, const ChatOptions& o, const Dialect& d, bool drop,
                     const std::string& effort_prefix) {
  const Json& msg = msgs[index];
  const int last_user = LastUserIndex(msgs, d.v41);
  const std::string role = Role(msg);
  const Json* content = Get(msg, "content");
  const Json* tools = Get(msg, "tools");
  const Json* response_format = Get(msg, "response_format");
  const Json* tool_calls = Get(msg, "tool_calls");
  const bool wo_eos = Truthy(Get(msg, "wo_eos"));

  Prompt prompt(d.v41);
  if (d.v41) {
    const std::string eff = index == 0 && o.thinking ? effort_prefix : "";
    if (index == 0 && (!eff.empty() || role == "system")) prompt += kSystem;
    prompt += eff;
  } else if (index == 0 && o.thinking) {
    prompt += effort_prefix;
  }

  auto tools_text = [&] {
    std::string schemas;
    bool first = true;
    for (const Json& t : *tools) {
      if (!t.is_object() || !t.contains("function")) Bad(index, "each tool must be {\"type\": ..., \"function\": {...}}");
      if (t.contains("namespace") || t["function"].contains("namespace"))
        Bad(index, "tool namespaces are not supported");
      if (!first) schemas += "\n";
      first = false;
      schemas += PyJsonDumps(t["function"]);
    }
    ToolsBlock(d, schemas, prompt);
  };
  auto extras = [&] {
    if (Truthy(tools)) {
      if (!tools->is_array()) Bad(index, "\"tools\" must be a list");
      prompt += "\n\n";
      tools_text();
    }
    if (Truthy(response_format)) {
      prompt += "\n\n";
      prompt += kResponseFormat;
      prompt.Plain(PyJsonDumps(*response_format));
    }
  };

  if (role == "system") {
    if (d.v41 && index > 0) prompt += kSystem;
    prompt.Content(StrOr(content, index, "content"));
    extras();
  } else if (role == "developer" && !d.v41) {
    if (!Truthy(content)) Bad(index, "a developer message needs content");
    prompt += kUser;
    prompt.Content(StrOr(content, index, "content"));
    extras();
  } else if (role == "user") {
    prompt += kUser;
    if (Truthy(Get(msg, "content_blocks"))) {
      RenderUserBlocks(msg["content_blocks"], index, prompt);
    } else {
      prompt.Content(StrOr(content, index, "content"));
    }
  } else if (role == "latest_reminder") {
    prompt += kLatestReminder;
    prompt.Content(FormatStr(content, index, "content"));
  } else if (role == "assistant") {
    Prompt tc(d.v41);
    if (Truthy(tool_calls)) {
      if (!tool_calls->is_array()) Bad(index, "\"tool_calls\" must be a list");
      Prompt list(d.v41);
      bool first = true;
      for (const Json& call : *tool_calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"].contains("arguments"))
          Bad(index, "each tool call needs function.name and function.arguments");
        const Json& f = call["function"];
        if (!first) list += "\n";
        first = false;
        const std::string name = f["name"].is_null() ? "None" : f["name"].is_string()
                                                                     ? f["name"].get<std::string>()
                                                                     : PyJsonDumps(f["name"]);
        list += fmt::format("<{}{} name=\"", kDsml, d.invoke);
        list.Plain(name);
        list += "\">\n";
        ArgumentsToDsml(d, f["arguments"], index, list);
        list += fmt::format("\n</{}{}>", kDsml, d.invoke);
      }
      tc += fmt::format("\n\n<{}{}>\n", kDsml, d.block);
      tc.Append(list);
      tc += fmt::format("\n</{}{}>", kDsml, d.block);
    }
    const std::string summary = StrOr(content, index, "content");
    const std::string rc = StrOr(Get(msg, "reasoning_content"), index, "reasoning_content");
    const bool prev_has_task = index >= 1 && Get(msgs[index - 1], "task") != nullptr;
    if (o.thinking && !prev_has_task && (!drop || static_cast<int>(index) > last_user)) {
      prompt.Content(rc);
      prompt += kThinkEnd;
    }
    prompt.Content(summary);
    prompt.Append(tc);
    if (!wo_eos) prompt += kEos;
  } else if (role == "tool") {
    Bad(index, "internal: tool message not merged");
  } else {
    Bad(index, fmt::format("unknown role \"{}\" for the {} chat format", role, d.v41 ? "DeepSeek-V4.1"
                                                                                     : "DeepSeek-V4"));
  }

  // Transition to what follows.
  const bool is_last = index + 1 == msgs.size();
  if (!is_last) {
    const std::string next = Role(msgs[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return prompt;
  }
  if (const Json* task = Get(msg, "task")) {
    if (!task->is_string() || !TaskTokens().count(task->get<std::string>()))
      Bad(index, fmt::format("invalid task {}", task->dump()));
    const std::string& tok = TaskTokens().at(task->get<std::string>());
    if (task->get<std::string>() != "action") {
      prompt += tok;
    } else {
      prompt += kAssistant;
      prompt += o.thinking ? kThinkStart : kThinkEnd;
      prompt += tok;
    }
  } else if (role == "user" || (!d.v41 && role == "developer") || (d.v41 && role == "system" && index > 0)) {
    if (is_last && !o.add_generation_prompt) return prompt;
    prompt += kAssistant;
    if (!drop && o.thinking) prompt += kThinkStart;
    else if (drop && o.thinking && static_cast<int>(index) >= last_user) prompt += kThinkStart;
    else prompt += kThinkEnd;
  }
  return prompt;
}

std::string EffortPrefix(const ChatOptions& o) {
  const Json& e = o.reasoning_effort;
  if (o.encoding == ChatEncoding::kDeepseekV41) {
    int budget = 75;  // default "high"
    if (e.is_null()) {
    } else if (e.is_number_integer() && e.get<int64_t>() >= 1 && e.get<int64_t>() <= 100) {
      budget = static_cast<int>(e.get<int64_t>());
    } else if (e.is_string() && e.get<std::string>() == "low") {
      budget = 50;
    } else if (e.is_string() && e.get<std::string>() == "high") {
      budget = 75;
    } else if (e.is_string() && e.get<std::string>() == "max") {
      budget = 100;
    } else {
      Fail(ErrorKind::kInvalidArgument,
           "invalid reasoning effort {} for DeepSeek-V4.1: an integer within [1,100] or \"low\", \"high\", \"max\"",
           e.dump());
    }
    return fmt::format("Reasoning Effort: {} (range 1-100, the higher the value, the more thorough the reasoning)\n\n",
                       budget);
  }
  if (e.is_null() || (e.is_string() && e.get<std::string>() == "high")) return "";
  if (e.is_string() && e.get<std::string>() == "max") return std::string(kReasoningEffortMaxV4);
  Fail(ErrorKind::kInvalidArgument, "invalid reasoning effort {} for DeepSeek-V4: \"high\" or \"max\"", e.dump());
}

}  // namespace

std::string PyJsonDumps(const Json& value) {
  std::string out;
  PyDump(value, out);
  return out;
}

ChatEncoding ChatEncodingForModelType(std::string_view model_type) {
  if (model_type == "deepseek_v4") return ChatEncoding::kDeepseekV4;
  if (model_type == "deepseek_v41") return ChatEncoding::kDeepseekV41;
  Fail(ErrorKind::kInvalidArgument, "no chat format for model_type \"{}\" (expected deepseek_v4 or deepseek_v41)",
       model_type);
}

RenderedChat RenderChatPieces(const Json& messages, const ChatOptions& o) {
  if (!messages.is_array()) Fail(ErrorKind::kInvalidArgument, "chat messages must be a JSON array");
  const Dialect& d = o.encoding == ChatEncoding::kDeepseekV41 ? kV41 : kV4;
  const std::string effort = EffortPrefix(o);  // validates in every mode, as the reference asserts
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object()) Bad(i, "a message must be a JSON object");
    // Field types first, so an error names the field the caller wrote.
    if (!m.contains("role") || m["role"].is_null()) Bad(i, "\"role\" is missing");
    if (!m["role"].is_string()) Bad(i, fmt::format("\"role\" must be a string, found {}", m["role"].type_name()));
    if (m.contains("content")) {
      const Json& c = m["content"];
      if (c.is_null() && m["role"] == "user")
        Bad(i, "\"content\" is null (give a string or a list of content blocks)");
      if (!c.is_null() && !c.is_string() && !c.is_array())
        Bad(i, fmt::format("\"content\" must be a string or a list of content blocks, found {}", c.type_name()));
    }
  }
  Json msgs = d.v41 ? ProcessImages(messages) : FlattenTextBlocks(messages);
  msgs = MergeToolMessages(msgs, d.v41);
  SortToolResults(msgs);
  bool drop = o.drop_thinking;
  for (const Json& m : msgs)
    if (Truthy(Get(m, "tools"))) drop = false;
  if (o.thinking && drop) msgs = DropThinking(msgs, d.v41);
  Prompt prompt(d.v41);
  if (o.add_bos) prompt += kBos;
  for (size_t i = 0; i < msgs.size(); ++i) prompt.Append(RenderMessage(i, msgs, o, d, drop, effort));
  return RenderedChat{prompt.text(), prompt.plain()};
}

std::string RenderChat(const Json& messages, const ChatOptions& o) { return RenderChatPieces(messages, o).text; }

std::vector<int32_t> EncodeChat(const Tokenizer& tokenizer, const Json& messages, const ChatOptions& options) {
  const RenderedChat r = RenderChatPieces(messages, options);
  std::vector<int32_t> ids;
  ids.reserve(r.text.size() / 3 + 4);
  tokenizer.EncodeAppend(r.text, ids, r.plain_ranges);
  return ids;
}

std::vector<int32_t> EncodeChatWithImages(const Tokenizer& tokenizer, const Json& messages, const ChatOptions& options,
                                          int32_t image_token_id, int* num_images) {
  const RenderedChat r = RenderChatPieces(messages, options);
  std::vector<int32_t> ids;
  ids.reserve(r.text.size() / 3 + 4);
  *num_images = 0;
  size_t pos = 0;
  while (pos <= r.text.size()) {
    size_t cut = r.text.find(kImage, pos);
    const size_t end = cut == std::string::npos ? r.text.size() : cut;
    // The plain ranges inside [pos, end), shifted to the piece.
    std::vector<std::pair<size_t, size_t>> plain;
    for (const auto& [b, e] : r.plain_ranges) {
      const size_t lo = std::max(b, pos), hi = std::min(e, end);
      if (lo < hi) plain.emplace_back(lo - pos, hi - pos);
    }
    tokenizer.EncodeAppend(std::string_view(r.text).substr(pos, end - pos), ids, plain);
    if (cut == std::string::npos) break;
    ids.push_back(image_token_id);
    ++*num_images;
    pos = cut + kImage.size();
  }
  return ids;
}

}  // namespace deepinfer
