// deepinfer/base/sanitizers.h — whether this translation unit is built with
// a sanitizer that brings its own allocator (ASan, TSan, MSan; GCC's
// __SANITIZE_* macros, clang's __has_feature). Such builds neither interpose
// malloc (base/alloc_count.h) nor tune it (base/malloc_tuning.h).
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DEEPINFER_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define DEEPINFER_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifndef DEEPINFER_SANITIZER_ALLOCATOR
#define DEEPINFER_SANITIZER_ALLOCATOR 0
#endif
