#include "server/metrics.h"

#include <cmath>

#include <fmt/format.h>

namespace deepinfer::server {
namespace {

// Prometheus floats: shortest round-trip form; +Inf/-Inf/NaN spelled as Go does.
std::string PromFloat(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

std::string WithLabels(const std::string& labels, const std::string& extra = {}) {
  if (labels.empty() && extra.empty()) return "";
  if (labels.empty()) return "{" + extra + "}";
  if (extra.empty()) return "{" + labels + "}";
  return "{" + labels + "," + extra + "}";
}

void Header(const std::string& name, const std::string& help, const char* type, std::string* out) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void Sample(const std::string& name, const std::string& labels, double v, std::string* out) {
  *out += fmt::format("{}{} {}\n", name, labels, PromFloat(v));
}

}  // namespace

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, const std::string& labels,
                       std::string* out) const {
  Header(name, help, "histogram", out);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    Sample(name + "_bucket", WithLabels(labels, "le=\"" + PromFloat(bounds_[i]) + "\""), static_cast<double>(cum), out);
  }
  cum += counts_.back();
  Sample(name + "_bucket", WithLabels(labels, "le=\"+Inf\""), static_cast<double>(cum), out);
  Sample(name + "_sum", WithLabels(labels), sum_, out);
  Sample(name + "_count", WithLabels(labels), static_cast<double>(count_), out);
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0}) {}

void ServerMetrics::ObserveTimeToFirstToken(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(s);
}
void ServerMetrics::ObserveInterTokenLatency(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(s);
}
void ServerMetrics::ObserveE2eLatency(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.Observe(s);
}
void ServerMetrics::CountFinished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 3;
  if (reason == "stop") i = 0;
  else if (reason == "length") i = 1;
  else if (reason == "abort") i = 2;
  ++finished_[i];
}

std::string ServerMetrics::Render(const EngineStats& s, const std::string& model_name) const {
  const std::string labels = "model_name=\"" + EscapeLabelValue(model_name) + "\"";
  const std::string l = WithLabels(labels);
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    Header(name, help, "gauge", &out);
    Sample(name, l, v, &out);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    Header(name, help, "counter", &out);
    Sample(name, l, v, &out);
  };
  gauge("deepinfer_num_requests_running", "Number of requests in the running batch.", s.num_running);
  gauge("deepinfer_num_requests_waiting", "Number of requests waiting to be scheduled.", s.num_waiting);
  gauge("deepinfer_kv_cache_blocks_used", "Paged KV-cache blocks owned by requests.",
        static_cast<double>(s.num_kv_blocks_used));
  gauge("deepinfer_kv_cache_blocks", "Paged KV-cache blocks in the pool.", static_cast<double>(s.num_kv_blocks));
  gauge("deepinfer_kv_cache_usage_perc", "KV-cache usage: used blocks / total blocks (1 = full).",
        s.num_kv_blocks > 0 ? static_cast<double>(s.num_kv_blocks_used) / static_cast<double>(s.num_kv_blocks) : 0.0);
  counter("deepinfer_prompt_tokens_total", "Prompt tokens computed (recomputation after preemption included).",
          static_cast<double>(s.prompt_tokens_total));
  counter("deepinfer_generation_tokens_total", "Tokens generated.", static_cast<double>(s.generation_tokens_total));
  counter("deepinfer_num_preemptions_total", "Requests preempted (their cache is recomputed later).",
          static_cast<double>(s.num_preemptions));
  counter("deepinfer_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (vLLM prefix_cache_queries).",
          static_cast<double>(s.prefix_cache_queries));
  counter("deepinfer_prefix_cache_hits_total", "Prompt tokens found in the prefix cache (vLLM prefix_cache_hits).",
          static_cast<double>(s.prefix_cache_hits));
  gauge("deepinfer_prefix_cache_blocks", "Published prefix-cache blocks (shared or evictable).",
        static_cast<double>(s.num_cached_blocks));
  if (s.spec_num_speculative_tokens > 0) {
    // Speculative decoding (vLLM's spec_decode_* counters; docs/speculative.md).
    counter("deepinfer_spec_decode_num_drafts_total", "Verification chunks with at least one draft token.",
            static_cast<double>(s.spec_num_drafts));
    counter("deepinfer_spec_decode_num_draft_tokens_total", "Draft tokens verified.",
            static_cast<double>(s.spec_num_draft_tokens));
    counter("deepinfer_spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
            static_cast<double>(s.spec_num_accepted_tokens));
    Header("deepinfer_spec_decode_num_accepted_tokens_per_pos_total", "Draft tokens accepted at each draft position.",
           "counter", &out);
    for (size_t i = 0; i < s.spec_num_accepted_tokens_per_pos.size(); ++i)
      Sample("deepinfer_spec_decode_num_accepted_tokens_per_pos_total",
             WithLabels(labels, "position=\"" + std::to_string(i) + "\""),
             static_cast<double>(s.spec_num_accepted_tokens_per_pos[i]), &out);
    gauge("deepinfer_spec_decode_mean_accepted_length",
          "Mean tokens produced per verification chunk: 1 + accepted / drafts.", s.spec_mean_accepted_length());
  }
  std::lock_guard<std::mutex> lock(mu_);
  Header("deepinfer_request_success_total", "Finished requests by finish reason.", "counter", &out);
  static const char* kReasons[4] = {"stop", "length", "abort", "error"};
  for (size_t i = 0; i < 4; ++i)
    Sample("deepinfer_request_success_total", WithLabels(labels, std::string("finished_reason=\"") + kReasons[i] + "\""),
           static_cast<double>(finished_[i]), &out);
  ttft_.Render("deepinfer_time_to_first_token_seconds", "Time from arrival to the first generated token, in seconds.",
               labels, &out);
  itl_.Render("deepinfer_inter_token_latency_seconds",
              "Time between consecutive token outputs of one request, in seconds.", labels, &out);
  e2e_.Render("deepinfer_e2e_request_latency_seconds",
              "Time from arrival to finish of requests that stopped or hit their length, in seconds.", labels, &out);
  return out;
}

}  // namespace deepinfer::server
