// Safetensors reader: header validation, mmap, sharded directories.
// See safetensors.h for the format and the list of checked malformations.
#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace deepinfer {

using json = nlohmann::json;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string PrintableName(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

namespace {

// A JSON parse error message from nlohmann, made one short line.
std::string JsonErrorText(const json::exception& e) {
  std::string_view w = e.what();
  // Drop the "[json.exception.parse_error.101] " prefix.
  if (!w.empty() && w.front() == '[') {
    size_t close = w.find("] ");
    if (close != std::string_view::npos) w.remove_prefix(close + 2);
  }
  std::string s = PrintableName(std::string(w.substr(0, 240)));
  if (w.size() > 240) s += "...";
  return s;
}

// Describes a JSON value's type for "found ..." parts of messages.
std::string JsonTypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a non-integer number";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "a discarded value";
  }
  return "?";
}

// Parses JSON text with the checks a safetensors header / index needs: one
// line errors, duplicate keys rejected (nlohmann would silently keep the last),
// nesting capped at `max_depth` levels of objects/arrays.
// The SAX events of nlohmann's DOM builder, with the two checks added: a
// repeated key in one object, and nesting deeper than max_depth. (nlohmann's
// callback parser, used before, rescans the parent object after every nested
// value ends — quadratic in the number of tensors of a header: 0.7 s for the
// 13 201 entries of the `large` tiny preset's header.)
class StrictJsonSax {
 public:
  StrictJsonSax(json& root, const std::string& what, int max_depth)
      : dom_(root, /*allow_exceptions=*/true), what_(what), max_depth_(max_depth) {}
  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& text) { return dom_.number_float(v, text); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    Open(true);
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second)
      Fail(ErrorKind::kCorruptData, "{}: duplicate JSON key \"{}\"", what_, PrintableName(k));
    return dom_.key(k);
  }
  bool end_object() {
    Close();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    Open(false);
    return dom_.start_array(n);
  }
  bool end_array() {
    Close();
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t pos, const std::string& token, const Exception& ex) {
    return dom_.parse_error(pos, token, ex);  // throws ex
  }

 private:
  void Open(bool object) {
    if (static_cast<int>(is_object_.size()) >= max_depth_)
      Fail(ErrorKind::kCorruptData, "{}: JSON nested deeper than {} levels", what_, max_depth_);
    is_object_.push_back(object);
    if (object) keys_.emplace_back();
  }
  void Close() {
    if (is_object_.empty()) return;
    if (is_object_.back()) keys_.pop_back();
    is_object_.pop_back();
  }
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const std::string& what_;
  int max_depth_;
  std::vector<std::set<std::string>> keys_;  // one key set per open object
  std::vector<bool> is_object_;              // open containers
};

json ParseStrictJson(const char* begin, const char* end, const std::string& what,
                     int max_depth) {
  json root;
  StrictJsonSax sax(root, what, max_depth);
  try {
    json::sax_parse(begin, end, &sax, json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    Fail(ErrorKind::kCorruptData, "{}: not valid JSON: {}", what, JsonErrorText(e));
  }
  return root;
}

// Reads a JSON value that must be a non-negative integer fitting int64.
bool NonNegInt(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = u;
    return true;
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
    return true;
  }
  return false;
}

std::string JsonScalarText(const json& v) {
  if (v.is_number() || v.is_boolean() || v.is_null())
    return v.dump();
  return JsonTypeName(v);
}

}  // namespace

