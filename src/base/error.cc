#include "base/error.h"

namespace deepinfer {

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid_argument";
    case ErrorKind::kNotFound: return "not_found";
    case ErrorKind::kCorruptData: return "corrupt_data";
    case ErrorKind::kOutOfRange: return "out_of_range";
    case ErrorKind::kResourceExhausted: return "resource_exhausted";
    case ErrorKind::kInternal: return "internal";
    case ErrorKind::kUnavailable: return "unavailable";
  }
  return "unknown";
}

}  // namespace deepinfer
