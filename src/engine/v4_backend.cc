// The DeepSeek-V4 model adapter (engine/v4_backend.h).
#include "engine/v4_backend.h"

#include <filesystem>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "engine/backend.h"
#include "model/v4/model.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

class V4Backend : public ModelBackend {
 public:
  explicit V4Backend(std::unique_ptr<v4::V4Model> model) : model_(std::move(model)) {}
  const ModelConfig& config() const override { return model_->config(); }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  StateGeometry Geometry(int64_t block_size) const override { return model_->Geometry(block_size); }
  // Every row in the per-row layout: identical whatever the batch or chunking.
  void Forward(const std::vector<BackendSeq>& seqs, std::vector<float>* logits) override {
    std::vector<v4::V4Seq> batch;
    batch.reserve(seqs.size());
    for (const BackendSeq& s : seqs)
      batch.push_back({s.tokens, s.len, s.start_pos, s.state, s.want_logits, s.all_logits});
    *logits = model_->Forward(batch, /*per_row_layout=*/true);
  }

 private:
  std::unique_ptr<v4::V4Model> model_;
};

}  // namespace

std::unique_ptr<Engine> OpenV4Engine(const EngineArgs& args) {
  namespace fs = std::filesystem;
  const fs::path dir(args.model);
  if (args.expert_parallel_size > 1 || args.data_parallel_size > 1)
    Fail(ErrorKind::kInvalidArgument, "{}: deepseek_v4 runs in one process only (--ep/--dp are not supported yet)",
         args.model);
  if (args.fp8_format != "e4m3fn")
    Fail(ErrorKind::kInvalidArgument, "{}: --fp8-format {} is not supported for deepseek_v4 (only e4m3fn)", args.model,
         args.fp8_format);
  std::unique_ptr<v4::V4Model> model = v4::V4Model::Load(dir);
  std::unique_ptr<Tokenizer> tok;
  if (fs::exists(dir / "tokenizer.json")) tok = std::make_unique<Tokenizer>(Tokenizer::Load(dir));
  spdlog::debug("loaded {} (deepseek_v4, {} layers, dim {})", args.model, model->config().n_layers,
                model->config().dim);
  return Engine::OpenWithBackend(args, std::make_unique<V4Backend>(std::move(model)), std::move(tok));
}

}  // namespace deepinfer