SafetensorsHeader SafetensorsFile::Parse(const uint8_t* data, size_t size,
                                         const std::string& name) {
  const std::string file = PrintableName(name);
  if (size < 8)
    Fail(ErrorKind::kCorruptData,
         "{}: file is {} bytes, expected at least 8 (the header length field); truncated?", file,
         size);
  uint64_t h = 0;
  for (int i = 7; i >= 0; --i) h = (h << 8) | data[i];
  if (h > kMaxHeaderBytes)
    Fail(ErrorKind::kOutOfRange,
         "{}: header length {} bytes, expected at most {} (100 MiB); not a safetensors file?",
         file, h, kMaxHeaderBytes);
  if (h > size - 8)
    Fail(ErrorKind::kOutOfRange,
         "{}: header length {} bytes runs past the end of the file: expected at least {} bytes "
         "after the 8-byte length field, found {}; truncated?",
         file, h, h, size - 8);

  SafetensorsHeader out;
  out.data_offset = 8 + h;
  const uint64_t data_size = size - out.data_offset;
  const uint8_t* data_base = data + out.data_offset;

  const char* jb = reinterpret_cast<const char*>(data + 8);
  // Valid headers nest at most 3 levels: {name: {"shape": [..]}}.
  json root = ParseStrictJson(jb, jb + h, file + ": header", 3);
  if (!root.is_object())
    Fail(ErrorKind::kCorruptData, "{}: header is {}, expected a JSON object", file,
         JsonTypeName(root));

  struct Range { uint64_t begin, end; size_t idx; };
  std::vector<Range> ranges;
  out.tensors.reserve(root.size());

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object())
        Fail(ErrorKind::kCorruptData, "{}: __metadata__ is {}, expected an object of strings",
             file, JsonTypeName(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          Fail(ErrorKind::kCorruptData,
               "{}: __metadata__ key \"{}\": expected a string value, found {}", file,
               PrintableName(m.key()), JsonTypeName(m.value()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tname = PrintableName(key);
    if (key.empty())
      Fail(ErrorKind::kCorruptData, "{}: tensor with an empty name", file);
    if (!v.is_object())
      Fail(ErrorKind::kCorruptData, "{}: tensor {}: entry is {}, expected an object with dtype, "
           "shape and data_offsets", file, tname, JsonTypeName(v));
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        Fail(ErrorKind::kCorruptData,
             "{}: tensor {}: unexpected field \"{}\", expected only dtype, shape, data_offsets",
             file, tname, PrintableName(f.key()));
    }
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!v.contains(field))
        Fail(ErrorKind::kCorruptData, "{}: tensor {}: missing field \"{}\"", file, tname, field);
    }
    TensorView t;
    t.name = key;
    t.file = name;

    const json& jd = v["dtype"];
    if (!jd.is_string())
      Fail(ErrorKind::kCorruptData, "{}: tensor {}: dtype is {}, expected a string", file, tname,
           JsonTypeName(jd));
    const std::string& ds = jd.get_ref<const std::string&>();
    auto dt = ParseDType(ds);
    if (!dt)
      Fail(ErrorKind::kCorruptData,
           "{}: tensor {}: unknown dtype \"{}\", expected one of BF16, F16, F32, F64, F8_E4M3, "
           "F8_E8M0, I8, U8, I16, I32, I64, BOOL",
           file, tname, PrintableName(ds.substr(0, 64)));
    t.dtype = *dt;

    const json& js = v["shape"];
    if (!js.is_array())
      Fail(ErrorKind::kCorruptData, "{}: tensor {}: shape is {}, expected an array of integers",
           file, tname, JsonTypeName(js));
    uint64_t numel = 1;
    for (size_t i = 0; i < js.size(); ++i) {
      uint64_t d = 0;
      if (!NonNegInt(js[i], &d))
        Fail(ErrorKind::kCorruptData,
             "{}: tensor {}: shape[{}] is {}, expected a non-negative integer", file, tname, i,
             JsonScalarText(js[i]));
      t.shape.push_back(static_cast<int64_t>(d));
      if (__builtin_mul_overflow(numel, d, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        Fail(ErrorKind::kCorruptData, "{}: tensor {}: element count of shape {} overflows",
             file, tname, ShapeString(t.shape));
    }

    const json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      Fail(ErrorKind::kCorruptData,
           "{}: tensor {}: data_offsets is {}, expected an array of 2 integers [begin, end]", file,
           tname, jo.is_array() ? fmt::format("an array of {}", jo.size()) : JsonTypeName(jo));
    uint64_t b = 0, e = 0;
    if (!NonNegInt(jo[0], &b) || !NonNegInt(jo[1], &e))
      Fail(ErrorKind::kCorruptData,
           "{}: tensor {}: data_offsets [{}, {}], expected non-negative integers", file, tname,
           JsonScalarText(jo[0]), JsonScalarText(jo[1]));
    if (b > e)
      Fail(ErrorKind::kCorruptData,
           "{}: tensor {}: data_offsets [{}, {}]: begin is after end", file, tname, b, e);
    if (e > data_size)
      Fail(ErrorKind::kOutOfRange,
           "{}: tensor {}: data_offsets [{}, {}] run past the end of the data: expected end <= {}, "
           "found {}; truncated?",
           file, tname, b, e, data_size, e);
    uint64_t expect = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(t.dtype)), &expect))
      Fail(ErrorKind::kCorruptData, "{}: tensor {}: byte size of shape {} overflows", file, tname,
           ShapeString(t.shape));
    if (e - b != expect)
      Fail(ErrorKind::kCorruptData,
           "{}: tensor {}: {} {} needs {} bytes, found data_offsets [{}, {}] = {} bytes", file,
           tname, DTypeName(t.dtype), ShapeString(t.shape), expect, b, e, e - b);
    t.data = data_base + b;
    t.nbytes = static_cast<size_t>(e - b);
    ranges.push_back({b, e, out.tensors.size()});
    out.tensors.push_back(std::move(t));
  }

  // Overlap check over non-empty ranges, in offset order.
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev && r.begin < prev->end)
      Fail(ErrorKind::kCorruptData,
           "{}: tensor {}: data_offsets [{}, {}] overlap tensor {}'s [{}, {}]; expected disjoint "
           "byte ranges",
           file, PrintableName(out.tensors[r.idx].name), r.begin, r.end,
           PrintableName(out.tensors[prev->idx].name), prev->begin, prev->end);
    if (!prev || r.end > prev->end) prev = &r;
  }
  return out;
}

