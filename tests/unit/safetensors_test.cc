// Tests for format/safetensors: header validation (every malformation named in
// safetensors.h gives a specific one-line message), zero-copy views, metadata,
// and sharded directories (model.safetensors.index.json).
#include "format/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint_test_util.h"

namespace deepinfer {
namespace {

using testing_util::ExpectError;
using testing_util::FakeTensor;
using testing_util::LengthPrefixed;
using testing_util::SafetensorsImage;
using testing_util::TempDir;
using testing_util::WriteFile;

SafetensorsHeader ParseString(const std::string& img, const std::string& name = "t.safetensors") {
  return SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(img.data()), img.size(), name);
}

// A header (not padded) followed by `data_bytes` bytes.
std::string Img(const std::string& header, size_t data_bytes = 64) {
  return LengthPrefixed(header) + std::string(data_bytes, '\x11');
}

std::string ParseError(const std::string& img, const std::vector<std::string>& parts) {
  return ExpectError([&] { ParseString(img); }, parts);
}

TEST(Safetensors, ParsesValidFileZeroCopy) {
  std::string w(8, '\0');
  for (int i = 0; i < 8; ++i) w[i] = static_cast<char>(i + 1);
  std::string img = SafetensorsImage(
      {{"a.weight", "BF16", {2, 2}, w}, {"b", "F32", {3}, ""}, {"e.weight", "I8", {4, 2}, ""}},
      {{"format", "pt"}});
  SafetensorsHeader h = ParseString(img, "model.safetensors");
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  const TensorView& a = h.tensors[0];
  EXPECT_EQ(a.name, "a.weight");
  EXPECT_EQ(a.dtype, DType::kBF16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a.nbytes, 8u);
  EXPECT_EQ(a.file, "model.safetensors");
  // Zero copy: the view points into the image.
  EXPECT_EQ(reinterpret_cast<const char*>(a.data), img.data() + h.data_offset);
  EXPECT_EQ(std::memcmp(a.data, w.data(), 8), 0);
  // I8 packed FP4: numel bytes of the stored shape.
  EXPECT_EQ(h.tensors[2].nbytes, 8u);
  EXPECT_EQ(h.tensors[2].dtype, DType::kI8);
}

// A header with many entries (a real shard holds thousands; the `large` tiny
// preset's one file 13 201): every tensor parsed, in name order, at its
// offsets; a duplicate among them is still found.
TEST(Safetensors, ManyTensorsParseAndDuplicateAmongThemIsFound) {
  constexpr int kN = 20000;
  std::vector<FakeTensor> t;
  t.reserve(kN);
  for (int i = 0; i < kN; ++i) t.push_back({"layers." + std::to_string(i) + ".w", "F32", {1}, ""});
  const std::string img = SafetensorsImage(t);
  const SafetensorsHeader h = ParseString(img);
  ASSERT_EQ(h.tensors.size(), static_cast<size_t>(kN));
  for (size_t i = 1; i < h.tensors.size(); ++i) ASSERT_LT(h.tensors[i - 1].name, h.tensors[i].name);
  for (const TensorView& v : h.tensors) {
    const int idx = std::stoi(v.name.substr(7));
    ASSERT_EQ(reinterpret_cast<const char*>(v.data), img.data() + h.data_offset + 4 * idx) << v.name;
  }
  std::string dup = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  for (int i = 0; i < kN; ++i) dup += ",\"t" + std::to_string(i) + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  dup += R"(,"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ParseError(Img(dup, 4), {"duplicate JSON key \"x\""});
}

TEST(Safetensors, EmptyHeaderObjectAndScalarShape) {
  EXPECT_TRUE(ParseString(Img("{}", 0)).tensors.empty());
  auto h = ParseString(Img(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4));
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].numel(), 1);
  // Zero-length tensor.
  auto z = ParseString(Img(R"({"z":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}})", 0));
  EXPECT_EQ(z.tensors[0].nbytes, 0u);
}

TEST(Safetensors, TruncatedFile) {
  ParseError(std::string(5, '\0'), {"t.safetensors", "file is 5 bytes", "expected at least 8"});
  ParseError("", {"file is 0 bytes"});
}

TEST(Safetensors, HeaderLengthPastEof) {
  std::string img = Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  img.resize(30);
  ParseError(img, {"t.safetensors: header length 54 bytes runs past the end of the file: "
                   "expected at least 54 bytes after the 8-byte length field, found 22; "
                   "truncated?"});
}

