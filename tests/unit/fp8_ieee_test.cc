// The e4m3-ieee mode (--fp8-format e4m3-ieee, the Neuron trn2 contract):
//   * IEEE-E4M3 encode/decode and the 224 quantisers at their boundaries
//     (224, 240, 448, subnormals, NaN, Inf);
//   * the load-time weight transform (HalveE4M3 + scale + 1) over every FP8
//     tensor of the tiny V4.1 checkpoint (DEEPINFER_TINY_DIR, made by the ctest
//     fixture with `deepinfer make-tiny --arch deepseek_v41`): code × scale is
//     unchanged except the counted inexact codes, and the model's binder holds
//     exactly the transformed bytes;
//   * the forward pass in this mode: fast kernels == reference kernels bit for
//     bit, at any thread count, and the mode really changes the logits; a
//     prefix-cache hit equals a cold run;
//   * start-up errors naming the flag.
// (A tiny V4 checkpoint cannot be made yet — make-tiny has no deepseek_v4 — so
// the transform test covers V4.1; it walks the store generically.)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "deepinfer/engine.h"
#include "checkpoint_test_util.h"
#include "format/numerics.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/state.h"
#include "model/v41/model.h"
#include "model/v41/weights.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using testing_util::ExpectError;
using testing_util::TempDir;

const float kInf = std::numeric_limits<float>::infinity();

std::string TinyDir() {
  const char* d = std::getenv("DEEPINFER_TINY_DIR");
  return d ? d : "";
}

// ------------------------------------------------------------------ encodings

TEST(E4M3Ieee, DecodeReservesExponentField15) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    if ((b & 0x78) != 0x78) {
      EXPECT_EQ(FloatBits(E4M3IeeeToFloat(b)), FloatBits(E4M3ToFloat(b))) << c;  // same value, same sign
      EXPECT_FALSE(E4M3IeeeIsSpecial(b));
    } else {
      EXPECT_TRUE(E4M3IeeeIsSpecial(b)) << c;
    }
  }
  EXPECT_EQ(E4M3IeeeToFloat(0x77), 240.0f);
  EXPECT_EQ(E4M3IeeeToFloat(0xF7), -240.0f);
  EXPECT_EQ(E4M3IeeeToFloat(0x78), kInf);
  EXPECT_EQ(E4M3IeeeToFloat(0xF8), -kInf);
  for (int m = 1; m < 8; ++m) {
    EXPECT_TRUE(std::isnan(E4M3IeeeToFloat(static_cast<uint8_t>(0x78 | m)))) << m;
    EXPECT_TRUE(std::isnan(E4M3IeeeToFloat(static_cast<uint8_t>(0xF8 | m)))) << m;
  }
  // The same bytes in E4M3FN: 0x78 = 256, 0x7E = 448.
  EXPECT_EQ(E4M3ToFloat(0x78), 256.0f);
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
}

