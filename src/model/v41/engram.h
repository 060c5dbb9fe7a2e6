// deepinfer/model/v41/engram.h — Engram n-gram hashing of V4.1
// (model-spec §3.3.2), computed on the host with exact int64 arithmetic.
//
// Inputs are data, not computed here:
//   * the compressed token map (one compressed id per token id; built from the
//     tokenizer by the tokenizer module, or loaded from a file such as the
//     golden `engram_token_map.i32`, int32 little-endian);
//   * the hash multipliers, shipped as a table keyed by (layer id, compressed
//     vocabulary size) — they come from numpy's PCG64 stream, which is not
//     reimplemented (model-spec §3.3.2 advises shipping them as data).
// The bucket primes come from the config (ModelConfig::engram_primes, the
// spec's rule; Σ primes = table rows is checked when the config is loaded).
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "model/config.h"

namespace deepinfer::v41 {

// The first `count` hash multipliers of Engram layer `layer_id` for a
// compressed vocabulary of `compressed_vocab` ids. Known: the V4.1-Flash
// release (layers 1 and 14, V_c 99092, 4 per layer) and the tiny test model
// (layers 1 and 2, V_c 99092, 3 per layer). Throws Error(kInvalidArgument)
// naming the combination for anything else.
std::vector<int64_t> EngramMultipliers(int layer_id, int64_t compressed_vocab, int count);

// Reads an int32 little-endian token map file. Throws kNotFound / kCorruptData.
std::vector<int32_t> LoadEngramTokenMap(const std::filesystem::path& file);

class EngramHasher {
 public:
  // Validates the map: size ≥ 1, every entry in [0, engram_compressed_vocab_size),
  // and that its number of distinct ids equals engram_compressed_vocab_size
  // (the multipliers depend on it); throws Error(kInvalidArgument) otherwise.
  EngramHasher(const ModelConfig& cfg, std::vector<int32_t> token_map);

  int n_layers() const { return static_cast<int>(multipliers_.size()); }
  // Hash columns per Engram layer: (max_ngram − 1) · n_heads.
  int cols() const { return cols_; }
  // Look-back length: max_ngram_size − 1 earlier positions.
  int lookback() const { return max_ngram_ - 1; }
  int64_t map_size() const { return static_cast<int64_t>(map_.size()); }
  // Compressed id of a raw token (the caller checks the range with map_size()).
  int64_t Compressed(int32_t token) const { return map_[token]; }

  // Hash ids of one position. `history[s]` = raw token id at position p − s
  // for s = 0 .. max_ngram−1, or −1 if that position is before the sequence or
  // DEAD (an image position). Writes n_layers()·cols() absolute table row ids
  // (offsets included), layer-major, (n, head) order within a layer.
  void Hash(const int32_t* history, int64_t* out) const;

 private:
  int max_ngram_ = 0, n_heads_ = 0, cols_ = 0;
  int64_t pad_ = 0;
  std::vector<int32_t> map_;
  std::vector<std::vector<int64_t>> multipliers_;  // [layer][s]
  std::vector<std::vector<int64_t>> primes_;       // [layer][(n-2)·heads + h]
  std::vector<std::vector<int64_t>> offsets_;      // same shape, exclusive prefix sums
};

}  // namespace deepinfer::v41
