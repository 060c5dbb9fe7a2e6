#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

namespace {

using Json = nlohmann::json;
using tokenizer_internal::SplitRegex;

// GPT-2's pattern, used when a ByteLevel pre-tokenizer has use_regex = true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) Fail(ErrorKind::kNotFound, "{}: cannot open file", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Json ParseJson(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    Fail(ErrorKind::kCorruptData, "{}: not valid JSON ({})", source, e.what());
  }
}

// tokenizer.json with model.vocab and model.merges (over 99% of the file)
// read straight into vectors by a SAX handler; everything else becomes a DOM.
// About three times faster than building the whole DOM.
struct TokenizerJson {
  Json rest;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // "a b" strings are split later
  std::vector<uint8_t> merge_is_string;                     // 1: "a b" form (second is empty)
  bool have_vocab = false, have_merges = false;
  std::string error;  // shape error in vocab/merges
};

class TokenizerJsonSax {
 public:
  explicit TokenizerJsonSax(TokenizerJson& out) : out_(out), dom_(out.rest, false) {}
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  bool null() { return Plain() ? dom_.null() : Shape(); }
  bool boolean(bool v) { return Plain() ? dom_.boolean(v) : Shape(); }
  bool number_integer(number_integer_t v) {
    if (mode_ == kVocab) { out_.vocab.emplace_back(std::move(key_), v); return true; }
    return Plain() ? dom_.number_integer(v) : Shape();
  }
  bool number_unsigned(number_unsigned_t v) {
    if (mode_ == kVocab) {
      out_.vocab.emplace_back(std::move(key_), v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
      return true;
    }
    return Plain() ? dom_.number_unsigned(v) : Shape();
  }
  bool number_float(number_float_t v, const string_t& s) { return Plain() ? dom_.number_float(v, s) : Shape(); }
  bool string(string_t& v) {
    if (mode_ == kMerges) {
      if (inner_ == 0) {
        out_.merges.emplace_back(std::move(v), std::string());
        out_.merge_is_string.push_back(1);
      } else if (inner_ == 1) {
        pair_.first = std::move(v);
        ++inner_;
      } else if (inner_ == 2) {
        pair_.second = std::move(v);
        ++inner_;
      } else {
        return Shape();
      }
      return true;
    }
    return Plain() ? dom_.string(v) : Shape();
  }
  bool binary(binary_t& v) { return Plain() ? dom_.binary(v) : Shape(); }
  bool start_object(std::size_t n) {
    if (mode_ == kNormal && pending_ == kVocab) {
      pending_ = kNormal;
      mode_ = kVocab;
      out_.have_vocab = true;
      return true;
    }
    if (mode_ != kNormal || pending_ != kNormal) return Shape();
    path_.push_back(next_key_);
    next_key_.clear();
    return dom_.start_object(n);
  }
  bool end_object() {
    if (mode_ == kVocab) { mode_ = kNormal; return true; }
    if (mode_ != kNormal) return Shape();
    path_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == kNormal && pending_ == kMerges) {
      pending_ = kNormal;
      mode_ = kMerges;
      out_.have_merges = true;
      return true;
    }
    if (mode_ == kMerges && inner_ == 0) { inner_ = 1; return true; }
    if (mode_ != kNormal || pending_ != kNormal) return Shape();
    path_.push_back(next_key_);
    next_key_.clear();
    return dom_.start_array(n);
  }
  bool end_array() {
    if (mode_ == kMerges) {
      if (inner_ == 0) { mode_ = kNormal; return true; }
      if (inner_ != 3) return Shape();
      out_.merges.push_back(std::move(pair_));
      out_.merge_is_string.push_back(0);
      inner_ = 0;
      return true;
    }
    if (mode_ != kNormal) return Shape();
    path_.pop_back();
    return dom_.end_array();
  }
  bool key(string_t& k) {
    if (mode_ == kVocab) { key_ = std::move(k); return true; }
    if (mode_ != kNormal) return Shape();
    // model.vocab / model.merges: path is ["" (top), "model"].
    if (path_.size() == 2 && path_[1] == "model" && (k == "vocab" || k == "merges")) {
      pending_ = k == "vocab" ? kVocab : kMerges;
      return true;
    }
    next_key_ = k;
    return dom_.key(k);
  }
  bool parse_error(std::size_t pos, const std::string& tok, const nlohmann::detail::exception& ex) {
    return dom_.parse_error(pos, tok, ex);
  }
  bool is_errored() const { return dom_.is_errored(); }