TEST(Safetensors, AbsurdHeaderLength) {
  std::string img(16, '\0');
  uint64_t h = (100ull << 20) + 1;
  std::memcpy(img.data(), &h, 8);
  ParseError(img, {"t.safetensors", "header length 104857601 bytes", "expected at most 104857600"});
  uint64_t huge = ~0ull;
  std::memcpy(img.data(), &huge, 8);
  ParseError(img, {"header length 18446744073709551615 bytes"});
}

TEST(Safetensors, BadJson) {
  ParseError(Img("{\"a\": [1, 2"), {"t.safetensors: header: not valid JSON"});
  ParseError(Img("not json"), {"not valid JSON"});
  ParseError(Img("[1, 2]"), {"header is an array, expected a JSON object"});
  ParseError(Img("\"x\""), {"header is a string, expected a JSON object"});
  // Invalid UTF-8 inside a string.
  ParseError(Img("{\"a\xff\":1}"), {"not valid JSON"});
  // Deep nesting is refused before it costs anything.
  ParseError(Img(std::string(10000, '[') + std::string(10000, ']')), {"nested deeper than 3"});
}

TEST(Safetensors, DuplicateKey) {
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
             {"duplicate JSON key \"a\""});
  ParseError(Img(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})"),
             {"duplicate JSON key \"dtype\""});
}

TEST(Safetensors, EntryFieldsAndTypes) {
  ParseError(Img(R"({"a":[1]})"), {"tensor a: entry is an array, expected an object"});
  ParseError(Img(R"({"a":{"shape":[1],"data_offsets":[0,4]}})"),
             {"tensor a: missing field \"dtype\""});
  ParseError(Img(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})"),
             {"tensor a: missing field \"shape\""});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1]}})"),
             {"tensor a: missing field \"data_offsets\""});
  ParseError(Img(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})"),
             {"tensor a: dtype is an integer, expected a string"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})"),
             {"tensor a: shape is a string, expected an array of integers"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})"),
             {"tensor a: data_offsets is an array of 1, expected an array of 2 integers"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})"),
             {"tensor a: data_offsets [0, a string], expected non-negative integers"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})"),
             {"tensor a: unexpected field \"x\""});
  ParseError(Img(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"),
             {"tensor with an empty name"});
}

TEST(Safetensors, UnknownDtype) {
  ParseError(Img(R"({"layers.0.w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}})"),
             {"t.safetensors: tensor layers.0.w: unknown dtype \"Q4_K\"", "expected one of BF16"});
}

TEST(Safetensors, BadShapes) {
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})"),
             {"tensor a: shape[1] is -1, expected a non-negative integer"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,4]}})"),
             {"tensor a: shape[0] is 2.5, expected a non-negative integer"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}})"),
             {"tensor a: shape[0] is true"});
  ParseError(
      Img(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})"),
      {"tensor a: element count of shape [4294967296, 4294967296] overflows"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}})"),
             {"tensor a: shape[0]", "expected a non-negative integer"});
}

TEST(Safetensors, ShapeBytesMismatch) {
  ParseError(Img(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})"),
             {"t.safetensors: tensor w: BF16 [2, 3] needs 12 bytes, found data_offsets [0, 10] = "
              "10 bytes"});
  // Packed FP4 (I8) counts one byte per stored element, not per FP4 value.
  ParseError(Img(R"({"e":{"dtype":"I8","shape":[4,2],"data_offsets":[0,16]}})"),
             {"tensor e: I8 [4, 2] needs 8 bytes", "= 16 bytes"});
}

TEST(Safetensors, OffsetsOutOfRangeAndReversed) {
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[60,76]}})", 64),
             {"tensor a: data_offsets [60, 76] run past the end of the data",
              "expected end <= 64, found 76"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})"),
             {"tensor a: data_offsets [8, 4]: begin is after end"});
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})"),
             {"tensor a: data_offsets [-4, 0], expected non-negative integers"});
}

