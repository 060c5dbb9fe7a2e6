#include "base/alloc_count.h"

#include <atomic>
#include <cstddef>

#include "base/sanitizers.h"

// Sanitizer runtimes interpose the allocator themselves (and call malloc before
// their own start-up, where this counter's instrumented code would crash): in
// such builds nothing is interposed and HeapAllocations() stays 0.
#define DEEPINFER_COUNT_ALLOCATIONS (!DEEPINFER_SANITIZER_ALLOCATOR)

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace deepinfer {
namespace {
std::atomic<uint64_t> g_allocations{0};
inline void Count() { g_allocations.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

uint64_t HeapAllocations() { return g_allocations.load(std::memory_order_relaxed); }

}  // namespace deepinfer

#if DEEPINFER_COUNT_ALLOCATIONS
extern "C" {
void* malloc(size_t n) {
  deepinfer::Count();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  deepinfer::Count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  deepinfer::Count();
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t align, size_t n) {
  deepinfer::Count();
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  deepinfer::Count();
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return 22;  // EINVAL
  void* p = __libc_memalign(align, n);
  if (p == nullptr && n != 0) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}
#endif  // DEEPINFER_COUNT_ALLOCATIONS
