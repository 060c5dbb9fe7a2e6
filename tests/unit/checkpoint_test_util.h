// Test helpers: a minimal safetensors writer and a self-deleting temp dir,
// used by safetensors_test, tensor_plan_test and config_test to build valid
// and corrupted checkpoints on the fly (tests never read ../shared).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "format/dtype.h"

namespace deepinfer::testing_util {

struct FakeTensor {
  std::string name;
  std::string dtype;            // safetensors dtype string
  std::vector<int64_t> shape;
  std::string bytes;            // empty: filled with a byte pattern of the right length
};

inline std::string LengthPrefixed(const std::string& header) {
  std::string out(8, '\0');
  uint64_t h = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h >> (8 * i)) & 0xFF);
  return out + header;
}

// header (padded to 8 with spaces) + data, exactly like make_tiny_v41.py.
inline std::string SafetensorsImage(const std::vector<FakeTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata = {}) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool f2 = true;
    for (const auto& [k, v] : metadata) {
      header += (f2 ? "" : ",") + std::string("\"") + k + "\":\"" + v + "\"";
      f2 = false;
    }
    header += "}";
    first = false;
  }
  std::string data;
  for (const FakeTensor& t : tensors) {
    std::string bytes = t.bytes;
    if (bytes.empty()) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      auto dt = ParseDType(t.dtype);
      const size_t len = static_cast<size_t>(n) * static_cast<size_t>(dt ? DTypeSize(*dt) : 1);
      bytes.resize(len);
      for (size_t i = 0; i < len; ++i) bytes[i] = static_cast<char>((i * 7 + t.name.size()) & 0xFF);
    }
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    header += (first ? "" : ",") + std::string("\"") + t.name + "\":{\"dtype\":\"" + t.dtype +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(data.size()) +
              "," + std::to_string(data.size() + bytes.size()) + "]}";
    first = false;
    data += bytes;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  return LengthPrefixed(header) + data;
}

inline void WriteFile(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << p;
}

inline std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("deepinfer_loader_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& s) const { return path_ / s; }

 private:
  std::filesystem::path path_;
};

// Runs `fn`, expects a deepinfer::Error whose message contains every one of
// `parts` and is a single line; returns the message.
template <typename Fn>
std::string ExpectError(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\": " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-deepinfer exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error thrown; expected one containing \"" << (parts.empty() ? "" : parts[0])
                << "\"";
  return "";
}

}  // namespace deepinfer::testing_util
