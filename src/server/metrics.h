// deepinfer/server/metrics.h — the server's Prometheus metrics.
//
// GET /metrics answers in the Prometheus text exposition format (version
// 0.0.4, Content-Type "text/plain; version=0.0.4"). Every metric carries the
// label model_name="<served model name>" (as vLLM does). Names follow the
// Prometheus rules (`promtool check metrics` passes with no warning): prefix
// "deepinfer_" (vLLM writes "vllm:", but a colon is reserved for recording
// rules), counters end in _total and nothing else does, units in the name.
//
//   name                                   type      what                                  vLLM counterpart
//   deepinfer_num_requests_running         gauge     requests in the running batch          vllm:num_requests_running
//   deepinfer_num_requests_waiting         gauge     requests queued in the engine          vllm:num_requests_waiting
//   deepinfer_kv_cache_blocks_used         gauge     paged KV blocks owned by requests now  (none; vllm:kv_cache_usage_perc × blocks)
//   deepinfer_kv_cache_blocks              gauge     paged KV blocks in the pool            vllm:cache_config_info num_gpu_blocks
//   deepinfer_kv_cache_usage_perc          gauge     used / total, in [0, 1]                vllm:kv_cache_usage_perc
//   deepinfer_prompt_tokens_total          counter   prompt tokens computed (recomputation) vllm:prompt_tokens_total
//   deepinfer_generation_tokens_total      counter   tokens generated                       vllm:generation_tokens_total
//   deepinfer_num_preemptions_total        counter   requests preempted (recompute)         vllm:num_preemptions_total
//   deepinfer_prefix_cache_queries_total  counter   prompt tokens looked up in the cache   vllm:prefix_cache_queries_total
//   deepinfer_prefix_cache_hits_total     counter   prompt tokens found there              vllm:prefix_cache_hits_total
//   deepinfer_prefix_cache_blocks         gauge     published prefix-cache blocks          (none)
//   deepinfer_request_success_total{finished_reason="stop"|"length"|"abort"|"error"}
//                                          counter   finished requests by finish reason     vllm:request_success_total
//   deepinfer_time_to_first_token_seconds  histogram arrival → first generated token        vllm:time_to_first_token_seconds
//   deepinfer_inter_token_latency_seconds  histogram between consecutive token outputs      vllm:inter_token_latency_seconds
//   deepinfer_e2e_request_latency_seconds  histogram arrival → finish (stop/length only)    vllm:e2e_request_latency_seconds
//
// Histogram buckets are vLLM's. Thread-safe: the engine thread observes, HTTP
// threads render.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::server {

// A cumulative Prometheus histogram with fixed upper bounds (+Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  // Appends "# HELP/# TYPE" and the _bucket/_sum/_count lines. `labels` is
  // the label list without braces (e.g. model_name="x"), may be empty.
  void Render(const std::string& name, const std::string& help, const std::string& labels, std::string* out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveE2eLatency(double seconds);
  // finish_reason: "stop" | "length" | "abort" | "error" (anything else is counted as "error").
  void CountFinished(const std::string& finish_reason);

  // The whole exposition text for these counters and the engine's stats.
  std::string Render(const EngineStats& stats, const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_;
  std::array<uint64_t, 4> finished_{};  // stop, length, abort, error
};

// Escapes a label value for the text format (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& v);

}  // namespace deepinfer::server
