#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <map>
#include <thread>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

using json = nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) { SendJson(res, e.status, ErrorBody(e)); }

// Constant-time comparison (the key's length is not secret).
bool SameKey(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions opts;
  ServerMetrics metrics;
  std::unique_ptr<EngineLoop> loop;
  httplib::Server svr;
  std::atomic<bool> stopping{false};
  std::atomic<int> active_streams{0};  // SSE responses not yet finished
  bool bound = false;
  EngineFactory factory;  // moved into the loop by Bind()
  std::mutex info_mu;
  std::unique_ptr<ModelInfo> info;

  // The model facts for request parsing (built once the engine is ready).
  const ModelInfo* Info() {
    std::lock_guard<std::mutex> lock(info_mu);
    if (!info) {
      const ModelFacts& f = loop->facts();
      auto m = std::make_unique<ModelInfo>();
      m->served_model_names = opts.served_model_names;
      m->tokenizer = f.tokenizer;
      m->model_type = f.model_type;
      m->max_model_len = f.args.max_model_len;
      m->max_logprobs = f.args.max_logprobs;
      m->vocab_size = f.vocab_size;
      if (f.tokenizer)
        for (int64_t id = 0; id < f.tokenizer->size(); ++id)
          m->max_token_bytes =
              std::max<int64_t>(m->max_token_bytes, f.tokenizer->TokenBytes(static_cast<int32_t>(id)).size());
      m->default_sampling = opts.default_sampling;
      m->default_thinking = opts.default_thinking;
      info = std::move(m);
    }
    return info.get();
  }

  // Runs a handler with the common checks: auth for /v1, engine readiness,
  // and every failure turned into an OpenAI error body.
  template <typename F>
  void Guarded(const httplib::Request& req, httplib::Response& res, bool needs_engine, F&& fn) {
    try {
      if (!opts.api_key.empty() && req.path.rfind("/v1", 0) == 0) {
        const std::string auth = req.get_header_value("Authorization");
        const std::string prefix = "Bearer ";
        if (auth.rfind(prefix, 0) != 0 || !SameKey(auth.substr(prefix.size()), opts.api_key))
          throw ApiError(401, "invalid_request_error",
                         auth.empty() ? "missing API key: send the header \"Authorization: Bearer <key>\""
                                      : "incorrect API key provided",
                         std::nullopt, "invalid_api_key");
      }
      if (needs_engine) {
        if (stopping) throw ApiError(503, "server_error", "the server is shutting down", std::nullopt, "shutting_down");
        const EngineLoop::State s = loop->state();
        if (s == EngineLoop::State::kLoading)
          throw ApiError(503, "server_error", "the model is still loading; retry when GET /health answers 200",
                         std::nullopt, "model_loading");
        if (s == EngineLoop::State::kFailed)
          throw ApiError(503, "server_error", "the model failed to load: " + loop->load_error(), std::nullopt,
                         "model_load_failed");
      }
      fn();
    } catch (const ApiError& e) {
      SendError(res, e);
    } catch (const Error& e) {
      SendError(res, FromLibraryError(e));
    } catch (const std::exception& e) {
      spdlog::error("{} {}: {}", req.method, req.path, e.what());
      SendError(res, ApiError(500, "server_error", std::string("internal error: ") + e.what()));
    }
  }

  void HandleGenerate(const httplib::Request& req, httplib::Response& res, Endpoint ep);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  void Routes();
};

// One in-flight completion request, shared by the handler and the streaming
// content provider (which outlives the handler call).
struct InFlight {
  ParsedRequest parsed;
  std::unique_ptr<ResponseBuilder> builder;
  std::shared_ptr<OutputChannel> channel;
  std::vector<uint64_t> ids;
  bool finished = false;  // every choice reported, [DONE] written
};

