#pragma once
// Reading optional string fields of untrusted JSON (request bodies, chat
// messages). nlohmann's value("key", "") throws type_error when the field
// exists with another type ({"type": {...}}); these helpers treat a field of
// the wrong type like a missing one, so the caller's own validation (which
// names the field) decides what is an error.

#include <string>

namespace deepinfer {

// o[key] when o is an object whose `key` is a string; else `fallback`.
// Json: nlohmann::json or nlohmann::ordered_json. Never throws (beyond
// std::bad_alloc).
template <class Json>
std::string StringField(const Json& o, const char* key, const std::string& fallback = "") {
  if (!o.is_object()) return fallback;
  auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return fallback;
  return it->template get<std::string>();
}

}  // namespace deepinfer
