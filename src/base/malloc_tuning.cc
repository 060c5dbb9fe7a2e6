#include "base/malloc_tuning.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// Sanitizer runtimes bring their own allocator, which mallopt does not reach.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DEEPINFER_TUNE_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define DEEPINFER_TUNE_MALLOC 0
#endif
#endif
#ifndef DEEPINFER_TUNE_MALLOC
#define DEEPINFER_TUNE_MALLOC 1
#endif

namespace deepinfer {

bool RetainFreedMemory() {
#if !DEEPINFER_TUNE_MALLOC
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
