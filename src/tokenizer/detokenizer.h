// deepinfer/tokenizer/detokenizer.h — streaming (incremental) detokenizer.
//
// Emits text as tokens arrive. It never emits invalid UTF-8: the bytes of a
// character split across tokens are held back until the character is complete
// (or proven broken). The emitted pieces concatenate to exactly what
// Tokenizer::Decode gives for all the ids at once, replacement characters
// included:
//
//   detok.Push(id) for each id, then detok.Flush()
//     ⇒ concatenation == tok.Decode(ids, skip_special_tokens)
//
// Why that holds: Decode is "concatenate the token bytes, then decode lossily"
// (utf8.h). Lossy decoding is prefix-stable except for a trailing valid prefix
// of a multi-byte sequence, which later bytes may complete or break; that tail
// (at most 3 bytes) is exactly what is held back.
//
// Prompts. A generated continuation may start in the middle of a character
// whose first bytes are the prompt's last tokens (byte-level BPE splits rare
// characters across tokens). Prime(prompt_ids) consumes the prompt silently and
// keeps such a partial character pending, so the first generated tokens
// complete it and the stream emits the whole character:
//
//   primed = detok.Prime(prompt);  emitted = Push(g1) + ... + Flush()
//     ⇒ primed + emitted == tok.Decode(prompt ++ generated)
//
// Not thread-safe (one per request); the Tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens = false)
      : tok_(&tok), skip_special_(skip_special_tokens) {}

  // Consumes prompt ids without emitting them; returns the prompt's text that
  // is final (everything but a trailing partial character, which stays pending).
  std::string Prime(std::span<const int32_t> prompt_ids);

  // Adds one token; returns the text that became final (possibly empty).
  // Throws Error(kOutOfRange) for an unknown id (nothing is consumed then).
  std::string Push(int32_t id);
  // Adds several tokens; returns the text that became final.
  std::string Push(std::span<const int32_t> ids);

  // End of stream: returns the pending bytes decoded lossily (a truncated
  // character becomes U+FFFD) and resets the pending state.
  std::string Flush();

  // Bytes held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  // Appends bytes to pending_ and moves the final part to `out`.
  void Feed(std::string_view bytes, std::string& out);

  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace deepinfer
