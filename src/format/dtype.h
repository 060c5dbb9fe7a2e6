// deepinfer/format/dtype.h — element types that appear in safetensors files of
// the DeepSeek-V4 family (model-spec §2.1, §2.2).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
  kBF16,     // "BF16"
  kF16,      // "F16"
  kF32,      // "F32"
  kF64,      // "F64"
  kF8E4M3,   // "F8_E4M3"  (OCP E4M3FN)
  kF8E8M0,   // "F8_E8M0"  (UE8M0 scale bytes)
  kI8,       // "I8"       (packed FP4 E2M1 pairs in expert weights)
  kU8,       // "U8"
  kI16,      // "I16"
  kI32,      // "I32"
  kI64,      // "I64"      (V4 tid2eid)
  kBool,     // "BOOL"
};

// Bytes per stored element (1 for I8 even when it holds two FP4 values).
int DTypeSize(DType t);
// The safetensors dtype string ("BF16", "F8_E4M3", ...).
std::string_view DTypeName(DType t);
// Parses a safetensors dtype string; nullopt for an unknown one (the caller
// names the file and tensor in its error).
std::optional<DType> ParseDType(std::string_view s);

}  // namespace deepinfer