TEST(E4M3Ieee, EncodeSaturatesAt240) {
  EXPECT_EQ(FloatToE4M3Ieee(224.0f), 0x76);
  EXPECT_EQ(FloatToE4M3Ieee(232.0f), 0x76);  // tie 224|240 → even mantissa (224, m = 6)
  EXPECT_EQ(FloatToE4M3Ieee(std::nextafter(232.0f, 300.0f)), 0x77);
  EXPECT_EQ(FloatToE4M3Ieee(240.0f), 0x77);
  EXPECT_EQ(FloatToE4M3Ieee(248.0f), 0x77);  // E4M3FN: 256 (0x78); IEEE has no 256: saturate
  EXPECT_EQ(FloatToE4M3(248.0f), 0x78);
  EXPECT_EQ(FloatToE4M3Ieee(448.0f), 0x77);
  EXPECT_EQ(FloatToE4M3Ieee(1e30f), 0x77);
  EXPECT_EQ(FloatToE4M3Ieee(kInf), 0x77);
  EXPECT_EQ(FloatToE4M3Ieee(-kInf), 0xF7);
  EXPECT_EQ(FloatToE4M3Ieee(-300.0f), 0xF7);
  EXPECT_EQ(FloatToE4M3Ieee(std::nanf("")), 0x7F);
  // Subnormals and ties below 240 are E4M3FN's.
  EXPECT_EQ(FloatToE4M3Ieee(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(FloatToE4M3Ieee(-std::ldexp(1.0f, -10)), 0x80);
  EXPECT_EQ(FloatToE4M3Ieee(std::ldexp(1.5f, -9)), 0x02);
  EXPECT_EQ(FloatToE4M3Ieee(std::ldexp(7.5f, -9)), 0x08);
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (E4M3IeeeIsSpecial(b)) {
      if (!E4M3IsNaN(b)) {
        EXPECT_EQ(FloatToE4M3Ieee(E4M3ToFloat(b)), (b & 0x80) | 0x77) << c;
      }
    } else {
      EXPECT_EQ(FloatToE4M3Ieee(E4M3IeeeToFloat(b)), b) << c;
    }
  }
}

TEST(E4M3Ieee, FormatNames) {
  Fp8Format f = Fp8Format::kE4M3FN;
  EXPECT_TRUE(ParseFp8Format("e4m3-ieee", &f));
  EXPECT_EQ(f, Fp8Format::kE4M3Ieee);
  EXPECT_TRUE(ParseFp8Format("e4m3fn", &f));
  EXPECT_EQ(f, Fp8Format::kE4M3FN);
  EXPECT_FALSE(ParseFp8Format("e4m3", &f));
  EXPECT_FALSE(ParseFp8Format("E4M3FN", &f));
  EXPECT_FALSE(ParseFp8Format("", &f));
  EXPECT_STREQ(Fp8FormatName(Fp8Format::kE4M3Ieee), "e4m3-ieee");
  EXPECT_STREQ(Fp8FormatName(Fp8Format::kE4M3FN), "e4m3fn");
  EXPECT_EQ(FloatBits(kInv224), 0x3B924925u);
  EXPECT_EQ(kInv224, 2.0f * kInv448);
}

// ------------------------------------------------------------------ weight transform, per code

TEST(IeeeTransform, HalveEveryCode) {
  int inexact = 0;
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    bool exact = false;
    const uint8_t h = HalveE4M3(b, &exact);
    EXPECT_EQ(kHalvedE4M3[c], h) << c;  // the table and the function agree
    if (E4M3IsNaN(b)) {
      EXPECT_EQ(h, b);
      continue;
    }
    EXPECT_FALSE(E4M3IeeeIsSpecial(h)) << c;         // no code with exponent field 15 survives
    EXPECT_EQ(E4M3IeeeToFloat(h), E4M3ToFloat(h));   // so both formats read the same value
    EXPECT_EQ((h & 0x80), (b & 0x80)) << c;          // sign kept (also on zero)
    const double v = E4M3ToFloat(b), got = E4M3ToFloat(h);
    const int e = (c >> 3) & 0xF, m = c & 7;
    const bool want_exact = e >= 2 || (m % 2 == 0);
    EXPECT_EQ(exact, want_exact) << c;
    if (exact) {
      EXPECT_EQ(got, v / 2) << c;
      if (e >= 2) {
        EXPECT_EQ(h, b - 8) << c;  // exponent field − 1
      }
    } else {
      ++inexact;
      EXPECT_EQ(std::fabs(got - v / 2), std::ldexp(1.0, -10)) << c;  // half a subnormal step
      EXPECT_EQ(h & 1, 0) << c;                                        // ties to the even code
    }
  }
  EXPECT_EQ(inexact, 16);  // 0x01,0x03,..,0x0F and their negatives
  EXPECT_EQ(HalveE4M3(0x7E), 0x76);  // 448 → 224
  EXPECT_EQ(HalveE4M3(0x78), 0x70);  // 256 → 128
  EXPECT_EQ(HalveE4M3(0x10), 0x08);  // 2^-5 → 2^-6 (lowest normal)
  EXPECT_EQ(HalveE4M3(0x08), 0x04);  // 2^-6 → 4·2^-9 (subnormal, exact)
  EXPECT_EQ(HalveE4M3(0x09), 0x04);  // 9·2^-9 / 2 = 4.5·2^-9 → 4 (even)
  EXPECT_EQ(HalveE4M3(0x0B), 0x06);  // 5.5 → 6
  EXPECT_EQ(HalveE4M3(0x0F), 0x08);  // 7.5 → 8 = 2^-6
  EXPECT_EQ(HalveE4M3(0x01), 0x00);  // 2^-9 → 0
  EXPECT_EQ(HalveE4M3(0x81), 0x80);  // −2^-9 → −0
  EXPECT_EQ(HalveE4M3(0x03), 0x02);  // 1.5 → 2
  EXPECT_EQ(HalveE4M3(0x05), 0x02);  // 2.5 → 2
  std::vector<uint8_t> all(256), out(256);
  for (int c = 0; c < 256; ++c) all[c] = static_cast<uint8_t>(c);
  EXPECT_EQ(HalveE4M3Codes(all.data(), 256, out.data()), 16);
  EXPECT_EQ(HalveE4M3Codes(all.data(), 256, all.data()), 16);  // in place
  EXPECT_EQ(all, out);
}