void HttpServer::Impl::HandleGenerate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
  const auto arrival = Clock::now();
  const ModelInfo* mi = Info();
  json body = ParseJsonBody(req.body);
  auto st = std::make_shared<InFlight>();
  if (ep == Endpoint::kChat) {
    st->parsed = ParseChatRequest(body, nlohmann::ordered_json::parse(req.body), *mi);
  } else {
    st->parsed = ParseCompletionRequest(body, nlohmann::ordered_json::parse(req.body), *mi);
  }
  const std::string id = NewRequestId(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  st->builder = std::make_unique<ResponseBuilder>(st->parsed, *mi, id, static_cast<int64_t>(std::time(nullptr)));
  try {
    st->channel = loop->Submit(st->parsed.ToGenerateRequests(id), &st->ids, arrival);
  } catch (const Error& e) {
    throw FromLibraryError(e);
  }

  if (!st->parsed.stream) {
    std::vector<ChoiceOutput> outs;
    while (!st->builder->done()) {
      outs.clear();
      if (!st->channel->WaitPop(&outs, kPoll)) {
        if (stopping) {
          loop->Abort(st->ids);
          throw ApiError(503, "server_error", "the server is shutting down", std::nullopt, "shutting_down");
        }
        continue;
      }
      for (ChoiceOutput& o : outs) st->builder->OnOutput(std::move(o));
      if (st->builder->error()) {
        loop->Abort(st->ids);  // the other choices of a failed request are not needed
        throw *st->builder->error();
      }
    }
    SendJson(res, 200, st->builder->Final());
    return;
  }

  // Streaming: events are produced inside cpp-httplib's chunked content provider.
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  EngineLoop* lp = loop.get();
  std::atomic<bool>* stop_flag = &stopping;
  std::atomic<int>* streams = &active_streams;
  auto pending = std::make_shared<std::string>(st->builder->Prologue());
  ++active_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, lp, stop_flag, pending](size_t /*offset*/, httplib::DataSink& sink) -> bool {
        std::string& ev = *pending;
        if (*stop_flag && !st->finished) {
          // Shutting down: end the stream visibly (an error event and [DONE])
          // instead of cutting it off; Run() waits briefly for this.
          lp->Abort(st->ids);
          st->finished = true;
          ev += "data: " +
                Dump(ErrorBody(ApiError(503, "server_error", "the server is shutting down", std::nullopt,
                                        std::optional<std::string>("shutting_down")))) +
                "\n\ndata: [DONE]\n\n";
          if (!sink.write(ev.data(), ev.size())) return false;
          ev.clear();
          sink.done();
          return true;
        }
        if (ev.empty()) {
          std::vector<ChoiceOutput> outs;
          if (!st->channel->WaitPop(&outs, kPoll)) {
            // Nothing new: is the client still there?
            if (*stop_flag || !sink.is_writable()) {
              lp->Abort(st->ids);
              return false;
            }
            return true;
          }
          for (ChoiceOutput& o : outs) {
            ev += st->builder->OnStreamOutput(std::move(o));
            if (st->builder->error()) break;
          }
          if (st->builder->error()) {
            lp->Abort(st->ids);
            ev += "data: " + Dump(ErrorBody(*st->builder->error())) + "\n\n" + "data: [DONE]\n\n";
            st->finished = true;
          } else if (st->builder->done()) {
            ev += st->builder->Epilogue();
            st->finished = true;
          }
        }
        if (!ev.empty()) {
          if (!sink.write(ev.data(), ev.size())) {
            lp->Abort(st->ids);
            return false;
          }
          ev.clear();
        }
        if (st->finished) sink.done();
        return true;
      },
      [st, lp, streams](bool success) {
        // Client gone or write failed before the end: free the engine's blocks now.
        if (!success || !st->finished) lp->Abort(st->ids);
        --*streams;
      });
}

