#include "format/dtype.h"

namespace deepinfer {
namespace {
struct Entry { DType t; std::string_view name; int size; };
constexpr Entry kEntries[] = {
    {DType::kBF16, "BF16", 2},    {DType::kF16, "F16", 2},         {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},      {DType::kF8E4M3, "F8_E4M3", 1},  {DType::kF8E8M0, "F8_E8M0", 1},
    {DType::kI8, "I8", 1},        {DType::kU8, "U8", 1},           {DType::kI16, "I16", 2},
    {DType::kI32, "I32", 4},      {DType::kI64, "I64", 8},         {DType::kBool, "BOOL", 1},
};
}  // namespace

int DTypeSize(DType t) {
  for (const auto& e : kEntries) if (e.t == t) return e.size;
  return 0;
}
std::string_view DTypeName(DType t) {
  for (const auto& e : kEntries) if (e.t == t) return e.name;
  return "?";
}
std::optional<DType> ParseDType(std::string_view s) {
  for (const auto& e : kEntries) if (e.name == s) return e.t;
  return std::nullopt;
}

}  // namespace deepinfer
