// The "canary" model backend of the engine tests (engine_test.cc,
// parallel_test.cc): it stores per-position markers in every state kind of
// the paged pool, verifies on every step that it reads back exactly its own
// sequence's rows, and derives its logits from what it read. So any
// cache-addressing, scheduling, preemption or padding bug changes the tokens
// or throws.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "deepinfer/engine.h"
#include "engine/backend.h"

namespace deepinfer::test_support {

constexpr int64_t kVocab = 300;
constexpr int64_t kWindow = 4;
constexpr int32_t kNanToken = 299;  // a prompt containing it makes the canary emit NaN logits

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

class CanaryBackend : public ModelBackend {
 public:
  CanaryBackend() {
    cfg_.vocab_size = kVocab;
    cfg_.eos_token_id = 1;
  }
  const ModelConfig& config() const override { return cfg_; }
  int64_t vocab_size() const override { return kVocab; }
  StateGeometry Geometry(int64_t block_size) const override {
    StateGeometry g;
    g.block_size = block_size;
    auto set = [&](StateKind k, int64_t row_bytes, int64_t rows) {
      g.kinds[static_cast<int>(k)].kind = k;
      StateRegionGeometry r;
      r.layer = 0;
      r.row_bytes = row_bytes;
      r.rows_per_block = rows;
      g.kinds[static_cast<int>(k)].regions.push_back(r);
    };
    set(StateKind::kWindow, 8, kWindow);
    set(StateKind::kCompressedKv, 8, block_size);       // "ratio 1"
    set(StateKind::kIndexKey, 8, block_size / 2);       // "ratio 2"
    set(StateKind::kCompressorCarry, 8, 1);
    set(StateKind::kEngram, 8, 1);
    return g;
  }
  // A logits row derived from what position p read back (h); NaN at id 7 when
  // the chunk so far contains kNanToken.
  static void PushRow(std::vector<float>* logits, uint64_t h, bool nan) {
    const size_t base = logits->size();
    logits->resize(base + kVocab);
    std::mt19937_64 rng(h);
    for (int64_t v = 0; v < kVocab; ++v)
      (*logits)[base + v] = static_cast<float>(static_cast<int64_t>(rng() % 2000) - 1000) / 200.0f;
    (*logits)[base + 1] -= 3.0f;  // EOS a little less likely
    if (nan) (*logits)[base + 7] = NAN;
  }
  int64_t num_all_logits_rows = 0;  // rows returned for all_logits seqs (prompt_logprobs)

  void Forward(const std::vector<BackendSeq>& seqs, std::vector<float>* logits) override {
    logits->clear();
    for (const BackendSeq& s : seqs) {
      bool padding = true;
      for (int64_t i = 0; i < s.len; ++i) padding &= s.tokens[i] == 0;
      uint64_t h = 0;
      bool nan = false;
      for (int64_t i = 0; i < s.len; ++i) {
        const int64_t p = s.start_pos + i;
        const int32_t tok = s.tokens[i];
        nan |= tok == kNanToken;
        int32_t rec[2] = {tok, static_cast<int32_t>(p)};
        std::memcpy(s.state.Row(StateKind::kCompressedKv, 0, p), rec, 8);
        std::memcpy(s.state.Row(StateKind::kWindow, 0, p % kWindow), rec, 8);
        int32_t* carry = reinterpret_cast<int32_t*>(s.state.Row(StateKind::kCompressorCarry, 0, 0));
        if (p % 2 == 0) {
          carry[0] = tok;
          carry[1] = static_cast<int32_t>(p);
        } else {
          if (!padding && carry[1] != p - 1) Fail(ErrorKind::kInternal, "canary: carry holds position {} at {}", carry[1], p);
          int32_t k[2] = {carry[0] * 1000 + tok, static_cast<int32_t>(p / 2)};
          std::memcpy(s.state.Row(StateKind::kIndexKey, 0, p / 2), k, 8);
        }
        if (padding) continue;
        // Read back everything this position may see, and check it is ours.
        h = 0;
        for (int64_t q = 0; q <= p; ++q) {
          const int32_t* r = reinterpret_cast<const int32_t*>(s.state.Row(StateKind::kCompressedKv, 0, q));
          if (r[1] != q) Fail(ErrorKind::kInternal, "canary: compressed row {} holds position {}", q, r[1]);
          h = Mix(h, static_cast<uint64_t>(r[0]));
        }
        for (int64_t q = 0; q < (p + 1) / 2; ++q) {
          const int32_t* r = reinterpret_cast<const int32_t*>(s.state.Row(StateKind::kIndexKey, 0, q));
          if (r[1] != q) Fail(ErrorKind::kInternal, "canary: index row {} holds {}", q, r[1]);
          h = Mix(h, static_cast<uint64_t>(r[0]));
        }
        for (int64_t q = std::max<int64_t>(0, p - kWindow + 1); q <= p; ++q) {
          const int32_t* r = reinterpret_cast<const int32_t*>(s.state.Row(StateKind::kWindow, 0, q % kWindow));
          if (r[1] != q) Fail(ErrorKind::kInternal, "canary: window slot {} holds position {}, want {}", q % kWindow, r[1], q);
        }
        if (s.all_logits) {
          PushRow(logits, h, nan);
          ++num_all_logits_rows;
        }
      }
      if (s.want_logits && !s.all_logits) PushRow(logits, h, nan);
    }
  }

 private:
  ModelConfig cfg_;
};

// Engine arguments of the canary tests: 4-token blocks, 128-token requests, one thread.
inline EngineArgs Args(int max_seqs, int64_t budget, int64_t blocks = 0) {
  EngineArgs a;
  a.max_num_seqs = max_seqs;
  a.max_num_batched_tokens = budget;
  a.max_model_len = 128;
  a.block_size = 4;
  a.num_kv_blocks = blocks;
  a.num_threads = 1;
  return a;
}

}  // namespace deepinfer::test_support
