// Vision: preprocessing, ViT tower and aligner against DeepSeek's reference
// run on the tiny vision checkpoint (tests/data/vision, copied from the shared
// golden vectors tiny-v41-vision; layout in docs/vision.md).
//
// The preprocessing tests need nothing else; the tower tests need the
// checkpoint: DEEPINFER_TINY_VISION_DIR = the output of `deepinfer make-tiny
// --arch deepseek_v41 --vision DIR` (skipped without it).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <zlib.h>
#include <cstdio>
#include <jpeglib.h>

#include "base/error.h"
#include "format/numerics.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "vision/image.h"
#include "vision/vit.h"
#include "vision/vit_attn.h"
#include "vision/vit_linear.h"

namespace deepinfer::vision {
namespace {

namespace fs = std::filesystem;
const fs::path kData = fs::path(DEEPINFER_TEST_DATA) / "vision";

// The vision checkpoint: DEEPINFER_TINY_VISION_DIR, else DEEPINFER_TINY_DIR + "-vision"
// (ctest's fixture makes both).
std::string VisionDir() {
  if (const char* v = std::getenv("DEEPINFER_TINY_VISION_DIR"); v && *v) return v;
  if (const char* t = std::getenv("DEEPINFER_TINY_DIR"); t && *t) return std::string(t) + "-vision";
  return "";
}

std::string ReadBytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
std::vector<float> ReadF32(const fs::path& p) {
  const std::string b = ReadBytes(p);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}
int64_t CountDiff(const std::vector<float>& a, const std::vector<float>& b, double* max_abs = nullptr) {
  EXPECT_EQ(a.size(), b.size());
  int64_t n = 0;
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) ++n;
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  if (max_abs) *max_abs = m;
  return n;
}

// The tiny vision config's geometry (TINY_V41_VISION_SPEC.md §1).
VisionGeometry TinyGeometry() {
  VisionGeometry g;
  g.patch_size = 14;
  g.downsample_ratio = 3;
  g.max_n_token = 32;
  g.min_pixels = 7056;
  return g;
}

TEST(VisionPreprocess, PlanOfBothCases) {
  const ImagePlan p0 = PlanImageGrid(126, 84, TinyGeometry());
  EXPECT_EQ(p0.best_width, 126);
  EXPECT_EQ(p0.best_height, 84);
  EXPECT_EQ(p0.n_vit_h, 6);
  EXPECT_EQ(p0.n_vit_w, 9);
  EXPECT_EQ(p0.n_llm_h, 2);
  EXPECT_EQ(p0.n_llm_w, 3);
  EXPECT_EQ(p0.n_tokens(), 10);
  const ImagePlan p1 = PlanImageGrid(60, 40, TinyGeometry());
  EXPECT_EQ(p1.best_width, 112);
  EXPECT_EQ(p1.best_height, 70);
  EXPECT_EQ(p1.n_vit_h, 5);
  EXPECT_EQ(p1.n_vit_w, 8);
  EXPECT_EQ(p1.n_llm_h, 2);
  EXPECT_EQ(p1.n_llm_w, 3);
  // Large image: the max_n_token shrink (n_llm_h·(n_llm_w+1)+2 <= 32), aspect kept.
  const ImagePlan big = PlanImageGrid(1000, 500, TinyGeometry());
  EXPECT_LE(big.n_tokens(), 32);
  EXPECT_EQ(big.best_width % 14, 0);
  EXPECT_GT(big.best_width, big.best_height);
  // Very wide: the single-row branch.
  const ImagePlan wide = PlanImageGrid(5000, 10, TinyGeometry());
  EXPECT_EQ(wide.n_llm_h, 1);
  EXPECT_LE(wide.n_tokens(), 32);
  EXPECT_THROW(PlanImageGrid(0, 10, TinyGeometry()), Error);
  const std::vector<int8_t> t = ImageTokenTypes(p0);
  const std::vector<int8_t> want = {0, 1, 1, 1, 2, 1, 1, 1, 2, 3};
  EXPECT_EQ(t, want);
}

TEST(VisionPreprocess, Case0PixelsAndPatchesBitIdentical) {
  const RgbImage img = DecodeImage(ReadBytes(kData / "image0.png"));
  ASSERT_EQ(img.width, 126);
  ASSERT_EQ(img.height, 84);
  // The image's formula (golden README): R = 2x, G = 3y, B = 5·(x xor y), mod 256.
  for (int y = 0; y < 84; y += 7)
    for (int x = 0; x < 126; x += 5) {
      const uint8_t* p = &img.rgb[(y * 126 + x) * 3];
      EXPECT_EQ(p[0], (2 * x) % 256);
      EXPECT_EQ(p[1], (3 * y) % 256);
      EXPECT_EQ(p[2], (5 * (x ^ y)) % 256);
    }
  const PreparedImage pi = PrepareImage(ReadBytes(kData / "image0.png"), TinyGeometry());
  EXPECT_EQ(CountDiff(PixelsChw(img), ReadF32(kData / "case0_pixels.f32")), 0);
  EXPECT_EQ(CountDiff(pi.patches, ReadF32(kData / "case0_patches.f32")), 0);
}

TEST(VisionPreprocess, Case1BicubicPadByteEqual) {
  const RgbImage img = DecodeImage(ReadBytes(kData / "image1.png"));
  ASSERT_EQ(img.width, 60);
  ASSERT_EQ(img.height, 40);
  const RgbImage padded = PadImage(img, 112, 70);
  const std::string want = ReadBytes(kData / "case1_padded_rgb.u8");
  ASSERT_EQ(padded.rgb.size(), want.size());
  int64_t diff = 0, over1 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const int d = std::abs(int(padded.rgb[i]) - int(static_cast<uint8_t>(want[i])));
    diff += d != 0;
    over1 += d > 1;
  }
  EXPECT_EQ(diff, 0) << "bytes differing from PIL's ImageOps.pad (of " << want.size() << ")";
  EXPECT_EQ(over1, 0);
  const PreparedImage pi = PrepareImage(ReadBytes(kData / "image1.png"), TinyGeometry());
  EXPECT_EQ(CountDiff(pi.patches, ReadF32(kData / "case1_patches.f32")), 0);
  EXPECT_EQ(CountDiff(PixelsChw(padded), ReadF32(kData / "case1_pixels.f32")), 0);
}