TEST(Safetensors, OverlappingOffsets) {
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})"),
             {"tensor b: data_offsets [12, 20] overlap tensor a's [0, 16]"});
  // Containment, listed in the other order.
  ParseError(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                 R"("b":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})"),
             {"tensor a: data_offsets [4, 8] overlap tensor b's [0, 32]"});
  // Gaps and zero-length tensors are fine.
  EXPECT_NO_THROW(ParseString(Img(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("z":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})")));
}

TEST(Safetensors, Metadata) {
  ParseError(Img(R"({"__metadata__":{"format":1}})"),
             {"__metadata__ key \"format\": expected a string value, found an integer"});
  ParseError(Img(R"({"__metadata__":"pt"})"),
             {"__metadata__ is a string, expected an object of strings"});
  auto h = ParseString(Img(R"({"__metadata__":{"format":"pt","x":"y"}})", 0));
  EXPECT_EQ(h.metadata.size(), 2u);
  EXPECT_TRUE(h.tensors.empty());
}

TEST(Safetensors, ControlCharactersInNamesStayOnOneLine) {
  std::string msg =
      ParseError(Img(R"({"a\nb":{"dtype":"Q","shape":[1],"data_offsets":[0,1]}})"),
                 {"tensor a\\x0ab: unknown dtype"});
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(Safetensors, OpenMapsFile) {
  TempDir d;
  std::string img = SafetensorsImage({{"x", "F32", {2}, std::string("\0\0\x80?\0\0\0@", 8)}});
  WriteFile(d / "m.safetensors", img);
  auto f = SafetensorsFile::Open(d / "m.safetensors");
  ASSERT_EQ(f->tensors().size(), 1u);
  float v[2];
  std::memcpy(v, f->tensors()[0].data, 8);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_EQ(f->tensors()[0].file, "m.safetensors");
  EXPECT_EQ(f->file_size(), img.size());
}

// Whether the page holding `addr` is present in this process's page table
// (/proc/self/pagemap bit 63); -1 where pagemap cannot be read.
int PagePresent(const void* addr) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  uint64_t e = 0;
  const off_t off = static_cast<off_t>(reinterpret_cast<uintptr_t>(addr) / 4096 * 8);
  const ssize_t n = ::pread(fd, &e, sizeof e, off);
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof e) ? static_cast<int>(e >> 63) : -1;
}

TEST(Safetensors, PrefaultMappedMapsPagesAndKeepsBytes) {
  TempDir d;
  // One 32 MiB tensor: its far pages are not mapped by opening the file (the
  // header parse reads the first pages; a fault maps at most a large folio
  // around it, up to 2 MiB).
  std::string w(32 << 20, '\0');
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<char>((i * 131 + 7) & 0xFF);
  WriteFile(d / "m.safetensors", SafetensorsImage({{"t", "I8", {static_cast<int64_t>(w.size())}, w}}));
  auto f = SafetensorsFile::Open(d / "m.safetensors");
  const uint8_t* t = f->tensors()[0].data;
  PrefaultMapped(nullptr, 100);  // no-ops
  PrefaultMapped(t, 0);
  // An unaligned range far into the tensor: every page it touches becomes present.
  const uint8_t* a = t + (24 << 20) + 123;
  const size_t len = (256 << 10) + 77;
  const int before = PagePresent(a + len / 2);
  PrefaultMapped(a, len);
  if (before < 0) GTEST_SKIP() << "/proc/self/pagemap not readable";
  EXPECT_EQ(before, 0) << "the page was mapped before (the test would not show anything)";
  for (size_t o = 0; o < len; o += 4096) EXPECT_EQ(PagePresent(a + o), 1) << "offset " << o;
  EXPECT_EQ(PagePresent(a + len - 1), 1);
  EXPECT_EQ(std::memcmp(t, w.data(), w.size()), 0);
}

TEST(Safetensors, OpenErrorsNameThePath) {
  TempDir d;
  ExpectError([&] { SafetensorsFile::Open(d / "nope.safetensors"); },
              {"nope.safetensors: cannot open"});
  WriteFile(d / "short.safetensors", "abc");
  ExpectError([&] { SafetensorsFile::Open(d / "short.safetensors"); },
              {"short.safetensors: file is 3 bytes, expected at least 8"});
  ExpectError([&] { SafetensorsFile::Open(d.path()); }, {"not a regular file"});
}

// ---------------------------------------------------------------------------
// TensorStore

std::string Index(const std::map<std::string, std::string>& wm, const std::string& extra = "") {
  std::string s = "{" + extra + "\"weight_map\":{";
  bool first = true;
  for (const auto& [t, f] : wm) {
    s += (first ? "" : ",") + std::string("\"") + t + "\":\"" + f + "\"";
    first = false;
  }
  return s + "}}";
}

TEST(TensorStore, SingleFile) {
  TempDir d;
  WriteFile(d / "model.safetensors", SafetensorsImage({{"b", "F32", {2}, ""}, {"a", "BF16", {3}, ""}}));
  auto s = TensorStore::Open(d.path());
  EXPECT_EQ(s->all().size(), 2u);
  EXPECT_EQ(s->all().begin()->first, "a");
  EXPECT_NE(s->Find("b"), nullptr);
  EXPECT_EQ(s->Find("c"), nullptr);
  EXPECT_EQ(s->Get("a").nbytes, 6u);
  EXPECT_EQ(s->total_bytes(), 14u);
  ExpectError([&] { s->Get("layers.9.x"); }, {"missing tensor layers.9.x in"});
}

