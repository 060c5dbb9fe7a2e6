// deepinfer/format/safetensors.h — zero-copy reader for Hugging Face
// safetensors checkpoints (single file or sharded with
// model.safetensors.index.json). model-spec §2.1.
//
// Files are mmapped read-only; TensorView points into the mapping, so views
// stay valid as long as the TensorStore lives. All errors are thrown as
// deepinfer::Error with a one-line message naming the file and the tensor and
// saying expected vs found: truncated file, header length past EOF or absurdly
// large (> 100 MiB), bad JSON, unknown dtype string, shape/bytes mismatch,
// overlapping or out-of-range data_offsets, a tensor listed in the index but
// absent from its shard (or vice versa), duplicate tensor names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/dtype.h"

namespace deepinfer {

// A read-only view of one tensor's bytes inside a mapped file.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;     // as stored (packed FP4: [out, in/2])
  const uint8_t* data = nullptr;  // little-endian raw bytes
  size_t nbytes = 0;
  std::string file;               // shard file name (for error messages)

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  template <typename T> const T* as() const { return reinterpret_cast<const T*>(data); }
};

// One parsed safetensors file (header parsed, data mmapped).
class SafetensorsFile {
 public:
  // Opens and validates `path`. Throws Error on any malformation.
  static std::unique_ptr<SafetensorsFile> Open(const std::filesystem::path& path);
  // Parses a header from memory (the whole file image); used by the fuzzer
  // and tests. `name` is used in messages. Throws Error on malformation.
  static std::vector<TensorView> ParseHeader(const uint8_t* file_data, size_t file_size,
                                             const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory (model.safetensors, or the shards named by
// model.safetensors.index.json).
class TensorStore {
 public:
  // Throws Error: no safetensors in the directory, bad index JSON, index naming
  // a missing shard, tensor in index but not in shard (or the reverse).
  static std::unique_ptr<TensorStore> Open(const std::filesystem::path& model_dir);

  // nullptr if absent.
  const TensorView* Find(const std::string& name) const;
  // Throws Error(kNotFound) "missing tensor NAME in MODEL_DIR" if absent.
  const TensorView& Get(const std::string& name) const;
  // Every tensor, sorted by name.
  const std::map<std::string, TensorView>& all() const { return by_name_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> by_name_;
};

}  // namespace deepinfer
