// deepinfer/format/numerics.h — element encodings of the DeepSeek-V4 family
// checkpoints and the activation quantisers of the reference.
//
// Source of the arithmetic: model-spec §2.2 (encodings), §3.1(b) (activation
// quantiser), §3.1(g)(h)(i) (QDQ variants), and TINY_V41_SPEC.md §3 (the
// encoders used to write checkpoints). All functions are pure, thread-safe and
// never throw; invalid codes are reported through the *IsNaN predicates so
// callers (the loader) can reject them with a message naming the tensor.
//
// Formats (all little-endian where multi-byte):
//   BF16       uint16_t, top half of an IEEE float32.
//   E4M3FN     uint8_t, sign·(1+m/8)·2^(e−7) for e=1..15, sign·(m/8)·2^−6 for
//              e=0; no infinities; 0x7F and 0xFF are NaN; max finite ±448.
//   E8M0       uint8_t (UE8M0), value 2^(b−127); 0xFF is NaN.
//   E2M1       4 bits, bit 3 = sign, bits 2..0 index {0,0.5,1,1.5,2,3,4,6};
//              packed two per byte, low nibble = even element.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace deepinfer {

// ---------------------------------------------------------------- float bits
inline uint32_t FloatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float BitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---------------------------------------------------------------- BF16
// Exact widening.
inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }
// Round-to-nearest-even narrowing; NaN stays a (quiet) NaN with its sign.
// This is torch's float→bfloat16 conversion and the spec's encoder
// (TINY_V41_SPEC §3: b = bits + 0x7FFF + ((bits >> 16) & 1)).
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// bf16(x) as a float: the rounding the reference applies whenever it stores a
// tensor in bfloat16.
inline float RoundBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// ---------------------------------------------------------------- E4M3FN
// Decode table for all 256 codes (0x7F/0xFF decode to NaN).
extern const float kE4M3Table[256];
inline float E4M3ToFloat(uint8_t c) { return kE4M3Table[c]; }
inline bool E4M3IsNaN(uint8_t c) { return (c & 0x7F) == 0x7F; }
// Round-to-nearest-even to the 127 finite magnitudes, saturating to ±448
// (== torch.clamp(x, -448, 448).to(torch.float8_e4m3fn)). The sign bit of x is
// kept, so negative values that round to zero give 0x80. NaN → 0x7F.
uint8_t FloatToE4M3(float x);
uint8_t DoubleToE4M3(double x);

// ---------------------------------------------------------------- IEEE E4M3
// The E4M3 that AWS Trainium2 reads `float8_e4m3fn` bytes as (serving-notes
// §3.4): the same bias 7 and the same codes for exponent fields 0..14, but the
// field 15 is reserved: m = 0 is ±infinity, m != 0 NaN; max finite ±240
// (code 0x77). Every code below 0x78 (magnitude) decodes to the same value in
// both formats.
inline bool E4M3IeeeIsSpecial(uint8_t c) { return (c & 0x78) == 0x78; }
float E4M3IeeeToFloat(uint8_t c);
// Round-to-nearest-even to the IEEE-E4M3 grid, saturating to ±240 (the
// largest finite value; a value that would need field 15 saturates, it is
// never encoded as infinity). Sign kept (−0 → 0x80). NaN → 0x7F (a NaN code in
// both formats). Equal to FloatToE4M3 for |x| <= 240.
uint8_t FloatToE4M3Ieee(float x);

// Which FP8 numerics the engine runs (the --fp8-format flag):
//   kE4M3FN    the checkpoint's and the reference's: activations and the KV
//              QAT quantised to a maximum of 448 (model-spec §3.1(b)(g)).
//   kE4M3Ieee  the Neuron (trn2) contract: every FP8 weight transformed at
//              load (code of value/2, UE8M0 block scale + 1: HalveE4M3,
//              RaiseE8M0ForIeee), activations and window-KV QAT quantised to a
//              maximum of 224 (so no code has exponent field 15), and the E4M3
//              scale of the FP4 compressed-KV QAT encoded with FloatToE4M3Ieee.
enum class Fp8Format { kE4M3FN, kE4M3Ieee };
// "e4m3fn" / "e4m3-ieee" (the --fp8-format spellings).
const char* Fp8FormatName(Fp8Format f);
// Parses those spellings; false (and *f untouched) for anything else.
bool ParseFp8Format(std::string_view s, Fp8Format* f);
// The activation quantiser's bound: 448 (kE4M3FN) or 224 (kE4M3Ieee).
inline float Fp8ActMax(Fp8Format f) { return f == Fp8Format::kE4M3Ieee ? 224.0f : 448.0f; }

// ---------------------------------------------------------------- IEEE weight transform
// One weight code of the e4m3-ieee load-time transform: the E4M3 code of
// RNE(v/2), v = E4M3ToFloat(c) (halving is exact in FP32; ties to the even
// code; sign kept, so a value that halves to zero keeps its sign). For
// exponent fields 2..15 this is the same mantissa with the field lowered by
// one (exact). For field 1 and the subnormals (|v| < 2^-5) v/2 is on the grid
// only when the mantissa is even: the 16 codes 0x01,0x03,..,0x0F and their
// negatives are *inexact* (v/2 lies exactly half-way between two codes; the
// even one is taken: the value moves by 2^-10 and, with the raised scale,
// the product by 2^-9 × the original block scale, half a subnormal step).
// NaN codes (0x7F, 0xFF) are returned unchanged. The result is always below
// 0x78 in magnitude or NaN, so it decodes identically as E4M3FN and IEEE E4M3.
// *exact (optional) is set to whether E4M3ToFloat(result) == v/2.
uint8_t HalveE4M3(uint8_t c, bool* exact = nullptr);
// The table form of HalveE4M3 (index = code).
extern const uint8_t kHalvedE4M3[256];
// Halves n codes (out may equal in); returns how many were inexact.
int64_t HalveE4M3Codes(const uint8_t* in, int64_t n, uint8_t* out);
// One UE8M0 scale of the transform: b + 1 (2^(b−126), twice the value).
// Returns false for b = 254 (2^127 cannot be doubled: 0xFF is NaN); a NaN
// scale (0xFF) stays 0xFF (true).
inline bool RaiseE8M0ForIeee(uint8_t b, uint8_t* out) {
  if (b == 0xFE) return false;
  *out = b == 0xFF ? b : static_cast<uint8_t>(b + 1);
  return true;
}

