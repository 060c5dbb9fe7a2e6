#include "server/http_server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "model/config.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

using json = nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);

void SendJson(HttpExchange& ex, int status, const json& body, HttpHeaders extra = {}) {
  ex.Respond(status, "application/json", Dump(body), std::move(extra));
}

void SendError(HttpExchange& ex, const ApiError& e, HttpHeaders extra = {}) {
  SendJson(ex, e.status, ErrorBody(e), std::move(extra));
}

ApiError ShuttingDown() {
  return ApiError(503, "server_error", "the server is shutting down", std::nullopt, std::string("shutting_down"));
}

// Constant-time comparison (the key's length is not secret).
bool SameKey(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

}  // namespace

// One in-flight completion request: the exchange it answers, its engine
// group's channel, and the response being built. Everything below `mu` is
// touched with it held (handler threads drain outputs as they come).
struct InFlight {
  std::shared_ptr<HttpExchange> ex;
  ParsedRequest parsed;
  std::unique_ptr<ResponseBuilder> builder;
  std::shared_ptr<OutputChannel> channel;
  std::mutex mu;
  bool submitted = false;  // the engine accepted the group (the stream, if any, is started)
  bool finished = false;   // answered (or the client is gone and the engine said so)
};

struct HttpServer::Impl {
  ServerOptions opts;
  ServerMetrics metrics;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<HttpTransport> http;
  std::atomic<bool> stopping{false};
  bool bound = false;
  EngineFactory factory;  // moved into the loop by Bind()
  std::mutex info_mu;
  std::unique_ptr<ModelInfo> info;

  std::mutex inflight_mu;
  std::condition_variable inflight_cv;
  std::set<std::shared_ptr<InFlight>> inflight;

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
      try {  // vision models: chat image blocks (docs/vision.md)
        const ModelConfig cfg = ModelConfig::Load(f.args.model);
        if (cfg.vision_enabled()) {
          m->vision = true;
          m->image_token_id = static_cast<int32_t>(cfg.image_token_id);
          m->vision_geometry = vision::VisionGeometry::FromConfig(cfg);
        }
      } catch (const Error&) {
        // no readable config (test engines): text only
      }
      info = std::move(m);
    }
    return info.get();
  }

  // Runs a handler with the common checks: auth for /v1, engine readiness,
  // and every failure turned into an OpenAI error body.
  template <typename F>
  void Guarded(HttpExchange& ex, bool needs_engine, F&& fn) {
    const HttpRequest& req = ex.request();
    try {
      if (!opts.api_key.empty() && req.path.rfind("/v1", 0) == 0) {
        const std::string auth = req.Header("Authorization");
        const std::string prefix = "Bearer ";
        if (auth.rfind(prefix, 0) != 0 || !SameKey(auth.substr(prefix.size()), opts.api_key))
          throw ApiError(401, "invalid_request_error",
                         auth.empty() ? "missing API key: send the header \"Authorization: Bearer <key>\""
                                      : "incorrect API key provided",
                         std::nullopt, "invalid_api_key");
      }
      if (needs_engine) {
        if (stopping) throw ShuttingDown();
        const EngineLoop::State s = loop->state();
        if (s == EngineLoop::State::kLoading)
          throw ApiError(503, "server_error", "the model is still loading; retry when GET /health answers 200",
                         std::nullopt, "model_loading");
        if (s == EngineLoop::State::kFailed) {
          // A parallel job that lost a rank after loading is down, not "failed to load".
          const std::string why = loop->load_error();
          if (why.rfind("a rank of the parallel job was lost", 0) == 0)
            throw ApiError(503, "server_error", "the engine is unavailable: " + why, std::nullopt, "rank_lost");
          throw ApiError(503, "server_error", "the model failed to load: " + why, std::nullopt, "model_load_failed");
        }
      }
      fn();
    } catch (const ApiError& e) {
      SendError(ex, e);
    } catch (const Error& e) {
      SendError(ex, FromLibraryError(e));
    } catch (const std::exception& e) {
      spdlog::error("{} {}: {}", req.method, req.path, e.what());
      SendError(ex, ApiError(500, "server_error", std::string("internal error: ") + e.what()));
    }
  }

  void Handle(std::shared_ptr<HttpExchange> ex);
  void HandleGenerate(const std::shared_ptr<HttpExchange>& ex, Endpoint ep);
  void OnSubmitted(const std::shared_ptr<InFlight>& st, std::exception_ptr err);
  void Drain(const std::shared_ptr<InFlight>& st);
  void ShutdownOne(const std::shared_ptr<InFlight>& st);
  void Finish(const std::shared_ptr<InFlight>& st);  // st->mu held
  void HandleTokenize(HttpExchange& ex);
  void HandleDetokenize(HttpExchange& ex);
};

