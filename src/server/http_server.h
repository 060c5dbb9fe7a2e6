// deepinfer/server/http_server.h — the OpenAI-compatible HTTP server
// (`deepinfer serve`): routes, auth and the request lifecycle, on the
// Beast/Asio transport of http_transport.h (this file and openai_api.h use no
// HTTP library type).
//
// Endpoints:
//   POST /v1/completions, POST /v1/chat/completions   openai_api.h; "stream": true
//        answers text/event-stream: "data: <chunk JSON>\n\n" events ending
//        with "data: [DONE]\n\n"
//   GET  /v1/models                                  the served model
//   POST /tokenize      {"prompt": str | "messages": [...], "add_special_tokens"?,
//                        "add_generation_prompt"?, "return_token_strs"?}
//                       → {"count", "max_model_len", "tokens", "token_strs"}   (vLLM)
//   POST /detokenize    {"tokens": [int]} → {"prompt": str}                     (vLLM)
//   GET  /health        200 when the engine is ready, 503 while it loads (or failed)
//   GET  /metrics       Prometheus text (metrics.h)
//   GET  /version       {"version": ...}
//
// Threads: `http_threads` I/O threads serve every connection (asynchronous
// sockets; no thread per connection or per request), `http_threads` handler
// threads parse and validate, tokenize (the Tokenizer is immutable and
// thread-safe) and submit to the one engine thread (engine_loop.h) without
// waiting; each engine output wakes a handler thread (OutputChannel::SetNotify)
// that turns it into the response or the next SSE events. Nothing blocks on a
// request's progress, so slow or stalled clients cost sockets, not threads.
//
// Disconnects: the transport watches every connection while its request is in
// flight; when the client goes away (EOF, reset, failed or timed-out write),
// the request's whole group is aborted through the loop's queue
// (EngineLoop::AbortChannel), streaming or not, and the engine frees its KV
// blocks before its next step.
//
// Shutdown (Stop(), SIGINT/SIGTERM): open streams get a shutting_down error
// event and [DONE], plain requests in flight a 503, then connections close
// (at most ~2 s for the last writes).
//
// Auth: with an API key, every /v1/* request needs "Authorization: Bearer
// KEY", else 401 {"error": {..., "type": "invalid_request_error", "code":
// "invalid_api_key"}}; /health, /metrics, /version, /tokenize and /detokenize
// stay open (vLLM guards /v1 only).
//
// Errors: every failure is an OpenAI error body (openai_api.h): 400 bad
// request (also: unknown model, code model_not_found; body over
// max_request_bytes, Content-Length or chunked, code request_too_large), 401,
// 404 unknown route, 405 known route with another method (Allow), 431 header
// over 64 KiB, 500 engine-side failure of that request, 503 while loading or
// shutting down, or beyond max_connections (code too_many_connections). One bad
// request never affects another.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/engine_loop.h"
#include "server/http_transport.h"

namespace deepinfer::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                              // 0 = any free port (Bind() returns it)
  std::string api_key;                          // empty = no auth
  std::vector<std::string> served_model_names;  // required; [0] is reported
  size_t max_request_bytes = 32u << 20;         // larger bodies get 400 request_too_large
  int http_threads = 2;                         // I/O threads, and as many handler threads
  int max_connections = 4096;                   // beyond: 503 too_many_connections (clamped to the fd limit)
  double timeout_keep_alive_s = 5;              // no request in progress (new or kept-alive connection)
  double timeout_header_s = 10;                 // first byte of a request → end of its header
  double timeout_body_s = 30;                   // end of the header → end of the body
  double timeout_write_s = 30;                  // a response write that makes no progress
  nlohmann::json default_sampling = nlohmann::json::object();  // the serve command's sampling flags
  bool default_thinking = false;                // chat in thinking mode unless the request says otherwise
};

class HttpServer {
 public:
  // Sets up the routes; nothing is bound or loaded yet. Throws Error for bad options.
  HttpServer(ServerOptions options, EngineFactory factory);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port, then starts loading the engine on the engine thread
  // (/health answers 503 until it is ready); returns the bound port. Throws
  // Error(kInvalidArgument) naming host:port when binding fails (port in use,
  // bad address); nothing is loaded then.
  int Bind();
  // Serves until Stop() (from any thread) or until the engine fails to load;
  // then stops the engine thread. Throws Error with the load error in the
  // latter case.
  void Run();
  void Stop();

  EngineLoop& loop();  // valid after Bind()
  HttpTransportCounters http_counters() const;  // connections, timeouts, disconnects (http_transport.h)

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
