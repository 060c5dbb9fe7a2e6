// base/malloc_tuning.h: freed heap memory stays with the process.
#include "base/malloc_tuning.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace deepinfer {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST(MallocTuning, UserSettingsWin) {
  ASSERT_EQ(setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1), 0);
  EXPECT_FALSE(RetainFreedMemory());
  ASSERT_EQ(unsetenv("MALLOC_TRIM_THRESHOLD_"), 0);
  ASSERT_EQ(setenv("GLIBC_TUNABLES", "glibc.malloc.top_pad=0", 1), 0);
  EXPECT_FALSE(RetainFreedMemory());
  ASSERT_EQ(unsetenv("GLIBC_TUNABLES"), 0);
}

TEST(MallocTuning, FreedHeapMemoryStaysWithTheProcess) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's malloc only";
#endif
  if (kSanitized) GTEST_SKIP() << "the sanitizer's allocator ignores mallopt";
  if (std::getenv("GLIBC_TUNABLES") != nullptr) GTEST_SKIP() << "GLIBC_TUNABLES set by the environment";
  ASSERT_TRUE(RetainFreedMemory());
  // 8 MiB: mmap-ed with glibc's defaults, from the heap (below the break) now.
  constexpr size_t kBytes = size_t{8} << 20;
  char* p = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBytes);
  char* brk_after_malloc = static_cast<char*>(sbrk(0));
  EXPECT_LT(p, brk_after_malloc);
  EXPECT_GE(brk_after_malloc - p, static_cast<std::ptrdiff_t>(kBytes));
  std::free(p);
  // Not trimmed: the break stays where it was (glibc's default would give the
  // top chunk back, the break going down by about 8 MiB).
  EXPECT_EQ(static_cast<char*>(sbrk(0)), brk_after_malloc);
}

}  // namespace
}  // namespace deepinfer
