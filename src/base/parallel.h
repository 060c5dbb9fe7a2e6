// deepinfer/base/parallel.h — the project's thread pool is OpenMP (README
// "Threads"). Debian 12's Highway 1.0.3 has no pool; OpenMP comes with g++.
// Determinism rule: work is split over independent output rows/experts/heads;
// every reduction runs in a fixed order inside one thread, so results never
// depend on the thread count.
#pragma once

#include <cstdint>

namespace deepinfer {

// Number of worker threads used by kernels (>= 1).
int NumThreads();
// Sets the worker count (n <= 0 → hardware concurrency). Throws kInvalidArgument
// for n > 1024.
void SetNumThreads(int n);

}  // namespace deepinfer
