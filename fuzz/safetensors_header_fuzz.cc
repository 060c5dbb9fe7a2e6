// libFuzzer target: SafetensorsFile::Parse on arbitrary file images.
//
// Contract (format/safetensors.h): for any input the parser either returns
// views that lie inside the input or throws deepinfer::Error. Anything else —
// a crash, an ASan report, another exception type (std::bad_alloc,
// nlohmann::json::exception, std::length_error), a timeout — is a bug.
// Build and run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "base/error.h"
#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    deepinfer::SafetensorsHeader h =
        deepinfer::SafetensorsFile::Parse(data, size, "fuzz.safetensors");
    // Every view must lie inside the image; touch its first and last byte so
    // ASan flags an out-of-range pointer.
    volatile uint8_t sink = 0;
    for (const deepinfer::TensorView& t : h.tensors) {
      if (t.nbytes == 0) continue;
      if (t.data < data || t.data + t.nbytes > data + size) std::abort();
      sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
    }
    (void)sink;
  } catch (const deepinfer::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
