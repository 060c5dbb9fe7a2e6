// deepinfer/sampling/philox.h — Philox4x32-10, the counter-based random
// number generator of Salmon, Moraes, Dror and Shaw, "Parallel Random Numbers:
// As Easy as 1, 2, 3" (SC'11), as shipped in D. E. Shaw Research's Random123.
//
// A counter-based generator is a pure function (counter, key) → 128 random
// bits. There is no state to carry, so the draw for a given (request seed,
// output position, draw index) is the same on every rank, in every batch
// slot, at every batch size, and after a preemption/recompute.
//
// Algorithm (Random123 philox4x32, R rounds; R = 10 is the standard variant):
//   counter c = (c0, c1, c2, c3), key k = (k0, k1), all uint32.
//   round:  (hi0, lo0) = 0xD2511F53 · c0 (64-bit product split in halves)
//           (hi1, lo1) = 0xCD9E8D57 · c2
//           c ← (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
//   between rounds: k0 += 0x9E3779B9, k1 += 0xBB67AE85 (mod 2^32).
// Verified against the published Random123 known-answer vectors
// (tests/unit/philox_test.cc).
//
// How the sampler keys it (the DeepInfer convention, sampling/sampler.h):
//   key     = (low 32 bits of seed, high 32 bits of seed)   (seed as uint64)
//   counter = (low 32 bits of output position, high 32 bits of output
//              position, draw index, stream)
// Output position = index of the generated token within the request's output
// (0 for the first generated token). Draw index 0 is the token draw; indices
// >= 1 are reserved for further draws at the same position (speculative-
// decoding acceptance tests). Stream 0 is the sampler's; other values are free
// for other consumers so they never collide with token draws.
// Nothing in the key or the counter depends on batch slot, batch size,
// thread or rank.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Philox4x32 with R rounds (R = 10: Philox4x32-10). Pure, constexpr, never throws.
template <int R = 10>
constexpr PhiloxCounter Philox4x32(PhiloxCounter c, PhiloxKey k) {
  static_assert(R >= 1 && R <= 16, "Philox4x32 rounds must be in [1, 16]");
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < R; ++r) {
    if (r > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = PhiloxCounter{hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

// The sampler's key for a request seed (any int64; negative seeds use their
// two's-complement bits).
constexpr PhiloxKey PhiloxKeyForSeed(int64_t seed) {
  const uint64_t s = static_cast<uint64_t>(seed);
  return PhiloxKey{static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32)};
}

// The sampler's counter for (output position, draw index, stream).
constexpr PhiloxCounter PhiloxCounterFor(uint64_t position, uint32_t draw, uint32_t stream = 0) {
  return PhiloxCounter{static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), draw,
                       stream};
}

// The 64-bit uniform used for draw `draw` at output position `position` of a
// request with seed `seed`: words 0 and 1 of Philox4x32-10, word 1 high.
// Uniform on [0, 2^64).
constexpr uint64_t PhiloxUniform64(int64_t seed, uint64_t position, uint32_t draw = 0,
                                   uint32_t stream = 0) {
  const PhiloxCounter r =
      Philox4x32<10>(PhiloxCounterFor(position, draw, stream), PhiloxKeyForSeed(seed));
  return (static_cast<uint64_t>(r[1]) << 32) | r[0];
}

}  // namespace deepinfer
