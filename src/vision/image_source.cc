// deepinfer/vision/image_source.cc — see image_source.h.
#include "vision/image_source.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <fmt/format.h>

#include "base/error.h"
#include "base/json_field.h"

namespace deepinfer::vision {

std::string DecodeBase64(std::string_view in, const std::string& what) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  bool pad = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      pad = true;
      continue;
    }
    const int v = val(c);
    if (v < 0 || pad)
      Fail(ErrorKind::kInvalidArgument, "{}: invalid base64 (character {} at offset {})", what,
           v < 0 ? fmt::format("0x{:02x}", static_cast<unsigned char>(c)) : std::string("after '='"), i);
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (bits >= 6) Fail(ErrorKind::kInvalidArgument, "{}: invalid base64 (truncated)", what);
  return out;
}

std::string ImageUrlBytes(const std::string& url, const std::string& field, bool allow_files) {
  if (url.rfind("data:", 0) == 0) {
    const size_t comma = url.find(',');
    if (comma == std::string::npos) Fail(ErrorKind::kInvalidArgument, "{}: data: URL without ','", field);
    const std::string header = url.substr(5, comma - 5);
    if (header.find(";base64") == std::string::npos)
      Fail(ErrorKind::kInvalidArgument, "{}: unsupported data: URL encoding '{}' (expected ;base64)", field, header);
    return DecodeBase64(std::string_view(url).substr(comma + 1), field);
  }
  const size_t colon = url.find("://");
  const bool file_url = url.rfind("file://", 0) == 0;
  if ((colon != std::string::npos && !file_url) || !allow_files)
    Fail(ErrorKind::kInvalidArgument, "{}: only data: URLs are accepted (no network access){}", field,
         allow_files ? " or local file paths" : "");
  const std::string path = file_url ? url.substr(7) : url;
  // Only regular files of bounded size: /dev/zero, a FIFO or a huge file must
  // fail this request, not exhaust the process's memory.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st))
    Fail(ErrorKind::kInvalidArgument, "{}: cannot open image file {}", field, path);
  if (!std::filesystem::is_regular_file(st))
    Fail(ErrorKind::kInvalidArgument, "{}: image file {} is not a regular file", field, path);
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) Fail(ErrorKind::kInvalidArgument, "{}: cannot read the size of image file {}", field, path);
  if (size > kMaxImageFileBytes)
    Fail(ErrorKind::kInvalidArgument, "{}: image file {} is {} bytes, more than the limit {}", field, path, size,
         kMaxImageFileBytes);
  std::ifstream f(path, std::ios::binary);
  if (!f) Fail(ErrorKind::kInvalidArgument, "{}: cannot open image file {}", field, path);
  std::string bytes(static_cast<size_t>(size), '\0');
  f.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<uintmax_t>(f.gcount()) != size)
    Fail(ErrorKind::kInvalidArgument, "{}: image file {} changed while being read", field, path);
  return bytes;
}

namespace {

std::string BlockBytes(const nlohmann::json& b, const std::string& field, bool allow_files) {
  const std::string type = StringField(b, "type");
  if (type == "image_url") {
    const nlohmann::json* u = b.contains("image_url") ? &b["image_url"] : nullptr;
    if (u && u->is_string()) return ImageUrlBytes(u->get<std::string>(), field + ".image_url", allow_files);
    if (u && u->is_object() && u->contains("url") && (*u)["url"].is_string())
      return ImageUrlBytes((*u)["url"].get<std::string>(), field + ".image_url.url", allow_files);
    Fail(ErrorKind::kInvalidArgument, "{}.image_url: expected {{\"url\": \"data:image/...;base64,...\"}}", field);
  }
  // DeepSeek's {"type": "image", ...}: data (base64), url, or source {data | url}.
  if (b.contains("data") && b["data"].is_string()) return DecodeBase64(b["data"].get<std::string>(), field + ".data");
  if (b.contains("url") && b["url"].is_string()) return ImageUrlBytes(b["url"].get<std::string>(), field + ".url", allow_files);
  if (b.contains("source") && b["source"].is_object()) {
    const nlohmann::json& s = b["source"];
    if (s.contains("data") && s["data"].is_string()) return DecodeBase64(s["data"].get<std::string>(), field + ".source.data");
    if (s.contains("url") && s["url"].is_string())
      return ImageUrlBytes(s["url"].get<std::string>(), field + ".source.url", allow_files);
  }
  Fail(ErrorKind::kInvalidArgument, "{}: image block does not contain a valid source", field);
}

}  // namespace

std::vector<std::shared_ptr<const PreparedImage>> CollectImages(const nlohmann::json& messages, const VisionGeometry& g,
                                                                bool allow_files) {
  std::vector<std::shared_ptr<const PreparedImage>> out;
  if (!messages.is_array()) return out;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& list,
                                                                          const std::string& path) {
    for (size_t j = 0; j < list.size(); ++j) {
      const nlohmann::json& b = list[j];
      if (!b.is_object()) continue;
      const std::string type = StringField(b, "type");
      const std::string field = fmt::format("{}[{}]", path, j);
      if (type == "image" || type == "image_url") {
        const std::string bytes = BlockBytes(b, field, allow_files);
        try {
          out.push_back(std::make_shared<const PreparedImage>(PrepareImage(bytes, g)));
        } catch (const Error& e) {
          Fail(ErrorKind::kInvalidArgument, "{}: {}", field, e.what());
        }
      } else if (type == "tool_result" && b.contains("content") && b["content"].is_array()) {
        walk(b["content"], field + ".content");
      }
    }
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    if (!m.is_object()) continue;
    const char* key = m.contains("content_blocks") ? "content_blocks" : "content";
    if (m.contains(key) && m[key].is_array()) walk(m[key], fmt::format("messages[{}].{}", i, key));
  }
  return out;
}

std::vector<int32_t> ExpandPlaceholders(const std::vector<int32_t>& ids, int32_t image_token_id,
                                        const std::vector<std::shared_ptr<const PreparedImage>>& images) {
  std::vector<int32_t> out;
  size_t k = 0;
  for (int32_t t : ids) {
    if (t == image_token_id && k < images.size()) {
      out.insert(out.end(), static_cast<size_t>(images[k++]->plan.n_tokens()), t);
    } else {
      out.push_back(t);
    }
  }
  return out;
}

}  // namespace deepinfer::vision
