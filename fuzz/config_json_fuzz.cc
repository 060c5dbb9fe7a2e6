// libFuzzer target: ModelConfig::FromJsonText + ExpectedTensors on arbitrary
// config.json text. Contract (model/config.h, model/tensor_plan.h): either a
// valid config and tensor plan, or deepinfer::Error — never a crash, another
// exception type, an out-of-memory or a hang (absurd sizes are refused with an
// error before anything is allocated). Build and run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "model/config.h"
#include "model/tensor_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    deepinfer::ModelConfig c = deepinfer::ModelConfig::FromJsonText(text, "config.json");
    deepinfer::SummarizeTensors(deepinfer::ExpectedTensors(c));
  } catch (const deepinfer::Error&) {
    // Expected for malformed or inconsistent configs.
  }
  return 0;
}
