// deepinfer/vision/image.h — image decoding and the V4.1 image preprocessing
// (model-spec §3.3.7; the reference's image_processor.py, restated in the
// docs/golden/TINY_V41_VISION_SPEC.md §4 step 1).
//
// Pipeline for one image: DecodeImage (PNG via libpng, JPEG via libjpeg-turbo,
// converted to 8-bit RGB the way PIL's convert("RGB") does) → PlanImageGrid
// (the resize rule: min_pixels upscale, multiple of the patch size, the
// max_n_token shrink of safe_resize) → PadImage (PIL ImageOps.pad: BICUBIC
// aspect-preserving resize with PIL's fixed-point resampler, centred on grey
// 127) → Patches (bf16((u/255 − 0.5)/0.5) in FP32, patch-major
// [n_vit_h·n_vit_w, 3·p·p]). ImageTokenTypes gives the span layout.
//
// Every function is a pure function of its arguments (no global state) and
// thread-safe. Bad input throws Error(kInvalidArgument) with a message that
// names the problem (format, size, limit).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace deepinfer::vision {

// Token types of an image span (image_processor.py): TEXT outside spans.
enum TokenType : int8_t { kText = -1, kImageStart = 0, kImage = 1, kImageNewLine = 2, kImageEnd = 3 };

// 8-bit RGB, row-major [height, width, 3].
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Largest decoded image accepted, in pixels (PIL's decompression-bomb error
// threshold is 2 × 89,478,485; we refuse at PIL's warning threshold).
inline constexpr int64_t kMaxImagePixels = 89478485;

// Decodes PNG or JPEG bytes (recognised by their signature) to RGB: palette
// and grey expanded, alpha dropped (not composited, as PIL's RGBA→RGB), 16-bit
// samples reduced to their high byte. Throws Error(kInvalidArgument):
// "image: unsupported format (expected PNG or JPEG)", "image: zero size",
// "image: 20000x20000 = 400000000 pixels, more than the limit 89478485",
// "image: undecodable PNG: <libpng message>", and the JPEG equivalents. The
// size limit is checked from the header, before the pixels are decoded.
RgbImage DecodeImage(std::string_view bytes);

// The sizes of image_processor.plan_image_grid (all integers in pixels / patches).
struct ImagePlan {
  int n_llm_h = 0, n_llm_w = 0;        // token grid after the aligner
  int best_height = 0, best_width = 0; // padded pixel size (multiples of the patch size)
  int n_vit_h = 0, n_vit_w = 0;        // patch grid = best / patch_size
  // Span length: n_llm_h·(n_llm_w + 1) + 2.
  int n_tokens() const { return n_llm_h * (n_llm_w + 1) + 2; }
};

// The vision fields of the config that preprocessing reads.
struct VisionGeometry {
  int patch_size = 14, downsample_ratio = 3;
  int64_t max_n_token = 0, min_pixels = 0;
  double max_wh_ratio = 0;  // 0: none (null)
  static VisionGeometry FromConfig(const ModelConfig& c);
};

// plan_image_grid(width, height): Python doubles and Python's int()/ceil/floor
// exactly. Throws Error(kInvalidArgument) for a non-positive size.
ImagePlan PlanImageGrid(int width, int height, const VisionGeometry& g);

// PIL Image.resize((w, h), BICUBIC) of an RGB image: separable fixed-point
// filter (22 fractional bits), horizontal pass first, each pass clipped to
// 8 bits (PIL's Resample.c arithmetic). A same-size call returns a copy.
RgbImage ResizeBicubic(const RgbImage& in, int width, int height);

// PIL ImageOps.pad(image, (width, height), color=(127,127,127)): the resize
// that fits the aspect ratio (Python round, half to even), pasted centred.
RgbImage PadImage(const RgbImage& in, int width, int height);

// The normalised pixel tensor, CHW FP32 of BF16-exact values:
// bf16(((u / 255) − 0.5) / 0.5) with each step in FP32. [3, H, W].
std::vector<float> PixelsChw(const RgbImage& img);

// ViT input: [n_vit_h·n_vit_w, 3·p·p], row n = ph·n_vit_w + pw, element
// [c, py, px] = pixels[c, ph·p + py, pw·p + px]. `img` must be
// (n_vit_w·p) × (n_vit_h·p).
std::vector<float> Patches(const RgbImage& img, const ImagePlan& plan, int patch_size);

// [IMAGE_START] + ([IMAGE]·n_llm_w + [IMAGE_NEW_LINE])·n_llm_h + [IMAGE_END].
std::vector<int8_t> ImageTokenTypes(const ImagePlan& plan);

// Everything a request needs from one image, ready for the tower.
struct PreparedImage {
  ImagePlan plan;
  std::vector<float> patches;  // [n_vit_h·n_vit_w, 3·p·p]
  uint64_t content_hash = 0;   // xxh64 of the encoded bytes (prefix-cache key)
};
// DecodeImage + PlanImageGrid + PadImage (or the plain resize of the
// max_wh_ratio branch) + Patches.
PreparedImage PrepareImage(std::string_view bytes, const VisionGeometry& g);

}  // namespace deepinfer::vision