void HttpServer::Impl::HandleTokenize(const httplib::Request& req, httplib::Response& res) {
  const ModelInfo* mi = Info();
  json body = ParseJsonBody(req.body);
  CheckModel(body, *mi);
  if (!mi->tokenizer) BadRequest("this model directory has no tokenizer.json");
  const bool has_prompt = body.contains("prompt"), has_messages = body.contains("messages");
  if (has_prompt == has_messages) BadRequest("give exactly one of \"prompt\" and \"messages\"", "prompt");
  auto get_bool = [&](const char* k, bool d) {
    if (!body.contains(k) || body[k].is_null()) return d;
    if (!body[k].is_boolean()) BadRequest(fmt::format("{}: expected true or false, found {}", k, body[k].type_name()), k);
    return body[k].get<bool>();
  };
  std::vector<int32_t> ids;
  if (has_prompt) {
    if (!body["prompt"].is_string())
      BadRequest(fmt::format("prompt: expected a string, found {}", body["prompt"].type_name()), "prompt");
    try {
      ids = mi->tokenizer->Encode(body["prompt"].get<std::string>(), get_bool("add_special_tokens", true));
    } catch (const Error& e) {
      throw FromLibraryError(e, "prompt");
    }
  } else {
    if (!body["messages"].is_array())
      BadRequest(fmt::format("messages: expected a list, found {}", body["messages"].type_name()), "messages");
    const auto ordered = nlohmann::ordered_json::parse(req.body);
    const ChatOptions chat = ChatOptionsFor(body, ordered, *mi);  // exactly as /v1/chat/completions renders
    try {
      ids = EncodeChat(*mi->tokenizer, ordered["messages"], chat);
    } catch (const Error& e) {
      throw FromLibraryError(e, "messages");
    }
  }
  json out = {{"count", ids.size()}, {"max_model_len", mi->max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
  if (get_bool("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(mi->tokenizer->IdToToken(id));
    out["token_strs"] = strs;
  }
  SendJson(res, 200, out);
}

void HttpServer::Impl::HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
  const ModelInfo* mi = Info();
  json body = ParseJsonBody(req.body);
  CheckModel(body, *mi);
  if (!mi->tokenizer) BadRequest("this model directory has no tokenizer.json");
  if (!body.contains("tokens")) BadRequest("tokens is required", "tokens");
  const json& t = body["tokens"];
  if (!t.is_array()) BadRequest(fmt::format("tokens: expected a list of token ids, found {}", t.type_name()), "tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].is_number_integer())
      BadRequest(fmt::format("tokens[{}]: expected an integer, found {}", i, t[i].type_name()), "tokens");
    const int64_t v = t[i].is_number_unsigned() && t[i].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                          ? INT64_MAX
                          : t[i].get<int64_t>();
    if (v < 0 || v >= mi->tokenizer->size())
      BadRequest(fmt::format("tokens[{}] = {} is outside the vocabulary [0, {})", i, v, mi->tokenizer->size()),
                 "tokens");
    ids.push_back(static_cast<int32_t>(v));
  }
  try {
    SendJson(res, 200, json{{"prompt", mi->tokenizer->Decode(ids)}});
  } catch (const Error& e) {
    throw FromLibraryError(e, "tokens");
  }
}

void HttpServer::Impl::Routes() {
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, true, [&] { HandleGenerate(req, res, Endpoint::kCompletions); });
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, true, [&] { HandleGenerate(req, res, Endpoint::kChat); });
  });
  svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, true, [&] {
      const ModelInfo* mi = Info();
      json data = json::array();
      for (const auto& name : mi->served_model_names)
        data.push_back(json{{"id", name},
                            {"object", "model"},
                            {"created", static_cast<int64_t>(std::time(nullptr))},
                            {"owned_by", "deepinfer"},
                            {"root", mi->served_model_names.at(0)},
                            {"parent", nullptr},
                            {"max_model_len", mi->max_model_len}});
      SendJson(res, 200, json{{"object", "list"}, {"data", data}});
    });
  });
  svr.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, true, [&] { HandleTokenize(req, res); });
  });
  svr.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, true, [&] { HandleDetokenize(req, res); });
  });
  svr.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, true, [&] {
      res.status = 200;
      res.set_content("", "text/plain");
    });
  });
  svr.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, false, [&] {
      res.status = 200;
      res.set_content(metrics.Render(loop->Stats(), opts.served_model_names.at(0)),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
  });
  svr.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    SendJson(res, 200, json{{"version", "0.1.0"}});
  });
  // cpp-httplib 0.11 does not apply the payload limit to a chunked request
  // body (it would read and buffer any size), so chunked uploads are refused
  // before the body is read: 411, send Content-Length.
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string te = req.get_header_value("Transfer-Encoding");
    if (te.empty()) return httplib::Server::HandlerResponse::Unhandled;
    SendError(res, ApiError(411, "invalid_request_error",
                            fmt::format("Transfer-Encoding: {} request bodies are not accepted; send the body with a "
                                        "Content-Length header (at most {} bytes, --max-request-bytes)",
                                        te, opts.max_request_bytes),
                            std::nullopt, std::optional<std::string>("length_required")));
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses set by cpp-httplib itself (404 no route, 413 body too large, 400
  // unparsable request) get an OpenAI error body too.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg, code;
    // A known route with another method: 405 with Allow (as vLLM/FastAPI).
    static const std::map<std::string, std::string> kAllowed = {
        {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/tokenize", "POST"},
        {"/detokenize", "POST"},     {"/v1/models", "GET, HEAD"},       {"/health", "GET, HEAD"},
        {"/metrics", "GET, HEAD"},   {"/version", "GET, HEAD"}};
    if (res.status == 404) {
      if (const auto it = kAllowed.find(req.path); it != kAllowed.end()) {
        res.status = 405;
        res.set_header("Allow", it->second);
        msg = fmt::format("method {} is not allowed on {}; use {}", req.method, req.path, it->second);
        code = "method_not_allowed";
      }
    }
    switch (res.status) {
      case 405:
        break;
      case 404:
        msg = fmt::format("no route for {} {}", req.method, req.path);
        code = "not_found";
        break;
      case 413:
        res.status = 400;  // edge validation answers 400 (the code says what it was)
        msg = fmt::format("the request body is larger than this server's limit of {} bytes (--max-request-bytes)",
                          opts.max_request_bytes);
        code = "request_too_large";
        break;
      case 400:
        msg = "the HTTP request could not be read: check the request line, the Content-Length of the body and "
              "the Content-Type (application/json)";
        break;
      default:
        msg = fmt::format("the HTTP request could not be handled (status {})", res.status);
        break;
    }
    const ApiError e(res.status, res.status >= 500 ? "server_error" : "invalid_request_error", msg, std::nullopt,
                     code.empty() ? std::nullopt : std::optional<std::string>(code));
    res.set_content(Dump(ErrorBody(e)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    SendError(res, ApiError(500, "server_error", "internal error: " + what));
  });
}

HttpServer::HttpServer(ServerOptions options, EngineFactory factory) : impl_(std::make_unique<Impl>()) {
  if (options.served_model_names.empty())
    Fail(ErrorKind::kInvalidArgument, "--served-model-name: at least one name is needed");
  if (options.http_threads < 1) Fail(ErrorKind::kInvalidArgument, "http_threads must be >= 1");
  impl_->opts = std::move(options);
  // Validate the sampling defaults once, up front.
  SamplingParams::FromJson(impl_->opts.default_sampling);
  impl_->factory = std::move(factory);
  const int threads = impl_->opts.http_threads;
  impl_->svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  impl_->svr.set_payload_max_length(impl_->opts.max_request_bytes);
  impl_->svr.set_tcp_nodelay(true);
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second server bind
  // the same port and silently share its traffic. Only SO_REUSEADDR here: a
  // busy port is an error, a port in TIME_WAIT can be reused.
  impl_->svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  impl_->Routes();
}

HttpServer::~HttpServer() {
  Stop();
  if (impl_->loop) impl_->loop->Stop();
}

int HttpServer::Bind() {
  Impl& m = *impl_;
  if (m.bound) Fail(ErrorKind::kInternal, "HttpServer::Bind called twice");
  int port = m.opts.port;
  if (port == 0) {
    port = m.svr.bind_to_any_port(m.opts.host);
    if (port < 0) Fail(ErrorKind::kInvalidArgument, "cannot bind {}:<any port>", m.opts.host);
  } else if (!m.svr.bind_to_port(m.opts.host, port)) {
    Fail(ErrorKind::kInvalidArgument, "cannot bind {}:{} (port in use or address not available)", m.opts.host, port);
  }
  m.bound = true;
  // Only now start loading the model: a port that cannot be bound fails fast.
  m.loop = std::make_unique<EngineLoop>(std::move(m.factory), &m.metrics);
  Impl* impl = &m;
  m.loop->SetOnLoaded([impl](EngineLoop::State s) {
    if (s == EngineLoop::State::kReady) {
      spdlog::info("engine ready: serving model \"{}\"", impl->opts.served_model_names.at(0));
    } else {
      impl->stopping = true;  // Run() stops the listener
    }
  });
  return port;
}

void HttpServer::Run() {
  if (!impl_->bound) Bind();
  // Listen on a helper thread and wait here for Stop() (or a load failure), so
  // that a Stop() that comes before the listen loop has started is not lost.
  std::atomic<bool> listening_done{false};
  std::thread listener([&] {
    impl_->svr.listen_after_bind();
    listening_done = true;
  });
  while (!impl_->stopping && !listening_done) std::this_thread::sleep_for(kPoll);
  // Give open streams a moment to send their shutdown event and [DONE]
  // (cpp-httplib stops calling content providers once it stops).
  for (int i = 0; i < 40 && impl_->active_streams > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Exactly one stop() while the listen loop runs (a second one would trip an
  // assert inside cpp-httplib).
  while (!listening_done) {
    if (impl_->svr.is_running()) {
      impl_->svr.stop();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  listener.join();
  impl_->stopping = true;
  impl_->loop->Stop();
  if (impl_->loop->state() == EngineLoop::State::kFailed)
    Fail(ErrorKind::kInvalidArgument, "{}", impl_->loop->load_error());
}

void HttpServer::Stop() { impl_->stopping = true; }

EngineLoop& HttpServer::loop() { return *impl_->loop; }

}  // namespace deepinfer::server
