// deepinfer/server/http_transport.h — the HTTP/1.1 layer of `deepinfer serve`,
// on Boost.Beast (request parsing) and Boost.Asio (sockets, timers), from
// Debian's libboost-dev. It knows nothing of OpenAI or of the engine: it reads
// requests, hands each to a handler as an HttpExchange, and writes what the
// handler answers. No Beast or Asio type appears in this header.
//
// Threads: `io_threads` run every socket of every connection (asynchronous
// reads, writes and timers; one strand per connection), and `handler_threads`
// run the handlers and whatever they Post(). Neither grows with the number of
// connections: a connection costs a socket and a few KiB, not a thread.
//
// Per connection (all limits and timeouts are HttpTransportOptions):
//   * idle_timeout: a connection with no request in progress (just accepted,
//     or kept alive after a response) is closed when no byte arrives for this
//     long;
//   * header_timeout: from the first byte of a request to the end of its
//     header; past it the connection is closed (a client sending one byte a
//     second, or a request line that stops half-way);
//   * body_timeout: from the end of the header to the end of the body
//     (Content-Length or chunked); past it the connection is closed;
//   * write_timeout: a response write that makes no progress for this long
//     (a client that stopped reading) closes the connection;
//   * max_header_bytes: a larger header is 431 and close;
//   * max_request_bytes: a body over it is refused while it is read — at once
//     for a Content-Length over the limit, at the chunk that crosses it for a
//     chunked body — with 400 (code request_too_large) and close;
//   * max_connections: a connection accepted beyond it is answered 503 (code
//     too_many_connections) and closed at once.
// "Expect: 100-continue" is answered before the body is read. HEAD is served
// as GET without the body. Pipelined requests are answered in order.
//
// Disconnects: while a request is being handled the connection keeps reading
// the socket, so a client that closes its connection (or resets it, or whose
// response write fails or times out) is seen at once, whether or not the
// response is streaming: the exchange's OnClose callbacks run then (on an I/O
// thread; they must not block). A client that half-closes its side after
// sending the request is treated the same (it is gone as far as HTTP/1.1
// keep-alive is concerned).
//
// Errors the transport answers itself (the request never reaches the handler)
// get a body from the ErrorBodyFn given at construction (JSON for the OpenAI
// server), with Connection: close.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::server {

struct HttpHeader {
  std::string name, value;
};
using HttpHeaders = std::vector<HttpHeader>;

struct HttpRequest {
  std::string method;  // as sent: "GET", "POST", ... ("HEAD" requests arrive as "HEAD")
  std::string target;  // request target as sent: path + optional "?query"
  std::string path;    // target up to '?'
  int version = 11;    // 10 = HTTP/1.0, 11 = HTTP/1.1
  HttpHeaders headers;
  std::string body;    // the decoded body (a chunked body is de-chunked)
  // The first value of header `name` (case-insensitive); "" when absent.
  std::string Header(std::string_view name) const;
};

// One request and its response. Thread-safe: any thread may call any method.
// Exactly one of Respond() or StartStream() ... End() should be used; calls
// after the response is complete, or after the client is gone, are ignored.
// An exchange destroyed without a response answers 500.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  // A complete response with Content-Length.
  virtual void Respond(int status, std::string_view content_type, std::string body, HttpHeaders extra = {}) = 0;
  // A streaming response (Transfer-Encoding: chunked; HTTP/1.0: close-delimited):
  // the status line and headers now, then each Write() as it comes, End() last.
  virtual void StartStream(int status, std::string_view content_type, HttpHeaders extra = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // Runs `fn` once if the client goes away before the response is complete
  // (at once if it is already gone). Runs on an I/O thread: it must not block.
  virtual void OnClose(std::function<void()> fn) = 0;
  // True once the client is gone (before the response completed).
  virtual bool closed() const = 0;
};

struct HttpTransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port (Bind() returns it)
  int io_threads = 2;
  int handler_threads = 2;
  int max_connections = 4096;  // clamped to the process's open-file limit (minus a reserve)
  size_t max_request_bytes = 32u << 20;
  size_t max_header_bytes = 64u << 10;
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds write_timeout{30000};
};

// Counts since Start(), for tests and logs.
struct HttpTransportCounters {
  int64_t open_connections = 0;  // sockets open now (rejected ones not included)
  int64_t accepted = 0;
  int64_t rejected_over_limit = 0;  // answered 503 too_many_connections
  int64_t idle_timeouts = 0;
  int64_t header_timeouts = 0;
  int64_t body_timeouts = 0;
  int64_t write_timeouts = 0;
  int64_t client_disconnects = 0;  // client gone while its request was being handled
  int64_t requests = 0;            // requests handed to the handler
};

// Parses one raw HTTP/1.x request (bytes as a client sends them) with exactly
// the parser settings and request mapping a connection uses (header and body
// limits, chunked decoding): for tests and fuzzing. Returns true and fills
// *out for a complete request; false with *error (the status and code a
// connection would answer: 400 bad_request / request_too_large, 431
// header_too_large; status 0 = incomplete input) otherwise. Never throws.
struct HttpParseError {
  int status = 0;
  std::string code, message;
};
bool ParseHttpRequest(std::string_view bytes, size_t max_header_bytes, size_t max_request_bytes, HttpRequest* out,
                      HttpParseError* error);

class HttpTransport {
 public:
  using Handler = std::function<void(std::shared_ptr<HttpExchange>)>;
  // The body (and its content type) of an error the transport answers itself:
  // status, a one-line message, a code ("request_too_large", "request_timeout",
  // "header_too_large", "bad_request", "too_many_connections").
  using ErrorBodyFn = std::function<std::pair<std::string, std::string>(int status, const std::string& message,
                                                                        const std::string& code)>;

  // Throws Error(kInvalidArgument) for bad options (thread counts < 1, ...).
  HttpTransport(HttpTransportOptions options, Handler handler, ErrorBodyFn error_body);
  ~HttpTransport();  // Stop()
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens on host:port (SO_REUSEADDR, not SO_REUSEPORT: a busy
  // port is an error); returns the port. Throws Error(kInvalidArgument)
  // naming host:port when that fails.
  int Bind();
  // Starts the I/O and handler threads and accepting. Returns at once.
  void Start();
  // Runs fn on a handler thread.
  void Post(std::function<void()> fn);
  // Stops accepting, closes every connection (OnClose runs for exchanges
  // still open), and joins the threads. Idempotent.
  void Stop();

  HttpTransportCounters counters() const;
  int max_connections() const;  // after clamping

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
