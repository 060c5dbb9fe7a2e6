#include "structured/tool_calls.h"

#include <fmt/format.h>

#include "base/error.h"
#include "structured/json_schema.h"

namespace deepinfer::structured {

using OJson = nlohmann::ordered_json;

DsmlMarkers DsmlMarkers::For(bool v41) {
  const std::string t = "｜DSML｜";
  const std::string block = v41 ? " calls" : "tool_calls", invoke = v41 ? " invoke" : "invoke",
                    param = v41 ? " parameter" : "parameter";
  return {"<" + t + block + ">", "</" + t + block + ">", "<" + t + invoke + " name=\"", "</" + t + invoke + ">",
          "<" + t + param + " name=\"", "</" + t + param + ">"};
}

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of s that is a proper prefix of marker.
size_t PartialSuffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
// s is a proper prefix of p.
bool PrefixOf(std::string_view s, std::string_view p) { return s.size() < p.size() && p.substr(0, s.size()) == s; }

// Parses the inside of an invoke (after `invoke name="`, before `</invoke>`).
bool ParseInvoke(std::string_view text, const DsmlMarkers& m, ParsedToolCall* out) {
  const size_t q = text.find("\">");
  if (q == std::string_view::npos || q == 0) return false;
  const std::string_view name = text.substr(0, q);
  if (name.find_first_of("\"<>\n") != std::string_view::npos) return false;
  size_t j = q + 2;
  OJson args = OJson::object();
  const std::string_view string_attr = "\" string=\"";
  while (true) {
    while (j < text.size() && IsSpace(text[j])) ++j;
    if (j == text.size()) break;
    if (!StartsWith(text.substr(j), m.param_open)) return false;
    j += m.param_open.size();
    const size_t k = text.find('"', j);
    if (k == std::string_view::npos || k == j) return false;
    const std::string key(text.substr(j, k - j));
    if (key.find_first_of("<>\n") != std::string::npos) return false;
    if (!StartsWith(text.substr(k), string_attr)) return false;
    j = k + string_attr.size();
    bool is_string;
    if (StartsWith(text.substr(j), "true\">")) {
      is_string = true;
      j += 6;
    } else if (StartsWith(text.substr(j), "false\">")) {
      is_string = false;
      j += 7;
    } else {
      return false;
    }
    const size_t e = text.find(m.param_close, j);
    if (e == std::string_view::npos) return false;
    const std::string value(text.substr(j, e - j));
    j = e + m.param_close.size();
    if (is_string) {
      args[key] = value;
    } else {
      try {
        args[key] = OJson::parse(value);
      } catch (const OJson::exception&) {
        args[key] = value;  // not JSON: keep the text (as vLLM's parsers do)
      }
    }
  }
  out->name = std::string(name);
  out->arguments = args.dump(-1, ' ', false, OJson::error_handler_t::replace);
  return true;
}

}  // namespace

OutputParser::OutputParser(bool thinking, bool tools, bool v41)
    : m_(DsmlMarkers::For(v41)), tools_(tools), state_(thinking ? State::kReasoning : State::kContent) {}

OutputParser::Delta OutputParser::Push(std::string_view text) {
  Delta d;
  buf_.append(text);
  Run(&d, false);
  return d;
}

OutputParser::Delta OutputParser::Flush() {
  Delta d;
  Run(&d, true);
  return d;
}

void OutputParser::Malformed(Delta* d) {
  d->content += block_prefix_ + buf_;
  block_prefix_.clear();
  buf_.clear();
  state_ = State::kContent;
}

bool OutputParser::ParseBlockItem(Delta* d, bool final) {
  while (true) {
    size_t i = 0;
    while (i < buf_.size() && IsSpace(buf_[i])) ++i;
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest.empty()) {
      if (final) Malformed(d);
      return final;
    }
    if (StartsWith(rest, m_.block_close)) {
      buf_.erase(0, i + m_.block_close.size());
      block_prefix_.clear();
      state_ = State::kContent;
      return true;
    }
    if (StartsWith(rest, m_.invoke_open)) {
      const size_t e = rest.find(m_.invoke_close);
      if (e == std::string_view::npos) {
        if (final) Malformed(d);
        return final;
      }
      ParsedToolCall call;
      if (!ParseInvoke(rest.substr(m_.invoke_open.size(), e - m_.invoke_open.size()), m_, &call)) {
        Malformed(d);
        return true;
      }
      d->calls.push_back(std::move(call));
      ++num_calls_;
      buf_.erase(0, i + e + m_.invoke_close.size());
      block_prefix_.clear();  // text before a completed call is consumed by it
      continue;
    }
    if (!final && (PrefixOf(rest, m_.block_close) || PrefixOf(rest, m_.invoke_open))) return false;
    Malformed(d);
    return true;
  }
}

