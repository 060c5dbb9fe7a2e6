// deepinfer/engine/speculative.h — speculative decoding (docs/speculative.md):
// the --speculative-config flag (vLLM's JSON), the proposer interface and the
// n-gram proposer.
//
// A proposer looks at one sequence's tokens (prompt + accepted output) and
// returns up to k draft ids for the positions after the last one. The engine
// feeds [last token, drafts...] as one chunk of 1 + k rows to the target
// model, samples every row exactly as it would sample that position without
// speculation, and keeps drafts while they equal the row's sampled token
// (engine.cc, "Speculative verification"). A new method (a model-based
// drafter) implements Proposer and is created by MakeProposer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"

namespace deepinfer {

// --speculative-config '{"method": ..., "num_speculative_tokens": k, ...}'
// (vLLM's field names). Methods: "ngram" (prompt_lookup_min/max: n-gram
// lengths tried, longest first), "mtp" (V4's MTP block mtp.0, a model-based
// drafter: backend.h ModelDrafter) and "dspark" (V4.1's DSpark drafter
// mtp.0 .. mtp.{n-1}, model/v41/dspark.h, also a ModelDrafter; refused at
// start-up on a model without one).
struct SpeculativeConfig {
  std::string method;                 // "ngram" | "mtp" | "dspark"
  int num_speculative_tokens = 0;     // k >= 1: draft tokens per step and sequence
  int prompt_lookup_min = 1;          // ngram: shortest n-gram matched (>= 1)
  int prompt_lookup_max = 0;          // ngram: longest n-gram matched (>= min); 0 = min
  bool enabled() const { return !method.empty(); }
  // Drafts come from the model's own drafter (backend.h ModelDrafter), not a Proposer.
  bool model_drafter() const { return method == "mtp" || method == "dspark"; }
};

// Parses the flag's JSON. Empty string = speculation off. Throws
// Error(kInvalidArgument) naming --speculative-config and the bad field
// (unknown method or field, k < 1, lookup bounds out of order).
SpeculativeConfig ParseSpeculativeConfig(const std::string& json);
// Checks the config against the model: k + 1 rows must fit the window ring
// (rollback restores ring slots, which must be distinct), and "dspark" needs
// a drafter (cfg.n_mtp_layers > 0 and dspark_block_size > 1) with
// k <= dspark_block_size - 1. Throws Error(kInvalidArgument) naming
// --speculative-config.
void ValidateSpeculativeConfig(const SpeculativeConfig& spec, const ModelConfig& cfg);

// Drafts for one sequence. `q` is empty for deterministic drafts (a one-hot
// draft distribution: verification by sampling the target row with the
// request's own draw and comparing, which is the speculative-sampling rule
// min(1, p/q) for one-hot q, see docs/speculative.md); a sampling drafter
// fills one probability row per draft (vocab floats each).
struct DraftProposal {
  std::vector<int32_t> ids;
  std::vector<float> q;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // tokens: the sequence's known tokens (prompt + accepted output, the last
  // one not yet fed to the model). max_drafts >= 1. Returns at most
  // max_drafts ids (possibly none). Must be a pure function of its inputs
  // (requests give the same drafts alone and batched).
  virtual DraftProposal Propose(std::span<const int32_t> tokens, int max_drafts) const = 0;
};

// vLLM's n-gram (prompt lookup) proposer: for n from prompt_lookup_max down to
// prompt_lookup_min, the last n tokens are searched for earlier in the
// sequence; at the most recent earlier occurrence, the tokens that followed
// it (up to max_drafts, fewer at the end of the sequence) are the drafts. No
// match for any n: no drafts.
class NgramProposer : public Proposer {
 public:
  NgramProposer(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}
  DraftProposal Propose(std::span<const int32_t> tokens, int max_drafts) const override;

 private:
  int min_n_, max_n_;
};

// The proposer of a validated config's token-level method ("ngram"); throws
// Error(kInvalidArgument) naming --speculative-config for any other (the
// model drafters come from the backend, backend.h EnableDrafter).
std::unique_ptr<Proposer> MakeProposer(const SpeculativeConfig& spec);

}  // namespace deepinfer
