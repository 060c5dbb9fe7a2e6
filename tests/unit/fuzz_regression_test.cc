// Runs every libFuzzer target's entry point (fuzz/*_fuzz.cc, compiled here as
// ordinary functions) on the committed corpus fuzz/corpus/<target>/: the seeds
// and every input that once crashed a target. A crash, a sanitizer report in
// the sanitizer build, or an exception escaping the target fails the test.
// The fuzzing itself is scripts/fuzz.sh (clang, libFuzzer).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#define DEEPINFER_FUZZ_NO_INIT
#define LLVMFuzzerTestOneInput FuzzHttpRequest
#include "../../fuzz/http_request_fuzz.cc"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput FuzzRequestSchema
#include "../../fuzz/request_schema_fuzz.cc"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput FuzzChatRender
#include "../../fuzz/chat_render_fuzz.cc"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput FuzzTokenizer
#include "../../fuzz/tokenizer_fuzz.cc"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput FuzzSafetensorsHeader
#include "../../fuzz/safetensors_header_fuzz.cc"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput FuzzConfigJson
#include "../../fuzz/config_json_fuzz.cc"
#undef LLVMFuzzerTestOneInput

namespace {

using Target = int (*)(const uint8_t*, size_t);

// Runs `fn` on every file of fuzz/corpus/<name>/; returns how many.
int RunCorpus(const std::string& name, Target fn) {
  const std::filesystem::path dir = std::filesystem::path(DEEPINFER_SOURCE_DIR) / "fuzz" / "corpus" / name;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ++n;
  }
  return n;
}

TEST(FuzzRegression, HttpRequest) { EXPECT_GE(RunCorpus("http_request", FuzzHttpRequest), 5); }
TEST(FuzzRegression, RequestSchema) { EXPECT_GE(RunCorpus("request_schema", FuzzRequestSchema), 5); }
TEST(FuzzRegression, ChatRender) { EXPECT_GE(RunCorpus("chat_render", FuzzChatRender), 3); }
TEST(FuzzRegression, Tokenizer) { EXPECT_GE(RunCorpus("tokenizer", FuzzTokenizer), 3); }
TEST(FuzzRegression, SafetensorsHeader) { EXPECT_GE(RunCorpus("safetensors_header", FuzzSafetensorsHeader), 1); }
TEST(FuzzRegression, ConfigJson) { EXPECT_GE(RunCorpus("config_json", FuzzConfigJson), 1); }

}  // namespace
