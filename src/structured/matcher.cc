#include "structured/matcher.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/error.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::structured {

namespace {
std::atomic<uint64_t> g_vocab_uid{1};
}

// ---------------------------------------------------------------------------
// TokenVocab

TokenVocab::TokenVocab(const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> eos_ids)
    : vocab_size_(vocab_size), eos_ids_(std::move(eos_ids)) {
  if (vocab_size_ < tokenizer.size())
    Fail(ErrorKind::kInvalidArgument, "vocabulary size {} is below the tokenizer's {} ids", vocab_size_, tokenizer.size());
  bytes_.resize(static_cast<size_t>(vocab_size_));
  for (int64_t id = 0; id < tokenizer.size(); ++id) {
    const int32_t i = static_cast<int32_t>(id);
    if (tokenizer.IsAdded(i)) continue;
    try {
      bytes_[static_cast<size_t>(id)] = std::string(tokenizer.TokenBytes(i));
    } catch (const Error&) {
      // a gap in the vocabulary: never allowed
    }
  }
  Build();
}

TokenVocab::TokenVocab(const std::vector<std::string>& token_bytes, std::vector<int32_t> eos_ids)
    : vocab_size_(static_cast<int64_t>(token_bytes.size())), eos_ids_(std::move(eos_ids)), bytes_(token_bytes) {
  for (int32_t e : eos_ids_) bytes_[static_cast<size_t>(e)].clear();
  Build();
}

void TokenVocab::Build() {
  uid_ = g_vocab_uid.fetch_add(1);
  for (int32_t e : eos_ids_)
    if (e < 0 || e >= vocab_size_) Fail(ErrorKind::kInvalidArgument, "EOS id {} is outside the vocabulary [0, {})", e, vocab_size_);
  std::vector<int32_t> order;
  for (int64_t id = 0; id < vocab_size_; ++id)
    if (!bytes_[static_cast<size_t>(id)].empty() &&
        std::find(eos_ids_.begin(), eos_ids_.end(), static_cast<int32_t>(id)) == eos_ids_.end())
      order.push_back(static_cast<int32_t>(id));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string &x = bytes_[static_cast<size_t>(a)], &y = bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  std::vector<int32_t> path;  // node index per depth - 1
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    if (s.size() > 65535) Fail(ErrorKind::kInvalidArgument, "token {} is longer than 65535 bytes", id);
    size_t common = 0;
    if (prev) {
      while (common < s.size() && common < prev->size() && common < path.size() && s[common] == (*prev)[common])
        ++common;
    }
    while (path.size() > common) {
      nodes_[static_cast<size_t>(path.back())].subtree_end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t k = common; k < s.size(); ++k) {
      Node n{static_cast<uint8_t>(s[k]), static_cast<uint16_t>(k + 1), 0, 0, 0};
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back(n);
      max_depth_ = std::max<uint16_t>(max_depth_, n.depth);
    }
    Node& last = nodes_[static_cast<size_t>(path.back())];
    if (last.num_tokens == 0) last.first_token = static_cast<int32_t>(token_ids_.size());
    token_ids_.push_back(id);
    ++last.num_tokens;
    prev = &s;
  }
  while (!path.empty()) {
    nodes_[static_cast<size_t>(path.back())].subtree_end = static_cast<int32_t>(nodes_.size());
    path.pop_back();
  }
}

// ---------------------------------------------------------------------------
// CompiledGrammar

CompiledGrammar::CompiledGrammar(Grammar grammar, std::string description)
    : grammar_(std::move(grammar)), description_(std::move(description)) {}

int32_t CompiledGrammar::Intern(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent + 1);
  auto [it, inserted] = node_index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) {
    const int32_t depth = parent < 0 ? 1 : nodes_[static_cast<size_t>(parent)].depth + 1;
    if (depth > kMaxDepth) {
      node_index_.erase(it);
      Fail(ErrorKind::kInvalidArgument, "{}: the output nests deeper than {} grammar levels", description_, kMaxDepth);
    }
    nodes_.push_back({pos, parent, depth});
  }
  return it->second;
}

