// Choosing the Highway target by name (`--target`, DEEPINFER_TARGET): see
// cpu_ops.h SelectTarget.
#include <hwy/targets.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_targets.h"

namespace deepinfer::cpu {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

std::string AvailableNames() {
  std::string r = "auto";
  for (int64_t t : AvailableTargets()) r += ", " + TargetFlagName(t);
  return r;
}


}  // namespace

bool ApplyTargetFromEnv() {
  const char* env = std::getenv("DEEPINFER_TARGET");
  if (env == nullptr || *env == '\0') return false;
  try {
    SelectTarget(env);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: DEEPINFER_TARGET: %s\n", e.what());
    std::exit(2);
  }
  return true;
}

std::string TargetFlagName(int64_t target) {
  if (target == HWY_AVX3) return "avx512";
  if (target == HWY_AVX2) return "avx2";
  return Lower(TargetName(target));
}

void SelectTarget(const std::string& name) {
  const std::string n = Lower(name);
  if (n == "auto") {
    ForceTarget(0);
    return;
  }
  ForceTarget(0);  // AvailableTargets() must see every supported target
  for (int64_t t : AvailableTargets()) {
    if (n == TargetFlagName(t) || n == Lower(TargetName(t)) || (t == HWY_AVX3 && n == "avx3")) {
      ForceTarget(t);
      return;
    }
  }
  Fail(ErrorKind::kInvalidArgument, "--target {}: not a target this binary and CPU support (available: {})", name,
       AvailableNames());
}

}  // namespace deepinfer::cpu
