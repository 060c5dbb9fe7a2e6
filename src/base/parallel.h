// deepinfer/base/parallel.h — the project's thread pool is OpenMP (README
// "Threads"). Debian 12's Highway 1.0.3 has no pool; OpenMP comes with g++.
// Determinism rule: work is split over independent output rows/experts/heads;
// every reduction runs in a fixed order inside one thread, so results never
// depend on the thread count.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>

namespace deepinfer {

// True inside any parallel region, active or not (omp_get_level() > 0). A
// kernel checks this, not omp_in_parallel(), before opening a team: inside an
// inactive region (`#pragma omp parallel if(false)`, a one-thread team)
// omp_in_parallel() is false, yet a team opened there is a nested one, which
// libgomp starts afresh on every call (measured: a batch-1 decode step's
// indexer 1.6 -> 18 ms when its per-row split ran inside such a region).
inline bool InParallelRegion() { return omp_get_level() > 0; }

// Number of worker threads used by kernels (>= 1).
int NumThreads();
// Sets the worker count (n <= 0 → hardware concurrency). Throws kInvalidArgument
// for n > 1024.
void SetNumThreads(int n);

// Runs fn(i) for every i in [0, items) (none when items <= 0) on the OpenMP
// team, each item exactly once on one thread. Thread t first takes the items
// of its static range [items·t/T, items·(t+1)/T) from the front (so each
// thread streams one contiguous stretch, as `schedule(static)`), then takes
// what is left of the other threads' ranges from their backs: a thread that
// starts late (woken after the others) or runs slower does not hold up the
// team. Which thread runs an item never changes a result when every item
// writes its own outputs (the determinism rule above). T is NumThreads();
// teams of more than kMaxStealTeam threads and counts of 2^31 or more fall
// back to `schedule(static)`; with one thread, or called inside a parallel
// region (InParallelRegion), every item runs on the calling thread, in order, without
// opening a region.
inline constexpr int kMaxStealTeam = 64;
template <typename Fn>
void ParallelForStealing(int64_t items, const Fn& fn) {
  if (items <= 0) return;  // nothing to run (a negative count included)
  const int T = NumThreads();
  if (T == 1 || InParallelRegion()) {  // no one-thread team (see ParallelFor)
    for (int64_t i = 0; i < items; ++i) fn(i);
    return;
  }
  if (T > kMaxStealTeam || items >= (int64_t{1} << 31)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < items; ++i) fn(i);
    return;
  }
  // Per thread one word: front in the low 32 bits, back in the high 32.
  struct alignas(64) Range {
    std::atomic<uint64_t> fb;
  };
  Range ranges[kMaxStealTeam];
  for (int t = 0; t < T; ++t) {
    const uint64_t lo = static_cast<uint64_t>(items * t / T), hi = static_cast<uint64_t>(items * (t + 1) / T);
    ranges[t].fb.store(lo | (hi << 32), std::memory_order_relaxed);
  }
  // Takes one item from the front (owner) or the back (thief); -1 when empty.
  const auto take = [](Range& r, bool front) -> int64_t {
    uint64_t s = r.fb.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t f = s & 0xffffffffu, b = s >> 32;
      if (f >= b) return -1;
      const uint64_t next = front ? s + 1 : s - (uint64_t{1} << 32);
      if (r.fb.compare_exchange_weak(s, next, std::memory_order_acq_rel, std::memory_order_relaxed))
        return static_cast<int64_t>(front ? f : b - 1);
    }
  };
#pragma omp parallel num_threads(T)
  {
    const int t = omp_get_thread_num();
    for (int64_t i; (i = take(ranges[t], true)) >= 0;) fn(i);
    for (int v = 1; v < T; ++v)
      for (int64_t i; (i = take(ranges[(t + v) % T], false)) >= 0;) fn(i);
  }
}

// Runs fn(i) for every i in [0, n) (none when n <= 0) as `#pragma omp
// parallel for schedule(static) if(team)` would, except that when `team` is
// false, n is 1, the team has one thread or the call is already inside a
// parallel region (InParallelRegion), the loop runs on the calling thread without entering
// libgomp: an `if(false)` or nested region still builds a one-thread team,
// ~1.5 us per call on the Zen 5 VM of docs/kernels.md (a batch-1 decode step
// of the `large` preset opened ~220 of them). Each item must write its own
// outputs (the determinism rule above).
template <typename Fn>
void ParallelFor(int64_t n, bool team, const Fn& fn) {
  if (n <= 0) return;
  if (!team || n == 1 || NumThreads() == 1 || InParallelRegion()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace deepinfer
