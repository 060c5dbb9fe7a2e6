#include "tokenizer/engram_token_map.h"

#include <unordered_map>

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

namespace {

const icu::Normalizer2& Norm(bool nfkc) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = nfkc ? icu::Normalizer2::getNFKCInstance(st) : icu::Normalizer2::getNFDInstance(st);
  if (U_FAILURE(st) || n == nullptr)
    Fail(ErrorKind::kInternal, "ICU: cannot get the {} normalizer ({})", nfkc ? "NFKC" : "NFD", u_errorName(st));
  return *n;
}

bool IsMark(UChar32 c) {
  const int8_t t = u_charType(c);
  return t == U_NON_SPACING_MARK || t == U_COMBINING_SPACING_MARK || t == U_ENCLOSING_MARK;
}

}  // namespace

std::string EngramNormalize(std::string_view text) {
  static const icu::Normalizer2& nfkc = Norm(true);
  static const icu::Normalizer2& nfd = Norm(false);
  UErrorCode st = U_ZERO_ERROR;
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  s = nfkc.normalize(s, st);
  s = nfd.normalize(s, st);
  if (U_FAILURE(st)) Fail(ErrorKind::kInternal, "ICU normalisation failed ({})", u_errorName(st));

  // Drop marks, lowercase code point by code point (full mappings), collapse
  // [ \t\r\n]+ to one space.
  icu::UnicodeString out;
  bool in_ws_run = false;
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    i += U16_LENGTH(c);
    if (IsMark(c)) continue;
    icu::UnicodeString lower;
    if (c < 0x80) {
      lower.append(static_cast<UChar32>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    } else {
      lower.append(c);
      lower.toLower(icu::Locale::getRoot());
    }
    for (int32_t k = 0; k < lower.length();) {
      const UChar32 d = lower.char32At(k);
      k += U16_LENGTH(d);
      const bool ws = d == ' ' || d == '\t' || d == '\r' || d == '\n';
      if (ws) {
        if (!in_ws_run) out.append(static_cast<UChar32>(' '));
        in_ws_run = true;
      } else {
        out.append(d);
        in_ws_run = false;
      }
    }
  }
  if (out.length() == 1 && out.charAt(0) == ' ') return " ";
  // Strip Unicode White_Space at both ends.
  int32_t b = 0, e = out.length();
  while (b < e) {
    const UChar32 c = out.char32At(b);
    if (!u_isUWhiteSpace(c)) break;
    b += U16_LENGTH(c);
  }
  while (e > b) {
    const UChar32 c = out.char32At(e - 1);
    if (!u_isUWhiteSpace(c)) break;
    e -= U16_LENGTH(c);
  }
  std::string r;
  out.tempSubStringBetween(b, e).toUTF8String(r);
  return r;
}

EngramTokenMap BuildEngramTokenMap(const Tokenizer& tok) {
  EngramTokenMap m;
  const int64_t n = tok.size();
  m.ids.resize(n);
  std::unordered_map<std::string, int32_t> keys;
  keys.reserve(static_cast<size_t>(n));
  for (int64_t v = 0; v < n; ++v) {
    const auto id = static_cast<int32_t>(v);
    const std::string text = utf8::DecodeLossy(tok.TokenBytes(id));  // throws on a gap
    std::string key;
    if (text.find(utf8::kReplacement) != std::string::npos) {
      key = tok.IdToToken(id);
    } else {
      key = EngramNormalize(text);
      if (key.empty()) key = text;
    }
    auto [it, inserted] = keys.emplace(std::move(key), static_cast<int32_t>(keys.size()));
    m.ids[v] = it->second;
  }
  m.compressed_vocab_size = static_cast<int64_t>(keys.size());
  return m;
}

EngramTokenMap BuildCheckedEngramTokenMap(const Tokenizer& tok, int64_t expected_compressed_vocab_size,
                                          int64_t vocab_size, const std::string& model_dir) {
  if (tok.size() > vocab_size)
    Fail(ErrorKind::kCorruptData, "{}: tokenizer has {} tokens but config vocab_size is {}", model_dir, tok.size(),
         vocab_size);
  EngramTokenMap m = BuildEngramTokenMap(tok);
  if (m.compressed_vocab_size != expected_compressed_vocab_size)
    Fail(ErrorKind::kCorruptData,
         "{}: Engram compressed vocabulary from tokenizer.json is {} but config engram_compressed_vocab_size is {} "
         "(the hash multipliers depend on it; is this the model's own tokenizer? the DeepSeek-V3 tokenizer alone "
         "gives 98627, with the 465 tiny reserved tokens 99092)",
         model_dir, m.compressed_vocab_size, expected_compressed_vocab_size);
  return m;
}

}  // namespace deepinfer
