#include "structured/grammar.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"

namespace deepinfer::structured {

CodepointRanges NormalizeRanges(CodepointRanges r) {
  std::sort(r.begin(), r.end());
  CodepointRanges out;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodepointRanges ComplementRanges(const CodepointRanges& r) {
  CodepointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

CodepointRanges IntersectRanges(const CodepointRanges& a, const CodepointRanges& b) {
  CodepointRanges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

int EncodedLength(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// Splits [lo, hi] into ranges whose UTF-8 encodings are byte-wise products of
// ranges (the standard construction used by regex engines).
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) Utf8Sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) Utf8Sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && hi > max) {
      Utf8Sequences(lo, max, out);
      Utf8Sequences(max + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  const int n = EncodedLength(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  AppendUtf8(lo, &a);
  AppendUtf8(hi, &b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out->push_back(std::move(seq));
}

[[noreturn]] void TooLarge() {
  Fail(ErrorKind::kInvalidArgument, "the constraint is too large: it compiles to more than {} grammar elements",
       kMaxElements);
}

}  // namespace

int Grammar::NewRule(std::string name) {
  rules_.emplace_back();
  names_.push_back(std::move(name));
  return static_cast<int>(rules_.size()) - 1;
}

int Grammar::RuleByName(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  const int r = NewRule(name);
  by_name_[name] = r;
  return r;
}

void Grammar::AddAlt(int rule, const Seq& seq) {
  num_elements_ += static_cast<int64_t>(seq.size()) + 1;
  if (num_elements_ > kMaxElements) TooLarge();
  rules_[static_cast<size_t>(rule)].push_back(seq);
}

Element Grammar::Bytes(const ByteSet& s) {
  auto it = set_index_.find(s);
  if (it != set_index_.end()) return {Element::kBytes, it->second};
  const int32_t id = static_cast<int32_t>(sets_.size());
  sets_.push_back(s);
  set_index_[s] = id;
  return {Element::kBytes, id};
}

Element Grammar::Byte(uint8_t b) {
  ByteSet s;
  s.Add(b);
  return Bytes(s);
}

Seq Grammar::Literal(std::string_view bytes) {
  Seq s;
  s.reserve(bytes.size());
  for (char c : bytes) s.push_back(Byte(static_cast<uint8_t>(c)));
  return s;
}

Element Grammar::Choice(const std::vector<Seq>& alts, std::string name) {
  const int r = NewRule(std::move(name));
  for (const Seq& a : alts) AddAlt(r, a);
  return Ref(r);
}

Element Grammar::Repeat(const Seq& seq, int64_t min, int64_t max, std::string name) {
  if (max >= 0 && max < min)
    Fail(ErrorKind::kInvalidArgument, "repetition {{{},{}}}: the maximum is below the minimum", min, max);
  if (min > kMaxElements || max > kMaxElements) TooLarge();
  std::vector<std::pair<int, int32_t>> key;
  for (const Element& e : seq) key.emplace_back(e.kind, e.value);
  auto cache_key = std::make_pair(key, std::make_pair(min, max));
  if (auto it = repeat_cache_.find(cache_key); it != repeat_cache_.end()) return Ref(it->second);
  // Tail: unbounded loop, or a chain of (max - min) optional copies.
  int tail = -1;
  if (max < 0) {
    tail = NewRule(name + "_star");
    Seq loop = seq;
    loop.push_back(Ref(tail));
    AddAlt(tail, loop);
    AddAlt(tail, {});
  } else {
    for (int64_t k = 0; k < max - min; ++k) {
      const int r = NewRule(fmt::format("{}_opt{}", name, k + 1));
      Seq one = seq;
      if (tail >= 0) one.push_back(Ref(tail));
      AddAlt(r, one);
      AddAlt(r, {});
      tail = r;
    }
  }
  const int r = NewRule(fmt::format("{}_{}_{}", name, min, max));
  Seq body;
  if (static_cast<int64_t>(seq.size()) * min > kMaxElements) TooLarge();
  for (int64_t k = 0; k < min; ++k) body.insert(body.end(), seq.begin(), seq.end());
  if (tail >= 0) body.push_back(Ref(tail));
  AddAlt(r, body);
  repeat_cache_[cache_key] = r;
  return Ref(r);
}

Element Grammar::Utf8Set(const CodepointRanges& ranges) {
  if (auto it = utf8_cache_.find(ranges); it != utf8_cache_.end()) return Ref(it->second);
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [lo, hi] : ranges) Utf8Sequences(lo, std::min<uint32_t>(hi, 0x10FFFF), &seqs);
  const int r = NewRule("char");
  // Merge single-byte sequences into one byte set; others become alternatives.
  ByteSet ascii;
  bool any_ascii = false;
  for (const auto& s : seqs) {
    if (s.size() == 1) {
      ascii.AddRange(s[0].first, s[0].second);
      any_ascii = true;
      continue;
    }
    Seq alt;
    for (auto [lo, hi] : s) {
      ByteSet b;
      b.AddRange(lo, hi);
      alt.push_back(Bytes(b));
    }
    AddAlt(r, alt);
  }
  if (any_ascii) AddAlt(r, {Bytes(ascii)});
  if (seqs.empty()) AddAlt(r, {Bytes(ByteSet{})});  // the empty set: never matches
  utf8_cache_[ranges] = r;
  return Ref(r);
}

void Grammar::Finish(const std::string& what) {
  const int n = num_rules();
  if (root_ < 0 || root_ >= n) Fail(ErrorKind::kInternal, "{}: grammar has no root rule", what);
  for (int r = 0; r < n; ++r)
    if (rules_[static_cast<size_t>(r)].empty())
      Fail(ErrorKind::kInvalidArgument, "{}: rule \"{}\" is used but never defined", what, names_[static_cast<size_t>(r)]);
  // Nullable rules (fixpoint).
  std::vector<char> nullable(static_cast<size_t>(n), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < n; ++r) {
      if (nullable[static_cast<size_t>(r)]) continue;
      for (const Seq& alt : rules_[static_cast<size_t>(r)]) {
        bool all = true;
        for (const Element& e : alt)
          if (e.kind != Element::kRef || !nullable[static_cast<size_t>(e.value)]) {
            all = false;
            break;
          }
        if (all) {
          nullable[static_cast<size_t>(r)] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  // Left-recursion check: edges A -> B when B can start A; iterative DFS for a cycle.
  std::vector<std::vector<int>> edges(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (const Seq& alt : rules_[static_cast<size_t>(r)])
      for (const Element& e : alt) {
        if (e.kind != Element::kRef) break;
        edges[static_cast<size_t>(r)].push_back(e.value);
        if (!nullable[static_cast<size_t>(e.value)]) break;
      }
  std::vector<char> color(static_cast<size_t>(n), 0);  // 0 new, 1 on stack, 2 done
  for (int s = 0; s < n; ++s) {
    if (color[static_cast<size_t>(s)]) continue;
    std::vector<std::pair<int, size_t>> stack{{s, 0}};
    color[static_cast<size_t>(s)] = 1;
    while (!stack.empty()) {
      auto& [r, k] = stack.back();
      if (k < edges[static_cast<size_t>(r)].size()) {
        const int t = edges[static_cast<size_t>(r)][k++];
        if (color[static_cast<size_t>(t)] == 1)
          Fail(ErrorKind::kInvalidArgument, "{}: rule \"{}\" is left-recursive (it can start with itself); rewrite it "
               "with repetition", what, names_[static_cast<size_t>(t)]);
        if (color[static_cast<size_t>(t)] == 0) {
          color[static_cast<size_t>(t)] = 1;
          stack.emplace_back(t, 0);
        }
      } else {
        color[static_cast<size_t>(r)] = 2;
        stack.pop_back();
      }
    }
  }
  // Flatten.
  elems_.clear();
  elems_.reserve(static_cast<size_t>(num_elements_));
  alt_starts_.assign(static_cast<size_t>(n), {});
  for (int r = 0; r < n; ++r)
    for (const Seq& alt : rules_[static_cast<size_t>(r)]) {
      alt_starts_[static_cast<size_t>(r)].push_back(static_cast<int32_t>(elems_.size()));
      elems_.insert(elems_.end(), alt.begin(), alt.end());
      elems_.push_back({Element::kEnd, r});
    }
  rules_.clear();
  rules_.shrink_to_fit();
  repeat_cache_.clear();
}

std::string Grammar::ToString() const {
  auto set_str = [&](const ByteSet& s) {
    std::string out = "[";
    for (int b = 0; b < 256; ++b) {
      if (!s.Has(static_cast<uint8_t>(b))) continue;
      int e = b;
      while (e + 1 < 256 && s.Has(static_cast<uint8_t>(e + 1))) ++e;
      auto one = [](int c) { return c >= 0x21 && c < 0x7F && c != ']' && c != '\\' && c != '-' ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02X}", c); };
      out += one(b);
      if (e > b) out += "-" + one(e);
      b = e;
    }
    return out + "]";
  };
  std::string out;
  for (int r = 0; r < num_rules(); ++r) {
    out += fmt::format("{}#{} ::=", names_[static_cast<size_t>(r)], r);
    bool first = true;
    for (int32_t start : alt_starts_[static_cast<size_t>(r)]) {
      out += first ? " " : " | ";
      first = false;
      for (int32_t p = start; elems_[static_cast<size_t>(p)].kind != Element::kEnd; ++p) {
        const Element& e = elems_[static_cast<size_t>(p)];
        if (e.kind == Element::kBytes) out += set_str(sets_[static_cast<size_t>(e.value)]) + " ";
        else out += fmt::format("{}#{} ", names_[static_cast<size_t>(e.value)], e.value);
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace deepinfer::structured