std::vector<TensorView> SafetensorsFile::ParseHeader(const uint8_t* file_data, size_t file_size,
                                                     const std::string& name) {
  return Parse(file_data, file_size, name).tensors;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::Open(const std::filesystem::path& path) {
  const std::string ps = PrintableName(path.string());
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    Fail(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kInvalidArgument, "{}: cannot open: {}",
         ps, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    Fail(ErrorKind::kInvalidArgument, "{}: cannot stat: {}", ps, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    Fail(ErrorKind::kInvalidArgument, "{}: not a regular file", ps);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  if (size < 8) {
    ::close(fd);
    // Parse reports the exact message for short files.
    uint8_t dummy[8] = {};
    Parse(dummy, size, path.string());
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (m == MAP_FAILED)
    Fail(ErrorKind::kResourceExhausted, "{}: mmap of {} bytes failed: {}", ps, size,
         std::strerror(err));
  f->map_ = m;
  f->map_size_ = size;
  SafetensorsHeader h =
      Parse(static_cast<const uint8_t*>(m), size, path.string());  // f owns the map on throw
  const std::string base = path.filename().string();
  for (auto& t : h.tensors) t.file = base;
  f->tensors_ = std::move(h.tensors);
  f->metadata_ = std::move(h.metadata);
  return f;
}

void PrefaultMapped(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  const long page_l = ::sysconf(_SC_PAGESIZE);
  const uintptr_t page = page_l > 0 ? static_cast<uintptr_t>(page_l) : 4096;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
#ifdef MADV_POPULATE_READ
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) == 0) return;
#endif
  // Older kernels (EINVAL) and anything else: touch one byte per page.
  volatile uint8_t sink = 0;
  for (uintptr_t a = std::max(begin, reinterpret_cast<uintptr_t>(p)); a < end; a = (a / page + 1) * page)
    sink = static_cast<uint8_t>(sink + *reinterpret_cast<const volatile uint8_t*>(a));
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ && map_size_) ::munmap(map_, map_size_);
}

// ---------------------------------------------------------------------------
// TensorStore

namespace {

std::string ReadTextFile(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    Fail(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kInvalidArgument, "{}: cannot open: {}",
         PrintableName(p.string()), std::strerror(err));
  }
  std::string s;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      Fail(ErrorKind::kInvalidArgument, "{}: read failed: {}", PrintableName(p.string()),
           std::strerror(err));
    }
    if (n == 0) break;
    s.append(buf, static_cast<size_t>(n));
    if (s.size() > (1ull << 30)) {
      ::close(fd);
      Fail(ErrorKind::kOutOfRange, "{}: larger than 1 GiB, expected a small JSON file",
           PrintableName(p.string()));
    }
  }
  ::close(fd);
  return s;
}

