// deepinfer/vision/image.cc — see image.h. Decoding uses libpng / libjpeg-turbo
// (Debian libpng-dev, libjpeg62-turbo-dev); the resampler restates the
// arithmetic of PIL's Resample.c (BICUBIC, a = −0.5, 8-bit fixed point).
#include "vision/image.h"

#include <csetjmp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include <jpeglib.h>
#include <png.h>
#include <xxhash.h>

#include "base/error.h"
#include "format/numerics.h"

namespace deepinfer::vision {
namespace {

[[noreturn]] void Bad(const std::string& what) { Fail(ErrorKind::kInvalidArgument, "image: {}", what); }

void CheckSize(int64_t w, int64_t h) {
  if (w <= 0 || h <= 0) Bad(fmt::format("zero size ({}x{})", w, h));
  if (w * h > kMaxImagePixels)
    Bad(fmt::format("{}x{} = {} pixels, more than the limit {}", w, h, w * h, kMaxImagePixels));
}

// ------------------------------------------------------------------ PNG
struct PngReader {
  std::string_view bytes;
  size_t pos = 0;
  char error[256] = {0};
};

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->pos + n > r->bytes.size()) png_error(png, "truncated data");
  std::memcpy(out, r->bytes.data() + r->pos, n);
  r->pos += n;
}
void PngError(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->error, sizeof r->error, "%s", msg);
  png_longjmp(png, 1);
}
void PngWarning(png_structp, png_const_charp) {}

RgbImage DecodePng(std::string_view bytes) {
  PngReader rd{bytes};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &rd, PngError, PngWarning);
  if (!png) Bad("undecodable PNG: out of memory");
  png_infop info = png_create_info_struct(png);
  RgbImage img;
  std::vector<png_bytep> rows;
  // Kept outside the setjmp scope: a longjmp leaves the vectors to the destructors.
  volatile bool size_error = false;
  volatile int64_t w = 0, h = 0;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    if (size_error) CheckSize(w, h);
    Bad(fmt::format("undecodable PNG: {}", rd.error[0] ? rd.error : "error"));
  }
  png_set_read_fn(png, &rd, PngRead);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  w = png_get_image_width(png, info);
  h = png_get_image_height(png, info);
  if (w <= 0 || h <= 0 || w * h > kMaxImagePixels) {
    size_error = true;
    png_error(png, "size");
  }
  const int color = png_get_color_type(png, info);
  const int depth = png_get_bit_depth(png, info);
  // PIL's convert("RGB"): palette → RGB (transparency ignored), grey → RGB,
  // alpha dropped; 16-bit samples keep their high byte.
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);
  if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(w) * 3) png_error(png, "unexpected row layout");
  img.width = static_cast<int>(w);
  img.height = static_cast<int>(h);
  img.rgb.resize(static_cast<size_t>(w * h * 3));
  rows.resize(static_cast<size_t>(h));
  for (int64_t y = 0; y < h; ++y) rows[y] = img.rgb.data() + y * w * 3;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return img;
}

// ------------------------------------------------------------------ JPEG
struct JpegErr {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX] = {0};
};
void JpegErrorExit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->msg);
  std::longjmp(e->jump, 1);
}
void JpegQuiet(j_common_ptr, int) {}

RgbImage DecodeJpeg(std::string_view bytes) {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = JpegErrorExit;
  err.mgr.emit_message = JpegQuiet;
  RgbImage img;
  volatile int64_t w = 0, h = 0;
  volatile bool size_error = false, cmyk = false;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    if (size_error) CheckSize(w, h);
    if (cmyk) Bad("unsupported JPEG colour space (CMYK/YCCK)");
    Bad(fmt::format("undecodable JPEG: {}", err.msg));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  w = cinfo.image_width;
  h = cinfo.image_height;
  if (w <= 0 || h <= 0 || w * h > kMaxImagePixels) {
    size_error = true;
    std::longjmp(err.jump, 1);
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    cmyk = true;
    std::longjmp(err.jump, 1);
  }
  cinfo.out_color_space = JCS_RGB;  // PIL: libjpeg's defaults (islow DCT, fancy upsampling), grey → RGB
  jpeg_start_decompress(&cinfo);
  img.width = static_cast<int>(cinfo.output_width);
  img.height = static_cast<int>(cinfo.output_height);
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = img.rgb.data() + static_cast<size_t>(cinfo.output_scanline) * img.width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return img;
}

