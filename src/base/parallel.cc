#include "base/parallel.h"

#include <omp.h>

#include <thread>

#include "base/error.h"

namespace deepinfer {

int NumThreads() { return omp_get_max_threads(); }

void SetNumThreads(int n) {
  if (n > 1024) Fail(ErrorKind::kInvalidArgument, "--threads {} is too large (at most 1024)", n);
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(n);
}

}  // namespace deepinfer
