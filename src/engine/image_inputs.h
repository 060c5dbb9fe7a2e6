// deepinfer/engine/image_inputs.h — a request's images inside the engine
// (docs/vision.md): the prompt's image placeholders expanded into spans, the
// span embeddings from the vision tower, the token types, and the content
// keys that prefix caching mixes into the blocks of a span.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "scheduler/scheduler.h"
#include "vision/image.h"
#include "vision/vit.h"

namespace deepinfer {

struct RequestImages {
  int64_t dim = 0;
  std::vector<int8_t> token_types;  // [prompt tokens] (−1 TEXT)
  std::vector<int32_t> embed_row;   // [prompt tokens]: row of `embeds`, −1 for TEXT
  std::vector<float> embeds;        // [span positions, dim] BF16 values
  std::vector<ImageKey> keys;       // one per span: positions and content hash
  bool empty() const { return keys.empty(); }
  // The chunk [start, start+len) of the prompt: fills types [len] and embeds
  // [len, dim] (zeros at TEXT rows) and returns true when it holds an image
  // position; false (buffers untouched) otherwise or past the prompt.
  bool Chunk(int64_t start, int64_t len, std::vector<int8_t>* types, std::vector<float>* rows) const;
  // Raw ids for the Engram look-back of a prefix-cache restore: image
  // positions become −1 (DEAD). ids point at positions first .. first+n−1.
  void MaskLookback(int64_t first, int64_t n, int32_t* ids) const;
};

// Expands every `cfg.image_token_id` in *ids (the i-th placeholder takes
// images[i]; a run of exactly that image's n_tokens placeholders counts as its
// span already expanded) into its span [IMAGE_START, (IMAGE × n_w, NEW_LINE) × n_h,
// IMAGE_END], all carrying the placeholder id, and runs the tower for the
// span embeddings. Throws Error(kInvalidArgument) naming `label`: placeholders
// and images differ in number ("3 image placeholders but 2 images"), the model
// has no vision tower, or more than `max_images` images.
RequestImages ExpandImages(const vision::VisionTower& tower, const ModelConfig& cfg, std::vector<int32_t>* ids,
                           const std::vector<std::shared_ptr<const vision::PreparedImage>>& images,
                           const std::string& label);

// Most images one request may carry.
inline constexpr int kMaxImagesPerRequest = 16;

}  // namespace deepinfer