// ------------------------------------------------------------------ PIL resampling
constexpr int kPrecisionBits = 32 - 8 - 2;

double BicubicFilter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // [out, 2]: xmin, count
  std::vector<int> k;       // [out, ksize] fixed point
};

// precompute_coeffs + normalize_coeffs_8bpc of Resample.c (box = whole input).
Coeffs PrecomputeCoeffs(int in_size, int out_size) {
  const double support0 = 2.0;  // bicubic
  double scale = static_cast<double>(in_size) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = support0 * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> pre(static_cast<size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = 0.0 + (xx + 0.5) * scale;
    double ww = 0.0;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    for (int x = 0; x < xmax; ++x) {
      const double w = BicubicFilter((x + xmin - center + 0.5) * ss);
      pre[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x)
      if (ww != 0.0) pre[x] /= ww;
    for (int x = 0; x < xmax; ++x) {
      const double v = pre[x] * (1 << kPrecisionBits);
      c.k[static_cast<size_t>(xx) * c.ksize + x] = v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v);
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  return c;
}

inline uint8_t Clip8(int v) {
  const int s = v >> kPrecisionBits;
  return static_cast<uint8_t>(s < 0 ? 0 : s > 255 ? 255 : s);
}

RgbImage Horizontal(const RgbImage& in, int out_w) {
  const Coeffs c = PrecomputeCoeffs(in.width, out_w);
  RgbImage out{out_w, in.height, std::vector<uint8_t>(static_cast<size_t>(out_w) * in.height * 3)};
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* src = in.rgb.data() + static_cast<size_t>(y) * in.width * 3;
    for (int xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[xx * 2], n = c.bounds[xx * 2 + 1];
      const int* k = c.k.data() + static_cast<size_t>(xx) * c.ksize;
      for (int ch = 0; ch < 3; ++ch) {
        int ss = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < n; ++x) ss += src[(x + xmin) * 3 + ch] * k[x];
        out.rgb[(static_cast<size_t>(y) * out_w + xx) * 3 + ch] = Clip8(ss);
      }
    }
  }
  return out;
}

RgbImage Vertical(const RgbImage& in, int out_h) {
  const Coeffs c = PrecomputeCoeffs(in.height, out_h);
  const int w = in.width;
  RgbImage out{w, out_h, std::vector<uint8_t>(static_cast<size_t>(w) * out_h * 3)};
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = c.bounds[yy * 2], n = c.bounds[yy * 2 + 1];
    const int* k = c.k.data() + static_cast<size_t>(yy) * c.ksize;
    for (int x = 0; x < w; ++x) {
      for (int ch = 0; ch < 3; ++ch) {
        int ss = 1 << (kPrecisionBits - 1);
        for (int y = 0; y < n; ++y) ss += in.rgb[(static_cast<size_t>(y + ymin) * w + x) * 3 + ch] * k[y];
        out.rgb[(static_cast<size_t>(yy) * w + x) * 3 + ch] = Clip8(ss);
      }
    }
  }
  return out;
}

// Python's round() of a double to an int (half to even).
int PyRound(double v) { return static_cast<int>(std::nearbyint(v)); }

int LlmCells(int best, int p, int r) { return static_cast<int>(std::ceil(static_cast<double>(best / p) / r)); }

}  // namespace

RgbImage DecodeImage(std::string_view bytes) {
  if (bytes.empty()) Bad("empty data (zero bytes)");
  static constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return DecodePng(bytes);
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
      static_cast<unsigned char>(bytes[1]) == 0xD8 && static_cast<unsigned char>(bytes[2]) == 0xFF)
    return DecodeJpeg(bytes);
  Bad("unsupported format (expected PNG or JPEG data)");
}

