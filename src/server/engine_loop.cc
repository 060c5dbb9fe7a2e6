#include "server/engine_loop.h"

#include <future>

#include <spdlog/spdlog.h>

#include "base/error.h"

namespace deepinfer::server {

namespace {
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

void OutputChannel::Push(ChoiceOutput o) {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(o));
    fn = notify_;
  }
  cv_.notify_all();
  if (fn) fn();
}

bool OutputChannel::TryPop(std::vector<ChoiceOutput>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (q_.empty()) return false;
  while (!q_.empty()) {
    out->push_back(std::move(q_.front()));
    q_.pop_front();
  }
  return true;
}

void OutputChannel::SetNotify(std::function<void()> fn) {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify_ = fn;
    pending = !q_.empty();
  }
  if (pending && fn) fn();
}

bool OutputChannel::WaitPop(std::vector<ChoiceOutput>* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return false;
  while (!q_.empty()) {
    out->push_back(std::move(q_.front()));
    q_.pop_front();
  }
  return true;
}

struct EngineLoop::Command {
  enum class Kind { kSubmit, kAbort, kAbortChannel } kind = Kind::kSubmit;
  std::vector<GenerateRequest> requests;
  Clock::time_point arrival;
  std::shared_ptr<OutputChannel> channel;
  SubmitDone done;
  std::vector<uint64_t> abort_ids;
};

struct EngineLoop::Route {
  std::shared_ptr<OutputChannel> channel;
  int index = 0;
  Clock::time_point arrival;
  Clock::time_point last_token;
  bool got_first = false;
};

EngineLoop::EngineLoop(EngineFactory factory, ServerMetrics* metrics)
    : factory_(std::move(factory)), metrics_(metrics) {
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Stop(); }

EngineLoop::State EngineLoop::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

std::string EngineLoop::load_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_error_;
}

EngineLoop::State EngineLoop::WaitLoaded(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  loaded_cv_.wait_for(lock, timeout, [&] { return state_ != State::kLoading; });
  return state_;
}

void EngineLoop::SetOnLoaded(std::function<void(State)> fn) {
  State s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = state_;
    if (s == State::kLoading) {
      on_loaded_ = std::move(fn);
      return;
    }
  }
  fn(s);
}

std::shared_ptr<OutputChannel> EngineLoop::Submit(std::vector<GenerateRequest> requests, std::vector<uint64_t>* ids,
                                                  Clock::time_point arrival) {
  auto reply = std::make_shared<std::promise<std::vector<uint64_t>>>();
  std::future<std::vector<uint64_t>> f = reply->get_future();
  auto channel = SubmitAsync(std::move(requests), arrival, [reply](std::vector<uint64_t> got, std::exception_ptr err) {
    if (err) reply->set_exception(err);
    else reply->set_value(std::move(got));
  });
  *ids = f.get();  // rethrows the engine's Error
  return channel;
}

std::shared_ptr<OutputChannel> EngineLoop::SubmitAsync(std::vector<GenerateRequest> requests,
                                                       Clock::time_point arrival, SubmitDone done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kSubmit;
  cmd->requests = std::move(requests);
  cmd->arrival = arrival;
  cmd->channel = std::make_shared<OutputChannel>();
  cmd->done = std::move(done);
  auto channel = cmd->channel;
  const char* refused = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) refused = "the engine is shutting down";
    else if (state_ != State::kReady) refused = "the engine is not ready";
    else commands_.push_back(std::move(cmd));
  }
  if (refused) {
    cmd->done({}, std::make_exception_ptr(Error(ErrorKind::kInternal, refused)));
    return channel;
  }
  cv_.notify_all();
  return channel;
}

void EngineLoop::AbortChannel(const std::shared_ptr<OutputChannel>& channel) {
  if (!channel) return;
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kAbortChannel;
  cmd->channel = channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    commands_.push_back(std::move(cmd));
  }
  cv_.notify_all();
}

void EngineLoop::Abort(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return;
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kAbort;
  cmd->abort_ids = ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    commands_.push_back(std::move(cmd));
  }
  cv_.notify_all();
}

EngineStats EngineLoop::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EngineLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::PublishStats() {
  EngineStats s = engine_->Stats();
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = s;
}

void EngineLoop::RouteOutputs(std::vector<RequestOutput>& outs) {
  const auto now = Clock::now();
  for (RequestOutput& o : outs) {
    auto it = routes_.find(o.id);
    if (it == routes_.end()) continue;  // e.g. a request already failed by a Step() exception
    Route& r = *it->second;
    if (metrics_ && !o.new_token_ids.empty()) {
      if (!r.got_first) metrics_->ObserveTimeToFirstToken(Seconds(r.arrival, now));
      else metrics_->ObserveInterTokenLatency(Seconds(r.last_token, now));
    }
    if (!o.new_token_ids.empty()) {
      r.got_first = true;
      r.last_token = now;
    }
    const bool finished = o.finished;
    if (finished && metrics_) {
      metrics_->CountFinished(o.finish_reason);
      if (o.finish_reason == "stop" || o.finish_reason == "length") metrics_->ObserveE2eLatency(Seconds(r.arrival, now));
    }
    r.channel->Push(ChoiceOutput{r.index, std::move(o)});
    if (finished) routes_.erase(it);
  }
}

