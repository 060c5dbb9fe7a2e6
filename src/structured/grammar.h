// deepinfer/structured/grammar.h — the byte-level context-free grammar every
// structured-output constraint compiles to (regex, JSON Schema, GBNF, choice).
//
// Form. A grammar is a list of rules; a rule is a list of alternatives; an
// alternative is a sequence of elements, each either a byte set (matches one
// byte in the set) or a reference to a rule. Everything is over BYTES: code
// points are written as their UTF-8 encodings (Utf8Set turns a set of code
// points into alternatives of byte-range sequences), so a constraint also
// forces valid UTF-8 wherever it says "a character".
//
// Flat layout (what the matcher walks, matcher.h): `elems` holds every
// alternative back to back, each terminated by a kEnd element; a position is
// an index into `elems`; rule r's alternatives start at alt_starts[r][k].
//
// Limits (checked by Finish(), Error kInvalidArgument naming the constraint):
//   * at most kMaxElements elements (a 1 MB schema or {0,1000000} repetition
//     is refused instead of compiled for minutes);
//   * no left recursion (A ::= A x, also through nullable prefixes): the
//     matcher expands rules top-down and would not terminate. The error names
//     the rule.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::structured {

inline constexpr int64_t kMaxElements = 4'000'000;

// A set of bytes (256 bits).
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool Has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool operator<(const ByteSet& o) const { return w < o.w; }
  bool operator==(const ByteSet& o) const { return w == o.w; }
};

struct Element {
  enum Kind : uint8_t { kBytes, kRef, kEnd };
  Kind kind = kEnd;
  int32_t value = 0;  // kBytes: index into Grammar::sets; kRef: rule id
};

// Inclusive code point ranges, sorted and disjoint after Normalize().
using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
CodepointRanges NormalizeRanges(CodepointRanges r);
// Complement within [0, 0x10FFFF] (surrogates are never encoded anyway).
CodepointRanges ComplementRanges(const CodepointRanges& r);
// Intersection of two normalized range lists.
CodepointRanges IntersectRanges(const CodepointRanges& a, const CodepointRanges& b);

using Seq = std::vector<Element>;

class Grammar {
 public:
  // --- building --------------------------------------------------------------
  int NewRule(std::string name);                 // a rule with no alternatives yet
  void AddAlt(int rule, const Seq& seq);         // seq may be empty (ε)
  Element Ref(int rule) const { return {Element::kRef, rule}; }
  Element Bytes(const ByteSet& s);               // one byte of the set
  Element Byte(uint8_t b);
  Seq Literal(std::string_view bytes);           // the exact bytes
  // A rule matching exactly one of `alts`.
  Element Choice(const std::vector<Seq>& alts, std::string name = "choice");
  // seq repeated min..max times (max < 0: unbounded). Right-recursive rules;
  // nested optional rules for bounded counts.
  Element Repeat(const Seq& seq, int64_t min, int64_t max, std::string name = "rep");
  // One UTF-8 encoded code point in `ranges` (normalized). Cached per set.
  Element Utf8Set(const CodepointRanges& ranges);
  // A named rule looked up or created by name (for GBNF / $ref forward uses).
  int RuleByName(const std::string& name);
  bool HasRule(const std::string& name) const { return by_name_.count(name) > 0; }

  void SetRoot(int rule) { root_ = rule; }
  // Flattens, checks the limits (see the header comment). `what` names the
  // constraint in errors ("guided_regex", "response_format.json_schema", ...).
  void Finish(const std::string& what);

  // --- compiled form (valid after Finish) ------------------------------------
  int root() const { return root_; }
  const std::vector<Element>& elems() const { return elems_; }
  const std::vector<std::vector<int32_t>>& alt_starts() const { return alt_starts_; }
  const std::vector<ByteSet>& sets() const { return sets_; }
  const std::string& rule_name(int r) const { return names_[static_cast<size_t>(r)]; }
  int num_rules() const { return static_cast<int>(rules_.size()); }
  int64_t num_elements() const { return num_elements_; }
  // Human-readable dump (GBNF-like), for tests and debugging.
  std::string ToString() const;

 private:
  std::vector<std::vector<Seq>> rules_;
  std::vector<std::string> names_;
  std::map<std::string, int> by_name_;
  std::vector<ByteSet> sets_;
  std::map<ByteSet, int32_t> set_index_;
  std::map<CodepointRanges, int> utf8_cache_;
  std::map<std::pair<std::vector<std::pair<int, int32_t>>, std::pair<int64_t, int64_t>>, int> repeat_cache_;
  int root_ = -1;
  int64_t num_elements_ = 0;
  std::vector<Element> elems_;
  std::vector<std::vector<int32_t>> alt_starts_;
};

// Appends the UTF-8 encoding of code point cp (<= 0x10FFFF, not a surrogate).
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace deepinfer::structured