VisionGeometry VisionGeometry::FromConfig(const ModelConfig& c) {
  VisionGeometry g;
  g.patch_size = c.vision_patch_size;
  g.downsample_ratio = c.vision_downsample_ratio;
  g.max_n_token = c.vision_max_n_token;
  g.min_pixels = c.vision_min_pixels;
  g.max_wh_ratio = c.vision_max_wh_ratio;
  return g;
}

ImagePlan PlanImageGrid(int width0, int height0, const VisionGeometry& g) {
  if (width0 <= 0 || height0 <= 0) Bad(fmt::format("zero size ({}x{})", width0, height0));
  const int p = g.patch_size, r = g.downsample_ratio;
  // Python: width/height may become floats (max_wh_ratio) — kept as doubles.
  double width = width0, height = height0;
  if (g.max_wh_ratio > 0 && width > height * g.max_wh_ratio) width = height * g.max_wh_ratio;
  if (0 < width * height && width * height < static_cast<double>(g.min_pixels)) {
    const double ratio = std::pow(static_cast<double>(g.min_pixels) / (width * height), 0.5);
    width = std::trunc(width * ratio);
    height = std::trunc(height * ratio);
  }
  int best_w = static_cast<int>(std::ceil(width / p)) * p;
  int best_h = static_cast<int>(std::ceil(height / p)) * p;
  auto n_tokens = [](int h, int w) { return static_cast<int64_t>(h) * (w + 1) + 2; };
  int n_h = LlmCells(best_h, p, r), n_w = LlmCells(best_w, p, r);
  if (n_tokens(n_h, n_w) > g.max_n_token) {
    // solve_resize_ratio(height, width, ...)
    const double rr = height / width;
    const double max_w_f = std::sqrt((g.max_n_token - 2) / rr + 0.25) - 0.5;
    const double max_h_f = max_w_f * rr;
    const int cell = p * r;
    if (max_w_f < 1.0) {
      best_h = static_cast<int>((g.max_n_token - 2) / 2) * cell;
      best_w = cell;
    } else if (max_h_f < 1.0) {
      best_h = cell;
      best_w = static_cast<int>(g.max_n_token - 3) * cell;
    } else {
      const double beta = std::min(std::floor(max_w_f) * cell / width, std::floor(max_h_f) * cell / height);
      best_h = static_cast<int>(std::floor(height * beta / p)) * p;
      best_w = static_cast<int>(std::floor(width * beta / p)) * p;
    }
    n_h = LlmCells(best_h, p, r);
    n_w = LlmCells(best_w, p, r);
    if (n_tokens(n_h, n_w) > g.max_n_token || best_h <= 0 || best_w <= 0)
      Bad(fmt::format("{}x{} cannot be fitted into vision_max_n_token = {} tokens", width0, height0, g.max_n_token));
  }
  ImagePlan plan;
  plan.n_llm_h = n_h;
  plan.n_llm_w = n_w;
  plan.best_height = best_h;
  plan.best_width = best_w;
  plan.n_vit_h = best_h / p;
  plan.n_vit_w = best_w / p;
  return plan;
}

RgbImage ResizeBicubic(const RgbImage& in, int width, int height) {
  if (width <= 0 || height <= 0) Bad(fmt::format("resize to zero size ({}x{})", width, height));
  if (width == in.width && height == in.height) return in;
  RgbImage cur = in;
  if (width != in.width) cur = Horizontal(cur, width);
  if (height != in.height) cur = Vertical(cur, height);
  return cur;
}