 private:
  enum Mode { kNormal, kVocab, kMerges };
  // A scalar outside vocab/merges (and not where vocab/merges' value is due).
  bool Plain() const { return mode_ == kNormal && pending_ == kNormal; }
  bool Shape() {
    if (out_.error.empty()) out_.error = "model.vocab must map strings to ids and model.merges be strings or pairs";
    return false;
  }
  TokenizerJson& out_;
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  std::vector<std::string> path_;
  std::string next_key_, key_;
  Mode mode_ = kNormal, pending_ = kNormal;
  int inner_ = 0;
  std::pair<std::string, std::string> pair_;
};

TokenizerJson ParseTokenizerJson(const std::string& text, const std::string& source) {
  TokenizerJson out;
  TokenizerJsonSax sax(out);
  bool ok = false;
  try {
    ok = Json::sax_parse(text, &sax);
  } catch (const Json::exception& e) {
    Fail(ErrorKind::kCorruptData, "{}: not valid JSON ({})", source, e.what());
  }
  if (!out.error.empty()) Fail(ErrorKind::kCorruptData, "{}: {}", source, out.error);
  if (!ok || sax.is_errored()) Fail(ErrorKind::kCorruptData, "{}: not valid JSON", source);
  return out;
}

// Byte-level alphabet string → bytes. Returns false if a character is outside
// the alphabet (then `out` is unspecified).
bool ByteLevelToBytes(std::string_view s, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < s.size()) {
    const utf8::Seq q = utf8::Inspect(s, i);
    if (q.kind != utf8::SeqKind::kValid) return false;
    const int b = byte_level::CpToByte(q.cp);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
    i += q.len;
  }
  return true;
}

