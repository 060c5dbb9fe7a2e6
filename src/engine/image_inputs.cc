// deepinfer/engine/image_inputs.cc — see image_inputs.h.
#include "engine/image_inputs.h"

#include <cstring>

#include "base/error.h"

namespace deepinfer {

bool RequestImages::Chunk(int64_t start, int64_t len, std::vector<int8_t>* types, std::vector<float>* rows) const {
  const int64_t n = static_cast<int64_t>(token_types.size());
  bool any = false;
  for (int64_t i = start; i < start + len && i < n; ++i) any |= token_types[i] >= 0;
  if (!any) return false;
  types->assign(static_cast<size_t>(len), -1);
  rows->assign(static_cast<size_t>(len * dim), 0.0f);
  for (int64_t i = 0; i < len && start + i < n; ++i) {
    (*types)[i] = token_types[start + i];
    if (embed_row[start + i] >= 0)
      std::memcpy(rows->data() + i * dim, embeds.data() + static_cast<int64_t>(embed_row[start + i]) * dim,
                  static_cast<size_t>(dim) * sizeof(float));
  }
  return true;
}

void RequestImages::MaskLookback(int64_t first, int64_t n, int32_t* ids) const {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = first + i;
    if (p >= 0 && p < static_cast<int64_t>(token_types.size()) && token_types[p] >= 0) ids[i] = -1;
  }
}

RequestImages ExpandImages(const vision::VisionTower& tower, const ModelConfig& cfg, std::vector<int32_t>* ids,
                           const std::vector<std::shared_ptr<const vision::PreparedImage>>& images,
                           const std::string& label) {
  RequestImages out;
  if (images.empty()) return out;
  if (!cfg.vision_enabled())
    Fail(ErrorKind::kInvalidArgument, "{}: the model has no vision tower (vision_config); it cannot take images", label);
  if (static_cast<int>(images.size()) > kMaxImagesPerRequest)
    Fail(ErrorKind::kInvalidArgument, "{}: too many images ({}; at most {} per request)", label, images.size(),
         kMaxImagesPerRequest);
  // The input holds, per image, either one placeholder or its whole span
  // already expanded (n_tokens consecutive placeholders; the server and the
  // CLI send that form so that prompt_tokens counts the span).
  out.dim = cfg.dim;
  const int32_t ph = static_cast<int32_t>(cfg.image_token_id);
  const std::vector<int32_t>& in = *ids;
  std::vector<int32_t> expanded;
  size_t next = 0;
  for (size_t p = 0; p < in.size();) {
    const int32_t t = in[p];
    if (t != ph) {
      expanded.push_back(t);
      out.token_types.push_back(vision::kText);
      out.embed_row.push_back(-1);
      ++p;
      continue;
    }
    if (next >= images.size())
      Fail(ErrorKind::kInvalidArgument, "{}: the prompt has more image placeholders (token {}) than the {} images",
           label, ph, images.size());
    const vision::PreparedImage& im = *images[next++];
    const size_t n_tok = static_cast<size_t>(im.plan.n_tokens());
    size_t run = 0;
    while (p + run < in.size() && run < n_tok && in[p + run] == ph) ++run;
    p += run == n_tok ? n_tok : 1;
    const std::vector<float> span = tower.SpanEmbeddings(im.patches.data(), im.plan.n_vit_h, im.plan.n_vit_w,
                                                         im.plan.n_llm_h, im.plan.n_llm_w);
    const std::vector<int8_t> types = vision::ImageTokenTypes(im.plan);
    ImageKey key;
    key.begin = static_cast<int64_t>(expanded.size());
    key.end = key.begin + static_cast<int64_t>(types.size());
    key.hash = im.content_hash;
    out.keys.push_back(key);
    const int32_t row0 = static_cast<int32_t>(out.embeds.size() / static_cast<size_t>(cfg.dim));
    out.embeds.insert(out.embeds.end(), span.begin(), span.end());
    for (size_t i = 0; i < types.size(); ++i) {
      expanded.push_back(t);
      out.token_types.push_back(types[i]);
      out.embed_row.push_back(row0 + static_cast<int32_t>(i));
    }
  }
  if (next != images.size())
    Fail(ErrorKind::kInvalidArgument, "{}: {} image placeholders (token {}) in the prompt but {} images", label, next, ph,
         images.size());
  *ids = std::move(expanded);
  return out;
}

}  // namespace deepinfer
