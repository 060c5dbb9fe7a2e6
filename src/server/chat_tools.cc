#include "server/chat_tools.h"

#include <set>

#include <fmt/format.h>

#include "server/openai_api.h"

namespace deepinfer::server {

using OJson = nlohmann::ordered_json;

namespace {
const OJson* Get(const OJson& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}
bool ValidName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return false;
  return true;
}
}  // namespace

ToolsRequest ParseTools(const OJson& body, bool v41) {
  ToolsRequest r;
  std::vector<std::string> names;
  if (const OJson* tools = Get(body, "tools")) {
    if (!tools->is_array()) BadRequest(fmt::format("tools: expected a list, found {}", tools->type_name()), "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const OJson& t = (*tools)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object()) BadRequest(fmt::format("{}: expected an object, found {}", at, t.type_name()), "tools");
      if (const OJson* type = Get(t, "type"); type && *type != "function")
        BadRequest(fmt::format("{}.type: only \"function\" tools are supported, found {}", at, type->dump()), "tools");
      const OJson* f = Get(t, "function");
      if (!f || !f->is_object()) BadRequest(fmt::format("{}.function: expected an object", at), "tools");
      const OJson* name = Get(*f, "name");
      if (!name || !name->is_string() || !ValidName(name->get<std::string>()))
        BadRequest(fmt::format("{}.function.name: expected 1-64 characters of [A-Za-z0-9_.-]", at), "tools");
      if (const OJson* p = Get(*f, "parameters"); p && !p->is_object())
        BadRequest(fmt::format("{}.function.parameters must be an object (a JSON Schema), found {}", at, p->type_name()),
                   "tools");
      if (const OJson* s = Get(*f, "strict"); s && !s->is_boolean())
        BadRequest(fmt::format("{}.function.strict: expected true or false", at), "tools");
      if (const OJson* d = Get(*f, "description"); d && !d->is_string())
        BadRequest(fmt::format("{}.function.description: expected a string", at), "tools");
      const std::string n = name->get<std::string>();
      for (const auto& m : names)
        if (m == n) BadRequest(fmt::format("{}.function.name: \"{}\" is defined twice", at, n), "tools");
      names.push_back(n);
    }
    r.tools = *tools;
  }
  bool parallel = true;
  if (const OJson* p = Get(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) BadRequest("parallel_tool_calls: expected true or false", "parallel_tool_calls");
    parallel = p->get<bool>();
  }
  std::string choice = names.empty() ? "none" : "auto";
  std::optional<std::string> named;
  if (const OJson* tc = Get(body, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        BadRequest(fmt::format("tool_choice: expected \"none\", \"auto\", \"required\" or a named function, found \"{}\"",
                               choice),
                   "tool_choice");
    } else if (tc->is_object()) {
      const OJson* f = Get(*tc, "function");
      const OJson* n = f && f->is_object() ? Get(*f, "name") : nullptr;
      if ((Get(*tc, "type") && (*tc)["type"] != "function") || !n || !n->is_string())
        BadRequest("tool_choice: a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
      named = n->get<std::string>();
      choice = "named";
      bool found = false;
      for (const auto& m : names) found |= m == *named;
      if (!found) {
        std::string list;
        for (const auto& m : names) list += (list.empty() ? "" : ", ") + m;
        BadRequest(fmt::format("tool_choice: unknown tool \"{}\" (tools defines: {})", *named,
                               list.empty() ? "none" : list),
                   "tool_choice");
      }
    } else {
      BadRequest(fmt::format("tool_choice: expected a string or an object, found {}", tc->type_name()), "tool_choice");
    }
  }
  if (names.empty() && (choice == "required" || choice == "auto") && Get(body, "tool_choice"))
    BadRequest(fmt::format("tool_choice \"{}\" needs tools", choice), "tool_choice");
  r.parse_calls = !names.empty() && choice != "none";
  if (choice == "required" || choice == "named") {
    OJson spec = {{"v41", v41}, {"parallel", choice == "required" && parallel}, {"tools", OJson::array()}};
    for (size_t i = 0; i < r.tools.size(); ++i) {
      const OJson& f = r.tools[i]["function"];
      if (named && f["name"] != *named) continue;
      OJson t = {{"name", f["name"]}, {"index", i}};
      if (const OJson* p = Get(f, "parameters")) t["parameters"] = *p;
      spec["tools"].push_back(t);
    }
    r.forced = spec;
  }
  return r;
}

}  // namespace deepinfer::server
