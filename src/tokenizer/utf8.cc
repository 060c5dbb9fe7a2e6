#include "tokenizer/utf8.h"

namespace deepinfer::utf8 {

Seq Inspect(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {SeqKind::kValid, 1, b0};
  int need;            // continuation bytes after the lead
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the FIRST continuation byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1; cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2; cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3; cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {SeqKind::kInvalid, 1, 0};  // 80..C1, F5..FF
  }
  size_t len = 1;
  for (int k = 0; k < need; ++k) {
    if (i + len >= s.size()) return {SeqKind::kIncomplete, len, 0};
    const auto b = static_cast<unsigned char>(s[i + len]);
    const unsigned l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
    if (b < l || b > h) return {SeqKind::kInvalid, len, 0};
    cp = (cp << 6) | (b & 0x3F);
    ++len;
  }
  return {SeqKind::kValid, len, cp};
}

size_t FirstInvalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Fast path over ASCII.
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    const Seq q = Inspect(s, i);
    if (q.kind != SeqKind::kValid) return i;
    i += q.len;
  }
  return std::string_view::npos;
}

std::string DecodeLossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) { out.push_back(bytes[i++]); continue; }
    const Seq q = Inspect(bytes, i);
    if (q.kind == SeqKind::kValid) out.append(bytes.substr(i, q.len));
    else out.append(kReplacement);
    i += q.len;
  }
  return out;
}

void Append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace deepinfer::utf8
