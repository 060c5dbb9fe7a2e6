// deepinfer/tools/py_json.cc — see py_json.h.
#include "tools/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace deepinfer::tiny {

// ============================================================================
// A JSON emitter that writes what Python's json.dumps(obj, indent=2) writes:
// insertion-ordered keys, ", " never used (one item per line), ": " after keys,
// floats in repr() form.
// ============================================================================

// Python's repr(float): shortest round-trip digits; fixed notation when the
// decimal exponent is in [-4, 16), else d.ddde±XX; ".0" added to integers.
std::string PyFloatRepr(double d) {
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  std::string sign = d < 0 ? "-" : "";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, std::fabs(d), std::chars_format::scientific);
  std::string s(buf, res.ptr);
  const size_t epos = s.find('e');
  std::string mant = s.substr(0, epos);
  const int exp10 = std::stoi(s.substr(epos + 1));
  std::string digits;
  for (char ch : mant)
    if (ch != '.') digits += ch;
  if (exp10 >= -4 && exp10 < 16) {
    std::string out;
    if (exp10 >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp10 + 1));
      while (ip.size() < static_cast<size_t>(exp10 + 1)) ip += '0';
      std::string fp = digits.size() > static_cast<size_t>(exp10 + 1) ? digits.substr(exp10 + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(-exp10 - 1, '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return sign + out + eb;
}


void EmitString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (ch < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", ch);
          *out += b;
        } else {
          *out += static_cast<char>(ch);
        }
    }
  }
  *out += '"';
}

namespace {
void Emit(const PyJson& j, int depth, std::string* out) {
  const std::string ind(2 * (depth + 1), ' '), ind0(2 * depth, ' ');
  switch (j.type) {
    case PyJson::kInt: *out += std::to_string(j.i); break;
    case PyJson::kFloat: *out += PyFloatRepr(j.f); break;
    case PyJson::kBool: *out += j.b ? "true" : "false"; break;
    case PyJson::kNull: *out += "null"; break;
    case PyJson::kStr: EmitString(j.s, out); break;
    case PyJson::kArr:
      if (j.arr.empty()) { *out += "[]"; break; }
      *out += "[\n";
      for (size_t k = 0; k < j.arr.size(); ++k) {
        *out += ind;
        Emit(j.arr[k], depth + 1, out);
        *out += k + 1 < j.arr.size() ? ",\n" : "\n";
      }
      *out += ind0 + "]";
      break;
    case PyJson::kObj:
      if (j.obj.empty()) { *out += "{}"; break; }
      *out += "{\n";
      for (size_t k = 0; k < j.obj.size(); ++k) {
        *out += ind;
        EmitString(j.obj[k].first, out);
        *out += ": ";
        Emit(j.obj[k].second, depth + 1, out);
        *out += k + 1 < j.obj.size() ? ",\n" : "\n";
      }
      *out += ind0 + "}";
      break;
  }
}

}  // namespace

std::string Dump(const PyJson& j) {
  std::string out;
  Emit(j, 0, &out);
  out += "\n";
  return out;
}


}  // namespace deepinfer::tiny