TEST(TensorStore, Sharded) {
  TempDir d;
  WriteFile(d / "model-00001-of-00002.safetensors",
            SafetensorsImage({{"a", "F32", {2}, ""}, {"b", "F32", {1}, ""}}));
  WriteFile(d / "model-00002-of-00002.safetensors", SafetensorsImage({{"c", "BF16", {4}, ""}}));
  WriteFile(d / "model.safetensors.index.json",
            Index({{"a", "model-00001-of-00002.safetensors"},
                   {"b", "model-00001-of-00002.safetensors"},
                   {"c", "model-00002-of-00002.safetensors"}},
                  "\"metadata\":{\"total_size\":20},"));
  auto s = TensorStore::Open(d.path());
  EXPECT_EQ(s->all().size(), 3u);
  EXPECT_EQ(s->Get("c").file, "model-00002-of-00002.safetensors");
  EXPECT_EQ(s->shard_names().size(), 2u);
}

TEST(TensorStore, IndexErrors) {
  TempDir d;
  const std::string shard = "s1.safetensors";
  WriteFile(d / shard, SafetensorsImage({{"a", "F32", {2}, ""}, {"b", "F32", {1}, ""}}));
  auto open = [&] { TensorStore::Open(d.path()); };
  auto index = [&](const std::string& text) { WriteFile(d / "model.safetensors.index.json", text); };

  index("{\"weight_map\": {");
  ExpectError(open, {"model.safetensors.index.json: not valid JSON"});
  index("[]");
  ExpectError(open, {"model.safetensors.index.json: is an array, expected a JSON object"});
  index("{}");
  ExpectError(open, {"model.safetensors.index.json: missing key \"weight_map\""});
  index("{\"weight_map\":[]}");
  ExpectError(open, {"weight_map is an array, expected an object"});
  index("{\"weight_map\":{\"a\":3}}");
  ExpectError(open, {"weight_map[\"a\"] is an integer, expected a shard file name"});
  index(Index({{"a", "../s1.safetensors"}}));
  ExpectError(open, {"weight_map[\"a\"] = \"../s1.safetensors\", expected a plain file name"});
  // Index naming a missing shard.
  index(Index({{"a", shard}, {"b", shard}, {"c", "s2.safetensors"}}));
  ExpectError(open, {"model.safetensors.index.json: weight_map names shard s2.safetensors",
                     "tensor c", "does not exist"});
  // Tensor in index but not in its shard.
  WriteFile(d / "s2.safetensors", SafetensorsImage({{"d", "F32", {1}, ""}}));
  index(Index({{"a", shard}, {"b", shard}, {"c", "s2.safetensors"}, {"d", "s2.safetensors"}}));
  ExpectError(open, {"s2.safetensors: tensor c: listed in the weight_map of ",
                     "model.safetensors.index.json but absent from s2.safetensors"});
  // Tensor in shard but not in index.
  index(Index({{"a", shard}}));
  ExpectError(open, {"s1.safetensors: tensor b: present in the shard but not listed"});
  // Tensor in the wrong shard according to the index.
  index(Index({{"a", shard}, {"b", "s2.safetensors"}, {"d", "s2.safetensors"}}));
  ExpectError(open, {"tensor b: ", "model.safetensors.index.json maps it to shard s2.safetensors, "
                     "found it in s1.safetensors"});
  // Duplicate across shards.
  WriteFile(d / "s3.safetensors", SafetensorsImage({{"a", "F32", {2}, ""}}));
  index(Index({{"a", "s3.safetensors"}, {"b", shard}}));
  ExpectError(open, {"tensor a appears in two shards"});
  // total_size mismatch.
  index(Index({{"a", shard}, {"b", shard}}, "\"metadata\":{\"total_size\":99},"));
  ExpectError(open, {"metadata.total_size: expected 12", "found 99"});
  // A corrupt shard is reported with its path.
  WriteFile(d / shard, "xx");
  index(Index({{"a", shard}}));
  ExpectError(open, {"s1.safetensors: file is 2 bytes"});
}

TEST(TensorStore, DirectoryErrors) {
  TempDir d;
  ExpectError([&] { TensorStore::Open(d / "missing"); }, {"missing: no such directory"});
  ExpectError([&] { TensorStore::Open(d.path()); },
              {"no model.safetensors.index.json or model.safetensors"});
  WriteFile(d / "f", "x");
  ExpectError([&] { TensorStore::Open(d / "f"); }, {"not a directory"});
}

}  // namespace
}  // namespace deepinfer