bool IsWhiteSpace(char32_t c) {  // Unicode White_Space (Rust char::is_whitespace)
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Escapes a literal for PCRE2 (Split with a String pattern).
std::string EscapeLiteral(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

const Json* Find(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool BoolOr(const Json& obj, const char* key, bool dflt) {
  const Json* v = Find(obj, key);
  return v && v->is_boolean() ? v->get<bool>() : dflt;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  int64_t n_vocab = 0;  // BPE vocabulary entries
  int64_t size = 0;     // max id + 1
  std::vector<std::string> id_to_token;   // "" for gaps
  std::vector<uint8_t> present;           // 1 where an id has a token
  std::vector<std::string> token_bytes;   // decoder bytes per id
  StringMap<int32_t> token_to_id;         // vocab strings and added contents
  StringMap<int32_t> bytes_to_id;         // raw bytes → BPE vocab id
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, uint64_t> merges;  // (a << 32 | b) → (rank << 32 | merged id)
  std::vector<uint8_t> self_bpe;          // BPE(token bytes) == [id]: whole-piece shortcut is exact
  bool ignore_merges = false;

  std::vector<AddedToken> added;
  std::vector<uint8_t> added_flag;        // per id: 1 added, 2 added + special
  // Trie over added-token contents (bytes).
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t token = -1;                              // index into `added`
  };
  std::vector<Node> trie{Node{}};
  std::array<bool, 256> first_byte{};

  std::vector<SplitRegex> splits;

  std::vector<int32_t> prefix_ids, suffix_ids;
  int32_t bos = -1, eos = -1, pad = -1;

  uint64_t MergeOf(int32_t a, int32_t b) const {
    auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges.end() ? ~0ull : it->second;
  }

  void BpeRaw(std::string_view piece, std::vector<int32_t>& out) const;
  void Bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void EncodeSection(std::string_view text, size_t begin, size_t end, std::vector<int32_t>& out) const;
  // Longest added token starting at text[i]: (token index, length) or (-1, 0).
  std::pair<int32_t, size_t> MatchAdded(std::string_view text, size_t i) const;
};

// ---------------------------------------------------------------------------
// BPE
// ---------------------------------------------------------------------------

void Tokenizer::Impl::BpeRaw(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  constexpr uint64_t kNone = ~0ull;
  if (n <= 48) {
    // Small pieces: arrays of symbols and of the merge (rank,id) of each
    // adjacent pair; each step merges the lowest rank, leftmost.
    int32_t sym[48];
    uint64_t pr[48];
    size_t m = n;
    for (size_t i = 0; i < n; ++i) sym[i] = byte_id[static_cast<uint8_t>(piece[i])];
    for (size_t i = 0; i + 1 < m; ++i) pr[i] = MergeOf(sym[i], sym[i + 1]);
    while (m > 1) {
      size_t best = 0;
      uint64_t best_v = kNone;
      for (size_t i = 0; i + 1 < m; ++i)
        if ((pr[i] >> 32) < (best_v >> 32)) { best_v = pr[i]; best = i; }
      if (best_v == kNone) break;
      sym[best] = static_cast<int32_t>(best_v & 0xffffffffu);
      for (size_t i = best + 1; i + 1 < m; ++i) { sym[i] = sym[i + 1]; }
      for (size_t i = best + 1; i + 2 < m; ++i) { pr[i] = pr[i + 1]; }
      --m;
      if (best > 0) pr[best - 1] = MergeOf(sym[best - 1], sym[best]);
      if (best + 1 < m) pr[best] = MergeOf(sym[best], sym[best + 1]);
    }
    out.insert(out.end(), sym, sym + m);
    return;
  }
  // Long pieces: linked list + min-heap on (rank, position), as HF's
  // Word::merge_all. Stale heap entries are recognised and skipped.
  struct Sym { int32_t id, prev, next; };
  std::vector<Sym> s(n);
  for (size_t i = 0; i < n; ++i)
    s[i] = {byte_id[static_cast<uint8_t>(piece[i])], static_cast<int32_t>(i) - 1,
            i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  using Entry = std::pair<uint64_t, int32_t>;  // (rank, position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (size_t i = 0; i + 1 < n; ++i) {
    const uint64_t v = MergeOf(s[i].id, s[i + 1].id);
    if (v != kNone) heap.emplace(v >> 32, static_cast<int32_t>(i));
  }
  while (!heap.empty()) {
    const auto [rank, pos] = heap.top();
    heap.pop();
    Sym& a = s[pos];
    if (a.id < 0 || a.next < 0) continue;
    const uint64_t v = MergeOf(a.id, s[a.next].id);
    if (v == kNone || (v >> 32) != rank) continue;  // stale
    Sym& b = s[a.next];
    a.id = static_cast<int32_t>(v & 0xffffffffu);
    const int32_t after = b.next;
    b.id = -1;
    a.next = after;
    if (after >= 0) s[after].prev = pos;
    if (a.prev >= 0) {
      const uint64_t w = MergeOf(s[a.prev].id, a.id);
      if (w != kNone) heap.emplace(w >> 32, a.prev);
    }
    if (after >= 0) {
      const uint64_t w = MergeOf(a.id, s[after].id);
      if (w != kNone) heap.emplace(w >> 32, pos);
    }
  }
  for (int32_t i = 0; i >= 0; i = s[i].next) out.push_back(s[i].id);
}

void Tokenizer::Impl::Bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > 1) {
    auto it = bytes_to_id.find(piece);
    if (it != bytes_to_id.end() && (ignore_merges || self_bpe[it->second])) {
      out.push_back(it->second);
      return;
    }
  }
  BpeRaw(piece, out);
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

void Tokenizer::Impl::EncodeSection(std::string_view text, size_t begin, size_t end,
                                    std::vector<int32_t>& out) const {
  if (begin >= end) return;
  std::vector<std::pair<size_t, size_t>> pieces{{begin, end}}, next;
  for (const SplitRegex& re : splits) {
    next.clear();
    for (const auto& [b, e] : pieces) re.SplitIsolated(text, b, e, next);
    pieces.swap(next);
  }
  for (const auto& [b, e] : pieces) Bpe(text.substr(b, e - b), out);
}

std::pair<int32_t, size_t> Tokenizer::Impl::MatchAdded(std::string_view text, size_t i) const {
  int32_t node = 0, best = -1;
  size_t best_len = 0;
  for (size_t j = i; j < text.size(); ++j) {
    const auto& nx = trie[node].next;
    const auto b = static_cast<uint8_t>(text[j]);
    auto it = std::lower_bound(nx.begin(), nx.end(), std::make_pair(b, int32_t{-1}));
    if (it == nx.end() || it->first != b) break;
    node = it->second;
    if (trie[node].token >= 0) { best = trie[node].token; best_len = j + 1 - i; }
  }
  return {best, best_len};
}

void Tokenizer::EncodeAppend(std::string_view text, std::vector<int32_t>& out) const {
  EncodeAppend(text, out, {});
}

void Tokenizer::EncodeAppend(std::string_view text, std::vector<int32_t>& out,
                             std::span<const std::pair<size_t, size_t>> plain) const {
  const Impl& m = *impl_;
  size_t r = 0;  // first plain range that ends after the current position
  if (const size_t bad = utf8::FirstInvalid(text); bad != std::string_view::npos)
    Fail(ErrorKind::kInvalidArgument, "text to encode is not valid UTF-8: invalid byte 0x{:02X} at byte offset {}",
         static_cast<uint8_t>(text[bad]), bad);
  size_t sec = 0;  // start of the pending non-added section
  size_t i = 0;
  while (i < text.size()) {
    if (!m.first_byte[static_cast<uint8_t>(text[i])]) { ++i; continue; }
    const auto [tok, len] = m.MatchAdded(text, i);
    if (tok < 0) { ++i; continue; }
    while (r < plain.size() && plain[r].second <= i) ++r;
    if (r < plain.size() && plain[r].first < i + len) { ++i; continue; }  // inside plain text: no added token
    const AddedToken& at = m.added[tok];
    size_t s = i, e = i + len;
    if (at.lstrip) {
      while (s > sec) {
        size_t k = s - 1;
        while (k > sec && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
        if (!IsWhiteSpace(utf8::Inspect(text, k).cp)) break;
        s = k;
      }
    }
    if (at.rstrip) {
      while (e < text.size()) {
        const utf8::Seq q = utf8::Inspect(text, e);
        if (!IsWhiteSpace(q.cp)) break;
        e += q.len;
      }
    }
    m.EncodeSection(text, sec, s, out);
    out.push_back(at.id);
    sec = i = e;
  }
  m.EncodeSection(text, sec, text.size(), out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out = impl_->prefix_ids;
  EncodeAppend(text, out);
  if (add_special_tokens) out.insert(out.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return out;
}

// ---------------------------------------------------------------------------
// Decoding and lookups
// ---------------------------------------------------------------------------

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= impl_->size || !impl_->present[id])
    Fail(ErrorKind::kOutOfRange, "token id {} is not in the vocabulary of {} (size {})", id, impl_->source,
         impl_->size);
  return impl_->token_bytes[id];
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    std::string_view b = TokenBytes(id);
    if (skip_special_tokens && impl_->added_flag[id] == 2) continue;
    bytes.append(b);
  }
  return utf8::DecodeLossy(bytes);
}

const std::string& Tokenizer::IdToToken(int32_t id) const {
  TokenBytes(id);  // range check
  return impl_->id_to_token[id];
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = impl_->token_to_id.find(token);
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsAdded(int32_t id) const {
  return id >= 0 && id < impl_->size && impl_->added_flag[id] != 0;
}
bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < impl_->size && impl_->added_flag[id] == 2;
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
int64_t Tokenizer::size() const { return impl_->size; }
int64_t Tokenizer::vocab_size_without_added() const { return impl_->n_vocab; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
const std::vector<int32_t>& Tokenizer::prefix_special_ids() const { return impl_->prefix_ids; }
const std::vector<int32_t>& Tokenizer::suffix_special_ids() const { return impl_->suffix_ids; }
const std::string& Tokenizer::source() const { return impl_->source; }

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

Tokenizer Tokenizer::Load(const std::filesystem::path& model_dir) {
  const auto tj = model_dir / "tokenizer.json";
  if (!std::filesystem::exists(tj))
    Fail(ErrorKind::kNotFound, "{}: no tokenizer.json in the model directory", model_dir.string());
  const auto tc = model_dir / "tokenizer_config.json";
  return FromFiles(tj, std::filesystem::exists(tc) ? tc : std::filesystem::path());
}

namespace {

// Content of a special-token entry of tokenizer_config.json: a string or an
// {"__type": "AddedToken", "content": ...} object; "" when absent or null.
std::string ConfigTokenContent(const Json& cfg, const char* key, const std::string& source) {
  const Json* v = Find(cfg, key);
  if (!v) return "";
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object() && v->contains("content") && (*v)["content"].is_string())
    return (*v)["content"].get<std::string>();
  Fail(ErrorKind::kCorruptData, "{}: \"{}\" must be a string or an AddedToken object", source, key);
}

}  // namespace

Tokenizer Tokenizer::FromFiles(const std::filesystem::path& tokenizer_json,
                               const std::filesystem::path& tokenizer_config_json) {
  auto m = std::make_unique<Impl>();
  const std::string src = tokenizer_json.string();
  m->source = src;
  TokenizerJson tjson = ParseTokenizerJson(ReadFile(tokenizer_json), src);
  const Json& j = tjson.rest;
  if (!j.is_object()) Fail(ErrorKind::kCorruptData, "{}: top level is not a JSON object", src);

  // --- normalizer: none, or an empty Sequence.
  if (const Json* n = Find(j, "normalizer")) {
    const bool empty_seq = n->value("type", "") == "Sequence" && n->contains("normalizers") &&
                           (*n)["normalizers"].is_array() && (*n)["normalizers"].empty();
    if (!empty_seq)
      Fail(ErrorKind::kCorruptData, "{}: normalizer {} is not supported (expected null or an empty Sequence)", src,
           n->dump().substr(0, 200));
  }

  // --- model: byte-level BPE.
  const Json* model = Find(j, "model");
  if (!model || model->value("type", "BPE") != "BPE")
    Fail(ErrorKind::kCorruptData, "{}: model.type must be \"BPE\"", src);
  if (BoolOr(*model, "byte_fallback", false))
    Fail(ErrorKind::kCorruptData, "{}: model.byte_fallback = true is not supported", src);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Json* v = Find(*model, k); v && !(v->is_string() && v->get<std::string>().empty()))
      Fail(ErrorKind::kCorruptData, "{}: model.{} is not supported", src, k);
  if (const Json* v = Find(*model, "dropout"); v && v->is_number() && v->get<double>() > 0)
    Fail(ErrorKind::kCorruptData, "{}: model.dropout > 0 is not supported", src);
  m->ignore_merges = BoolOr(*model, "ignore_merges", false);
  if (!tjson.have_vocab) Fail(ErrorKind::kCorruptData, "{}: model.vocab missing or not an object", src);
  if (!tjson.have_merges) Fail(ErrorKind::kCorruptData, "{}: model.merges missing or not an array", src);
  const auto& vocab = tjson.vocab;

  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0 || id > INT32_MAX) Fail(ErrorKind::kCorruptData, "{}: model.vocab[{}] is not a valid id", src, tok);
    max_id = std::max(max_id, id);
  }
  const Json* added = Find(j, "added_tokens");
  if (added && !added->is_array()) Fail(ErrorKind::kCorruptData, "{}: added_tokens is not an array", src);
  if (added)
    for (const Json& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > INT32_MAX)
        Fail(ErrorKind::kCorruptData, "{}: added_tokens entry {} lacks a valid id/content", src,
             a.dump().substr(0, 200));
      max_id = std::max(max_id, a["id"].get<int64_t>());
    }
  m->size = max_id + 1;
  m->n_vocab = static_cast<int64_t>(vocab.size());
  m->id_to_token.assign(m->size, "");
  m->present.assign(m->size, 0);
  m->token_bytes.assign(m->size, "");
  m->added_flag.assign(m->size, 0);
  m->byte_id.fill(-1);
  m->token_to_id.reserve(static_cast<size_t>(m->size) * 2);
  m->bytes_to_id.reserve(static_cast<size_t>(m->size) * 2);

  std::string bytes;
  for (const auto& [tok, id64] : vocab) {
    const auto id = static_cast<int32_t>(id64);
    if (m->present[id]) Fail(ErrorKind::kCorruptData, "{}: model.vocab has id {} twice", src, id);
    m->present[id] = 1;
    m->id_to_token[id] = tok;
    m->token_to_id.emplace(tok, id);
    if (!ByteLevelToBytes(tok, bytes)) {
      // Not producible by the ByteLevel pre-tokenizer (DeepSeek lists its
      // special tokens in model.vocab too); the decoder emits its raw UTF-8.
      m->token_bytes[id] = tok;
      continue;
    }
    m->token_bytes[id] = bytes;
    m->bytes_to_id.emplace(bytes, id);
    if (bytes.size() == 1) m->byte_id[static_cast<uint8_t>(bytes[0])] = id;
  }
  for (int b = 0; b < 256; ++b)
    if (m->byte_id[b] < 0)
      Fail(ErrorKind::kCorruptData, "{}: model.vocab has no token for byte 0x{:02X} (byte-level BPE needs all 256)",
           src, b);

  // Merges: "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs.
  m->merges.reserve(tjson.merges.size() * 2);
  std::string ab;
  for (size_t r = 0; r < tjson.merges.size(); ++r) {
    std::string_view a = tjson.merges[r].first, b = tjson.merges[r].second;
    if (tjson.merge_is_string[r]) {
      const std::string_view s = a;
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        Fail(ErrorKind::kCorruptData, "{}: model.merges[{}] = \"{}\" is not \"A B\"", src, r, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    }
    ab.assign(a);
    ab.append(b);
    auto ia = m->token_to_id.find(a), ib = m->token_to_id.find(b), im = m->token_to_id.find(ab);
    if (ia == m->token_to_id.end() || ib == m->token_to_id.end() || im == m->token_to_id.end())
      Fail(ErrorKind::kCorruptData, "{}: model.merges[{}] ({} + {}) uses or makes a token not in model.vocab", src,
           r, a, b);
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    m->merges.emplace(key, (static_cast<uint64_t>(r) << 32) | static_cast<uint32_t>(im->second));  // first wins
  }

  // Added tokens.
  if (added) {
    for (const Json& a : *added) {
      AddedToken t;
      t.id = static_cast<int32_t>(a["id"].get<int64_t>());
      t.content = a["content"].get<std::string>();
      t.special = BoolOr(a, "special", false);
      t.lstrip = BoolOr(a, "lstrip", false);
      t.rstrip = BoolOr(a, "rstrip", false);
      t.normalized = BoolOr(a, "normalized", false);
      if (BoolOr(a, "single_word", false))
        Fail(ErrorKind::kCorruptData, "{}: added token {} (id {}) has single_word = true, which is not supported", src,
             t.content, t.id);
      if (t.content.empty()) Fail(ErrorKind::kCorruptData, "{}: added token id {} has empty content", src, t.id);
      if (utf8::FirstInvalid(t.content) != std::string_view::npos)
        Fail(ErrorKind::kCorruptData, "{}: added token id {} is not valid UTF-8", src, t.id);
      if (m->present[t.id] && m->id_to_token[t.id] != t.content)
        Fail(ErrorKind::kCorruptData, "{}: added token {} reuses id {} of vocab token {}", src, t.content, t.id,
             m->id_to_token[t.id]);
      m->present[t.id] = 1;
      m->id_to_token[t.id] = t.content;
      m->token_to_id[t.content] = t.id;
      m->added_flag[t.id] = t.special ? 2 : 1;
      // Decoder bytes: ByteLevel maps the characters if all are in the
      // alphabet, otherwise the token's own UTF-8 (HF decode_chain).
      if (!ByteLevelToBytes(t.content, bytes)) bytes = t.content;
      m->token_bytes[t.id] = bytes;
      // Trie insertion (a later duplicate content wins, as in HF's map).
      int32_t node = 0;
      for (char ch : t.content) {
        const auto b = static_cast<uint8_t>(ch);
        auto& nx = m->trie[node].next;
        auto it = std::lower_bound(nx.begin(), nx.end(), std::make_pair(b, int32_t{-1}));
        if (it != nx.end() && it->first == b) {
          node = it->second;
        } else {
          const auto child = static_cast<int32_t>(m->trie.size());
          nx.insert(it, {b, child});
          m->trie.emplace_back();
          node = child;
        }
      }
      m->trie[node].token = static_cast<int32_t>(m->added.size());
      m->first_byte[static_cast<uint8_t>(t.content[0])] = true;
      m->added.push_back(std::move(t));
    }
  }

  // --- pre-tokenizer: Sequence of Split(Isolated) + a final ByteLevel.
  {
    const Json* pt = Find(j, "pre_tokenizer");
    if (!pt) Fail(ErrorKind::kCorruptData, "{}: pre_tokenizer is missing (byte-level BPE needs ByteLevel)", src);
    std::vector<const Json*> steps;
    if (pt->value("type", "") == "Sequence") {
      if (!pt->contains("pretokenizers") || !(*pt)["pretokenizers"].is_array())
        Fail(ErrorKind::kCorruptData, "{}: pre_tokenizer.pretokenizers is not an array", src);
      for (const Json& s : (*pt)["pretokenizers"]) steps.push_back(&s);
    } else {
      steps.push_back(pt);
    }
    bool byte_level = false;
    for (size_t k = 0; k < steps.size(); ++k) {
      const Json& s = *steps[k];
      const std::string type = s.value("type", "");
      const std::string where = fmt::format("{}: pre_tokenizer step {} ({})", src, k, type);
      if (byte_level) Fail(ErrorKind::kCorruptData, "{} follows ByteLevel, which must be last", where);
      if (type == "Split") {
        if (s.value("behavior", "") != "Isolated")
          Fail(ErrorKind::kCorruptData, "{}: behavior {} is not supported (only Isolated)", where,
               s.value("behavior", ""));
        if (BoolOr(s, "invert", false)) Fail(ErrorKind::kCorruptData, "{}: invert = true is not supported", where);
        const Json* pat = Find(s, "pattern");
        if (pat && Find(*pat, "Regex") && (*pat)["Regex"].is_string())
          m->splits.emplace_back((*pat)["Regex"].get<std::string>(), where);
        else if (pat && Find(*pat, "String") && (*pat)["String"].is_string())
          m->splits.emplace_back(EscapeLiteral((*pat)["String"].get<std::string>()), where);
        else
          Fail(ErrorKind::kCorruptData, "{}: pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where);
      } else if (type == "ByteLevel") {
        if (BoolOr(s, "add_prefix_space", false))
          Fail(ErrorKind::kCorruptData, "{}: add_prefix_space = true is not supported", where);
        if (BoolOr(s, "use_regex", true)) m->splits.emplace_back(kGpt2Pattern, where);
        byte_level = true;
      } else {
        Fail(ErrorKind::kCorruptData, "{}: pre-tokenizer type is not supported", where);
      }
    }
    if (!byte_level) Fail(ErrorKind::kCorruptData, "{}: pre_tokenizer has no ByteLevel step", src);
  }

  // --- decoder: ByteLevel (or none, which we treat the same for byte-level BPE).
  if (const Json* d = Find(j, "decoder"); d && d->value("type", "") != "ByteLevel")
    Fail(ErrorKind::kCorruptData, "{}: decoder type {} is not supported (expected ByteLevel)", src,
         d->value("type", ""));

  // --- whole-piece shortcut table: exact because it caches our own BPE.
  m->self_bpe.assign(m->size, 0);
  {
    std::vector<int32_t> tmp;
    for (const auto& [tok, id64] : vocab) {
      const auto id = static_cast<int32_t>(id64);
      if (m->bytes_to_id.find(m->token_bytes[id]) == m->bytes_to_id.end()) continue;
      tmp.clear();
      m->BpeRaw(m->token_bytes[id], tmp);
      m->self_bpe[id] = tmp.size() == 1 && tmp[0] == id;
    }
  }

  // --- special tokens: tokenizer_config.json, else the post-processor.
  auto id_of = [&](const std::string& content, const std::string& what, const std::string& file) -> int32_t {
    if (content.empty()) return -1;
    auto it = m->token_to_id.find(content);
    if (it == m->token_to_id.end())
      Fail(ErrorKind::kCorruptData, "{}: {} {} is not a token of {}", file, what, content, src);
    return it->second;
  };
  bool template_from_config = false;
  if (!tokenizer_config_json.empty()) {
    const std::string csrc = tokenizer_config_json.string();
    const Json c = ParseJson(ReadFile(tokenizer_config_json), csrc);
    if (!c.is_object()) Fail(ErrorKind::kCorruptData, "{}: top level is not a JSON object", csrc);
    m->bos = id_of(ConfigTokenContent(c, "bos_token", csrc), "bos_token", csrc);
    m->eos = id_of(ConfigTokenContent(c, "eos_token", csrc), "eos_token", csrc);
    m->pad = id_of(ConfigTokenContent(c, "pad_token", csrc), "pad_token", csrc);
    const std::string cls = c.value("tokenizer_class", "");
    if (cls == "LlamaTokenizerFast" || cls == "LlamaTokenizer") {
      // transformers' LlamaTokenizerFast.update_post_processor(): defaults
      // add_bos_token = True, add_eos_token = False.
      template_from_config = true;
      if (BoolOr(c, "add_bos_token", true)) {
        if (m->bos < 0) Fail(ErrorKind::kCorruptData, "{}: add_bos_token is set but bos_token is missing", csrc);
        m->prefix_ids.push_back(m->bos);
      }
      if (BoolOr(c, "add_eos_token", false)) {
        if (m->eos < 0) Fail(ErrorKind::kCorruptData, "{}: add_eos_token is set but eos_token is missing", csrc);
        m->suffix_ids.push_back(m->eos);
      }
    }
  }
  if (!template_from_config) {
    if (const Json* pp = Find(j, "post_processor")) {
      const std::string type = pp->value("type", "");
      if (type == "TemplateProcessing") {
        const Json* single = Find(*pp, "single");
        if (!single || !single->is_array())
          Fail(ErrorKind::kCorruptData, "{}: post_processor.single is not an array", src);
        bool seen_seq = false;
        for (const Json& piece : *single) {
          if (piece.contains("Sequence")) {
            seen_seq = true;
          } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id")) {
            const std::string name = piece["SpecialToken"]["id"].get<std::string>();
            const int32_t id = id_of(name, "post_processor special token", src);
            (seen_seq ? m->suffix_ids : m->prefix_ids).push_back(id);
          } else {
            Fail(ErrorKind::kCorruptData, "{}: post_processor.single entry {} not understood", src, piece.dump());
          }
        }
      } else if (type != "ByteLevel") {
        Fail(ErrorKind::kCorruptData, "{}: post_processor type {} is not supported", src, type);
      }
    }
  }
  return Tokenizer(std::move(m));
}

}  // namespace deepinfer
