// deepinfer/tools/make_tiny_vision.cc — the vision additions of the tiny V4.1
// checkpoint (docs/golden/TINY_V41_VISION_SPEC.md §2; make_tiny_v41_vision.py
// vision_plan()). All 26 tensors are BF16 and follow the generator's value
// rule; the file layout (sorted names) is the text generator's.
#include <string>
#include <vector>

#include "tools/make_tiny.h"

namespace deepinfer::tiny {

void EnableVision(TinyConfig* c) {
  const TinyConfig defaults;
  c->vision_n_layers = 2;
  c->vision_dim = defaults.vision_dim;
  c->vision_n_heads = defaults.vision_n_heads;
  c->vision_inter_dim = defaults.vision_inter_dim;
  c->vision_patch_size = defaults.vision_patch_size;
  c->vision_downsample_ratio = defaults.vision_downsample_ratio;
  c->vision_max_n_token = defaults.vision_max_n_token;
  c->vision_min_pixels = defaults.vision_min_pixels;
  c->vision_max_wh_ratio = defaults.vision_max_wh_ratio;
  c->vision_rope_theta = defaults.vision_rope_theta;
}

void PlanVisionTensors(const TinyConfig& c, std::vector<PlannedTensor>* plan) {
  if (c.vision_n_layers <= 0) return;
  const int64_t vd = c.vision_dim, vi = c.vision_inter_dim, d = c.dim;
  const int64_t ps = c.vision_patch_size, r = c.vision_downsample_ratio;
  auto linear = [&](std::string name, int64_t out, int64_t in) {
    plan->push_back({std::move(name), TinyKind::kBf16, {out, in}, 0.0, LinearAmp(in)});
  };
  auto bias = [&](std::string name, int64_t n) {
    plan->push_back({std::move(name), TinyKind::kBf16, {n}, 0.0, 0.125});
  };
  auto norm = [&](std::string name, int64_t n) {
    plan->push_back({std::move(name), TinyKind::kBf16, {n}, 1.0, 0.125});
  };
  linear("vision.patch_embed.proj.weight", vd, 3 * ps * ps);
  bias("vision.patch_embed.proj.bias", vd);
  for (int b = 0; b < c.vision_n_layers; ++b) {
    const std::string q = "vision.blocks." + std::to_string(b) + ".";
    norm(q + "norm1.weight", vd);
    linear(q + "attn.wqkv.weight", 3 * vd, vd);
    bias(q + "attn.wqkv.bias", 3 * vd);
    linear(q + "attn.wo.weight", vd, vd);
    bias(q + "attn.wo.bias", vd);
    norm(q + "norm2.weight", vd);
    linear(q + "mlp.w1.weight", 2 * vi, vd);
    linear(q + "mlp.w2.weight", vd, vi);
  }
  norm("vision.norm.weight", vd);
  linear("aligner.w1.weight", d, vd * r * r);
  bias("aligner.w1.bias", d);
  linear("aligner.w2.weight", d, d);
  bias("aligner.w2.bias", d);
  for (const char* n : {"image_start", "image_end", "image_newline"})
    plan->push_back({n, TinyKind::kBf16, {d}, 0.0, 1.0});
}

}  // namespace deepinfer::tiny
