#include "model/v41/engram.h"

#include <fstream>

#include "base/error.h"

namespace deepinfer::v41 {
namespace {

struct MultiplierRow {
  int layer_id;
  int64_t compressed_vocab;
  std::vector<int64_t> values;  // m = 2·(PCG64 bounded draw) + 1, in draw order
};

// numpy default_rng(10007·layer_id).integers(0, ⌊⌊(2^63−1)/V_c⌋/2⌋, size=n) · 2 + 1
// (model-spec §3.3.2, TINY_V41_SPEC §1). Draws are sequential, so a shorter
// request is a prefix of a longer one.
const std::vector<MultiplierRow>& MultiplierTable() {
  static const std::vector<MultiplierRow> table = {
      {1, 99092, {76632096046245, 4839876093313, 35959672319349, 73987337458391}},
      {14, 99092, {67716810739261, 51510806800915, 30921347202721, 82619226485591}},
      {2, 99092, {76507469730479, 37097805264573, 22647385550623}},
  };
  return table;
}

}  // namespace

std::vector<int64_t> EngramMultipliers(int layer_id, int64_t compressed_vocab, int count) {
  for (const auto& row : MultiplierTable()) {
    if (row.layer_id == layer_id && row.compressed_vocab == compressed_vocab) {
      if (count > static_cast<int>(row.values.size()))
        Fail(ErrorKind::kInvalidArgument,
             "Engram hash multipliers for layer {} with engram_compressed_vocab_size {}: {} needed "
             "(engram_max_ngram_size), only {} known",
             layer_id, compressed_vocab, count, row.values.size());
      return {row.values.begin(), row.values.begin() + count};
    }
  }
  Fail(ErrorKind::kInvalidArgument,
       "no Engram hash multipliers for layer {} with engram_compressed_vocab_size {}; known: "
       "layers 1, 14 (release) and 1, 2 (tiny) with 99092 (model-spec §3.3.2: they are numpy "
       "PCG64 draws and must be added as data)",
       layer_id, compressed_vocab);
}

std::vector<int32_t> LoadEngramTokenMap(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  if (!f) Fail(ErrorKind::kNotFound, "Engram token map {} not found", file.string());
  f.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(f.tellg());
  if (size <= 0 || size % 4 != 0)
    Fail(ErrorKind::kCorruptData, "Engram token map {}: expected a non-empty int32 array, found {} bytes",
         file.string(), size);
  std::vector<int32_t> map(static_cast<size_t>(size / 4));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(map.data()), size);
  if (!f) Fail(ErrorKind::kCorruptData, "Engram token map {}: read failed", file.string());
  return map;
}

EngramHasher::EngramHasher(const ModelConfig& cfg, std::vector<int32_t> token_map)
    : max_ngram_(cfg.engram_max_ngram_size), n_heads_(cfg.engram_n_heads), map_(std::move(token_map)) {
  const int64_t vc = cfg.engram_compressed_vocab_size;
  if (max_ngram_ < 2 || max_ngram_ > 16)
    Fail(ErrorKind::kInvalidArgument, "engram_max_ngram_size {} not supported, expected 2..16", max_ngram_);
  if (map_.empty()) Fail(ErrorKind::kInvalidArgument, "Engram token map is empty");
  if (cfg.engram_pad_id < 0 || cfg.engram_pad_id >= static_cast<int64_t>(map_.size()))
    Fail(ErrorKind::kInvalidArgument, "engram_pad_id {} outside the token map of {} entries", cfg.engram_pad_id,
         map_.size());
  std::vector<bool> seen(static_cast<size_t>(vc), false);
  int64_t distinct = 0;
  for (size_t i = 0; i < map_.size(); ++i) {
    if (map_[i] < 0 || map_[i] >= vc)
      Fail(ErrorKind::kInvalidArgument,
           "Engram token map: token {} maps to {}, expected an id in [0, {}) (engram_compressed_vocab_size)", i,
           map_[i], vc);
    if (!seen[map_[i]]) { seen[map_[i]] = true; ++distinct; }
  }
  if (distinct != vc)
    Fail(ErrorKind::kInvalidArgument,
         "Engram token map has {} distinct compressed ids, expected {} (engram_compressed_vocab_size); the hash "
         "multipliers depend on it",
         distinct, vc);
  pad_ = map_[cfg.engram_pad_id];
  cols_ = (max_ngram_ - 1) * n_heads_;
  if (cfg.engram_primes.size() != cfg.engram_layer_ids.size())
    Fail(ErrorKind::kInternal, "config has {} Engram prime sets for {} Engram layers", cfg.engram_primes.size(),
         cfg.engram_layer_ids.size());
  for (size_t k = 0; k < cfg.engram_layer_ids.size(); ++k) {
    multipliers_.push_back(EngramMultipliers(cfg.engram_layer_ids[k], vc, max_ngram_));
    const auto& pr = cfg.engram_primes[k];
    if (static_cast<int>(pr.size()) != cols_)
      Fail(ErrorKind::kInternal, "Engram layer {}: {} primes, expected {}", cfg.engram_layer_ids[k], pr.size(),
           cols_);
    primes_.push_back(pr);
    std::vector<int64_t> off(pr.size());
    int64_t acc = 0;
    for (size_t i = 0; i < pr.size(); ++i) { off[i] = acc; acc += pr[i]; }
    offsets_.push_back(std::move(off));
  }
}

void EngramHasher::Hash(const int32_t* history, int64_t* out) const {
  int64_t tok[16];
  bool blocked = false;
  for (int s = 0; s < max_ngram_; ++s) {
    blocked = blocked || history[s] < 0;
    tok[s] = blocked ? pad_ : static_cast<int64_t>(map_[history[s]]);
  }
  for (size_t k = 0; k < multipliers_.size(); ++k) {
    const auto& m = multipliers_[k];
    // int64 products (< 2^63 by construction of the multipliers); uint64 keeps wrap-around defined.
    uint64_t rolling = static_cast<uint64_t>(tok[0]) * static_cast<uint64_t>(m[0]);
    int64_t* o = out + k * cols_;
    for (int n = 1; n < max_ngram_; ++n) {
      rolling ^= static_cast<uint64_t>(tok[n]) * static_cast<uint64_t>(m[n]);
      const auto h = static_cast<int64_t>(rolling);
      for (int hd = 0; hd < n_heads_; ++hd) {
        const int i = (n - 1) * n_heads_ + hd;
        int64_t r = h % primes_[k][i];
        if (r < 0) r += primes_[k][i];  // torch's remainder takes the divisor's sign
        o[i] = r + offsets_[k][i];
      }
    }
  }
}

}  // namespace deepinfer::v41