TEST(VisionPreprocess, BadImagesNameTheProblem) {
  auto msg = [](const std::string& bytes) {
    try {
      DecodeImage(bytes);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("").find("empty"), std::string::npos);
  EXPECT_NE(msg("GIF89a....").find("unsupported format"), std::string::npos);
  std::string png = ReadBytes(kData / "image0.png");
  EXPECT_NE(msg(png.substr(0, png.size() / 2)).find("undecodable PNG"), std::string::npos);
  // A PNG header declaring 20000 x 20000 pixels: refused before decoding.
  // IHDR data is bytes 16..28, its CRC (over type + data) bytes 29..32.
  auto with_dims = [&](const unsigned char dims[8]) {
    std::string s = png;
    std::memcpy(&s[16], dims, 8);
    const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(s.data() + 12), 17);
    for (int i = 0; i < 4; ++i) s[29 + i] = static_cast<char>((crc >> (24 - 8 * i)) & 0xff);
    return s;
  };
  const unsigned char big[8] = {0, 0, 0x4e, 0x20, 0, 0, 0x4e, 0x20};
  const std::string huge = with_dims(big);
  EXPECT_NE(msg(huge).find("more than the limit"), std::string::npos) << msg(huge);
  const unsigned char none[8] = {0, 0, 0, 0, 0, 0, 0, 84};
  EXPECT_NE(msg(with_dims(none)).find("PNG"), std::string::npos) << msg(with_dims(none));
  EXPECT_NE(msg("\xff\xd8\xff\xe0garbage").find("undecodable JPEG"), std::string::npos);
}

// JPEG bytes of a smooth w×h image (channels 3 or 1) at quality 100, made with libjpeg.
std::string EncodeJpeg(int w, int h, int channels) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = channels;
  c.in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 100, TRUE);
  jpeg_start_compress(&c, TRUE);
  std::vector<unsigned char> row(static_cast<size_t>(w) * channels);
  while (c.next_scanline < c.image_height) {
    const int y = static_cast<int>(c.next_scanline);
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < channels; ++ch) row[x * channels + ch] = static_cast<unsigned char>(20 + x + 2 * y + 40 * ch);
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  std::string out(reinterpret_cast<char*>(buf), size);
  jpeg_destroy_compress(&c);
  std::free(buf);
  return out;
}