void EngineLoop::Run() {
  // ---- Load.
  std::unique_ptr<Engine> engine;
  std::string error;
  try {
    engine = factory_();
    if (!engine) error = "the engine factory returned no engine";
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::function<void(State)> on_loaded;
  State loaded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine) {
      engine_ = std::move(engine);
      facts_.args = engine_->args();
      facts_.tokenizer = engine_->tokenizer();
      facts_.vocab_size = engine_->vocab_size();
      facts_.model_type = engine_->model_type();
      stats_ = engine_->Stats();
      state_ = State::kReady;
    } else {
      load_error_ = error;
      state_ = State::kFailed;
    }
    loaded = state_;
    on_loaded = std::move(on_loaded_);
  }
  loaded_cv_.notify_all();
  if (loaded == State::kFailed) spdlog::error("engine failed to load: {}", error);
  if (on_loaded) on_loaded(loaded);
  if (loaded != State::kReady) return;

  // ---- Serve.
  for (;;) {
    std::deque<std::unique_ptr<Command>> cmds;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle: wake up now and then to check that every rank of a parallel
      // job is still there (a lost rank turns the server unavailable, 503).
      while (!engine_->HasUnfinished() && !stop_ && commands_.empty()) {
        cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stop_ || !commands_.empty(); });
        if (engine_->fatal_error()) continue;  // already down: just wait for commands
        engine_->CheckPeers();
        if (engine_->fatal_error()) break;
      }
      cmds.swap(commands_);
      stopping = stop_;
    }
    for (auto& cmd : cmds) {
      if (cmd->kind == Command::Kind::kAbort) {
        for (uint64_t id : cmd->abort_ids) engine_->Abort(id);
        continue;
      }
      if (cmd->kind == Command::Kind::kAbortChannel) {
        for (auto& [id, r] : routes_)
          if (r->channel == cmd->channel) engine_->Abort(id);
        continue;
      }
      if (stopping) {
        cmd->done({}, std::make_exception_ptr(Error(ErrorKind::kInternal, "the engine is shutting down")));
        continue;
      }
      std::vector<uint64_t> ids;
      try {
        for (const GenerateRequest& req : cmd->requests) ids.push_back(engine_->Submit(req));
      } catch (...) {
        // All or nothing: abort the part of the group already queued (no route
        // is registered for it, so its "abort" outputs are dropped).
        for (uint64_t id : ids) engine_->Abort(id);
        cmd->done({}, std::current_exception());
        continue;
      }
      for (size_t i = 0; i < ids.size(); ++i) {
        auto r = std::make_unique<Route>();
        r->channel = cmd->channel;
        r->index = static_cast<int>(i);
        r->arrival = cmd->arrival;
        routes_[ids[i]] = std::move(r);
      }
      cmd->done(std::move(ids), nullptr);
    }
    if (stopping) {
      for (auto& [id, r] : routes_) engine_->Abort(id);
    }
    if (engine_->fatal_error()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (state_ == State::kReady) {
        // Requests still in flight fail in the next Step; new ones get 503.
        load_error_ = "a rank of the parallel job was lost: " + *engine_->fatal_error();
        state_ = State::kFailed;  // the engine already logged the lost rank
      }
    }
    if (engine_->HasUnfinished()) {
      std::vector<RequestOutput> outs;
      try {
        outs = engine_->Step();
      } catch (const std::exception& e) {
        // A bug below the engine's own per-request error handling: fail what is in flight, keep serving.
        spdlog::error("engine step failed: {}", e.what());
        for (auto& [id, r] : routes_) {
          RequestOutput o;
          o.id = id;
          o.finished = true;
          o.finish_reason = "error";
          o.error = std::string("engine step failed: ") + e.what();
          if (metrics_) metrics_->CountFinished("error");
          r->channel->Push(ChoiceOutput{r->index, std::move(o)});
          engine_->Abort(id);
        }
        routes_.clear();
      }
      // Stats first: a client that has seen an output then sees stats at least that recent.
      PublishStats();
      RouteOutputs(outs);
    } else {
      PublishStats();
    }
    if (stopping) {
      // Drain the aborted requests' final outputs, then leave.
      int guard = 0;
      while (engine_->HasUnfinished() && guard++ < 1000) {
        std::vector<RequestOutput> outs = engine_->Step();
        RouteOutputs(outs);
      }
      PublishStats();
      return;
    }
  }
}

}  // namespace deepinfer::server