void HttpServer::Impl::HandleGenerate(const std::shared_ptr<HttpExchange>& ex, Endpoint ep) {
  const auto arrival = Clock::now();
  const ModelInfo* mi = Info();
  const std::string& raw = ex->request().body;
  json body = ParseJsonBody(raw);
  auto st = std::make_shared<InFlight>();
  st->ex = ex;
  if (ep == Endpoint::kChat) {
    st->parsed = ParseChatRequest(body, nlohmann::ordered_json::parse(raw), *mi);
  } else {
    st->parsed = ParseCompletionRequest(body, nlohmann::ordered_json::parse(raw), *mi);
  }
  const std::string id = NewRequestId(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  st->builder = std::make_unique<ResponseBuilder>(st->parsed, *mi, id, static_cast<int64_t>(std::time(nullptr)));
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    if (stopping) throw ShuttingDown();
    inflight.insert(st);
  }
  HttpTransport* h = http.get();
  std::weak_ptr<InFlight> weak = st;
  // Held until st->channel is set: the engine may answer (OnSubmitted, Drain on
  // another thread) before SubmitAsync has returned here.
  std::lock_guard<std::mutex> lock(st->mu);
  st->channel = loop->SubmitAsync(st->parsed.ToGenerateRequests(id), arrival,
                                  [this, h, st](std::vector<uint64_t>, std::exception_ptr err) {
                                    h->Post([this, st, err] { OnSubmitted(st, err); });
                                  });
  // A client that goes away aborts its requests, streaming or not: the engine
  // frees their blocks before its next step.
  EngineLoop* lp = loop.get();
  ex->OnClose([lp, ch = st->channel] { lp->AbortChannel(ch); });
  st->channel->SetNotify([this, h, weak] {
    if (auto s = weak.lock()) h->Post([this, s] { Drain(s); });
  });
}

void HttpServer::Impl::OnSubmitted(const std::shared_ptr<InFlight>& st, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->finished) return;
    if (err) {
      ApiError e(500, "server_error", "internal error");
      try {
        std::rethrow_exception(err);
      } catch (const Error& x) {
        e = stopping ? ShuttingDown() : FromLibraryError(x);
      } catch (const std::exception& x) {
        e = ApiError(500, "server_error", std::string("internal error: ") + x.what());
      }
      SendError(*st->ex, e);
      Finish(st);
      return;
    }
    st->submitted = true;
    if (st->parsed.stream) {
      st->ex->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      std::string pro = st->builder->Prologue();
      if (!pro.empty()) st->ex->Write(std::move(pro));
    }
  }
  Drain(st);
}

void HttpServer::Impl::Drain(const std::shared_ptr<InFlight>& st) {
  std::lock_guard<std::mutex> lock(st->mu);
  if (!st->submitted || st->finished) return;
  std::vector<ChoiceOutput> outs;
  if (!st->channel->TryPop(&outs)) return;
  ResponseBuilder& b = *st->builder;
  if (!st->parsed.stream) {
    for (ChoiceOutput& o : outs) {
      b.OnOutput(std::move(o));
      if (b.error()) break;
    }
    if (b.error()) {
      loop->AbortChannel(st->channel);  // the other choices of a failed request are not needed
      SendError(*st->ex, *b.error());
      Finish(st);
    } else if (b.done()) {
      SendJson(*st->ex, 200, b.Final());
      Finish(st);
    }
    return;
  }
  std::string ev;
  for (ChoiceOutput& o : outs) {
    ev += b.OnStreamOutput(std::move(o));
    if (b.error()) break;
  }
  bool end = false;
  if (b.error()) {
    loop->AbortChannel(st->channel);
    ev += "data: " + Dump(ErrorBody(*b.error())) + "\n\ndata: [DONE]\n\n";
    end = true;
  } else if (b.done()) {
    ev += b.Epilogue();
    end = true;
  }
  if (!ev.empty()) st->ex->Write(std::move(ev));
  if (end) {
    st->ex->End();
    Finish(st);
  }
}