TEST(VisionPreprocess, JpegDecodesToRgb) {
  for (int channels : {3, 1}) {
    SCOPED_TRACE("channels " + std::to_string(channels));
    const RgbImage img = DecodeImage(EncodeJpeg(40, 24, channels));
    ASSERT_EQ(img.width, 40);
    ASSERT_EQ(img.height, 24);
    int worst = 0;
    for (int y = 0; y < 24; ++y)
      for (int x = 0; x < 40; ++x)
        for (int ch = 0; ch < 3; ++ch) {
          const int want = 20 + x + 2 * y + 40 * (channels == 3 ? ch : 0);
          worst = std::max(worst, std::abs(int(img.rgb[(y * 40 + x) * 3 + ch]) - want));
        }
    EXPECT_LE(worst, 4);  // lossy, quality 100, smooth image
  }
}

class VisionTowerGolden : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const std::string dir = VisionDir();
    if (dir.empty() || !fs::exists(fs::path(dir) / "model.safetensors")) return;
    store_ = TensorStore::Open(dir).release();
    cfg_ = new ModelConfig(ModelConfig::Load(dir));
    tower_ = VisionTower::Bind(*store_, *cfg_).release();
  }
  void SetUp() override {
    if (!tower_) GTEST_SKIP() << "no vision checkpoint: set DEEPINFER_TINY_VISION_DIR (or DEEPINFER_TINY_DIR, next to which ctest makes DIR-vision)";
  }
  static TensorStore* store_;
  static ModelConfig* cfg_;
  static VisionTower* tower_;
};
TensorStore* VisionTowerGolden::store_ = nullptr;
ModelConfig* VisionTowerGolden::cfg_ = nullptr;
VisionTower* VisionTowerGolden::tower_ = nullptr;

TEST_F(VisionTowerGolden, ConfigGeometry) {
  const VisionGeometry g = VisionGeometry::FromConfig(*cfg_);
  EXPECT_EQ(g.patch_size, 14);
  EXPECT_EQ(g.downsample_ratio, 3);
  EXPECT_EQ(g.max_n_token, 32);
  EXPECT_EQ(g.min_pixels, 7056);
  EXPECT_EQ(g.max_wh_ratio, 0.0);
}

// The tower from the golden patches: ViT output, aligner output and the span rows of the merged
// embedding stream all bit-identical to the reference's (docs/vision.md, "Bit-identical ViT").
void CheckCase(const VisionTower& t, int k, int nh, int nw) {
  SCOPED_TRACE("case " + std::to_string(k));
  const std::string c = "case" + std::to_string(k) + "_";
  const std::vector<float> patches = ReadF32(kData / (c + "patches.f32"));
  const std::vector<float> vit = t.Vit(patches.data(), nh, nw);
  const std::vector<float> gv = ReadF32(kData / (c + "vit_out.f32"));
  double m = 0;
  const int64_t nd = CountDiff(vit, gv, &m);
  std::printf("case %d ViT: %lld of %zu values differ, max |d| %.4g\n", k, static_cast<long long>(nd), gv.size(), m);
  EXPECT_EQ(nd, 0) << "max |d| " << m;
  // The aligner from the golden ViT output, and from ours: bit-identical.
  const std::vector<float> ge = ReadF32(kData / (c + "image_embeds.f32"));
  const std::vector<float> al = t.Align(gv.data(), nh, nw);
  EXPECT_EQ(CountDiff(al, ge, &m), 0) << "max |d| " << m;
  EXPECT_EQ(CountDiff(t.Align(vit.data(), nh, nw), ge, &m), 0) << "max |d| " << m;
  // The span rows of the merged stream (positions 2..11 of the 19-token prompt), from our tower.
  const std::vector<float> span = t.SpanEmbeddings(patches.data(), nh, nw, 2, 3);
  const std::vector<float> merged = ReadF32(kData / (c + "merged_embed.f32"));
  const std::vector<float> want(merged.begin() + 2 * 64, merged.begin() + 12 * 64);
  EXPECT_EQ(CountDiff(span, want, &m), 0) << "max |d| " << m;
}

