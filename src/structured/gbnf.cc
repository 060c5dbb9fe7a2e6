#include "structured/gbnf.h"

#include <set>

#include <fmt/format.h>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::structured {

namespace {

class GbnfParser {
 public:
  GbnfParser(Grammar& g, std::string_view text, const std::string& what) : g_(g), s_(text), what_(what) {}

  void Parse() {
    if (utf8::FirstInvalid(s_) != std::string_view::npos) Bad("the grammar is not valid UTF-8");
    Skip();
    while (i_ < s_.size()) {
      const std::string name = Name();
      if (name.empty()) Bad("expected a rule name");
      Skip();
      if (s_.substr(i_, 3) != "::=") Bad(fmt::format("expected \"::=\" after rule name \"{}\"", name));
      i_ += 3;
      if (!defined_.insert(name).second) Bad(fmt::format("rule \"{}\" is defined twice", name));
      const int r = g_.RuleByName(name);
      for (const Seq& alt : Alternates(false)) g_.AddAlt(r, alt);
      Skip();
    }
    if (!defined_.count("root")) Fail(ErrorKind::kInvalidArgument, "{}: the grammar has no \"root\" rule", what_);
    g_.SetRoot(g_.RuleByName("root"));
  }

 private:
  [[noreturn]] void Bad(const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    Fail(ErrorKind::kInvalidArgument, "{}: {} at line {} column {}", what_, msg, line, col);
  }
  static bool NameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }
  void Skip() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }
  std::string Name() {
    const size_t b = i_;
    while (i_ < s_.size() && NameChar(s_[i_])) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }
  // Is a `name ::=` starting at i_ (the start of the next rule)?
  bool AtRuleStart() const {
    size_t k = i_;
    while (k < s_.size() && NameChar(s_[k])) ++k;
    if (k == i_) return false;
    while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\n' || s_[k] == '\r')) ++k;
    return s_.substr(k, 3) == "::=";
  }
  uint32_t Hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (i_ >= s_.size()) Bad("truncated escape");
      const char c = s_[i_++];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) Bad("bad hex digit in escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }
  // One (possibly escaped) character of a literal or class.
  uint32_t Char() {
    if (i_ >= s_.size()) Bad("unexpected end of grammar");
    if (s_[i_] == '\\') {
      ++i_;
      if (i_ >= s_.size()) Bad("trailing backslash");
      const char c = s_[i_++];
      switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': return '\\';
        case '"': return '"';
        case '[': return '[';
        case ']': return ']';
        case '-': return '-';
        case '^': return '^';
        case 'x': return Hex(2);
        case 'u': return Hex(4);
        case 'U': return Hex(8);
        default: --i_; Bad(fmt::format("unknown escape \\{}", c));
      }
    }
    const utf8::Seq q = utf8::Inspect(s_, i_);
    i_ += q.len;
    return static_cast<uint32_t>(q.cp);
  }
  void CheckCp(uint32_t cp) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) Bad(fmt::format("U+{:X} is not a character", cp));
  }
  std::vector<Seq> Alternates(bool nested) {
    std::vector<Seq> alts{Sequence(nested)};
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      alts.push_back(Sequence(nested));
    }
    return alts;
  }
  Seq Sequence(bool nested) {
    Seq seq;
    while (true) {
      Skip();
      if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')') break;
      if (!nested && AtRuleStart()) break;
      Seq item = Item();
      // postfix operators
      while (true) {
        Skip();
        if (i_ >= s_.size()) break;
        const char c = s_[i_];
        int64_t lo = 0, hi = -1;
        if (c == '*') {
          ++i_;
        } else if (c == '+') {
          lo = 1;
          ++i_;
        } else if (c == '?') {
          hi = 1;
          ++i_;
        } else if (c == '{') {
          ++i_;
          Skip();
          lo = Int();
          Skip();
          hi = lo;
          if (i_ < s_.size() && s_[i_] == ',') {
            ++i_;
            Skip();
            hi = (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ? Int() : -1;
            Skip();
          }
          if (i_ >= s_.size() || s_[i_] != '}') Bad("expected '}' to close {m,n}");
          ++i_;
          if (hi >= 0 && hi < lo) Bad(fmt::format("repetition {{{},{}}}: maximum below minimum", lo, hi));
        } else {
          break;
        }
        item = {g_.Repeat(item, lo, hi, "rep")};
      }
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }
  int64_t Int() {
    if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') Bad("expected a number");
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + (s_[i_++] - '0');
      if (v > 100000) Bad("repetition count above 100000");
    }
    return v;
  }
  Seq Item() {
    const char c = s_[i_];
    if (c == '"') {
      ++i_;
      std::string bytes;
      while (true) {
        if (i_ >= s_.size() || s_[i_] == '\n') Bad("unterminated string literal");
        if (s_[i_] == '"') break;
        const uint32_t cp = Char();
        CheckCp(cp);
        AppendUtf8(cp, &bytes);
      }
      ++i_;
      return g_.Literal(bytes);
    }
    if (c == '[') {
      ++i_;
      bool negate = false;
      if (i_ < s_.size() && s_[i_] == '^') {
        negate = true;
        ++i_;
      }
      CodepointRanges set;
      while (true) {
        if (i_ >= s_.size()) Bad("unterminated character class");
        if (s_[i_] == ']') break;
        const uint32_t lo = Char();
        uint32_t hi = lo;
        if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
          ++i_;
          hi = Char();
        }
        CheckCp(lo);
        CheckCp(hi);
        if (hi < lo) Bad("character class range out of order");
        set.emplace_back(lo, hi);
      }
      ++i_;
      set = NormalizeRanges(set);
      if (negate) set = ComplementRanges(set);
      return {g_.Utf8Set(set)};
    }
    if (c == '.') {
      ++i_;
      return {g_.Utf8Set({{0, 0x10FFFF}})};
    }
    if (c == '(') {
      ++i_;
      std::vector<Seq> alts = Alternates(true);
      Skip();
      if (i_ >= s_.size() || s_[i_] != ')') Bad("expected ')'");
      ++i_;
      return {g_.Choice(alts, "group")};
    }
    if (NameChar(c)) {
      const std::string name = Name();
      return {g_.Ref(g_.RuleByName(name))};
    }
    Bad(fmt::format("unexpected character '{}'", c));
  }

  Grammar& g_;
  std::string_view s_;
  const std::string& what_;
  size_t i_ = 0;
  std::set<std::string> defined_;
};

}  // namespace

void CompileGbnf(Grammar& g, std::string_view text, const std::string& what) {
  GbnfParser p(g, text, what);
  p.Parse();
}

}  // namespace deepinfer::structured
