// base/malloc_tuning.h: freed heap memory stays with the process.
#include "base/malloc_tuning.h"
#include "base/sanitizers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

namespace deepinfer {
namespace {

constexpr bool kSanitized = DEEPINFER_SANITIZER_ALLOCATOR;

// Sets (or unsets, value null) an environment variable for the scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// Whether the environment names malloc settings or another allocator.
bool EnvironmentChangesMalloc() {
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr)
    return true;
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "LD_PRELOAD"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

TEST(MallocTuning, UserSettingsWin) {
  {
    ScopedEnv trim("MALLOC_TRIM_THRESHOLD_", "131072");
    EXPECT_FALSE(RetainFreedMemory());
  }
  {
    ScopedEnv tunables("GLIBC_TUNABLES", "glibc.malloc.top_pad=0");
    EXPECT_FALSE(RetainFreedMemory());
  }
}

TEST(MallocTuning, FreedHeapMemoryStaysWithTheProcess) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's malloc only";
#endif
  if (kSanitized) GTEST_SKIP() << "the sanitizer's allocator ignores mallopt";
  if (EnvironmentChangesMalloc()) GTEST_SKIP() << "malloc settings or another allocator from the environment";
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
