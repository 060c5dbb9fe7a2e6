// deepinfer/base/alloc_count.h — a count of heap allocations, for benchmarks
// (`bench e2e` reports allocations per decode step).
//
// Linking a program that calls HeapAllocations() interposes the C allocator
// entry points (malloc, calloc, realloc, aligned_alloc, posix_memalign; glibc:
// they forward to __libc_*), so every allocation of the process is counted,
// C++ operator new included (libstdc++'s calls malloc). Programs that do not
// call it are unaffected. In sanitizer builds (ASan, TSan) nothing is
// interposed and the count stays 0.
#pragma once

#include <cstdint>

namespace deepinfer {

// Allocations made by the whole process so far (all threads; relaxed count).
uint64_t HeapAllocations();

}  // namespace deepinfer