void CompiledGrammar::Closure(int32_t start, std::vector<int32_t>* out) {
  const auto& elems = grammar_.elems();
  std::vector<int32_t> work{start};
  while (!work.empty()) {
    const int32_t n = work.back();
    work.pop_back();
    if (n < 0) {
      out->push_back(-1);
      continue;
    }
    if (visit_.size() < nodes_.size()) visit_.resize(nodes_.size() * 2, 0);
    if (visit_[static_cast<size_t>(n)] == stamp_) continue;
    visit_[static_cast<size_t>(n)] = stamp_;
    const NodeRec rec = nodes_[static_cast<size_t>(n)];
    const Element& e = elems[static_cast<size_t>(rec.pos)];
    if (e.kind == Element::kBytes) {
      out->push_back(n);
      if (out->size() > static_cast<size_t>(kMaxStacks))
        Fail(ErrorKind::kInvalidArgument, "{}: the constraint is too ambiguous (more than {} live parses)", description_,
             kMaxStacks);
    } else if (e.kind == Element::kEnd) {
      work.push_back(rec.parent);
    } else {
      const int32_t ret = elems[static_cast<size_t>(rec.pos) + 1].kind == Element::kEnd
                              ? rec.parent
                              : Intern(rec.pos + 1, rec.parent);
      for (int32_t a : grammar_.alt_starts()[static_cast<size_t>(e.value)]) {
        if (elems[static_cast<size_t>(a)].kind == Element::kEnd) work.push_back(ret);
        else work.push_back(Intern(a, ret));
      }
    }
  }
}

int32_t CompiledGrammar::StateFor(std::vector<int32_t> tops) {
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  std::string key(reinterpret_cast<const char*>(tops.data()), tops.size() * sizeof(int32_t));
  auto [it, inserted] = state_index_.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (inserted) {
    State s;
    s.accepting = !tops.empty() && tops[0] == -1;
    s.tops = std::move(tops);
    states_.push_back(std::move(s));
  }
  return it->second;
}

int32_t CompiledGrammar::Step(int32_t state, uint8_t b) {
  State& st = states_[static_cast<size_t>(state)];
  if (!st.trans) {
    st.trans = std::make_unique<int32_t[]>(256);
    std::fill_n(st.trans.get(), 256, -2);
  }
  if (st.trans[b] != -2) return st.trans[b];
  const auto& elems = grammar_.elems();
  std::vector<int32_t> out;
  ++stamp_;
  if (stamp_ == 0) {
    std::fill(visit_.begin(), visit_.end(), 0);
    stamp_ = 1;
  }
  const std::vector<int32_t> tops = states_[static_cast<size_t>(state)].tops;  // copy: states_ may grow
  for (int32_t t : tops) {
    if (t < 0) continue;
    const NodeRec rec = nodes_[static_cast<size_t>(t)];
    if (!grammar_.sets()[static_cast<size_t>(elems[static_cast<size_t>(rec.pos)].value)].Has(b)) continue;
    const int32_t next = elems[static_cast<size_t>(rec.pos) + 1].kind == Element::kEnd ? rec.parent
                                                                                       : Intern(rec.pos + 1, rec.parent);
    Closure(next, &out);
  }
  const int32_t result = out.empty() ? -1 : StateFor(std::move(out));
  states_[static_cast<size_t>(state)].trans[b] = result;
  return result;
}

int32_t CompiledGrammar::Intern(const Config& config) {
  if (config.empty()) return -1;
  std::vector<int32_t> tops;
  tops.reserve(config.size());
  for (const auto& stack : config) {
    int32_t parent = -1;
    for (int32_t pos : stack) parent = Intern(pos, parent);
    tops.push_back(parent);
  }
  return StateFor(std::move(tops));
}

CompiledGrammar::Config CompiledGrammar::Structural(int32_t state) const {
  Config c;
  for (int32_t t : states_[static_cast<size_t>(state)].tops) {
    std::vector<int32_t> stack;
    for (int32_t n = t; n >= 0; n = nodes_[static_cast<size_t>(n)].parent) stack.push_back(nodes_[static_cast<size_t>(n)].pos);
    std::reverse(stack.begin(), stack.end());
    c.push_back(std::move(stack));
  }
  return c;
}

void CompiledGrammar::ResetIfFull() {
  if (static_cast<int64_t>(states_.size()) > kMaxStates || nodes_.size() > 20'000'000) {
    states_.clear();
    state_index_.clear();
    nodes_.clear();
    node_index_.clear();
    visit_.clear();
    masks_.clear();
    ++stats_.resets;
  }
  if (static_cast<int64_t>(masks_.size()) >= kMaxMasks) {
    masks_.clear();
    for (State& s : states_) s.mask = -1;
  }
}

CompiledGrammar::Config CompiledGrammar::InitialConfig() {
  std::lock_guard<std::mutex> lock(mu_);
  ResetIfFull();
  std::vector<int32_t> out;
  ++stamp_;
  const auto& elems = grammar_.elems();
  for (int32_t a : grammar_.alt_starts()[static_cast<size_t>(grammar_.root())]) {
    if (elems[static_cast<size_t>(a)].kind == Element::kEnd) out.push_back(-1);
    else Closure(Intern(a, -1), &out);
  }
  if (out.empty()) Fail(ErrorKind::kInvalidArgument, "{}: the constraint matches no output at all", description_);
  return Structural(StateFor(std::move(out)));
}