bool PlainFileName(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

std::unique_ptr<TensorStore> TensorStore::Open(const std::filesystem::path& model_dir) {
  namespace fs = std::filesystem;
  const std::string dir = PrintableName(model_dir.string());
  std::error_code ec;
  if (!fs::exists(model_dir, ec))
    Fail(ErrorKind::kNotFound, "{}: no such directory", dir);
  if (!fs::is_directory(model_dir, ec))
    Fail(ErrorKind::kInvalidArgument, "{}: not a directory, expected a model directory", dir);

  auto store = std::make_unique<TensorStore>();
  store->dir_ = model_dir;
  const fs::path index_path = model_dir / "model.safetensors.index.json";
  const fs::path single_path = model_dir / "model.safetensors";

  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec))
      Fail(ErrorKind::kNotFound,
           "{}: no model.safetensors.index.json or model.safetensors, expected a safetensors "
           "checkpoint",
           dir);
    store->files_.push_back(SafetensorsFile::Open(single_path));
    for (const TensorView& t : store->files_.back()->tensors()) store->by_name_[t.name] = t;
    return store;
  }

  const std::string iname = PrintableName(index_path.string());
  const std::string text = ReadTextFile(index_path);
  json index = ParseStrictJson(text.data(), text.data() + text.size(), iname, 8);
  if (!index.is_object())
    Fail(ErrorKind::kCorruptData, "{}: is {}, expected a JSON object", iname, JsonTypeName(index));
  if (!index.contains("weight_map"))
    Fail(ErrorKind::kCorruptData, "{}: missing key \"weight_map\"", iname);
  const json& wm = index["weight_map"];
  if (!wm.is_object())
    Fail(ErrorKind::kCorruptData, "{}: weight_map is {}, expected an object {{tensor: shard}}",
         iname, JsonTypeName(wm));

  // shard -> tensors the index puts there, in shard first-seen (sorted-name) order.
  std::map<std::string, std::string> tensor_to_shard;
  std::vector<std::string> shard_order;
  std::set<std::string> shard_set;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    if (!it.value().is_string())
      Fail(ErrorKind::kCorruptData, "{}: weight_map[\"{}\"] is {}, expected a shard file name",
           iname, PrintableName(it.key()), JsonTypeName(it.value()));
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!PlainFileName(shard))
      Fail(ErrorKind::kCorruptData,
           "{}: weight_map[\"{}\"] = \"{}\", expected a plain file name inside {}", iname,
           PrintableName(it.key()), PrintableName(shard), dir);
    tensor_to_shard[it.key()] = shard;
    if (shard_set.insert(shard).second) shard_order.push_back(shard);
  }
  for (const std::string& shard : shard_order) {
    if (!fs::exists(model_dir / shard, ec)) {
      std::string example;
      for (const auto& [t, s] : tensor_to_shard)
        if (s == shard) { example = t; break; }
      Fail(ErrorKind::kNotFound,
           "{}: weight_map names shard {} (e.g. for tensor {}), but {} does not exist", iname,
           PrintableName(shard), PrintableName(example),
           PrintableName((model_dir / shard).string()));
    }
  }

  std::map<std::string, std::string> seen_in;  // tensor -> shard it was found in
  for (const std::string& shard : shard_order) {
    store->files_.push_back(SafetensorsFile::Open(model_dir / shard));
    for (const TensorView& t : store->files_.back()->tensors()) {
      auto prev = seen_in.find(t.name);
      if (prev != seen_in.end())
        Fail(ErrorKind::kCorruptData, "{}: tensor {} appears in two shards: {} and {}", dir,
             PrintableName(t.name), PrintableName(prev->second), PrintableName(shard));
      seen_in[t.name] = shard;
      auto m = tensor_to_shard.find(t.name);
      if (m == tensor_to_shard.end())
        Fail(ErrorKind::kCorruptData,
             "{}: tensor {}: present in the shard but not listed in the weight_map of {}",
             PrintableName(shard), PrintableName(t.name), iname);
      if (m->second != shard)
        Fail(ErrorKind::kCorruptData,
             "{}: tensor {}: {} maps it to shard {}, found it in {}", PrintableName(shard),
             PrintableName(t.name), iname, PrintableName(m->second), PrintableName(shard));
      store->by_name_[t.name] = t;
    }
  }
  for (const auto& [t, shard] : tensor_to_shard) {
    if (!store->by_name_.count(t))
      Fail(ErrorKind::kNotFound, "{}: tensor {}: listed in the weight_map of {} but absent from {}",
           PrintableName(shard), PrintableName(t), iname, PrintableName(shard));
  }
  if (index.contains("metadata")) {
    const json& md = index["metadata"];
    if (!md.is_object())
      Fail(ErrorKind::kCorruptData, "{}: metadata is {}, expected an object", iname,
           JsonTypeName(md));
    if (md.contains("total_size")) {
      uint64_t ts = 0;
      if (!NonNegInt(md["total_size"], &ts))
        Fail(ErrorKind::kCorruptData,
             "{}: metadata.total_size is {}, expected a non-negative integer", iname,
             JsonScalarText(md["total_size"]));
      if (ts != store->total_bytes())
        Fail(ErrorKind::kCorruptData,
             "{}: metadata.total_size: expected {} (sum of tensor bytes in the shards), found {}",
             iname, store->total_bytes(), ts);
    }
  }
  return store;
}

const TensorView* TensorStore::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

const TensorView& TensorStore::Get(const std::string& name) const {
  const TensorView* t = Find(name);
  if (!t)
    Fail(ErrorKind::kNotFound, "missing tensor {} in {}", PrintableName(name),
         PrintableName(dir_.string()));
  return *t;
}

std::vector<std::string> TensorStore::shard_names() const {
  std::vector<std::string> v;
  for (const auto& f : files_) v.push_back(f->path().filename().string());
  return v;
}

uint64_t TensorStore::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : by_name_) n += t.nbytes;
  return n;
}

}  // namespace deepinfer
