#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <pcre2.h>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_internal {

std::string OnigToPcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (!in_class && n == 's') {
        out += "[^\\S\\x{180E}]";
      } else if (!in_class && n == 'S') {
        out += "[\\S\\x{180E}]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') { out += '^'; ++i; }
      if (i + 1 < p.size() && p[i + 1] == ']') { out += ']'; ++i; }
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

namespace {
pcre2_code* Code(void* p) { return static_cast<pcre2_code*>(p); }
}  // namespace

SplitRegex::SplitRegex(std::string_view onig_pattern, const std::string& source)
    : pattern_(OnigToPcre2(onig_pattern)) {
  int err = 0;
  PCRE2_SIZE erroff = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &erroff, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    Fail(ErrorKind::kCorruptData, "{}: pre-tokenizer regex does not compile with PCRE2 at offset {}: {} (pattern {})",
         source, erroff, reinterpret_cast<const char*>(msg), pattern_);
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::SplitRegex(SplitRegex&& o) noexcept
    : code_(o.code_), pattern_(std::move(o.pattern_)), jit_(o.jit_) {
  o.code_ = nullptr;
}

SplitRegex& SplitRegex::operator=(SplitRegex&& o) noexcept {
  if (this != &o) {
    if (code_) pcre2_code_free(Code(code_));
    code_ = o.code_;
    pattern_ = std::move(o.pattern_);
    jit_ = o.jit_;
    o.code_ = nullptr;
  }
  return *this;
}

SplitRegex::~SplitRegex() {
  if (code_) pcre2_code_free(Code(code_));
}

void SplitRegex::SplitIsolated(std::string_view text, size_t begin, size_t end,
                               std::vector<std::pair<size_t, size_t>>& out) const {
  // The piece is the whole subject (as in HF, which runs the regex on the
  // piece's own string): anchors and lookarounds never see outside it.
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + begin);
  const size_t len = end - begin;
  // One match-data per thread and pattern would save an allocation; the
  // per-call one keeps this simple and thread-safe.
  struct MatchData {
    pcre2_match_data* md;
    ~MatchData() { pcre2_match_data_free(md); }
  } md{pcre2_match_data_create_from_pattern(Code(code_), nullptr)};
  if (md.md == nullptr) Fail(ErrorKind::kResourceExhausted, "PCRE2: out of memory for match data");

  size_t pos = 0, prev = 0;
  while (pos <= len) {
    int rc = -1;
    if (jit_) rc = pcre2_jit_match(Code(code_), subject, len, pos, 0, md.md, nullptr);
    if (!jit_ || rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(Code(code_), subject, len, pos, PCRE2_NO_UTF_CHECK, md.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      Fail(ErrorKind::kInternal, "PCRE2 match failed ({}) for pre-tokenizer pattern {}",
           reinterpret_cast<const char*>(msg), pattern_);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
    const size_t ms = ov[0], me = ov[1];
    if (me == ms) {
      // Empty match: contributes nothing; step one code point.
      if (ms >= len) break;
      pos = ms + utf8::Inspect(std::string_view(text.data() + begin, len), ms).len;
      continue;
    }
    if (ms > prev) out.emplace_back(begin + prev, begin + ms);
    out.emplace_back(begin + ms, begin + me);
    prev = me;
    pos = me;
  }
  if (prev < len) out.emplace_back(begin + prev, end);
}

}  // namespace deepinfer::tokenizer_internal
