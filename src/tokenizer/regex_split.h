// deepinfer/tokenizer/regex_split.h — the pre-tokenizer's Split regexes on PCRE2.
//
// Hugging Face tokenizers compiles Split patterns with Oniguruma (Ruby syntax,
// Unicode tables). We compile them with PCRE2 (PCRE2_UTF | PCRE2_UCP, JIT) after
// one rewrite: Oniguruma's `\s` is the Unicode White_Space property, while
// PCRE2's UCP `\s` (\p{Z} ∪ \h ∪ \v) also contains U+180E MONGOLIAN VOWEL
// SEPARATOR (no longer White_Space since Unicode 6.3). Outside a character
// class `\s` becomes `[^\S\x{180E}]` and `\S` becomes `[\S\x{180E}]`; inside a
// class they are left as they are (DeepSeek's patterns have none there).
// Everything else (\p{L}, \p{N}, \p{M}, \p{P}, \p{S}, lookahead, literal
// UTF-8 ranges) has the same meaning in both engines.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::tokenizer_internal {

// Rewrites an Oniguruma pattern into the PCRE2 pattern described above.
std::string OnigToPcre2(std::string_view pattern);

class SplitRegex {
 public:
  // Compiles `onig_pattern`; throws Error(kCorruptData) naming `source` with
  // PCRE2's message and offset if it does not compile.
  SplitRegex(std::string_view onig_pattern, const std::string& source);
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;
  ~SplitRegex();

  // Splits text[begin, end) with HF "Isolated" behaviour: the gaps between
  // matches and the matches themselves, in order, empty pieces dropped. Pieces
  // are appended to `out` as [begin, end) offsets into `text`. `text` must be
  // valid UTF-8 (not re-checked). Thread-safe.
  void SplitIsolated(std::string_view text, size_t begin, size_t end,
                     std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string pattern_;   // as compiled (after OnigToPcre2)
  bool jit_ = false;
};

}  // namespace deepinfer::tokenizer_internal
