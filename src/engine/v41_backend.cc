// Engine::Open: the DeepSeek-V4.1 model behind the engine's ModelBackend
// interface, plus the tokenizer and the Engram token map of the model directory.
#include <filesystem>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "deepinfer/engine.h"
#include "engine/backend.h"
#include "model/v41/model.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

class V41Backend : public ModelBackend {
 public:
  explicit V41Backend(std::unique_ptr<v41::V41Model> model) : model_(std::move(model)) {}
  const ModelConfig& config() const override { return model_->config(); }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  StateGeometry Geometry(int64_t block_size) const override { return model_->geometry(block_size); }
  void Forward(const std::vector<BackendSeq>& seqs, std::vector<float>* logits) override {
    v41::ForwardBatch batch;
    batch.per_row_layout = true;  // chunk- and batch-invariant rows (model.h)
    batch.seqs.reserve(seqs.size());
    for (const BackendSeq& s : seqs) {
      v41::ForwardSeq f;
      f.tokens = s.tokens;
      f.len = s.len;
      f.start_pos = s.start_pos;
      f.state = s.state;
      f.logits = s.all_logits    ? v41::ForwardSeq::Logits::kAll
                 : s.want_logits ? v41::ForwardSeq::Logits::kLast
                                 : v41::ForwardSeq::Logits::kNone;
      batch.seqs.push_back(f);
    }
    model_->Forward(batch, &out_);
    logits->swap(out_.logits);
  }

 private:
  std::unique_ptr<v41::V41Model> model_;
  v41::ForwardOutput out_;
};

}  // namespace

std::unique_ptr<Engine> Engine::Open(const EngineArgs& args) {
  namespace fs = std::filesystem;
  const fs::path dir(args.model);
  if (args.model.empty()) Fail(ErrorKind::kInvalidArgument, "--model is required");
  if (!fs::is_directory(dir)) Fail(ErrorKind::kNotFound, "model directory {} does not exist", args.model);
  ModelConfig cfg = ModelConfig::Load(dir);
  if (cfg.arch != Arch::kDeepseekV41)
    Fail(ErrorKind::kInvalidArgument, "{}: model_type {} is not supported yet (only deepseek_v41)", args.model,
         cfg.model_type);
  std::unique_ptr<Tokenizer> tokenizer;
  if (fs::exists(dir / "tokenizer.json")) tokenizer = std::make_unique<Tokenizer>(Tokenizer::Load(dir));
  v41::V41Options opts;
  if (!args.engram_token_map.empty()) {
    opts.engram_token_map_file = args.engram_token_map;
  } else if (!cfg.engram_layer_ids.empty()) {
    if (!tokenizer)
      Fail(ErrorKind::kNotFound,
           "{}: the model has Engram layers, whose token map is built from tokenizer.json, which is missing "
           "(or pass --engram-token-map FILE)",
           args.model);
    opts.engram_token_map =
        BuildCheckedEngramTokenMap(*tokenizer, cfg.engram_compressed_vocab_size, cfg.vocab_size, args.model).ids;
  }
  auto model = v41::V41Model::Load(dir, opts);
  spdlog::debug("loaded {} ({} layers, dim {})", args.model, cfg.n_layers, cfg.dim);
  return OpenWithBackend(args, std::make_unique<V41Backend>(std::move(model)), std::move(tokenizer));
}

}  // namespace deepinfer
