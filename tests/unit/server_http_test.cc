// The server's HTTP layer under hostile and careless clients, in-process over
// the fake backend: disconnects abort requests (streaming or not) and free
// their blocks; slow and stalled connections neither hold threads nor delay
// other requests and are closed at their timeouts; the connection limit; size
// limits on Content-Length and chunked bodies; keep-alive, pipelining and
// "Expect: 100-continue".
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "server_testing.h"

namespace deepinfer::server {
namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `done(bytes)` holds, the peer closes, or `timeout_ms` passes.
// *closed says whether the peer closed (EOF or reset).
template <typename Done>
std::string RecvUntil(int fd, int timeout_ms, Done done, bool* closed = nullptr) {
  std::string got;
  const auto end = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  if (closed) *closed = false;
  char buf[8192];
  while (!done(got)) {
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now()).count());
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// A whole response with a Content-Length body is in `s`.
bool HasWholeResponse(const std::string& s) {
  const size_t h = s.find("\r\n\r\n");
  if (h == std::string::npos) return false;
  std::string head = s.substr(0, h);
  std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
  const size_t cl = head.find("content-length: ");
  if (cl == std::string::npos) return true;
  const size_t len = std::stoul(head.substr(cl + 16));
  return s.size() >= h + 4 + len;
}

std::string Request(const std::string& method, const std::string& path, const std::string& body,
                    const std::string& extra_headers = "") {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Polls `pred` every 5 ms for up to `seconds`; returns whether it became true.
template <typename P>
bool WaitFor(double seconds, P pred) {
  const auto end = SteadyClock::now() + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// ---------------------------------------------------------------------------

// A plain (non-streaming) request whose client goes away is aborted, and its
// blocks are back within a second — for both generation endpoints.
TEST(HttpHardening, NonStreamingDisconnectAbortsAndFreesBlocks) {
  ServerFixture f({}, SlowFake(5));  // 5 ms a step: 480 tokens would take > 2 s
  ASSERT_TRUE(f.WaitReady());
  const char* bodies[2][2] = {
      {"/v1/completions", R"({"prompt":"Once upon a time","max_tokens":480,"ignore_eos":true})"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":480,"ignore_eos":true})"}};
  int64_t gen_before = 0;
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(bodies[k][0]);
    const int fd = Connect(f.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, Request("POST", bodies[k][0], bodies[k][1])));
    // Running and holding blocks...
    ASSERT_TRUE(WaitFor(10, [&] {
      const EngineStats s = f.server().loop().Stats();
      return s.num_running == 1 && s.num_kv_blocks_used > 0 && s.generation_tokens_total > gen_before + 20;
    }));
    const auto t0 = SteadyClock::now();
    close(fd);  // ... when the client goes away.
    const bool freed = WaitFor(1.0, [&] {
      const EngineStats s = f.server().loop().Stats();
      return s.num_running == 0 && s.num_kv_blocks_used == 0;
    });
    const double took = SecondsSince(t0);
    EXPECT_TRUE(freed) << "blocks still held after 1 s";
    EXPECT_LT(took, 1.0);
    const EngineStats s = f.server().loop().Stats();
    EXPECT_LT(s.generation_tokens_total - gen_before, 480) << "the request ran on";
    gen_before = s.generation_tokens_total;
    // (at least: a client that closes right after reading its answer may count too)
    EXPECT_GE(f.server().http_counters().client_disconnects, k + 1);
  }
  // The abort is counted in /metrics, and the server still answers.
  auto m = f.Client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("finished_reason=\"abort\"} 2\n"), std::string::npos) << m->body;
  int status = 0;
  auto c = f.Client();
  json ok = PostJson(c, "/v1/completions", R"({"prompt":"a","max_tokens":3})", &status);
  EXPECT_EQ(status, 200) << ok.dump();
}

