// deepinfer/tokenizer/engram_token_map.h — V4.1 Engram compressed token map
// (model-spec §3.3.2; shared/golden/TOKENIZER_CHECK.md).
//
// For every id v in [0, len(tokenizer)):
//   text = the single token decoded (special tokens not skipped), i.e. its
//          decoder bytes decoded as UTF-8 with replacement (Tokenizer::Decode);
//   if text contains U+FFFD: key = the raw token string (Tokenizer::IdToToken);
//   else key = normalise(text), or text itself if that is empty, where
//     normalise = NFKC → NFD → drop every character of general category
//                 Mn, Mc or Me ("strip accents" as HF's StripAccents does, not
//                 only Mn) → lowercase (full case mapping, code point by code
//                 point, as Rust's char::to_lowercase in HF's Lowercase) →
//                 every run of [ \t\r\n] becomes one space → a text that is
//                 exactly " " stays " " (the reference's sentinel) → strip
//                 Unicode White_Space at both ends.
//   map[v] = index of key in first-seen order.
// The compressed vocabulary size is the number of distinct keys. Unicode
// normalisation and properties come from ICU (Debian's libicu).
//
// Values: the DeepSeek-V3 tokenizer alone gives 98,627; with the tiny model's
// 465 reserved tokens (len 129,280) 99,092, which is the release's
// engram_compressed_vocab_size; the map is then byte-identical to
// shared/golden/vectors/tiny-v41/engram_token_map.i32.
//
// Engram hashing (the forward pass) uses map[id] for every input id and pads
// with map[engram_pad_token_id]. The multipliers depend on the compressed size,
// so a mismatch with the config is an error, never a silent fallback.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct EngramTokenMap {
  std::vector<int32_t> ids;             // size len(tokenizer): compressed id of each token id
  int64_t compressed_vocab_size = 0;    // number of distinct keys (max(ids) + 1)
};

// The normalisation above, on UTF-8 text (exposed for tests).
std::string EngramNormalize(std::string_view text);

// Builds the map (about a second for 129k tokens). Throws Error(kOutOfRange)
// if the tokenizer has gaps in its ids.
EngramTokenMap BuildEngramTokenMap(const Tokenizer& tok);

// Builds the map and checks it against the model config: the compressed size
// must equal `expected_compressed_vocab_size` (config engram_compressed_vocab_size)
// and len(tokenizer) must not exceed `vocab_size`. Throws Error(kCorruptData)
// naming `model_dir`, expected and found otherwise.
EngramTokenMap BuildCheckedEngramTokenMap(const Tokenizer& tok, int64_t expected_compressed_vocab_size,
                                          int64_t vocab_size, const std::string& model_dir);

}  // namespace deepinfer
