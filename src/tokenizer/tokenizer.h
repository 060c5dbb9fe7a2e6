// deepinfer/tokenizer/tokenizer.h — DeepSeek's byte-level BPE tokenizer, loaded
// from a Hugging Face model directory (tokenizer.json + tokenizer_config.json).
//
// Pipeline (what Hugging Face `tokenizers` does for DeepSeek-V3/V4 files):
//   1. Added tokens (special or not) are matched first, leftmost-longest, on
//      the raw text; they become their ids directly. (HF matches non-normalized
//      tokens, normalizes, then matches normalized ones; with DeepSeek's empty
//      normalizer that is one pass. lstrip/rstrip are honoured, single_word is
//      rejected at load.)
//   2. Every other section goes through the pre-tokenizer: a Sequence of Split
//      regexes (behavior Isolated) and a final ByteLevel (no prefix space, no
//      regex). The regexes run on PCRE2 (UTF + UCP, JIT). They are written in
//      Oniguruma syntax, whose `\s` is Unicode White_Space; PCRE2's UCP `\s`
//      also matches U+180E, so `\s`/`\S` outside a character class are
//      rewritten to exclude it (see regex_split.h). DeepSeek-V3's pre-tokenizer:
//        \p{N}{1,3}
//        [一-龥぀-ゟ゠-ヿ]+
//        [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//          ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   3. BPE on the raw bytes of each piece: repeatedly merge the adjacent pair
//      with the lowest merge rank, leftmost first (HF `Word::merge_all`).
//   4. Special tokens from the post-processor: LlamaTokenizerFast's
//      add_bos_token / add_eos_token from tokenizer_config.json when present
//      (transformers rebuilds the post-processor from them), otherwise a
//      TemplateProcessing post-processor's "single" template.
//
// Decoding is HF's ByteLevel decoder: each token's characters map back to
// bytes (a token with a character outside the byte alphabet, e.g. an added
// token like <｜User｜>, contributes its raw UTF-8), the bytes are concatenated
// and decoded lossily (utf8.h).
//
// Thread safety: a loaded Tokenizer is immutable; Encode/Decode may be called
// from any number of threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;     // skipped by Decode(skip_special_tokens=true)
  bool lstrip = false;      // swallows whitespace on its left
  bool rstrip = false;      // swallows whitespace on its right
  bool normalized = false;  // irrelevant with DeepSeek's empty normalizer
};

class Tokenizer {
 public:
  // Loads MODEL_DIR/tokenizer.json and (if present) MODEL_DIR/tokenizer_config.json.
  // Throws Error(kNotFound) if tokenizer.json is missing, Error(kCorruptData)
  // naming the file and field for malformed or unsupported contents (e.g. a
  // normalizer other than an empty Sequence, a pre-tokenizer step we do not
  // implement, byte_fallback, a merge whose result is not in the vocab).
  static Tokenizer Load(const std::filesystem::path& model_dir);
  // Same from explicit paths; `tokenizer_config_json` may be empty (no config).
  static Tokenizer FromFiles(const std::filesystem::path& tokenizer_json,
                             const std::filesystem::path& tokenizer_config_json);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text → ids. `text` must be valid UTF-8 (Error kInvalidArgument naming the
  // byte offset otherwise). add_special_tokens adds BOS/EOS per the
  // post-processor (for DeepSeek: one BOS at the front).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = true) const;
  // Appends the ids of `text` (no special tokens added) to `out`.
  void EncodeAppend(std::string_view text, std::vector<int32_t>& out) const;
  // The same, except that no added token (special or not) is matched where
  // it would overlap one of the byte ranges `plain` ([begin, end) into
  // `text`, sorted, not overlapping): text there only ever becomes BPE
  // tokens, as with HF's split_special_tokens for every added token. The chat
  // renderer passes the messages' content this way, so a user typing
  // "<｜Assistant｜>" gets the characters, not the role marker. Ids are
  // unchanged wherever no such match was refused.
  void EncodeAppend(std::string_view text, std::vector<int32_t>& out,
                    std::span<const std::pair<size_t, size_t>> plain) const;

  // Ids → text (lossy UTF-8 as HF). Throws Error(kOutOfRange) for an id
  // outside [0, size()) or an id with no token (a gap in the vocabulary).
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes a token contributes to decoded text (before lossy UTF-8 decoding).
  std::string_view TokenBytes(int32_t id) const;
  // The token's string as stored in tokenizer.json (byte-level alphabet for
  // BPE tokens, the content for added tokens). Throws kOutOfRange.
  const std::string& IdToToken(int32_t id) const;
  // Inverse of IdToToken; std::nullopt if unknown.
  std::optional<int32_t> TokenToId(std::string_view token) const;

  bool IsAdded(int32_t id) const;
  bool IsSpecial(int32_t id) const;  // an added token with "special": true
  const std::vector<AddedToken>& added_tokens() const;

  // len(tokenizer) in transformers' sense: max id + 1 over vocab and added tokens.
  int64_t size() const;
  int64_t vocab_size_without_added() const;  // BPE vocabulary entries

  // -1 when not configured.
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  // Ids prepended / appended by Encode(text, add_special_tokens=true).
  const std::vector<int32_t>& prefix_special_ids() const;
  const std::vector<int32_t>& suffix_special_ids() const;

  // Where the files came from (for error messages).
  const std::string& source() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer
