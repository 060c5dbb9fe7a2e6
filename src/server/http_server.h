// deepinfer/server/http_server.h — the OpenAI-compatible HTTP server
// (`deepinfer serve`), on cpp-httplib (Debian's libcpp-httplib 0.11).
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
// Threads: cpp-httplib's pool (ServerOptions::http_threads; a streaming
// response holds one thread for its duration) runs the handlers; one engine
// thread (engine_loop.h) owns the Engine. Handlers parse and validate, tokenize
// (the Tokenizer is immutable and thread-safe), submit through the loop's queue
// and wait on their request's output channel.
//
// Disconnects: a streaming handler polls its channel every 50 ms; when the
// client is gone (the socket reports EOF, or a write fails) it aborts its
// requests through the queue and the engine frees their KV blocks at once.
// A non-streaming request runs to completion (cpp-httplib 0.11 gives a plain
// handler no way to see the socket).
//
// Auth: with an API key, every /v1/* request needs "Authorization: Bearer
// KEY", else 401 {"error": {..., "type": "invalid_request_error", "code":
// "invalid_api_key"}}; /health, /metrics, /version, /tokenize and /detokenize
// stay open (vLLM guards /v1 only).
//
// Errors: every failure is an OpenAI error body (openai_api.h): 400 bad
// request, 401, 404 unknown model / unknown route, 413 body over
// max_request_bytes, 500 engine-side failure of that request, 503 while
// loading or shutting down. One bad request never affects another.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/engine_loop.h"

namespace deepinfer::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                              // 0 = any free port (Bind() returns it)
  std::string api_key;                          // empty = no auth
  std::vector<std::string> served_model_names;  // required; [0] is reported
  size_t max_request_bytes = 32u << 20;         // larger bodies get 413
  int http_threads = 64;
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

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