// Shutting down: a stream ends visibly (a shutting_down error event and
// [DONE]) instead of being cut off; a plain request gets 503.
void HttpServer::Impl::ShutdownOne(const std::shared_ptr<InFlight>& st) {
  std::lock_guard<std::mutex> lock(st->mu);
  if (st->finished) return;
  loop->AbortChannel(st->channel);
  if (st->parsed.stream && st->submitted) {
    st->ex->Write("data: " + Dump(ErrorBody(ShuttingDown())) + "\n\ndata: [DONE]\n\n");
    st->ex->End();
  } else {
    SendError(*st->ex, ShuttingDown());
  }
  Finish(st);
}

void HttpServer::Impl::Finish(const std::shared_ptr<InFlight>& st) {
  st->finished = true;
  st->ex.reset();  // the exchange (and its connection) are not needed any more
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    inflight.erase(st);
  }
  inflight_cv.notify_all();
}

void HttpServer::Impl::HandleTokenize(HttpExchange& ex) {
  const ModelInfo* mi = Info();
  json body = ParseJsonBody(ex.request().body);
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
    const auto ordered = nlohmann::ordered_json::parse(ex.request().body);
    const ChatOptions chat = ChatOptionsFor(body, ordered, *mi);  // exactly as /v1/chat/completions renders
    std::vector<std::shared_ptr<const vision::PreparedImage>> images;
    ids = EncodeChatPrompt(body, ordered["messages"], chat, *mi, &images);
  }
  json out = {{"count", ids.size()}, {"max_model_len", mi->max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
  if (get_bool("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(mi->tokenizer->IdToToken(id));
    out["token_strs"] = strs;
  }
  SendJson(ex, 200, out);
}

void HttpServer::Impl::HandleDetokenize(HttpExchange& ex) {
  const ModelInfo* mi = Info();
  json body = ParseJsonBody(ex.request().body);
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
    SendJson(ex, 200, json{{"prompt", mi->tokenizer->Decode(ids)}});
  } catch (const Error& e) {
    throw FromLibraryError(e, "tokens");
  }
}

void HttpServer::Impl::Handle(std::shared_ptr<HttpExchange> ex) {
  const HttpRequest& req = ex->request();
  // HEAD is GET without the body (the transport drops it).
  const std::string method = req.method == "HEAD" ? "GET" : req.method;
  struct Route {
    const char* method;
    const char* allow;
  };
  static const std::map<std::string, Route> kRoutes = {
      {"/v1/completions", {"POST", "POST"}}, {"/v1/chat/completions", {"POST", "POST"}},
      {"/tokenize", {"POST", "POST"}},       {"/detokenize", {"POST", "POST"}},
      {"/v1/models", {"GET", "GET, HEAD"}},  {"/health", {"GET", "GET, HEAD"}},
      {"/metrics", {"GET", "GET, HEAD"}},    {"/version", {"GET", "GET, HEAD"}}};
  const auto it = kRoutes.find(req.path);
  if (it == kRoutes.end()) {
    SendError(*ex, ApiError(404, "invalid_request_error", fmt::format("no route for {} {}", req.method, req.path),
                            std::nullopt, std::string("not_found")));
    return;
  }
  if (method != it->second.method) {
    // A known route with another method: 405 with Allow (as vLLM/FastAPI).
    SendError(*ex,
              ApiError(405, "invalid_request_error",
                       fmt::format("method {} is not allowed on {}; use {}", req.method, req.path, it->second.allow),
                       std::nullopt, std::string("method_not_allowed")),
              {{"Allow", it->second.allow}});
    return;
  }
  const std::string& p = req.path;
  if (p == "/v1/completions") {
    Guarded(*ex, true, [&] { HandleGenerate(ex, Endpoint::kCompletions); });
  } else if (p == "/v1/chat/completions") {
    Guarded(*ex, true, [&] { HandleGenerate(ex, Endpoint::kChat); });
  } else if (p == "/v1/models") {
    Guarded(*ex, true, [&] {
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
      SendJson(*ex, 200, json{{"object", "list"}, {"data", data}});
    });
  } else if (p == "/tokenize") {
    Guarded(*ex, true, [&] { HandleTokenize(*ex); });
  } else if (p == "/detokenize") {
    Guarded(*ex, true, [&] { HandleDetokenize(*ex); });
  } else if (p == "/health") {
    Guarded(*ex, true, [&] { ex->Respond(200, "text/plain", ""); });
  } else if (p == "/metrics") {
    Guarded(*ex, false, [&] {
      ex->Respond(200, "text/plain; version=0.0.4; charset=utf-8",
                  metrics.Render(loop->Stats(), opts.served_model_names.at(0)));
    });
  } else if (p == "/version") {
    SendJson(*ex, 200, json{{"version", "0.1.0"}});
  }
}

HttpServer::HttpServer(ServerOptions options, EngineFactory factory) : impl_(std::make_unique<Impl>()) {
  if (options.served_model_names.empty())
    Fail(ErrorKind::kInvalidArgument, "--served-model-name: at least one name is needed");
  if (options.http_threads < 1) Fail(ErrorKind::kInvalidArgument, "--http-threads must be >= 1, got {}", options.http_threads);
  for (const auto& [name, v] : {std::pair<const char*, double>{"--timeout-keep-alive", options.timeout_keep_alive_s},
                                {"--timeout-header", options.timeout_header_s},
                                {"--timeout-body", options.timeout_body_s},
                                {"--timeout-write", options.timeout_write_s}})
    if (!(v > 0 && v <= 86400)) Fail(ErrorKind::kInvalidArgument, "{} must be in (0, 86400] seconds, got {}", name, v);
  impl_->opts = std::move(options);
  // Validate the sampling defaults once, up front.
  SamplingParams::FromJson(impl_->opts.default_sampling);
  impl_->factory = std::move(factory);
  const ServerOptions& o = impl_->opts;
  HttpTransportOptions t;
  t.host = o.host;
  t.port = o.port;
  t.io_threads = o.http_threads;
  t.handler_threads = o.http_threads;
  t.max_connections = o.max_connections;
  t.max_request_bytes = o.max_request_bytes;
  t.idle_timeout = Millis(o.timeout_keep_alive_s);
  t.header_timeout = Millis(o.timeout_header_s);
  t.body_timeout = Millis(o.timeout_body_s);
  t.write_timeout = Millis(o.timeout_write_s);
  Impl* impl = impl_.get();
  impl_->http = std::make_unique<HttpTransport>(
      t, [impl](std::shared_ptr<HttpExchange> ex) { impl->Handle(std::move(ex)); },
      [](int status, const std::string& message, const std::string& code) {
        const ApiError e(status, status >= 500 ? "server_error" : "invalid_request_error", message, std::nullopt,
                         code.empty() ? std::nullopt : std::optional<std::string>(code));
        return std::make_pair(Dump(ErrorBody(e)), std::string("application/json"));
      });
}

HttpServer::~HttpServer() {
  Stop();
  impl_->http->Stop();
  if (impl_->loop) impl_->loop->Stop();
}

int HttpServer::Bind() {
  Impl& m = *impl_;
  if (m.bound) Fail(ErrorKind::kInternal, "HttpServer::Bind called twice");
  const int port = m.http->Bind();
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
  Impl& m = *impl_;
  if (!m.bound) Bind();
  m.http->Start();
  while (!m.stopping) std::this_thread::sleep_for(kPoll);
  // End what is in flight visibly (streams get a shutting_down event and
  // [DONE], plain requests 503), give the writes a moment, then close.
  std::vector<std::shared_ptr<InFlight>> open;
  {
    std::lock_guard<std::mutex> lock(m.inflight_mu);
    open.assign(m.inflight.begin(), m.inflight.end());
  }
  for (auto& st : open) m.ShutdownOne(st);
  open.clear();
  {
    std::unique_lock<std::mutex> lock(m.inflight_mu);
    m.inflight_cv.wait_for(lock, std::chrono::seconds(2), [&] { return m.inflight.empty(); });
  }
  m.http->Stop();  // closes idle connections now, the others once their last write is out (<= 2 s)
  m.loop->Stop();
  {
    std::lock_guard<std::mutex> lock(m.inflight_mu);
    m.inflight.clear();
  }
  if (m.loop->state() == EngineLoop::State::kFailed)
    Fail(ErrorKind::kInvalidArgument, "{}", m.loop->load_error());
}

void HttpServer::Stop() { impl_->stopping = true; }

EngineLoop& HttpServer::loop() { return *impl_->loop; }

HttpTransportCounters HttpServer::http_counters() const { return impl_->http->counters(); }

}  // namespace deepinfer::server
