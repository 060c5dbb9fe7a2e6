// deepinfer/tools/py_json.h — a JSON emitter that writes exactly what Python's
// json.dumps(obj, indent=2, ensure_ascii=False) + "\n" writes: insertion-ordered
// keys, one item per line, ": " after keys, floats in repr() form. Used by the
// tiny-checkpoint generators, whose config files must be byte-identical to the
// Python reference generators' output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer::tiny {

// Python's repr(float): shortest round-trip digits; fixed notation when the
// decimal exponent is in [-4, 16), else d.ddde±XX; ".0" added to integers.
std::string PyFloatRepr(double d);

// A JSON value (ints, floats, bools, null, strings, arrays, insertion-ordered objects).
struct PyJson {
  enum Type { kInt, kFloat, kBool, kStr, kArr, kObj, kNull } type = kInt;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<PyJson> arr;
  std::vector<std::pair<std::string, PyJson>> obj;

  static PyJson Int(int64_t v) { PyJson j; j.type = kInt; j.i = v; return j; }
  static PyJson Float(double v) { PyJson j; j.type = kFloat; j.f = v; return j; }
  static PyJson Bool(bool v) { PyJson j; j.type = kBool; j.b = v; return j; }
  static PyJson Str(std::string v) { PyJson j; j.type = kStr; j.s = std::move(v); return j; }
  template <typename T>
  static PyJson IntList(const std::vector<T>& v) {
    PyJson j; j.type = kArr;
    for (auto x : v) j.arr.push_back(Int(static_cast<int64_t>(x)));
    return j;
  }
  static PyJson Obj() { PyJson j; j.type = kObj; return j; }
  static PyJson Null() { PyJson j; j.type = kNull; return j; }
  static PyJson OptFloat(const std::optional<double>& v) { return v ? Float(*v) : Null(); }
  PyJson& Add(std::string key, PyJson v) { obj.emplace_back(std::move(key), std::move(v)); return *this; }
};

// A JSON string literal of s (json.dumps escaping with ensure_ascii=False), appended to *out.
void EmitString(const std::string& s, std::string* out);
// json.dumps(j, indent=2) + "\n".
std::string Dump(const PyJson& j);

}  // namespace deepinfer::tiny