RgbImage PadImage(const RgbImage& in, int width, int height) {
  const double im_ratio = static_cast<double>(in.width) / in.height;
  const double dest_ratio = static_cast<double>(width) / height;
  if (im_ratio == dest_ratio) return ResizeBicubic(in, width, height);
  RgbImage out{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3, 127)};
  RgbImage src;
  int x0 = 0, y0 = 0;
  if (im_ratio > dest_ratio) {
    const int new_h = PyRound(static_cast<double>(in.height) / in.width * width);
    src = new_h != height ? ResizeBicubic(in, width, new_h) : in;
    y0 = PyRound((height - new_h) * 0.5);
  } else {
    const int new_w = PyRound(static_cast<double>(in.width) / in.height * height);
    src = new_w != width ? ResizeBicubic(in, new_w, height) : in;
    x0 = PyRound((width - new_w) * 0.5);
  }
  // paste (clipped to the canvas, as PIL does)
  for (int y = 0; y < src.height; ++y) {
    const int oy = y + y0;
    if (oy < 0 || oy >= height) continue;
    for (int x = 0; x < src.width; ++x) {
      const int ox = x + x0;
      if (ox < 0 || ox >= width) continue;
      std::memcpy(&out.rgb[(static_cast<size_t>(oy) * width + ox) * 3], &src.rgb[(static_cast<size_t>(y) * src.width + x) * 3], 3);
    }
  }
  return out;
}

std::vector<float> PixelsChw(const RgbImage& img) {
  const size_t hw = static_cast<size_t>(img.width) * img.height;
  std::vector<float> out(3 * hw);
  float lut[256];
  for (int u = 0; u < 256; ++u) {
    const float x = static_cast<float>(u) / 255.0f;
    lut[u] = RoundBf16((x - 0.5f) / 0.5f);
  }
  for (size_t i = 0; i < hw; ++i)
    for (int c = 0; c < 3; ++c) out[c * hw + i] = lut[img.rgb[i * 3 + c]];
  return out;
}

std::vector<float> Patches(const RgbImage& img, const ImagePlan& plan, int p) {
  if (img.width != plan.n_vit_w * p || img.height != plan.n_vit_h * p)
    Fail(ErrorKind::kInternal, "vision: image {}x{} does not match the patch grid {}x{} of {} px", img.width,
         img.height, plan.n_vit_w, plan.n_vit_h, p);
  const std::vector<float> px = PixelsChw(img);
  const int64_t W = img.width, HW = static_cast<int64_t>(img.width) * img.height, row = 3LL * p * p;
  std::vector<float> out(static_cast<size_t>(plan.n_vit_h) * plan.n_vit_w * row);
  for (int ph = 0; ph < plan.n_vit_h; ++ph)
    for (int pw = 0; pw < plan.n_vit_w; ++pw) {
      float* o = out.data() + (static_cast<int64_t>(ph) * plan.n_vit_w + pw) * row;
      for (int c = 0; c < 3; ++c)
        for (int py = 0; py < p; ++py)
          for (int pxx = 0; pxx < p; ++pxx)
            *o++ = px[c * HW + (static_cast<int64_t>(ph) * p + py) * W + pw * p + pxx];
    }
  return out;
}

std::vector<int8_t> ImageTokenTypes(const ImagePlan& plan) {
  std::vector<int8_t> t;
  t.reserve(static_cast<size_t>(plan.n_tokens()));
  t.push_back(kImageStart);
  for (int h = 0; h < plan.n_llm_h; ++h) {
    for (int w = 0; w < plan.n_llm_w; ++w) t.push_back(kImage);
    t.push_back(kImageNewLine);
  }
  t.push_back(kImageEnd);
  return t;
}

PreparedImage PrepareImage(std::string_view bytes, const VisionGeometry& g) {
  RgbImage img = DecodeImage(bytes);
  PreparedImage out;
  out.plan = PlanImageGrid(img.width, img.height, g);
  RgbImage padded;
  if (g.max_wh_ratio > 0 && img.width >= g.max_wh_ratio * img.height)
    padded = ResizeBicubic(img, out.plan.best_width, out.plan.best_height);
  else
    padded = PadImage(img, out.plan.best_width, out.plan.best_height);
  out.patches = Patches(padded, out.plan, g.patch_size);
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0x76697369u);
  const int32_t dims[2] = {out.plan.n_vit_h, out.plan.n_vit_w};
  XXH64_update(st, dims, sizeof dims);
  XXH64_update(st, out.patches.data(), out.patches.size() * sizeof(float));
  out.content_hash = XXH64_digest(st);
  XXH64_freeState(st);
  return out;
}

}  // namespace deepinfer::vision