bool CompiledGrammar::Advance(Config* config, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ResetIfFull();
  int32_t s = Intern(*config);
  if (s < 0) return false;
  for (char c : bytes) {
    s = Step(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  *config = Structural(s);
  return true;
}

bool CompiledGrammar::Accepts(const Config& config) {
  for (const auto& st : config)
    if (st.empty()) return true;
  return false;
}

bool CompiledGrammar::IsTerminal(const Config& config) {
  return config.size() == 1 && config[0].empty();
}

void CompiledGrammar::FillMask(const Config& config, const TokenVocab& vocab, std::span<uint32_t> words) {
  if (static_cast<int64_t>(words.size()) != vocab.num_words())
    Fail(ErrorKind::kInternal, "mask has {} words, the vocabulary needs {}", words.size(), vocab.num_words());
  std::lock_guard<std::mutex> lock(mu_);
  ResetIfFull();
  if (mask_vocab_uid_ != vocab.uid()) {
    masks_.clear();
    for (State& s : states_) s.mask = -1;
    mask_vocab_uid_ = vocab.uid();
  }
  const int32_t s0 = Intern(config);
  if (s0 >= 0 && states_[static_cast<size_t>(s0)].mask >= 0) {
    const auto& m = masks_[static_cast<size_t>(states_[static_cast<size_t>(s0)].mask)];
    std::copy(m.begin(), m.end(), words.begin());
    ++stats_.mask_hits;
    return;
  }
  ++stats_.mask_misses;
  std::fill(words.begin(), words.end(), 0u);
  if (s0 < 0) return;
  const auto& nodes = vocab.nodes();
  const auto& ids = vocab.trie_token_ids();
  dfs_states_.resize(1 + 65536);
  dfs_states_[0] = s0;
  const int32_t n = static_cast<int32_t>(nodes.size());
  for (int32_t i = 0; i < n;) {
    const TokenVocab::Node& nd = nodes[static_cast<size_t>(i)];
    const int32_t ps = dfs_states_[nd.depth - 1];
    const State& pst = states_[static_cast<size_t>(ps)];
    int32_t t = pst.trans ? pst.trans[nd.byte] : -2;
    if (t == -2) t = Step(ps, nd.byte);
    if (t < 0) {
      i = nd.subtree_end;
      continue;
    }
    dfs_states_[nd.depth] = t;
    for (int32_t k = 0; k < nd.num_tokens; ++k) {
      const int32_t id = ids[static_cast<size_t>(nd.first_token + k)];
      words[static_cast<size_t>(id >> 5)] |= uint32_t{1} << (id & 31);
    }
    ++i;
  }
  if (states_[static_cast<size_t>(s0)].accepting)
    for (int32_t e : vocab.eos_ids()) words[static_cast<size_t>(e >> 5)] |= uint32_t{1} << (e & 31);
  states_[static_cast<size_t>(s0)].mask = static_cast<int32_t>(masks_.size());
  masks_.emplace_back(words.begin(), words.end());
}

CompiledGrammar::Stats CompiledGrammar::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.states = static_cast<int64_t>(states_.size());
  s.masks = static_cast<int64_t>(masks_.size());
  return s;
}

// ---------------------------------------------------------------------------
// Matcher

Matcher::Matcher(std::shared_ptr<CompiledGrammar> grammar, const TokenVocab* vocab)
    : grammar_(std::move(grammar)), vocab_(vocab) {
  config_ = grammar_->InitialConfig();
}

void Matcher::FillMask(std::span<uint32_t> words) {
  if (finished_) {
    std::fill(words.begin(), words.end(), 0u);
    return;
  }
  grammar_->FillMask(config_, *vocab_, words);
}

bool Matcher::AcceptToken(int32_t token_id) {
  if (finished_) return false;
  const auto& eos = vocab_->eos_ids();
  if (std::find(eos.begin(), eos.end(), token_id) != eos.end()) {
    if (!grammar_->Accepts(config_)) return false;
    finished_ = true;
    return true;
  }
  if (token_id < 0 || token_id >= vocab_->vocab_size()) return false;
  const std::string& b = vocab_->token_bytes(token_id);
  if (b.empty()) return false;
  return grammar_->Advance(&config_, b);
}

}  // namespace deepinfer::structured