void OutputParser::Run(Delta* d, bool final) {
  while (true) {
    if (state_ == State::kReasoning) {
      const std::string_view think = "</think>";
      size_t p_think = buf_.find(think);
      size_t p_block = tools_ ? buf_.find(m_.block_open) : std::string::npos;
      if (p_think != std::string::npos && (p_block == std::string::npos || p_think < p_block)) {
        d->reasoning += buf_.substr(0, p_think);
        buf_.erase(0, p_think + think.size());
        state_ = State::kContent;
        continue;
      }
      if (p_block != std::string::npos) {
        d->reasoning += buf_.substr(0, p_block);
        buf_.erase(0, p_block + m_.block_open.size());
        block_prefix_ = m_.block_open;
        state_ = State::kBlock;
        continue;
      }
      size_t hold = final ? 0 : PartialSuffix(buf_, think);
      if (tools_ && !final) hold = std::max(hold, PartialSuffix(buf_, m_.block_open));
      d->reasoning += buf_.substr(0, buf_.size() - hold);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
    if (state_ == State::kContent) {
      if (!tools_) {
        d->content += buf_;
        buf_.clear();
        return;
      }
      const size_t p = buf_.find(m_.block_open);
      if (p != std::string::npos) {
        size_t end = p;
        while (end > 0 && IsSpace(buf_[end - 1])) --end;  // whitespace before a block is not content
        d->content += buf_.substr(0, end);
        buf_.erase(0, p + m_.block_open.size());
        block_prefix_ = m_.block_open;
        state_ = State::kBlock;
        continue;
      }
      size_t keep = buf_.size();
      if (!final) {
        keep -= PartialSuffix(buf_, m_.block_open);
        while (keep > 0 && IsSpace(buf_[keep - 1])) --keep;
      }
      d->content += buf_.substr(0, keep);
      buf_.erase(0, keep);
      return;
    }
    if (!ParseBlockItem(d, final)) return;
    if (final && buf_.empty()) return;
  }
}

// ---------------------------------------------------------------------------
// Grammar of a forced tool call

Element ToolCallGrammar(Grammar& g, const OJson& spec, const std::string& what) {
  const DsmlMarkers m = DsmlMarkers::For(spec.value("v41", true));
  const bool parallel = spec.value("parallel", true);
  const OJson& tools = spec.at("tools");
  if (!tools.is_array() || tools.empty()) Fail(ErrorKind::kInvalidArgument, "{}: no tool to call", what);
  std::vector<Seq> invokes;
  for (size_t t = 0; t < tools.size(); ++t) {
    const OJson& tool = tools[t];
    const std::string name = tool.at("name").get<std::string>();
    const std::string path = fmt::format("tools[{}].function.parameters", tool.value("index", static_cast<int>(t)));
    const OJson params = tool.contains("parameters") && !tool["parameters"].is_null() ? tool["parameters"] : OJson::object();
    JsonSchemaCompiler c(g, params, what + " (" + path + ")");
    std::vector<std::pair<std::string, Element>> props;
    std::vector<bool> required;
    if (params.contains("properties")) {
      const OJson& pr = params["properties"];
      if (!pr.is_object()) Fail(ErrorKind::kInvalidArgument, "{}: \"properties\" must be an object", path);
      std::set<std::string> req;
      if (params.contains("required") && params["required"].is_array())
        for (const OJson& r : params["required"])
          if (r.is_string()) req.insert(r.get<std::string>());
      for (auto it = pr.begin(); it != pr.end(); ++it) {
        const OJson& ps = it.value();
        const std::string ppath = "/properties/" + it.key();
        const bool is_string = ps.is_object() && ps.contains("type") && ps["type"] == "string";
        Seq s = g.Literal(m.param_open + it.key() + "\" string=\"" + (is_string ? "true" : "false") + "\">");
        s.push_back(is_string ? c.RawString(ps, ppath, {{'<', '<'}}) : c.Value(ps, ppath));
        Seq close = g.Literal(m.param_close);
        s.insert(s.end(), close.begin(), close.end());
        props.emplace_back(it.key(), g.Choice({s}, "param"));
        required.push_back(req.count(it.key()) > 0);
      }
    }
    // F(i, first): parameters from i on, one per line.
    const size_t n = props.size();
    std::vector<std::array<int, 2>> f(n + 1);
    for (size_t i = 0; i <= n; ++i)
      for (int first = 0; first < 2; ++first) f[i][first] = g.NewRule(fmt::format("params{}", i));
    for (int first = 0; first < 2; ++first) g.AddAlt(f[n][first], {});
    for (size_t i = n; i-- > 0;)
      for (int first = 0; first < 2; ++first) {
        Seq with = first ? Seq{} : g.Literal("\n");
        with.push_back(props[i].second);
        with.push_back(g.Ref(f[i + 1][0]));
        g.AddAlt(f[i][first], with);
        if (!required[i]) g.AddAlt(f[i][first], {g.Ref(f[i + 1][first])});
      }
    Seq inv = g.Literal(m.invoke_open + name + "\">\n");
    inv.push_back(g.Ref(f[0][1]));
    Seq close = g.Literal("\n" + m.invoke_close);
    inv.insert(inv.end(), close.begin(), close.end());
    invokes.push_back(inv);
  }
  const Element invoke = g.Choice(invokes, "invoke");
  Seq block = g.Literal(m.block_open + "\n");
  block.push_back(invoke);
  if (parallel) {
    Seq more = g.Literal("\n");
    more.push_back(invoke);
    block.push_back(g.Repeat(more, 0, -1, "more_invokes"));
  }
  Seq close = g.Literal("\n" + m.block_close);
  block.insert(block.end(), close.begin(), close.end());
  return g.Choice({block}, "tool_calls");
}

}  // namespace deepinfer::structured
