// Engram compressed token map (model-spec §3.3.2) on the real DeepSeek-V3
// tokenizer, and on the tiny model's tokenizer (V3 + 465 reserved tokens),
// whose map must be byte-identical to the golden engram_token_map.i32
// (copied from shared/golden/vectors/tiny-v41, sha256 c60a8632…6481).
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include <gtest/gtest.h>

#include "base/error.h"
#include "model/config.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tiny_tokenizer_files.h"
#include "tokenizer_testing.h"

namespace deepinfer {
namespace {

std::vector<int32_t> GoldenMap() {
  const std::string raw =
      testing::ReadAll(std::string(DEEPINFER_TEST_DATA) + "/tokenizer/engram_token_map_tiny_v41.i32");
  EXPECT_EQ(raw.size(), 129280u * 4);
  std::vector<int32_t> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), raw.size());  // little-endian host (x86-64)
  return v;
}

std::filesystem::path TinyTokenizerDir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("deepinfer_tiny_tok_" + std::to_string(::getpid()));
    WriteTinyTokenizerFiles(testing::NpmTokenizerDir(), d, 129280);
    static const std::filesystem::path to_remove = d;
    std::atexit([] { std::error_code ec; std::filesystem::remove_all(to_remove, ec); });
    return d;
  }();
  return dir;
}

TEST(EngramNormalize, Rules) {
  EXPECT_EQ(EngramNormalize("Hello"), "hello");
  EXPECT_EQ(EngramNormalize(" "), " ");      // sentinel: a lone space survives the strip
  EXPECT_EQ(EngramNormalize("  \t"), " ");   // collapses to " " first
  EXPECT_EQ(EngramNormalize("\tA\n"), "a");
  EXPECT_EQ(EngramNormalize(" Word "), "word");
  EXPECT_EQ(EngramNormalize("Ångström"), "angstrom");
  EXPECT_EQ(EngramNormalize("ﬁ"), "fi");              // NFKC
  EXPECT_EQ(EngramNormalize("ＡＢＣ"), "abc");          // fullwidth
  EXPECT_EQ(EngramNormalize("\u0986\u09BE"), "\u0986");  // U+09BE is Mc: stripped too
  EXPECT_EQ(EngramNormalize("\u0130"), "i");            // İ → I + U+0307 → I → i
  EXPECT_EQ(EngramNormalize("\u00a0x\u3000"), "x");     // White_Space strip
  EXPECT_EQ(EngramNormalize("\u0301"), "");             // only a mark: empty (caller keeps the text)
}

TEST(EngramTokenMap, V3TokenizerAloneGives98627) {
  const Tokenizer& tok = testing::V3Tokenizer();
  const EngramTokenMap m = BuildEngramTokenMap(tok);
  EXPECT_EQ(tok.size(), 128815);
  EXPECT_EQ(m.compressed_vocab_size, 98627);
  const auto golden = GoldenMap();
  ASSERT_EQ(m.ids.size(), 128815u);
  // For ids < 128815 the tiny map equals the V3 map.
  EXPECT_TRUE(std::equal(m.ids.begin(), m.ids.end(), golden.begin()));
}

TEST(EngramTokenMap, TinyTokenizerMapIsByteIdenticalToGolden) {
  const Tokenizer tok = Tokenizer::Load(TinyTokenizerDir());
  ASSERT_EQ(tok.size(), 129280);
  EXPECT_EQ(tok.TokenToId("<｜tiny▁reserved▁0｜>"), 128815);
  EXPECT_EQ(tok.TokenToId("<｜tiny▁reserved▁464｜>"), 129279);
  EXPECT_TRUE(tok.IsSpecial(129279));
  const EngramTokenMap m = BuildCheckedEngramTokenMap(tok, 99092, 129280, "tiny");
  EXPECT_EQ(m.compressed_vocab_size, 99092);
  const auto golden = GoldenMap();
  ASSERT_EQ(m.ids.size(), golden.size());
  EXPECT_EQ(std::memcmp(m.ids.data(), golden.data(), golden.size() * 4), 0);
  EXPECT_EQ(m.ids[2], golden[2]);  // the Engram pad id's entry
  EXPECT_EQ(m.ids[128815], 98627);
  EXPECT_EQ(m.ids[129279], 99091);
}

// The model directory written by `deepinfer make-tiny` (the ctest fixture
// passes it as DEEPINFER_TINY_DIR): its tokenizer and config, loaded the way
// the engine loads them, give the golden map.
TEST(EngramTokenMap, MakeTinyModelDirectoryYieldsGoldenMap) {
  const char* dir = std::getenv("DEEPINFER_TINY_DIR");
  if (dir == nullptr) GTEST_SKIP() << "DEEPINFER_TINY_DIR not set (run through ctest)";
  const ModelConfig cfg = ModelConfig::Load(dir);
  const Tokenizer tok = Tokenizer::Load(dir);
  EXPECT_EQ(tok.size(), cfg.vocab_size);
  const EngramTokenMap m = BuildCheckedEngramTokenMap(tok, cfg.engram_compressed_vocab_size, cfg.vocab_size, dir);
  EXPECT_EQ(m.compressed_vocab_size, 99092);
  const auto golden = GoldenMap();
  ASSERT_EQ(m.ids.size(), golden.size());
  EXPECT_EQ(std::memcmp(m.ids.data(), golden.data(), golden.size() * 4), 0);
}

TEST(EngramTokenMap, SizeMismatchWithConfigIsAnError) {
  const Tokenizer& tok = testing::V3Tokenizer();
  try {
    BuildCheckedEngramTokenMap(tok, 99092, 129280, "/models/x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorruptData);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("/models/x"), std::string::npos) << msg;
    EXPECT_NE(msg.find("98627"), std::string::npos) << msg;
    EXPECT_NE(msg.find("99092"), std::string::npos) << msg;
  }
  EXPECT_THROW(BuildCheckedEngramTokenMap(tok, 98627, 1000, "/models/x"), Error);  // more tokens than vocab_size
}

TEST(TinyTokenizerFiles, MissingSourceIsAClearError) {
  try {
    WriteTinyTokenizerFiles("/nonexistent/dir", std::filesystem::temp_directory_path() / "never_written");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/tokenizer.json"), std::string::npos);
  }
}

TEST(TinyTokenizerFiles, ExtendsOnlyAddedTokensAndCopiesTheConfig) {
  const Tokenizer tiny = Tokenizer::Load(TinyTokenizerDir());
  const Tokenizer& v3 = testing::V3Tokenizer();
  EXPECT_EQ(tiny.bos_id(), 0);
  EXPECT_EQ(tiny.eos_id(), 1);
  for (const char* s : {"Hello world", "<｜User｜>hi<｜Assistant｜>", "数字 12345"})
    EXPECT_EQ(tiny.Encode(s), v3.Encode(s)) << s;
  EXPECT_EQ(tiny.Encode("a<｜tiny▁reserved▁7｜>b", false),
            (std::vector<int32_t>{v3.Encode("a", false)[0], 128822, v3.Encode("b", false)[0]}));
  EXPECT_EQ(testing::ReadAll(TinyTokenizerDir() / "tokenizer_config.json"),
            testing::ReadAll(testing::NpmTokenizerDir() / "tokenizer_config.json"));
}

}  // namespace
}  // namespace deepinfer