TEST(IeeeTransform, RaiseScale) {
  uint8_t o = 0;
  EXPECT_TRUE(RaiseE8M0ForIeee(0, &o));
  EXPECT_EQ(o, 1);
  EXPECT_TRUE(RaiseE8M0ForIeee(127, &o));
  EXPECT_EQ(o, 128);
  EXPECT_EQ(E8M0ToFloat(o), 2.0f);
  EXPECT_TRUE(RaiseE8M0ForIeee(253, &o));
  EXPECT_EQ(o, 254);
  o = 7;
  EXPECT_FALSE(RaiseE8M0ForIeee(254, &o));
  EXPECT_EQ(o, 7);
  EXPECT_TRUE(RaiseE8M0ForIeee(255, &o));  // NaN stays NaN
  EXPECT_EQ(o, 255);
}

// ------------------------------------------------------------------ the 224 quantisers

std::vector<uint8_t> QuantIeee(const std::vector<float>& x, uint8_t* scale) {
  std::vector<uint8_t> q(x.size());
  QuantizeActE4M3(x.data(), static_cast<int64_t>(x.size()), static_cast<int>(x.size()), q.data(), scale,
                  Fp8Format::kE4M3Ieee);
  return q;
}

TEST(ActQuantIeee, Amax224GivesScaleOneAndCode0x76) {
  // t = 224 × fp32(1/224) = 1.0 exactly → s = 1 (byte 127); 224/1 → 0x76.
  std::vector<float> x(32, 0.0f);
  x[0] = 224.0f;
  x[1] = 216.0f;                      // tie 208|224 → 224 (even mantissa)
  x[2] = 208.0f;                      // 0x75
  x[3] = -std::ldexp(1.0f, -10);      // subnormal tie → −0
  x[4] = 3.0f * std::ldexp(1.0f, -10);  // 1.5·2^-9 → 2·2^-9 (0x02)
  x[5] = std::ldexp(7.5f, -9);        // tie 7|8 → 0x08 (2^-6)
  x[6] = std::ldexp(1.0f, -9);        // smallest subnormal 0x01
  uint8_t s = 0;
  const std::vector<uint8_t> q = QuantIeee(x, &s);
  EXPECT_EQ(s, 127);
  EXPECT_EQ(q[0], 0x76);
  EXPECT_EQ(q[1], 0x76);
  EXPECT_EQ(q[2], 0x75);
  EXPECT_EQ(q[3], 0x80);
  EXPECT_EQ(q[4], 0x02);
  EXPECT_EQ(q[5], 0x08);
  EXPECT_EQ(q[6], 0x01);
  EXPECT_EQ(q[7], 0x00);
  // The standard mode puts the same block at s = 2^-1 (byte 126) with 224 → 448.
  std::vector<uint8_t> qs(32);
  uint8_t ss = 0;
  QuantizeActE4M3(x.data(), 32, 32, qs.data(), &ss);
  EXPECT_EQ(ss, 126);
  EXPECT_EQ(qs[0], 0x7E);
}

TEST(ActQuantIeee, Amax240And448DoubleTheScale) {
  for (const float a : {240.0f, 448.0f, std::nextafter(224.0f, 300.0f)}) {
    std::vector<float> x(32, 1.0f);
    x[9] = a;
    uint8_t s = 0;
    const std::vector<uint8_t> q = QuantIeee(x, &s);
    EXPECT_EQ(s, 128) << a;  // s = 2
    EXPECT_EQ(E4M3ToFloat(q[9]), a == 448.0f ? 224.0f : a == 240.0f ? 120.0f : 112.0f) << a;
    EXPECT_EQ(q[0], 0x30) << a;  // 1/2 = 0.5
    for (uint8_t c : q) EXPECT_LE(c & 0x7F, 0x76) << a;
  }
}

