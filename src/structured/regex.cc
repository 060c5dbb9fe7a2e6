#include "structured/regex.h"

#include <fmt/format.h>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::structured {

namespace {

const CodepointRanges kDigit = {{'0', '9'}};
const CodepointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodepointRanges kSpace = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const CodepointRanges kDot = {{0, 0x09}, {0x0B, 0x0C}, {0x0E, 0x2027}, {0x202A, 0x10FFFF}};

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view pattern, const CodepointRanges* allowed, const std::string& what)
      : g_(g), allowed_(allowed), what_(what) {
    // Decode the pattern into code points (it must be valid UTF-8).
    for (size_t i = 0; i < pattern.size();) {
      const utf8::Seq s = utf8::Inspect(pattern, i);
      if (s.kind != utf8::SeqKind::kValid) Bad(i, "invalid UTF-8");
      cps_.push_back(static_cast<uint32_t>(s.cp));
      offsets_.push_back(i);
      i += s.len;
    }
    offsets_.push_back(pattern.size());
  }

  Element Parse(RegexMode mode) {
    bool anchored_start = false, anchored_end = false;
    size_t end = cps_.size();
    if (!cps_.empty() && cps_[0] == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    if (end > pos_ && cps_[end - 1] == '$' && !(end >= 2 && cps_[end - 2] == '\\' && !EscapedBackslash(end - 2))) {
      anchored_end = true;
      --end;
    }
    end_ = end;
    Seq body = ParseAlt();
    if (pos_ != end_) Bad(offsets_[pos_], cps_[pos_] == ')' ? "unmatched ')'" : "unexpected character");
    if (mode == RegexMode::kSearch) {
      const Element any = g_.Repeat({Char(kDot)}, 0, -1, "any");
      Seq s;
      if (!anchored_start) s.push_back(any);
      s.insert(s.end(), body.begin(), body.end());
      if (!anchored_end) s.push_back(any);
      body = s;
    }
    return g_.Choice({body}, "regex");
  }

 private:
  // True if the backslash at index i is itself escaped (preceded by an odd run of backslashes).
  bool EscapedBackslash(size_t i) const {
    size_t n = 0;
    while (i > n && cps_[i - 1 - n] == '\\') ++n;
    return n % 2 == 1;
  }
  [[noreturn]] void Bad(size_t byte_offset, const std::string& msg) const {
    Fail(ErrorKind::kInvalidArgument, "{}: invalid or unsupported regular expression at offset {}: {}", what_,
         byte_offset, msg);
  }
  [[noreturn]] void BadHere(const std::string& msg) const { Bad(offsets_[std::min(pos_, cps_.size())], msg); }
  bool AtEnd() const { return pos_ >= end_; }
  uint32_t Peek() const { return cps_[pos_]; }

  Element Char(const CodepointRanges& set) {
    CodepointRanges s = NormalizeRanges(set);
    if (allowed_) s = IntersectRanges(s, *allowed_);
    return g_.Utf8Set(s);
  }

  Seq ParseAlt() {
    std::vector<Seq> alts{ParseConcat()};
    while (!AtEnd() && Peek() == '|') {
      ++pos_;
      alts.push_back(ParseConcat());
    }
    if (alts.size() == 1) return alts[0];
    return {g_.Choice(alts, "alt")};
  }

  Seq ParseConcat() {
    Seq s;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      Seq atom = ParseAtom();
      atom = ParseQuantifiers(atom);
      s.insert(s.end(), atom.begin(), atom.end());
    }
    return s;
  }

  bool ParseInt(int64_t* v) {
    if (AtEnd() || Peek() < '0' || Peek() > '9') return false;
    int64_t x = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      x = x * 10 + (Peek() - '0');
      if (x > 100000) BadHere("repetition count above 100000");
      ++pos_;
    }
    *v = x;
    return true;
  }

  Seq ParseQuantifiers(Seq atom) {
    while (!AtEnd()) {
      const uint32_t c = Peek();
      int64_t lo = 0, hi = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        lo = 1;
        ++pos_;
      } else if (c == '?') {
        hi = 1;
        ++pos_;
      } else if (c == '{') {
        const size_t save = pos_;
        ++pos_;
        if (!ParseInt(&lo)) {  // ECMAScript: a '{' that is not a quantifier is a literal (Annex B)
          pos_ = save;
          return atom;
        }
        hi = lo;
        if (!AtEnd() && Peek() == ',') {
          ++pos_;
          if (!ParseInt(&hi)) hi = -1;
        }
        if (AtEnd() || Peek() != '}') BadHere("unterminated {n,m} quantifier");
        ++pos_;
        if (hi >= 0 && hi < lo) BadHere(fmt::format("quantifier {{{},{}}}: maximum below minimum", lo, hi));
      } else {
        return atom;
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: same language
      else if (!AtEnd() && Peek() == '+') BadHere("possessive quantifiers are not supported");
      atom = {g_.Repeat(atom, lo, hi, "rep")};
    }
    return atom;
  }

  uint32_t HexDigits(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (AtEnd()) BadHere("truncated hex escape");
      const uint32_t c = Peek();
      int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10) : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
      if (d < 0) BadHere("bad hex digit in escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash: fills *set (a class escape) or returns the literal code point.
  bool ParseEscape(CodepointRanges* set, uint32_t* cp, bool in_class) {
    if (AtEnd()) BadHere("trailing backslash");
    const uint32_t c = Peek();
    const size_t at = offsets_[pos_ - 1];  // the backslash
    auto BadHere = [&](const std::string& msg) { Bad(at, msg); };
    ++pos_;
    switch (c) {
      case 'd': *set = kDigit; return true;
      case 'D': *set = ComplementRanges(kDigit); return true;
      case 'w': *set = kWord; return true;
      case 'W': *set = ComplementRanges(NormalizeRanges(kWord)); return true;
      case 's': *set = kSpace; return true;
      case 'S': *set = ComplementRanges(NormalizeRanges(kSpace)); return true;
      case 'n': *cp = '\n'; return false;
      case 'r': *cp = '\r'; return false;
      case 't': *cp = '\t'; return false;
      case 'f': *cp = '\f'; return false;
      case 'v': *cp = '\v'; return false;
      case '0': *cp = 0; return false;
      case 'x': *cp = HexDigits(2); return false;
      case 'u':
        if (!AtEnd() && Peek() == '{') {
          ++pos_;
          uint32_t v = 0;
          int n = 0;
          while (!AtEnd() && Peek() != '}') {
            v = v * 16 + HexDigits(1);
            if (++n > 6 || v > 0x10FFFF) BadHere("\\u{...} escape out of range");
          }
          if (AtEnd()) BadHere("unterminated \\u{...}");
          ++pos_;
          *cp = v;
        } else {
          *cp = HexDigits(4);
        }
        return false;
      case 'b':
        if (in_class) {
          *cp = '\b';
          return false;
        }
        BadHere("word boundaries (\\b) are not supported");
        [[fallthrough]];  // not reached: BadHere throws (g++ 12 still warns without this)
      case 'B':
        BadHere("\\B is not supported");
        [[fallthrough]];  // not reached
      case 'p':
      case 'P':
        BadHere("Unicode property classes (\\p{...}) are not supported");
        [[fallthrough]];  // not reached
      case 'k':
        BadHere("named backreferences are not supported");
        [[fallthrough]];  // not reached
      default:
        if (c >= '1' && c <= '9') BadHere("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) BadHere(fmt::format("unknown escape \\{}", char(c)));
        *cp = c;  // escaped punctuation / any other character
        return false;
    }
  }

  Seq ParseClass() {
    // after '['
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodepointRanges set;
    bool first = true;
    while (true) {
      if (AtEnd()) BadHere("unterminated character class");
      uint32_t c = Peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      if (c == ']' && first) {  // ECMAScript: [] is the empty class, []...] is not a literal
        ++pos_;
        break;
      }
      first = false;
      uint32_t lo;
      ++pos_;
      if (c == '[' && !AtEnd() && Peek() == ':') BadHere("POSIX classes ([:alpha:]) are not supported");
      if (c == '\\') {
        CodepointRanges esc;
        if (ParseEscape(&esc, &lo, true)) {
          set.insert(set.end(), esc.begin(), esc.end());
          continue;
        }
      } else {
        lo = c;
      }
      if (pos_ + 1 < end_ && Peek() == '-' && cps_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        const uint32_t d = Peek();
        ++pos_;
        if (d == '\\') {
          CodepointRanges esc;
          if (ParseEscape(&esc, &hi, true)) BadHere("a class escape cannot end a range");
        } else {
          hi = d;
        }
        if (hi < lo) BadHere("character class range out of order");
        set.emplace_back(lo, hi);
      } else {
        set.emplace_back(lo, lo);
      }
    }
    set = NormalizeRanges(set);
    if (negate) set = ComplementRanges(set);
    return {Char(set)};
  }

  Seq ParseAtom() {
    const uint32_t c = Peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (!AtEnd() && Peek() == '?') {
          ++pos_;
          if (!AtEnd() && Peek() == ':') {
            ++pos_;
          } else if (!AtEnd() && Peek() == '<' && pos_ + 1 < end_ && cps_[pos_ + 1] != '=' && cps_[pos_ + 1] != '!') {
            while (!AtEnd() && Peek() != '>') ++pos_;
            if (AtEnd()) BadHere("unterminated group name");
            ++pos_;
          } else if (!AtEnd() && Peek() == 'P' && pos_ + 1 < end_ && cps_[pos_ + 1] == '<') {
            while (!AtEnd() && Peek() != '>') ++pos_;
            if (AtEnd()) BadHere("unterminated group name");
            ++pos_;
          } else {
            BadHere("lookaround and inline flags ((?=, (?!, (?<=, (?i) ...) are not supported");
          }
        }
        Seq inner = ParseAlt();
        if (AtEnd() || Peek() != ')') BadHere("missing ')'");
        ++pos_;
        return {g_.Choice({inner}, "group")};
      }
      case '[': return ParseClass();
      case '.': return {Char(kDot)};
      case '\\': {
        CodepointRanges set;
        uint32_t cp;
        if (ParseEscape(&set, &cp, false)) return {Char(set)};
        return Literal(cp);
      }
      case '^':
      case '$': --pos_; BadHere("anchors are only supported at the start (^) and end ($) of the pattern");
      case '*':
      case '+':
      case '?': --pos_; BadHere("quantifier without anything to repeat");
      case ')': --pos_; BadHere("unmatched ')'");
      default: return Literal(c);
    }
  }

  Seq Literal(uint32_t cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) BadHere("surrogate code points are not characters");
    if (allowed_) return {Char({{cp, cp}})};
    std::string b;
    AppendUtf8(cp, &b);
    return g_.Literal(b);
  }

  Grammar& g_;
  const CodepointRanges* allowed_;
  const std::string& what_;
  std::vector<uint32_t> cps_;
  std::vector<size_t> offsets_;
  size_t pos_ = 0, end_ = 0;
};

}  // namespace

Element CompileRegex(Grammar& g, std::string_view pattern, RegexMode mode, const CodepointRanges* allowed,
                     const std::string& what) {
  RegexParser p(g, pattern, allowed, what);
  return p.Parse(mode);
}

}  // namespace deepinfer::structured
