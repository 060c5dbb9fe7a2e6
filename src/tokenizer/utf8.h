// deepinfer/tokenizer/utf8.h — small UTF-8 helpers shared by the tokenizer,
// the streaming detokenizer and the CLI.
//
// Lossy decoding follows the "substitution of maximal subparts" rule that Rust's
// String::from_utf8_lossy, the WHATWG TextDecoder and Python's
// bytes.decode("utf-8", errors="replace") all use: each maximal prefix of a
// valid sequence that cannot be completed becomes ONE U+FFFD, and decoding
// resumes at the byte that broke it. Hugging Face tokenizers decode byte-level
// tokens exactly this way, so Decode() and the Engram token map do too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Result of looking at the sequence that starts at s[i].
enum class SeqKind {
  kValid,       // a complete, valid sequence of `len` bytes
  kInvalid,     // a maximal subpart of `len` bytes (>= 1) that can never be completed
  kIncomplete,  // the `len` bytes up to the end of input are a valid prefix of a sequence
};
struct Seq {
  SeqKind kind;
  size_t len;
  char32_t cp;  // the code point when kind == kValid
};

// Classifies the sequence starting at s[i] (i < s.size()).
Seq Inspect(std::string_view s, size_t i);

// Byte offset of the first byte that makes `s` invalid UTF-8 (an invalid or
// truncated sequence), or std::string_view::npos if `s` is valid.
size_t FirstInvalid(std::string_view s);

// Lossy decode: valid sequences copied, each maximal invalid subpart (and a
// truncated sequence at the end) replaced by U+FFFD.
std::string DecodeLossy(std::string_view bytes);

// Appends the UTF-8 encoding of cp (cp must be a Unicode scalar value).
void Append(std::string& out, char32_t cp);

}  // namespace deepinfer::utf8