TEST(ActQuantIeee, NoCodeAbove224AndScaleTwiceStandard) {
  // Wide random blocks (huge, tiny, mixed signs): every code <= 0x76 in
  // magnitude, every scale byte = standard + 1.
  uint32_t st = 12345;
  auto next = [&] { return st = st * 1664525u + 1013904223u; };
  const int64_t K = 32 * 64;
  std::vector<float> x(K);
  for (int64_t i = 0; i < K; ++i) {
    const int e = static_cast<int>(next() % 200) - 100;
    x[i] = RoundBf16(std::ldexp(1.0f + (next() % 1024) / 1024.0f, e) * ((next() & 1) ? -1.0f : 1.0f));
  }
  std::vector<uint8_t> q(K), qs(K), s(K / 32), ss(K / 32);
  QuantizeActE4M3(x.data(), K, 32, q.data(), s.data(), Fp8Format::kE4M3Ieee);
  QuantizeActE4M3(x.data(), K, 32, qs.data(), ss.data());
  int64_t differ = 0;
  for (int64_t i = 0; i < K; ++i) {
    EXPECT_LE(q[i] & 0x7F, 0x76) << i;
    differ += (E4M3ToFloat(q[i]) * 2.0f != E4M3ToFloat(qs[i]));
  }
  for (int64_t b = 0; b < K / 32; ++b) EXPECT_EQ(s[b], ss[b] + 1) << b;
  // q_ieee·2 == q_std except where the standard code's half is off the grid
  // (its subnormal / lowest binade): the modes do differ, in those values only.
  EXPECT_GT(differ, 0);
}

TEST(ActQuantIeee, NaNAndInf) {
  std::vector<float> x(32, 0.5f);
  x[3] = std::nanf("");
  uint8_t s = 0;
  std::vector<uint8_t> q = QuantIeee(x, &s);
  EXPECT_EQ(q[3], 0x7F);  // NaN in both formats
  EXPECT_EQ(s, 119);      // the NaN does not enter the amax: 0.5 × fp32(1/224) = 2^-8.8 → s = 2^-8
  EXPECT_EQ(E4M3ToFloat(q[0]) * E8M0ToFloat(s), 0.5f);
  x[3] = -kInf;
  q = QuantIeee(x, &s);
  EXPECT_EQ(s, 0xFF);  // as the reference: an infinite amax gives the NaN scale
  for (uint8_t c : q) EXPECT_TRUE(E4M3IsNaN(c));
}

TEST(QdqIeee, Fp8WindowKvMaximum224) {
  // amax 5: standard s = 2^-6, IEEE s = 2^-5. 5 → 160·2^-5 = 5 (exact in both);
  // 2^-15: standard 2^-15/2^-6 = 2^-9 (code 0x01) → kept; IEEE 2^-10 → tie → 0.
  std::vector<float> x(32, 0.0f), y;
  x[0] = 5.0f;
  x[1] = 0.3f;
  x[2] = std::ldexp(1.0f, -15);
  y = x;
  Fp8QdqInPlace(x.data(), 32, 32, Fp8Format::kE4M3Ieee);
  Fp8QdqInPlace(y.data(), 32, 32);
  EXPECT_EQ(x[0], 5.0f);
  EXPECT_EQ(x[1], 0.3125f);  // 0.3/2^-5 = 9.6 → 10
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_EQ(y[2], std::ldexp(1.0f, -15));
  // amax exactly 224 → s = 1: 224 stays, nothing above it.
  std::vector<float> z(32, 100.0f);
  z[5] = 224.0f;
  z[6] = -230.0f;  // the amax: 230/224 > 1 → s = 2; 230/2 = 115 → 112 (grid step 8 in [64, 128))
  Fp8QdqInPlace(z.data(), 32, 32, Fp8Format::kE4M3Ieee);
  EXPECT_EQ(z[5], 224.0f);
  EXPECT_EQ(z[6], -224.0f);
}

