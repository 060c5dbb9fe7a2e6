#include "base/malloc_tuning.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "base/sanitizers.h"

namespace deepinfer {

bool RetainFreedMemory() {
#if DEEPINFER_SANITIZER_ALLOCATOR  // its own allocator, which mallopt does not reach
  return false;
#elif defined(__GLIBC__)
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr)
    return false;
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(v) != nullptr) return false;
  bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && ok;
  ok = mallopt(M_TOP_PAD, 16 << 20) == 1 && ok;
  return ok;
#else
  return false;
#endif
}

}  // namespace deepinfer
