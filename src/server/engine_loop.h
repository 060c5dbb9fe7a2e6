// deepinfer/server/engine_loop.h — the one thread that owns the Engine.
//
// The Engine is not thread-safe (include/deepinfer/engine.h). The server runs
// it on one dedicated thread; HTTP handler threads talk to it only through
// this class:
//
//   HTTP thread                               engine thread
//   Submit(group) ──command queue──────────▶  engine->Submit() for each request
//        ◀── accepted ids / the engine's Error (synchronous reply)
//   channel->WaitPop() ◀──per-group channel── outputs of every Step()
//   Abort(ids) ─────command queue──────────▶  engine->Abort() (blocks freed at once)
//
// The engine thread loops: drain the command queue, Step() while there is
// unfinished work, publish a stats snapshot (so /metrics sees freed blocks
// right after an abort; published before the step's outputs are routed, so a
// client that has seen an output sees stats at least that recent), route each
// RequestOutput to its group's channel, and sleep on a condition variable
// when idle.
//
// Loading: the factory (normally Engine::Open) runs on the engine thread, so
// the HTTP server can answer /health with 503 while the model loads. A factory
// that throws puts the loop in State::kFailed with the message.
//
// Failures: Submit() rethrows the engine's Error (kInvalidArgument for a bad
// request) to the caller and queues nothing of the group. A request that fails
// while running arrives as a finished output with finish_reason "error". If
// Step() itself throws (a bug), every request in flight is finished with
// "error" and aborted; the loop and later requests go on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "deepinfer/engine.h"
#include "server/metrics.h"

namespace deepinfer::server {

using EngineFactory = std::function<std::unique_ptr<Engine>()>;
using Clock = std::chrono::steady_clock;

// One engine output, tagged with its position in the submitted group.
struct ChoiceOutput {
  int index = 0;
  RequestOutput out;
};

// Outputs of one submitted group, in the order the engine produced them.
class OutputChannel {
 public:
  void Push(ChoiceOutput o);
  // Waits up to `timeout` for outputs and moves every queued one into *out.
  // Returns false if nothing arrived.
  bool WaitPop(std::vector<ChoiceOutput>* out, std::chrono::milliseconds timeout);
  // Moves every queued output into *out without waiting; false if none.
  bool TryPop(std::vector<ChoiceOutput>* out);
  // `fn` runs after every Push (on the pushing thread, normally the engine
  // thread: it must not block), and once at once if outputs are already queued.
  void SetNotify(std::function<void()> fn);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceOutput> q_;
  std::function<void()> notify_;
};

// Facts about the loaded model, fixed once the engine is ready (safe to read
// from any thread after state() == kReady).
struct ModelFacts {
  EngineArgs args;
  const Tokenizer* tokenizer = nullptr;  // immutable, thread-safe; owned by the engine
  int64_t vocab_size = 0;
  std::string model_type;
};

class EngineLoop {
 public:
  enum class State { kLoading, kReady, kFailed };

  // Starts the engine thread, which calls `factory`. `metrics` (may be null)
  // receives latency observations and finish counts; it must outlive the loop.
  EngineLoop(EngineFactory factory, ServerMetrics* metrics);
  ~EngineLoop();  // Stop()
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  State state() const;
  std::string load_error() const;  // set in kFailed
  // Blocks until the state is not kLoading or `timeout` passes; returns the state.
  State WaitLoaded(std::chrono::milliseconds timeout) const;
  // Called once from the engine thread when loading ends (ready or failed).
  void SetOnLoaded(std::function<void(State)> fn);
  const ModelFacts& facts() const { return facts_; }  // valid in kReady

  // Submits a group of requests (one per choice) all-or-nothing. On success
  // returns the group's channel and fills *ids (engine ids, in group order).
  // Throws the engine's Error for a bad request, Error(kInternal) if the
  // engine is not ready or the loop is stopping.
  std::shared_ptr<OutputChannel> Submit(std::vector<GenerateRequest> requests, std::vector<uint64_t>* ids,
                                        Clock::time_point arrival = Clock::now());
  // The same without waiting: returns the group's channel at once; `done`
  // runs on the engine thread once the group is queued (ids, null error) or
  // refused (no ids, the engine's Error as an exception_ptr; nothing of the
  // group runs then). `done` must not block. If the loop is stopping or not
  // ready, `done` runs on the calling thread with Error(kInternal).
  using SubmitDone = std::function<void(std::vector<uint64_t> ids, std::exception_ptr error)>;
  std::shared_ptr<OutputChannel> SubmitAsync(std::vector<GenerateRequest> requests, Clock::time_point arrival,
                                             SubmitDone done);
  // Aborts the requests (asynchronously; finished or unknown ids are ignored).
  void Abort(const std::vector<uint64_t>& ids);
  // Aborts every unfinished request of the group whose channel this is
  // (asynchronously, in queue order: a group still being submitted is aborted
  // right after it is queued). The engine frees their blocks before its next step.
  void AbortChannel(const std::shared_ptr<OutputChannel>& channel);

  // The engine's stats as of the last command batch or step (never older than
  // the outputs already delivered to channels).
  EngineStats Stats() const;

  // Stops the engine thread: requests in flight are finished with "abort".
  void Stop();

 private:
  struct Command;
  struct Route;
  void Run();
  void RouteOutputs(std::vector<RequestOutput>& outs);
  void PublishStats();

  EngineFactory factory_;
  ServerMetrics* metrics_;
  ModelFacts facts_;
  std::unique_ptr<Engine> engine_;  // touched only by the engine thread (after load)

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;         // wakes the engine thread
  mutable std::condition_variable loaded_cv_;  // wakes WaitLoaded
  std::deque<std::unique_ptr<Command>> commands_;
  bool stop_ = false;
  State state_ = State::kLoading;
  std::string load_error_;
  EngineStats stats_;
  std::function<void(State)> on_loaded_;

  std::unordered_map<uint64_t, std::unique_ptr<Route>> routes_;  // engine thread only
  std::thread thread_;
};

}  // namespace deepinfer::server