TEST(QdqIeee, Fp4CompressedKvE4m3ScaleSaturatesAt240) {
  // amax 1500: a/6 = 250. E4M3FN scale 256 (0x78); IEEE scale saturates at 240.
  std::vector<float> x(16, 0.0f), y;
  x[0] = 1500.0f;
  x[1] = 700.0f;
  y = x;
  Fp4QdqE4m3InPlace(x.data(), 16, 16, Fp8Format::kE4M3Ieee);
  Fp4QdqE4m3InPlace(y.data(), 16, 16);
  EXPECT_EQ(x[0], 1440.0f);  // 1500/240 = 6.25 → clamp 6 → 6·240
  EXPECT_EQ(y[0], 1536.0f);  // 1500/256 = 5.86 → 6 → 6·256
  EXPECT_EQ(x[1], 720.0f);   // 700/240 = 2.92 → 3
  EXPECT_EQ(y[1], 768.0f);   // 700/256 = 2.73 → 3
  // Below the saturation both modes agree.
  std::vector<float> a(16, 0.0f), b;
  a[0] = 6.6f;
  a[1] = -2.9f;
  b = a;
  Fp4QdqE4m3InPlace(a.data(), 16, 16, Fp8Format::kE4M3Ieee);
  Fp4QdqE4m3InPlace(b.data(), 16, 16);
  EXPECT_EQ(a, b);
}

// ------------------------------------------------------------------ the tiny checkpoint

// Scale tensor of an FP8 weight: NAME.weight → NAME.scale.
std::string ScaleName(const std::string& w) { return w.substr(0, w.size() - std::string("weight").size()) + "scale"; }

