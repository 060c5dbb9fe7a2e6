// deepinfer/format/safetensors.h — zero-copy reader for Hugging Face
// safetensors checkpoints (single file or sharded with
// model.safetensors.index.json). model-spec §2.1.
//
// File layout: 8 bytes little-endian u64 H (header length), H bytes of UTF-8
// JSON, then the tensor data. The JSON is an object; every key except
// "__metadata__" names a tensor and maps to
//   {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [BEGIN, END]}
// with offsets relative to the first data byte (8 + H). "__metadata__" is an
// object of string values.
//
// Files are mmapped read-only; TensorView points into the mapping, so views
// stay valid as long as the SafetensorsFile / TensorStore lives. Tensor data is
// not copied and may be unaligned for multi-byte dtypes when the writer did not
// align offsets (memcpy, or check alignment, before using as<T>() on them).
//
// Errors: every malformation throws deepinfer::Error with ONE line that names
// the file (and the tensor where there is one) and says expected vs found:
//   * kCorruptData: file shorter than 8 bytes, header not valid JSON / not an
//     object / nested deeper than a header can be, duplicate key, an entry that
//     is not an object or lacks dtype/shape/data_offsets or has the wrong JSON
//     types, unknown dtype string, negative or non-integer dimension, element
//     count overflow, data_offsets with begin > end, byte length != numel x
//     dtype size (I8 packed FP4: numel of the STORED shape, one byte each),
//     two tensors' byte ranges overlapping, "__metadata__" not a string map.
//   * kOutOfRange: header length past EOF or above kMaxHeaderBytes (100 MiB),
//     data_offsets past the end of the data.
//   * kNotFound: file or directory missing, shard named by the index missing,
//     tensor absent (TensorStore::Get).
// Gaps between tensors and trailing bytes after the last one are accepted.
// Names from the file are printed with control bytes escaped (\xNN), so a
// message is always one line.
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

// Largest accepted JSON header (the safetensors reference uses the same cap).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// A read-only view of one tensor's bytes inside a mapped file.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;     // as stored (packed FP4: [out, in/2])
  const uint8_t* data = nullptr;  // little-endian raw bytes (possibly unaligned, see above)
  size_t nbytes = 0;
  std::string file;               // shard file name, e.g. "model.safetensors" (for messages)

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  template <typename T> const T* as() const { return reinterpret_cast<const T*>(data); }
};

// "[512, 64]" — the shape notation used in every message.
std::string ShapeString(const std::vector<int64_t>& shape);
// `s` with bytes < 0x20 and 0x7F written as \xNN (keeps messages on one line).
std::string PrintableName(const std::string& s);

// Result of parsing a whole file image (see SafetensorsFile::Parse).
struct SafetensorsHeader {
  std::vector<TensorView> tensors;              // sorted by name; data points into the image
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty if absent)
  uint64_t data_offset = 0;                     // 8 + H: first data byte in the file
};

// One parsed safetensors file (header parsed, data mmapped).
class SafetensorsFile {
 public:
  // Opens, maps and validates `path`. Messages name `path` as given; each
  // TensorView::file is path.filename(). Throws Error on any malformation.
  static std::unique_ptr<SafetensorsFile> Open(const std::filesystem::path& path);
  // Parses and validates a whole file image held in memory; `name` is used in
  // messages and as TensorView::file. Never reads outside [file_data,
  // file_data + file_size). Throws Error on malformation.
  static SafetensorsHeader Parse(const uint8_t* file_data, size_t file_size,
                                 const std::string& name);
  // Parse(...).tensors; used by the fuzzer and tests.
  static std::vector<TensorView> ParseHeader(const uint8_t* file_data, size_t file_size,
                                             const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }
  size_t file_size() const { return map_size_; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory.
//
// If MODEL_DIR/model.safetensors.index.json exists it is authoritative: it must
// be a JSON object with a "weight_map" object {tensor name: shard file name};
// shard names must be plain file names inside MODEL_DIR; every shard it names
// must exist; every tensor it lists must be in the shard it names and every
// tensor of those shards must be listed (under that shard); a tensor may not
// appear in two shards. If "metadata"."total_size" is present it must equal the
// sum of the tensors' byte lengths. Otherwise MODEL_DIR/model.safetensors is
// opened alone.
class TensorStore {
 public:
  // Throws Error: directory missing, neither file present, bad index JSON or
  // types, index naming a missing shard, tensor in index but not in its shard
  // (or the reverse), duplicate tensor across shards, total_size mismatch, and
  // every SafetensorsFile::Open error.
  static std::unique_ptr<TensorStore> Open(const std::filesystem::path& model_dir);

  // nullptr if absent.
  const TensorView* Find(const std::string& name) const;
  // Throws Error(kNotFound) "missing tensor NAME in MODEL_DIR" if absent.
  const TensorView& Get(const std::string& name) const;
  // Every tensor, sorted by name.
  const std::map<std::string, TensorView>& all() const { return by_name_; }
  const std::filesystem::path& dir() const { return dir_; }
  // Shard file names in the order they were opened.
  std::vector<std::string> shard_names() const;
  // Sum of nbytes over all tensors.
  uint64_t total_bytes() const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> by_name_;
};

// Makes the pages of [p, p + bytes) of a read-only file mapping (a
// TensorView's data) present in this process's page table, so that later
// reads of them do not fault: madvise(MADV_POPULATE_READ) (Linux >= 5.14),
// or one read per 4 KiB page where the kernel refuses it. For the tables a
// decode step reads at random rows (the token embedding, Engram's tables):
// measured on a 2-vCPU VM, the first read of a mapped page-cache page cost
// 70-125 us (a fault), a later one 0.06 us, and a batch-1 decode step of the
// `large` preset took ~7.5 such faults (docs/kernels-log.md). The bytes are
// unchanged (read-only); it reads the range from disk now if it is not in
// the page cache. bytes == 0 does nothing; p need not be page-aligned.
// Never throws: a range the kernel cannot populate is left to fault as before.
void PrefaultMapped(const void* p, size_t bytes);

}  // namespace deepinfer
