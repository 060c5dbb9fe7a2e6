// Shared by the libFuzzer targets that need a tokenizer and the served-model
// facts: the DeepSeek-V3 tokenizer files installed by scripts/setup.sh (npm),
// loaded once.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "server/openai_api.h"
#include "tokenizer/tiny_tokenizer_files.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::fuzzing {

inline const Tokenizer& SharedTokenizer() {
  static const Tokenizer* tok = [] {
    try {
      return new Tokenizer(Tokenizer::Load(DefaultNpmTokenizerDir()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz: cannot load the tokenizer (run scripts/setup.sh): %s\n", e.what());
      std::abort();
    }
  }();
  return *tok;
}

inline const server::ModelInfo& SharedInfo() {
  static const server::ModelInfo* info = [] {
    auto* m = new server::ModelInfo();
    m->served_model_names = {"tiny"};
    m->tokenizer = &SharedTokenizer();
    m->model_type = "deepseek_v41";
    m->max_model_len = 4096;
    m->max_logprobs = 20;
    m->vocab_size = SharedTokenizer().size();
    m->max_token_bytes = 128;
    return m;
  }();
  return *info;
}

}  // namespace deepinfer::fuzzing

#ifndef DEEPINFER_FUZZ_NO_INIT
// libFuzzer: load the tokenizer before the first input (not inside its timeout).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  deepinfer::fuzzing::SharedInfo();
  return 0;
}
#endif