TEST(IeeeTransform, EveryFp8TensorOfTheTinyCheckpoint) {
  ASSERT_FALSE(TinyDir().empty()) << "DEEPINFER_TINY_DIR is not set (ctest's fixture sets it)";
  const auto store = TensorStore::Open(TinyDir());
  int64_t tensors = 0, values = 0, inexact = 0, inexact_bound = 0, values_bound = 0;
  for (const auto& [name, t] : store->all()) {
    if (t.dtype != DType::kF8E4M3) continue;
    ASSERT_EQ(t.shape.size(), 2u) << name;
    const TensorView* s = store->Find(ScaleName(name));
    ASSERT_NE(s, nullptr) << name << " has no scale tensor";
    ASSERT_EQ(s->dtype, DType::kF8E8M0) << name;
    ASSERT_EQ(s->shape.size(), 2u) << name;
    const int64_t R = t.shape[0], C = t.shape[1];
    // Block shape from the two shapes: 32×32 linear blocks, or 1×32 Engram row groups.
    const int64_t br = (R + s->shape[0] - 1) / s->shape[0], bc = (C + s->shape[1] - 1) / s->shape[1];
    ASSERT_EQ((R + br - 1) / br, s->shape[0]) << name;
    ASSERT_EQ((C + bc - 1) / bc, s->shape[1]) << name;
    std::vector<uint8_t> raised(s->nbytes);
    for (size_t i = 0; i < s->nbytes; ++i) ASSERT_TRUE(RaiseE8M0ForIeee(s->data[i], &raised[i])) << name << " " << i;
    std::vector<uint8_t> halved(t.nbytes);
    const int64_t counted = HalveE4M3Codes(t.data, static_cast<int64_t>(t.nbytes), halved.data());
    int64_t bad = 0, here = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = r * C + c, si = (r / br) * s->shape[1] + c / bc;
        const double before = static_cast<double>(E4M3ToFloat(t.data[i])) * E8M0ToFloat(s->data[si]);
        // The Neuron device reads the transformed bytes as IEEE E4M3.
        const double after = static_cast<double>(E4M3IeeeToFloat(halved[i])) * E8M0ToFloat(raised[si]);
        if (std::isnan(before)) {
          bad += !std::isnan(after);
          continue;
        }
        if (before != after) {
          ++here;
          // Only the 16 odd low codes, moved by exactly half a subnormal step × scale.
          bad += (t.data[i] & 0x71) != 0x01;
          // after − before = 2s·(E(h) − v/2), |E(h) − v/2| = 2^-10.
          bad += std::fabs(after - before) != std::ldexp(1.0, -9) * E8M0ToFloat(s->data[si]);
        }
      }
    EXPECT_EQ(bad, 0) << name;
    EXPECT_EQ(here, counted) << name;
    ++tensors;
    values += R * C;
    inexact += here;
    if (name.rfind("mtp.", 0) != 0 && name.find("engram.embed") == std::string::npos) {
      inexact_bound += here;
      values_bound += R * C;
    }
    if (here > 0) std::printf("  %s: %lld of %lld inexact\n", name.c_str(), static_cast<long long>(here),
                              static_cast<long long>(R * C));
  }
  std::printf("e4m3-ieee weight transform: %lld FP8 tensors, %lld values, %lld inexact (rounded half to even)\n",
              static_cast<long long>(tensors), static_cast<long long>(values), static_cast<long long>(inexact));
  RecordProperty("fp8_tensors", std::to_string(tensors));
  RecordProperty("inexact_weights", std::to_string(inexact));
  EXPECT_GT(tensors, 20);

  // The model's binder holds exactly these bytes (and counts the same).
  const ModelConfig cfg = ModelConfig::Load(TinyDir());
  const auto w = v41::ModelWeights::Bind(*store, cfg, 1, 0, Fp8Format::kE4M3Ieee);
  const auto w0 = v41::ModelWeights::Bind(*store, cfg);
  EXPECT_EQ(w0->ieee_report.tensors, 0);
  EXPECT_TRUE(w0->ieee_bytes.empty());
  EXPECT_EQ(w->fp8_format, Fp8Format::kE4M3Ieee);
  EXPECT_EQ(w->ieee_report.inexact, inexact_bound);
  EXPECT_EQ(w->ieee_report.values, values_bound);
  auto check = [&](const v41::Fp8Linear& got, const v41::Fp8Linear& orig, const std::string& what) {
    EXPECT_EQ(got.act_format, Fp8Format::kE4M3Ieee) << what;
    EXPECT_EQ(orig.act_format, Fp8Format::kE4M3FN) << what;
    ASSERT_NE(got.w.w, orig.w.w) << what;  // a copy, the checkpoint stays read-only
    const int64_t n = got.w.out * got.w.in, B = got.w.block;
    const int64_t ns = ((got.w.out + B - 1) / B) * ((got.w.in + B - 1) / B);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got.w.w[i], kHalvedE4M3[orig.w.w[i]]) << what << " " << i;
    for (int64_t i = 0; i < ns; ++i) ASSERT_EQ(got.w.scale[i], orig.w.scale[i] + 1) << what << " " << i;
  };
  int64_t linears = 0;
  for (size_t l = 0; l < w->layers.size(); ++l) {
    const auto& L = w->layers[l];
    const auto& L0 = w0->layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    check(L.attn.wq_a, L0.attn.wq_a, p + "wq_a");
    check(L.attn.wq_b, L0.attn.wq_b, p + "wq_b");
    check(L.attn.wkv, L0.attn.wkv, p + "wkv");
    check(L.attn.wo_b, L0.attn.wo_b, p + "wo_b");
    check(L.ffn.shared_w1, L0.ffn.shared_w1, p + "shared_w1");
    check(L.ffn.shared_w2, L0.ffn.shared_w2, p + "shared_w2");
    check(L.ffn.shared_w3, L0.ffn.shared_w3, p + "shared_w3");
    linears += 7;
    if (L.attn.has_indexer_query) {
      check(L.attn.indexer_wq_b, L0.attn.indexer_wq_b, p + "indexer.wq_b");
      ++linears;
    }
    if (L.has_engram) {
      check(L.engram.wkv, L0.engram.wkv, p + "engram.wkv");
      ++linears;
      EXPECT_TRUE(L.engram.halve_codes);
      EXPECT_FALSE(L0.engram.halve_codes);
      EXPECT_EQ(L.engram.table, L0.engram.table);  // decoded through kHalvedE4M3 on lookup
    }
    // wo_a is dequantised after the transform: the same BF16 except where a code was inexact.
    ASSERT_EQ(L.attn.wo_a.rows * L.attn.wo_a.cols, L0.attn.wo_a.rows * L0.attn.wo_a.cols);
    const TensorView& woa = store->Get("layers." + std::to_string(l) + ".attn.wo_a.weight");
    for (int64_t e = 0; e < L.attn.wo_a.rows * L.attn.wo_a.cols; ++e)
      if ((woa.data[e] & 0x71) != 0x01) {
        ASSERT_EQ(L.attn.wo_a.data[e], L0.attn.wo_a.data[e]) << p << "wo_a " << e;
      }
    for (const auto& ex : L.ffn.experts) EXPECT_EQ(ex.w1.act_format, Fp8Format::kE4M3Ieee);
    for (size_t e = 0; e < L.ffn.experts.size(); ++e)
      EXPECT_EQ(L.ffn.experts[e].w1.w.w, L0.ffn.experts[e].w1.w.w);  // FP4 experts untouched
  }
  EXPECT_GT(linears, 0);
  EXPECT_EQ(w->ieee_report.tensors, tensors - [&] {
    int64_t mtp = 0;
    for (const auto& [name, t] : store->all()) mtp += t.dtype == DType::kF8E4M3 && name.rfind("mtp.", 0) == 0;
    return mtp;
  }());
}

