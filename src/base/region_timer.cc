#include "base/region_timer.h"

#include <atomic>
#include <chrono>

namespace deepinfer {
namespace {

constexpr int kN = static_cast<int>(Region::kCount);
std::atomic<bool> g_enabled{false};
std::atomic<int64_t> g_ns[kN];

struct ThreadState {
  int current = -1;        // innermost open region
  int64_t since = 0;       // when `current` last started being charged
};
thread_local ThreadState t_state;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Charge(int region, int64_t now) {
  if (region >= 0) g_ns[region].fetch_add(now - t_state.since, std::memory_order_relaxed);
  t_state.since = now;
}

}  // namespace

const char* RegionName(Region r) {
  static const char* const kNames[kN] = {"embed",   "mhc",    "norm", "attention", "attention_core",
                                         "compressor", "indexer", "router", "moe", "head", "collective"};
  const int i = static_cast<int>(r);
  return i >= 0 && i < kN ? kNames[i] : "?";
}

void EnableRegionTimer(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool RegionTimerEnabled() { return g_enabled.load(std::memory_order_relaxed); }

void ResetRegionTimes() {
  for (auto& v : g_ns) v.store(0, std::memory_order_relaxed);
}

std::array<double, kN> RegionSeconds() {
  std::array<double, kN> r{};
  for (int i = 0; i < kN; ++i) r[i] = static_cast<double>(g_ns[i].load(std::memory_order_relaxed)) * 1e-9;
  return r;
}

RegionScope::RegionScope(Region r) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  region_ = static_cast<int>(r);
  parent_ = t_state.current;
  Charge(parent_, NowNs());
  t_state.current = region_;
}

RegionScope::~RegionScope() {
  if (region_ < 0) return;
  Charge(region_, NowNs());
  t_state.current = parent_;
}

}  // namespace deepinfer