// ---------------------------------------------------------------- E8M0 (UE8M0)
inline bool E8M0IsNaN(uint8_t b) { return b == 0xFF; }
// 2^(b−127) as float (b = 0 gives 2^-127, a float32 subnormal; b = 255 NaN).
float E8M0ToFloat(uint8_t b);
// Smallest power of two >= t for a positive normal float t, as the reference's
// fast_round_scale computes it from the FP32 bits: exponent field − 127, plus
// one if any mantissa bit is set. Returns the E8M0 byte.
inline uint8_t Pow2CeilE8M0(float t) {
  uint32_t u = FloatBits(t);
  uint32_t e = (u >> 23) & 0xFFu;
  uint32_t m = u & 0x7FFFFFu;
  return static_cast<uint8_t>(e + (m != 0 ? 1u : 0u));
}

// ---------------------------------------------------------------- E2M1
extern const float kE2M1Table[16];
inline float E2M1ToFloat(uint8_t code) { return kE2M1Table[code & 0xF]; }
// Nearest of {0,0.5,1,1.5,2,3,4,6} after min(|x|, 6), ties to the even index
// (0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4); bit 3 set when the
// sign bit of x is set (−0 possible). NaN → 0 magnitude.
uint8_t FloatToE2M1(float x);
uint8_t DoubleToE2M1(double x);
// Element i of a packed FP4 row (low nibble = even element).
inline uint8_t E2M1PackedCode(const uint8_t* row, int64_t i) {
  uint8_t b = row[i >> 1];
  return (i & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
}

// ---------------------------------------------------------------- quantisers
// FP32 constants exactly as the reference spells them.
inline constexpr float kInv448 = 1.0f / 448.0f;  // bits 0x3B124925
inline constexpr float kInv6 = 1.0f / 6.0f;      // bits 0x3E2AAAAB
// The e4m3-ieee mode's constant: exactly 2 × kInv448 (bits 0x3B924925), so
// its power-of-two scales are exactly twice the standard mode's.
inline constexpr float kInv224 = 1.0f / 224.0f;
inline float Fp8ActInvMax(Fp8Format f) { return f == Fp8Format::kE4M3Ieee ? kInv224 : kInv448; }

// Activation quantiser, model-spec §3.1(b) step 1. For one row x[K] and block
// size B (32 for V4.1, 128 for V4; K % B == 0 is the caller's contract):
//   a = max(max|x_blk|, 1e-4); t = a × fp32(1/448); s = Pow2Ceil(t);
//   q = E4M3_RNE(clamp(x/s, −448, 448)).
// Writes q[K] codes and scale_e8m0[K/B] bytes (value 2^(b−127)).
// fmt = kE4M3Ieee (the Neuron contract): the same with 224 in place of 448,
//   t = a × fp32(1/224) (= 2t exactly, so s is twice the standard scale) and
//   q = E4M3_RNE(clamp(x/s, −224, 224)): every code is at most 0x76 (224) in
//   magnitude, so none needs exponent field 15 (values above 224 saturate at
//   the clamp; nothing is reported). NaN inputs give 0x7F (NaN in both
//   formats); a row block with ±Inf gets the NaN scale 0xFF and NaN codes in
//   both modes, as the reference's.
void QuantizeActE4M3(const float* x, int64_t K, int B, uint8_t* q, uint8_t* scale_e8m0,
                     Fp8Format fmt = Fp8Format::kE4M3FN);

// FP8 QDQ, §3.1(g): the quantiser above on blocks of B, dequantised in place
// (q·s; exact, and exactly representable in bf16). Used for the V4.1 window-K
// QAT (B = 32 over all 512 dims). fmt as for QuantizeActE4M3 (maximum 224).
void Fp8QdqInPlace(float* x, int64_t K, int B, Fp8Format fmt = Fp8Format::kE4M3FN);

// FP4 QDQ with UE8M0 scale, §3.1(h): blocks of 32;
//   a = max(max|x|, 6·2^−126); s = Pow2Ceil(a × fp32(1/6));
//   v = E2M1_RNE(clamp(x/s, ±6))·s.  (V4.1 indexer q and index keys.)
void Fp4QdqUe8m0InPlace(float* x, int64_t K, int B = 32);

// FP4 QDQ with E4M3 scale, §3.1(i): blocks of 16;
//   a = max(max|x|, 6·2^−9); s = E4M3_RNE_saturating(a/6) as a real number;
//   v = E2M1_RNE(clamp(x/s, ±6))·s.  (V4.1 compressed-KV QAT.)
// fmt = kE4M3Ieee: s = FloatToE4M3Ieee(a/6), i.e. saturating at 240 instead
// of 448 (identical unless a/6 >= 248, i.e. a block's max |x| >= 1488).
void Fp4QdqE4m3InPlace(float* x, int64_t K, int B = 16, Fp8Format fmt = Fp8Format::kE4M3FN);

}  // namespace deepinfer
