// deepinfer/structured/matcher.h — grammar → per-step token bitmask.
//
// Algorithm. The grammar (grammar.h) is run as a nondeterministic pushdown
// automaton over bytes: a configuration is the set of parse stacks that are
// still alive, each stack a chain of grammar positions whose top is a byte set
// to match next (or the empty stack: the input may end here). Stacks are
// hash-consed (a node = (position, parent node)), so a configuration is a
// sorted list of node ids and equal configurations are equal lists. Every
// distinct configuration becomes a state of a lazily built DFA whose
// transitions (state, byte) → state are computed on first use and cached, so
// after warm-up one byte costs one table lookup.
//
// A token mask for a state walks the vocabulary's byte trie (TokenVocab) in
// preorder, following the DFA and skipping every subtree whose prefix is dead;
// a token is allowed iff its whole byte string leaves a live state. EOS ids are
// allowed iff the state accepts (contains the empty stack). Masks are cached per
// state. A mask is a pure function of (grammar, configuration), so it never
// depends on the batch, the order of requests or what the caches hold: masks
// are batch-invariant by construction.
//
// Bitmask layout: the sampler's (sampler.h SetTokenBitmask): ceil(vocab/32)
// uint32 words, bit (id % 32) of word (id / 32) set = allowed.
//
// Bounds. A configuration may hold at most kMaxStacks stacks of depth at most
// kMaxDepth (Error kInvalidArgument: "the constraint is too ambiguous/deep");
// the DFA of one grammar keeps at most kMaxStates states and kMaxMasks masks —
// past that the caches are dropped and rebuilt on demand (results unchanged).
//
// Thread safety: CompiledGrammar serialises its cache updates with a mutex, so
// matchers of one grammar may run on different threads. A Matcher is used by
// one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::structured {

inline constexpr int kMaxStacks = 4096;
inline constexpr int kMaxDepth = 4096;
inline constexpr int64_t kMaxStates = 100'000;
inline constexpr int64_t kMaxMasks = 2048;

// The vocabulary as a byte trie in preorder. Built once per tokenizer.
class TokenVocab {
 public:
  // Every id of the tokenizer whose bytes are non-empty and that is not an
  // added token (added/special tokens — role markers, BOS — are never allowed
  // by a constraint) enters the trie; `eos_ids` are allowed where the grammar
  // may end. vocab_size = the logits row length (>= tokenizer.size()).
  TokenVocab(const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> eos_ids);
  // For tests: explicit token byte strings (id = index; empty = never allowed).
  TokenVocab(const std::vector<std::string>& token_bytes, std::vector<int32_t> eos_ids);

  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_words() const { return (vocab_size_ + 31) / 32; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const std::string& token_bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  int64_t num_trie_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  uint64_t uid() const { return uid_; }

  struct Node {
    uint8_t byte;
    uint16_t depth;       // 1 = first byte of a token
    int32_t subtree_end;  // index after this node's subtree
    int32_t first_token;  // tokens ending here: token_ids_[first_token, first_token + num_tokens)
    int32_t num_tokens;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& trie_token_ids() const { return token_ids_; }

 private:
  void Build();
  int64_t vocab_size_ = 0;
  std::vector<int32_t> eos_ids_;
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  uint16_t max_depth_ = 0;
  uint64_t uid_ = 0;
};

// A grammar with its lazy DFA and mask cache (shared by every request using
// the same constraint text; see constraint.h for the compile cache).
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::string description);
  const Grammar& grammar() const { return grammar_; }
  const std::string& description() const { return description_; }

  // A configuration in structural form (independent of cache state): each
  // stack bottom → top as grammar positions; an empty stack = may end.
  using Config = std::vector<std::vector<int32_t>>;
  Config InitialConfig();
  // Feeds bytes; returns false (and leaves *config unchanged) if they are rejected.
  bool Advance(Config* config, std::string_view bytes);
  bool Accepts(const Config& config);      // may the output end here?
  bool IsTerminal(const Config& config);   // accepting and no byte can follow
  // Fills `words` (vocab.num_words() entries) with the mask of `config`.
  void FillMask(const Config& config, const TokenVocab& vocab, std::span<uint32_t> words);

  struct Stats {
    int64_t states = 0, masks = 0, mask_hits = 0, mask_misses = 0, resets = 0;
  };
  Stats stats();

 private:
  struct NodeRec {
    int32_t pos, parent;
    int32_t depth;
  };
  struct State {
    std::vector<int32_t> tops;  // sorted node ids; -1 = the empty stack
    bool accepting = false;
    std::unique_ptr<int32_t[]> trans;  // 256 entries: -2 unknown, -1 dead
    int32_t mask = -1;                 // index into masks_
  };
  int32_t Intern(int32_t pos, int32_t parent);
  void Closure(int32_t node, std::vector<int32_t>* out);
  void ClosurePos(int32_t pos, int32_t parent, std::vector<int32_t>* out);
  int32_t StateFor(std::vector<int32_t> tops);
  int32_t Step(int32_t state, uint8_t b);
  int32_t Intern(const Config& config);
  Config Structural(int32_t state) const;
  void ResetIfFull();

  Grammar grammar_;
  std::string description_;
  std::mutex mu_;
  std::vector<NodeRec> nodes_;
  std::unordered_map<uint64_t, int32_t> node_index_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_index_;
  std::vector<std::vector<uint32_t>> masks_;
  uint64_t mask_vocab_uid_ = 0;
  std::vector<uint32_t> visit_;  // closure visit stamps per node
  uint32_t stamp_ = 0;
  std::vector<int32_t> dfs_states_;
  Stats stats_;
};

// Per-request matcher: the current configuration of one generation.
class Matcher {
 public:
  Matcher(std::shared_ptr<CompiledGrammar> grammar, const TokenVocab* vocab);
  // The mask for the next token (vocab.num_words() words).
  void FillMask(std::span<uint32_t> words);
  // Advances by an accepted token. EOS ids finish the matcher; any other token
  // must be allowed by the last mask: returns false (state unchanged) if not.
  bool AcceptToken(int32_t token_id);
  bool finished() const { return finished_; }  // EOS accepted
  bool Accepts() { return grammar_->Accepts(config_); }
  bool IsTerminal() { return grammar_->IsTerminal(config_); }
  const CompiledGrammar& compiled() const { return *grammar_; }

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  const TokenVocab* vocab_;
  CompiledGrammar::Config config_;
  bool finished_ = false;
};

}  // namespace deepinfer::structured