// ------------------------------------------------------------------ the forward pass

class TinyModel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TinyDir().empty()) GTEST_FAIL() << "DEEPINFER_TINY_DIR is not set (ctest's fixture sets it)";
  }
  static std::vector<float> Logits(v41::V41Model& m, const std::vector<int32_t>& ids) {
    const StateGeometry geo = m.geometry(16);
    const int64_t blocks = geo.BlocksForTokens(static_cast<int64_t>(ids.size()));
    DenseStateArena arena(geo, 1, blocks);
    std::vector<int32_t> table(blocks);
    for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
    v41::ForwardBatch batch;
    batch.per_row_layout = true;
    v41::ForwardSeq q;
    q.tokens = ids.data();
    q.len = static_cast<int64_t>(ids.size());
    q.state = arena.View(0, table.data(), blocks);
    q.logits = v41::ForwardSeq::Logits::kAll;
    batch.seqs.push_back(q);
    v41::ForwardOutput out;
    m.Forward(batch, &out);
    return out.logits;
  }
  static v41::V41Options Opts(Fp8Format f, bool ref) {
    v41::V41Options o;
    o.engram_token_map_file = fs::path(DEEPINFER_TEST_DATA) / "golden-tiny-v41" / "engram_token_map.i32";
    o.fp8_format = f;
    o.reference_kernels = ref;
    return o;
  }
};

TEST_F(TinyModel, IeeeFastKernelsEqualReferenceAndDifferFromStandard) {
  // The first English prompt of the engine tests. (On it the two modes first differ by one BF16 ulp
  // in 2 of the 6912 stream values after layer 1; the tiny random model amplifies that. Some other
  // prompts give identical logits in both modes: the modes differ only in values below ~2^-12 of
  // their block's max and in the 80 inexact weights.)
  const std::vector<int32_t> ids = Tokenizer::Load(TinyDir()).Encode(
      "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced "
      "\" no evidence \" that any irregularities took place.");
  ASSERT_GT(ids.size(), 20u);
  auto fast = v41::V41Model::Load(TinyDir(), Opts(Fp8Format::kE4M3Ieee, false));
  auto ref = v41::V41Model::Load(TinyDir(), Opts(Fp8Format::kE4M3Ieee, true));
  auto std_fast = v41::V41Model::Load(TinyDir(), Opts(Fp8Format::kE4M3FN, false));
  const std::vector<float> a = Logits(*fast, ids), b = Logits(*ref, ids), c = Logits(*std_fast, ids);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  ASSERT_EQ(a.size(), ids.size() * static_cast<size_t>(fast->config().vocab_size));
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "fast != reference kernels in e4m3-ieee mode";
  // Any thread count: the same bits.
  const int threads = NumThreads();
  SetNumThreads(threads == 1 ? 2 : 1);
  const std::vector<float> a2 = Logits(*fast, ids);
  SetNumThreads(threads);
  EXPECT_EQ(0, std::memcmp(a.data(), a2.data(), a.size() * 4)) << "thread count changed e4m3-ieee logits";
  int64_t differ = 0, nonfinite = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ += FloatBits(a[i]) != FloatBits(c[i]);
    nonfinite += !std::isfinite(a[i]);
  }
  EXPECT_EQ(nonfinite, 0);
  EXPECT_GT(differ, 0) << "the e4m3-ieee mode changed no logit";
}