TEST_F(VisionTowerGolden, Case0BitIdentical) { CheckCase(*tower_, 0, 6, 9); }
TEST_F(VisionTowerGolden, Case1BitIdentical) { CheckCase(*tower_, 1, 5, 8); }

// The Highway score and P·V rows (vit_attn.h) against the scalar loops they replace, bit for bit,
// including sizes that leave a scalar tail (n or hd not a multiple of the vector width).
TEST(VisionAttentionRows, HighwayEqualsScalarLoops) {
  uint32_t state = 12345;
  auto next = [&]() {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(1 << 22);
  };
  for (const auto& [n, hd] : std::vector<std::pair<int64_t, int64_t>>{{54, 32}, {40, 32}, {7, 5}, {33, 17}, {1, 1}}) {
    SCOPED_TRACE("n " + std::to_string(n) + " hd " + std::to_string(hd));
    const int64_t ldv = hd + 3;
    std::vector<float> q(hd), kt(hd * n), v(n * ldv), p(n);
    for (float& x : q) x = next();
    for (float& x : kt) x = next();
    for (float& x : v) x = next();
    for (float& x : p) x = std::fabs(next());
    std::vector<float> s(n), s_ref(n), o(hd), o_ref(hd);
    VitScoresRow(q.data(), kt.data(), n, hd, s.data());
    VitPvRow(p.data(), v.data(), n, hd, ldv, o.data());
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t e = 0; e < hd; ++e) acc += q[e] * kt[e * n + j];
      s_ref[j] = acc;
    }
    for (int64_t e = 0; e < hd; ++e) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) acc += p[j] * v[j * ldv + e];
      o_ref[e] = acc;
    }
    EXPECT_EQ(std::memcmp(s.data(), s_ref.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(o.data(), o_ref.data(), hd * sizeof(float)), 0);
  }
}

// The linears' dot products (vit_linear.h): the Highway rows equal the scalar oracle bit for bit
// (K with and without the 64-block, 16-wide and scalar tails; N not a multiple of the vector
// width), and the order is torch's, not a sequential sum.
TEST(VisionLinearRows, HighwayEqualsOracleAndOrderIsTorchs) {
  uint32_t state = 777;
  auto next = [&]() {
    state = state * 1664525u + 1013904223u;
    return RoundBf16(static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(1 << 22));
  };
  for (const auto& [M, K, N] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {5, 588, 64}, {3, 64, 192}, {2, 96, 64}, {4, 576, 19}, {1, 13, 7}, {2, 0, 3}}) {
    SCOPED_TRACE("K " + std::to_string(K) + " N " + std::to_string(N));
    std::vector<float> x(M * K), wT(K * N), y(M * N);
    for (float& v : x) v = next();
    for (float& v : wT) v = next();
    VitLinearRows(x.data(), M, K, wT.data(), N, y.data());
    int64_t bad = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const float r = VitDotTorchOrder(x.data() + m * K, wT.data() + n, K, N);
        bad += std::memcmp(&r, &y[m * N + n], 4) != 0;
      }
    EXPECT_EQ(bad, 0);
  }
  // p_0 = 1, p_1 = p_3 = 2^-24 (lanes 1 and 3): torch adds the two small terms first (1 + 2^-23);
  // a sequential sum loses both to round-to-even (1).
  const float e = std::ldexp(1.0f, -12);
  std::vector<float> x(64, 0.0f), w(64, 0.0f);
  x[0] = w[0] = 1.0f;
  x[1] = w[1] = x[3] = w[3] = e;
  float y = 0;
  VitLinearRows(x.data(), 1, 64, w.data(), 1, &y);
  EXPECT_EQ(y, 1.0f + std::ldexp(1.0f, -23));
  // The transposed-input form: p_1 and p_5 share the partial sum s_1 (1 + 2^-23); sequential: 1.
  std::vector<float> x8 = {1.0f, e, 0, 0, 0, e, 0, 0};
  VitLinearRowsSum4(x8.data(), 1, 8, x8.data(), 1, &y);
  EXPECT_EQ(y, 1.0f + std::ldexp(1.0f, -23));
}

}  // namespace
}  // namespace deepinfer::vision