// 500 connections sending one byte a second and 500 that stop half-way
// through the request line: normal requests are answered as fast as alone,
// no thread is added, and the stalled connections are closed at the header
// timeout (not before).
TEST(HttpHardening, SlowAndStalledClientsDoNotDelayOthers) {
  ServerOptions o;
  o.timeout_header_s = 3;
  o.timeout_keep_alive_s = 3;
  ServerFixture f(o);
  ASSERT_TRUE(f.WaitReady());
  const std::string body = R"({"prompt":"The quick brown fox","max_tokens":16,"seed":3})";
  auto timed = [&] {
    auto c = f.Client();
    int status = 0;
    const auto t0 = SteadyClock::now();
    json r = PostJson(c, "/v1/completions", body, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return SecondsSince(t0);
  };
  std::vector<double> solo;
  for (int i = 0; i < 3; ++i) solo.push_back(timed());
  std::sort(solo.begin(), solo.end());
  const double solo_s = solo[1];
  const int threads_before = ThreadCount();

  constexpr int kSlow = 500, kStalled = 500;
  const std::string slow_text = Request("POST", "/v1/completions", body);
  std::vector<int> slow, stalled;
  const auto t_start = SteadyClock::now();
  for (int i = 0; i < kSlow; ++i) {
    const int fd = Connect(f.port());
    ASSERT_GE(fd, 0) << "connect " << i;
    ASSERT_TRUE(SendAll(fd, slow_text.substr(0, 1)));
    slow.push_back(fd);
  }
  for (int i = 0; i < kStalled; ++i) {
    const int fd = Connect(f.port());
    ASSERT_GE(fd, 0) << "connect " << i;
    ASSERT_TRUE(SendAll(fd, "POST /v1/compl"));
    stalled.push_back(fd);
  }
  // One byte a second on each slow connection (one driver thread).
  std::atomic<bool> stop{false};
  std::thread driver([&] {
    for (size_t pos = 1; !stop && pos < slow_text.size(); ++pos) {
      for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (int fd : slow) send(fd, slow_text.data() + pos, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  });
  ASSERT_TRUE(WaitFor(5, [&] { return f.server().http_counters().open_connections >= kSlow + kStalled; }));
  // Normal requests meanwhile, repeatedly.
  for (int i = 0; i < 3; ++i) {
    const double t = timed();
    EXPECT_LT(t, solo_s + 1.0) << "request " << i << " took " << t << " s (alone " << solo_s << " s)";
  }
  EXPECT_EQ(ThreadCount(), threads_before + 1);  // the driver thread only
  // None closed before its timeout...
  if (SecondsSince(t_start) < 2.5) {
    EXPECT_EQ(f.server().http_counters().header_timeouts, 0);
  }
  // ... and all closed at it.
  EXPECT_TRUE(WaitFor(3.0 + 5.0, [&] { return f.server().http_counters().header_timeouts >= kSlow + kStalled; }))
      << f.server().http_counters().header_timeouts;
  EXPECT_GE(SecondsSince(t_start), 3.0);
  EXPECT_TRUE(WaitFor(2, [&] { return f.server().http_counters().open_connections == 0; }));
  int closed_seen = 0;
  for (int fd : slow) {
    bool closed = false;
    RecvUntil(fd, 2000, [](const std::string&) { return false; }, &closed);
    closed_seen += closed;
  }
  for (int fd : stalled) {
    bool closed = false;
    RecvUntil(fd, 2000, [](const std::string&) { return false; }, &closed);
    closed_seen += closed;
  }
  EXPECT_EQ(closed_seen, kSlow + kStalled);
  stop = true;
  driver.join();
  for (int fd : slow) close(fd);
  for (int fd : stalled) close(fd);
  EXPECT_LT(timed(), solo_s + 1.0);
}

TEST(HttpHardening, ConnectionLimitAnswers503) {
  ServerOptions o;
  o.max_connections = 4;
  ServerFixture f(o);
  ASSERT_TRUE(f.WaitReady());
  ASSERT_TRUE(WaitFor(5, [&] { return f.server().http_counters().open_connections == 0; }));
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(Connect(f.port()));
  ASSERT_TRUE(WaitFor(5, [&] { return f.server().http_counters().open_connections == 4; }));
  const int extra = Connect(f.port());
  ASSERT_GE(extra, 0);
  bool closed = false;
  const std::string got = RecvUntil(extra, 5000, [](const std::string&) { return false; }, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("\"code\":\"too_many_connections\""), std::string::npos) << got;
  close(extra);
  EXPECT_EQ(f.server().http_counters().rejected_over_limit, 1);
  for (int fd : held) close(fd);
  ASSERT_TRUE(WaitFor(5, [&] { return f.server().http_counters().open_connections == 0; }));
  auto h = f.Client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(HttpHardening, IdleAndBodyTimeoutsClose) {
  ServerOptions o;
  o.timeout_keep_alive_s = 1;
  o.timeout_body_s = 1;
  ServerFixture f(o);
  ASSERT_TRUE(f.WaitReady());
  const auto base = f.server().http_counters();
  // Idle: connected, nothing sent.
  const int idle = Connect(f.port());
  auto t0 = SteadyClock::now();
  bool closed = false;
  RecvUntil(idle, 5000, [](const std::string&) { return false; }, &closed);
  EXPECT_TRUE(closed);
  EXPECT_GE(SecondsSince(t0), 0.9);
  EXPECT_LT(SecondsSince(t0), 3.0);
  close(idle);
  EXPECT_TRUE(WaitFor(1, [&] { return f.server().http_counters().idle_timeouts - base.idle_timeouts == 1; }));
  // Body: the header promises 100 bytes, 10 come.
  const int partial = Connect(f.port());
  ASSERT_TRUE(SendAll(partial, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":"));
  t0 = SteadyClock::now();
  RecvUntil(partial, 5000, [](const std::string&) { return false; }, &closed);
  EXPECT_TRUE(closed);
  EXPECT_GE(SecondsSince(t0), 0.9);
  close(partial);
  // Kept alive after a response, then idle.
  const int ka = Connect(f.port());
  ASSERT_TRUE(SendAll(ka, Request("GET", "/health", "")));
  const std::string r = RecvUntil(ka, 5000, HasWholeResponse, &closed);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  t0 = SteadyClock::now();
  RecvUntil(ka, 5000, [](const std::string&) { return false; }, &closed);
  EXPECT_TRUE(closed);
  EXPECT_GE(SecondsSince(t0), 0.9);
  close(ka);
  // (The client sees the close a moment before the server's count.)
  EXPECT_TRUE(WaitFor(1, [&] { return f.server().http_counters().idle_timeouts - base.idle_timeouts == 2; }));
  EXPECT_TRUE(WaitFor(1, [&] { return f.server().http_counters().body_timeouts - base.body_timeouts == 1; }));
  const auto c = f.server().http_counters();
  EXPECT_EQ(c.idle_timeouts - base.idle_timeouts, 2);
  EXPECT_EQ(c.body_timeouts - base.body_timeouts, 1);
}

TEST(HttpHardening, ChunkedBodiesAreReadWithinTheLimit) {
  ServerOptions o;
  o.max_request_bytes = 4096;
  ServerFixture f(o);
  ASSERT_TRUE(f.WaitReady());
  // A chunked body within the limit is served.
  {
    const int fd = Connect(f.port());
    const std::string body = R"({"prompt":"Hello world"})";
    std::string req = "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n";
    for (size_t i = 0; i < body.size(); i += 5) {
      const std::string part = body.substr(i, 5);
      req += fmt::format("{:x}\r\n{}\r\n", part.size(), part);
    }
    req += "0\r\n\r\n";
    ASSERT_TRUE(SendAll(fd, req));
    const std::string r = RecvUntil(fd, 5000, HasWholeResponse);
    EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
    const json j = json::parse(r.substr(r.find("\r\n\r\n") + 4));
    EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), SharedTokenizer().Encode("Hello world"));
    close(fd);
  }
  // A chunked body that grows past the limit is refused at the chunk that
  // crosses it, while the client is still sending.
  {
    const int fd = Connect(f.port());
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 5; ++i) req += fmt::format("{:x}\r\n{}\r\n", 1000, std::string(1000, ' '));
    ASSERT_TRUE(SendAll(fd, req));  // no terminating chunk: the body is unfinished
    bool closed = false;
    const std::string r = RecvUntil(fd, 5000, HasWholeResponse, &closed);
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
    EXPECT_NE(r.find("\"code\":\"request_too_large\""), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
    close(fd);
  }
  // A Content-Length over the limit is refused before the body is sent.
  {
    const int fd = Connect(f.port());
    ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"));
    const std::string r = RecvUntil(fd, 5000, HasWholeResponse);
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
    EXPECT_NE(r.find("request_too_large"), std::string::npos) << r;
    close(fd);
  }
  // A header over 64 KiB: 431.
  {
    const int fd = Connect(f.port());
    SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(70000, 'a') + "\r\n\r\n");
    const std::string r = RecvUntil(fd, 5000, HasWholeResponse);
    EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r.substr(0, 200);
    close(fd);
  }
  // A malformed request line: 400 naming the problem.
  {
    const int fd = Connect(f.port());
    SendAll(fd, "NOT-HTTP\r\n\r\n");
    const std::string r = RecvUntil(fd, 5000, HasWholeResponse);
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
    EXPECT_NE(r.find("could not be read"), std::string::npos) << r;
    close(fd);
  }
}

TEST(HttpHardening, KeepAlivePipeliningAndExpectContinue) {
  // Not a timeout test: generous timeouts keep it deterministic on a loaded
  // machine under TSan (the 5 s default keep-alive once closed the connection
  // between the pipelined answers and the 100-continue request).
  ServerOptions o;
  o.timeout_header_s = 120;
  o.timeout_keep_alive_s = 120;
  ServerFixture f(o);
  ASSERT_TRUE(f.WaitReady());
  // Two pipelined requests on one connection: two answers, in order.
  const int fd = Connect(f.port());
  ASSERT_TRUE(SendAll(fd, Request("POST", "/tokenize", R"({"prompt":"one"})") +
                              Request("POST", "/tokenize", R"({"prompt":"two two"})")));
  const std::string r = RecvUntil(fd, 5000, [](const std::string& s) {
    const size_t second = s.find("HTTP/1.1 200", 1);
    return second != std::string::npos && HasWholeResponse(s.substr(second));
  });
  const size_t second = r.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << r;
  const json a = json::parse(r.substr(r.find("\r\n\r\n") + 4, second - r.find("\r\n\r\n") - 4));
  const json b = json::parse(r.substr(r.find("\r\n\r\n", second) + 4));
  EXPECT_EQ(a["tokens"].get<std::vector<int32_t>>(), SharedTokenizer().Encode("one"));
  EXPECT_EQ(b["tokens"].get<std::vector<int32_t>>(), SharedTokenizer().Encode("two two"));
  // Expect: 100-continue, on the same kept-alive connection.
  const std::string body = R"({"prompt":"three"})";
  ASSERT_TRUE(SendAll(fd, "POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n"));
  const std::string cont = RecvUntil(fd, 60000, [](const std::string& s) { return s.find("\r\n\r\n") != std::string::npos; });
  EXPECT_EQ(cont, "HTTP/1.1 100 Continue\r\n\r\n")
      << "idle timeouts " << f.server().http_counters().idle_timeouts << ", header timeouts "
      << f.server().http_counters().header_timeouts << ", body timeouts " << f.server().http_counters().body_timeouts;
  ASSERT_TRUE(SendAll(fd, body));
  const std::string third = RecvUntil(fd, 60000, HasWholeResponse);
  ASSERT_EQ(third.rfind("HTTP/1.1 200", 0), 0u) << third;
  EXPECT_EQ(json::parse(third.substr(third.find("\r\n\r\n") + 4))["tokens"].get<std::vector<int32_t>>(),
            SharedTokenizer().Encode("three"));
  close(fd);
  // HEAD: the GET's headers, no body.
  const int h = Connect(f.port());
  ASSERT_TRUE(SendAll(h, "HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string head = RecvUntil(h, 2000, [](const std::string& s) { return s.find("\r\n\r\n") != std::string::npos; });
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  const std::string more = RecvUntil(h, 300, [](const std::string&) { return false; });
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4) + more, "");
  close(h);
}

}  // namespace
}  // namespace deepinfer::server
