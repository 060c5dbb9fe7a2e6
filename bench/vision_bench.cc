// Vision cost on the tiny vision model (docs/vision.md): one image's
// preprocessing (decode + resize/pad + patches), ViT + aligner, and the
// prefill of the 19-token image prompt through the language model, timed in
// the same run so that the ViT's share of an image prompt's prefill is a
// ratio of this run. DEEPINFER_TINY_VISION_DIR = the checkpoint
// (`deepinfer make-tiny --arch deepseek_v41 --vision DIR`); the image and the
// token map come from tests/data.
// Run: build/bench/vision_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "model/config.h"
#include "model/state.h"
#include "model/v41/model.h"
#include "vision/image.h"
#include "vision/vit.h"

namespace deepinfer {
namespace {

const std::string kData = DEEPINFER_SOURCE_DIR "/tests/data";

std::string Bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Fixture {
  std::unique_ptr<TensorStore> store;
  ModelConfig cfg;
  std::unique_ptr<vision::VisionTower> tower;
  std::unique_ptr<v41::V41Model> model;
  std::string png;
  static Fixture* Get() {
    static Fixture* f = [] {
      const char* dir = std::getenv("DEEPINFER_TINY_VISION_DIR");
      if (!dir) return static_cast<Fixture*>(nullptr);
      auto* x = new Fixture;
      x->store = TensorStore::Open(dir);
      x->cfg = ModelConfig::Load(dir);
      x->tower = vision::VisionTower::Bind(*x->store, x->cfg);
      v41::V41Options o;
      o.engram_token_map_file = kData + "/golden-tiny-v41/engram_token_map.i32";
      x->model = v41::V41Model::Load(dir, o);
      x->png = Bytes(kData + "/vision/image0.png");
      return x;
    }();
    return f;
  }
};

void BM_Preprocess(benchmark::State& st) {
  Fixture* f = Fixture::Get();
  if (!f) return st.SkipWithError("DEEPINFER_TINY_VISION_DIR not set");
  const vision::VisionGeometry g = vision::VisionGeometry::FromConfig(f->cfg);
  for (auto _ : st) benchmark::DoNotOptimize(vision::PrepareImage(f->png, g));
}
BENCHMARK(BM_Preprocess)->Unit(benchmark::kMicrosecond);

void BM_VitAndAligner(benchmark::State& st) {
  Fixture* f = Fixture::Get();
  if (!f) return st.SkipWithError("DEEPINFER_TINY_VISION_DIR not set");
  const vision::PreparedImage im = vision::PrepareImage(f->png, vision::VisionGeometry::FromConfig(f->cfg));
  for (auto _ : st)
    benchmark::DoNotOptimize(f->tower->SpanEmbeddings(im.patches.data(), im.plan.n_vit_h, im.plan.n_vit_w,
                                                      im.plan.n_llm_h, im.plan.n_llm_w));
}
BENCHMARK(BM_VitAndAligner)->Unit(benchmark::kMicrosecond);

// The language model's prefill of the golden 19-token image prompt (span embeddings precomputed).
void BM_ImagePromptPrefill(benchmark::State& st) {
  Fixture* f = Fixture::Get();
  if (!f) return st.SkipWithError("DEEPINFER_TINY_VISION_DIR not set");
  const vision::PreparedImage im = vision::PrepareImage(f->png, vision::VisionGeometry::FromConfig(f->cfg));
  const std::vector<float> span =
      f->tower->SpanEmbeddings(im.patches.data(), im.plan.n_vit_h, im.plan.n_vit_w, im.plan.n_llm_h, im.plan.n_llm_w);
  std::vector<int32_t> ids = {0, 128803};
  std::vector<int8_t> types = {-1, -1};
  const std::vector<int8_t> span_types = vision::ImageTokenTypes(im.plan);
  for (int8_t t : span_types) ids.push_back(129264), types.push_back(t);
  for (int32_t t : {201, 72188, 566, 4609, 16, 128804, 128799}) ids.push_back(t), types.push_back(-1);
  const int64_t d = f->cfg.dim;
  std::vector<float> embeds(ids.size() * d, 0.0f);
  std::copy(span.begin(), span.end(), embeds.begin() + 2 * d);
  const StateGeometry geo = f->model->geometry(16);
  const int64_t blocks = geo.BlocksForTokens(64);
  DenseStateArena arena(geo, 1, blocks);
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  for (auto _ : st) {
    v41::ForwardBatch b;
    v41::ForwardSeq q;
    q.tokens = ids.data();
    q.token_types = types.data();
    q.embeds = embeds.data();
    q.len = static_cast<int64_t>(ids.size());
    q.state = arena.View(0, table.data(), blocks);
    b.seqs.push_back(q);
    b.per_row_layout = true;
    v41::ForwardOutput out;
    f->model->Forward(b, &out);
    benchmark::DoNotOptimize(out.logits.data());
  }
}
BENCHMARK(BM_ImagePromptPrefill)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();