// Prefix caching in the e4m3-ieee mode: a hit restores the (224-quantised)
// state and equals a cold run bit for bit (raw logits of the top 5).
TEST_F(TinyModel, IeeePrefixCacheHitEqualsCold) {
  const Tokenizer tok = Tokenizer::Load(TinyDir());
  std::vector<int32_t> text = tok.Encode(
      "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced "
      "no evidence that any irregularities took place. The jury further said in term-end presentments that the "
      "City Executive Committee, which had over-all charge of the election, deserves the praise and thanks of "
      "the City of Atlanta for the manner in which the election was conducted.");
  ASSERT_GE(text.size(), 69u);
  auto args = [&](bool caching) {
    EngineArgs a;
    a.model = TinyDir();
    a.max_model_len = 512;
    a.num_threads = 1;
    a.logprobs_mode = LogprobsMode::kRawLogits;
    a.enable_prefix_caching = caching;
    a.fp8_format = "e4m3-ieee";
    return a;
  };
  auto run = [](Engine& e, std::vector<int32_t> ids, const std::string& id, int64_t* cached) {
    GenerateRequest r;
    r.prompt_token_ids = std::move(ids);
    r.params.max_tokens = 5;
    r.params.temperature = 0;
    r.params.logprobs = 5;
    r.request_id = id;
    e.Submit(r);
    std::vector<std::pair<int32_t, float>> out;
    while (e.HasUnfinished())
      for (auto& o : e.Step()) {
        if (!o.finished) continue;
        EXPECT_TRUE(o.error.empty()) << o.error;
        *cached = o.num_cached_tokens;
        for (const auto& lp : o.logprobs)
          for (const auto& t : lp.top) out.emplace_back(t.token_id, t.logprob);
      }
    return out;
  };
  auto hot = Engine::Open(args(true));
  auto cold = Engine::Open(args(false));
  for (size_t L : {16u, 17u, 33u, 60u}) {
    std::vector<int32_t> a(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(L)), b = a;
    a.insert(a.end(), text.begin() + 1, text.begin() + 6);
    b.insert(b.end(), text.begin() + 61, text.begin() + 69);
    int64_t c0 = 0, c1 = 0, c2 = 0;
    run(*hot, a, "a", &c0);  // publishes the prefix blocks
    const auto h = run(*hot, b, "b", &c1);
    const auto c = run(*cold, b, "b", &c2);
    EXPECT_EQ(c1, static_cast<int64_t>(L / 16 * 16)) << L;
    EXPECT_EQ(c2, 0) << L;
    EXPECT_EQ(h, c) << "prefix " << L;
  }
}

TEST_F(TinyModel, CheckpointWithoutFp8WeightsIsAStartUpError) {
  TempDir d;
  fs::copy_file(fs::path(TinyDir()) / "config.json", d / "config.json");
  testing_util::WriteFile(d / "model.safetensors",
                          testing_util::SafetensorsImage({{"embed.weight", "BF16", {4, 4}, ""}}));
  ExpectError([&] { v41::V41Model::Load(d.path(), Opts(Fp8Format::kE4M3Ieee, true)); },
              {"--fp8-format e4m3-ieee", "no FP8 weights", d.path().string()});
}

TEST_F(TinyModel, UnraisableScaleIsAStartUpErrorNamingTheTensor) {
  // A copy of the tiny checkpoint with one UE8M0 block scale set to 254.
  TempDir d;
  for (const auto& e : fs::directory_iterator(TinyDir())) fs::copy(e.path(), d / e.path().filename().string());
  const std::string victim = "layers.0.attn.wkv.scale";
  bool patched = false;
  for (const auto& e : fs::directory_iterator(d.path())) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t hlen = 0;
    f.read(reinterpret_cast<char*>(&hlen), 8);
    std::string header(hlen, '\0');
    f.read(header.data(), static_cast<std::streamsize>(hlen));
    const auto j = nlohmann::json::parse(header);
    if (!j.contains(victim)) continue;
    const uint64_t off = 8 + hlen + j[victim]["data_offsets"][0].get<uint64_t>() + 1;
    f.seekp(static_cast<std::streamoff>(off));
    const char b = static_cast<char>(0xFE);
    f.write(&b, 1);
    patched = f.good();
  }
  ASSERT_TRUE(patched);
  ExpectError([&] { v41::V41Model::Load(d.path(), Opts(Fp8Format::kE4M3Ieee, true)); },
              {"--fp8-format e4m3-ieee", victim, "scale byte 1 is 254"});
  // The standard mode loads it (a 2^127 scale is legal there).
  EXPECT_NO_THROW(v41::V41Model::Load(d.path(), Opts(Fp8Format::kE4M3FN, true)));
}

}  // namespace
}  // namespace deepinfer
