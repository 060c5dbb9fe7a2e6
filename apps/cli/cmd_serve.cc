// deepinfer serve --model MODEL_DIR (or serve MODEL_DIR) — the OpenAI-compatible HTTP server
// (src/server/http_server.h). Binds 127.0.0.1:8000 by default; the engine
// flags are those of `deepinfer generate` (vLLM names); the sampling flags set
// server-wide defaults that each request's fields override.
//
// The port is bound before the model loads, so GET /health answers 503 while
// loading and 200 once ready. SIGINT/SIGTERM stop the server (requests in
// flight are aborted). Exit status 2 when the port cannot be bound or the model
// fails to load.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "commands.h"
#include "engine/parallel_runner.h"
#include "engine_flags.h"
#include "parallel/communicator.h"
#include "server/http_server.h"

namespace deepinfer::cli {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

struct ServeOptions {
  EngineFlags engine;
  SamplingFlags sampling;
  server::ServerOptions server;
  std::string model;       // positional MODEL_DIR
  std::string model_flag;  // --model DIR
  std::vector<std::string> served_model_names;
  bool thinking = false;
};

void RunServe(ServeOptions& o) {
  if (!o.model.empty() && !o.model_flag.empty() && o.model != o.model_flag)
    Fail(ErrorKind::kInvalidArgument, "serve: the model directory is given twice ({} and --model {}); give one",
         o.model, o.model_flag);
  if (o.model.empty()) o.model = o.model_flag;
  if (o.model.empty()) Fail(ErrorKind::kInvalidArgument, "serve: give the model directory: serve --model DIR (or serve DIR)");
  o.engine.args.model = o.model;
  const EngineArgs args = o.engine.Resolve();
  CheckParallelArgs(args, World().size());  // before anything else (serve binds its port next)
  // Under mpirun, ranks > 0 follow the leader's steps; only rank 0 serves HTTP (docs/parallel.md).
  if (IsFollowerRank()) {
    if (const int rc = RunFollower(args); rc != 0) FollowerExit(rc);
    return;
  }
  o.server.served_model_names = o.served_model_names.empty() ? std::vector<std::string>{o.model} : o.served_model_names;
  o.server.default_sampling = o.sampling.given;
  o.server.default_thinking = o.thinking;
  if (o.server.api_key.empty()) {
    if (const char* k = std::getenv("DEEPINFER_API_KEY")) o.server.api_key = k;
  }
  if (o.server.port < 0 || o.server.port > 65535)
    Fail(ErrorKind::kInvalidArgument, "--port must be in [0, 65535], got {}", o.server.port);

  // SIGINT/SIGTERM set a flag from a handler (any thread may take the signal:
  // libraries such as OpenBLAS start threads before main, so a blocked mask
  // cannot be relied on); a watcher thread polls it and stops the server.
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { g_stop_signal = sig; };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  server::HttpServer srv(o.server, [args] { return Engine::Open(args); });
  const int port = srv.Bind();
  spdlog::info("deepinfer serve: listening on http://{}:{} (model \"{}\" loading; GET /health answers 200 when ready)",
               o.server.host, port, o.server.served_model_names.front());

  std::atomic<bool> done{false};
  std::thread signals([&] {
    while (!done) {
      if (const int sig = g_stop_signal; sig != 0) {
        spdlog::info("deepinfer serve: signal {}, shutting down", sig);
        srv.Stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  try {
    srv.Run();
  } catch (...) {
    done = true;
    signals.join();
    throw;
  }
  done = true;
  signals.join();
}

}  // namespace

void RegisterServe(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, ...)");
  auto o = std::make_shared<ServeOptions>();
  cmd->add_option("model", o->model, "Model directory (or --model DIR)");
  cmd->add_option("--model", o->model_flag, "Model directory (as `generate --model`)");
  cmd->add_option("--host", o->server.host, "Address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port (0 = any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->server.api_key,
                  "Require \"Authorization: Bearer KEY\" on /v1 routes (default: $DEEPINFER_API_KEY, else none)");
  cmd->add_option("--served-model-name", o->served_model_names,
                  "Model name(s) clients use in \"model\" (default: the model directory as given)");
  cmd->add_option("--max-request-bytes", o->server.max_request_bytes,
                  "Largest request body accepted, Content-Length or chunked (400 request_too_large above)")
      ->capture_default_str();
  cmd->add_option("--http-threads", o->server.http_threads,
                  "HTTP I/O threads, and as many request-handling threads (connections do not hold threads)")
      ->capture_default_str();
  cmd->add_option("--max-connections", o->server.max_connections,
                  "Open connections accepted at once (503 too_many_connections beyond)")
      ->capture_default_str();
  cmd->add_option("--timeout-keep-alive", o->server.timeout_keep_alive_s,
                  "Seconds a connection may wait with no request in progress")
      ->capture_default_str();
  cmd->add_option("--timeout-header", o->server.timeout_header_s,
                  "Seconds from a request's first byte to the end of its header")
      ->capture_default_str();
  cmd->add_option("--timeout-body", o->server.timeout_body_s, "Seconds from the end of the header to the end of the body")
      ->capture_default_str();
  cmd->add_option("--timeout-write", o->server.timeout_write_s,
                  "Seconds a response write may make no progress (a client that stopped reading)")
      ->capture_default_str();
  cmd->add_flag("--thinking", o->thinking, "Render chat requests in thinking mode unless a request says otherwise");
  AddEngineFlags(cmd, &o->engine);
  AddSamplingFlags(cmd, &o->sampling);
  cmd->callback([o] { RunServe(*o); });
}

}  // namespace deepinfer::cli
