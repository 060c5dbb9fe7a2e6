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

// The MTP block mtp.0 as the speculative drafter (backend.h ModelDrafter,
// method "mtp"): for each kept row at position q it reads the main model's
// final streams h_q and the next token t_{q+1}, writes the MTP window ring at q
// and, on the last kept row, gives the draft for position q+2: the argmax of
// the MTP logits (ties: the lowest id). Rows are computed in the per-row
// layout, so a draft depends only on the sequence's tokens.
class MtpDrafter : public ModelDrafter {
 public:
  MtpDrafter(v4::V4Model* model, const std::vector<float>* streams, const std::vector<BackendSeq>* fwd,
             const std::vector<int64_t>* row0)
      : model_(model), streams_(streams), fwd_(fwd), row0_(row0) {}
  void Draft(const std::vector<DraftSeq>& seqs, std::vector<DraftProposal>* out) override {
    const ModelConfig& c = model_->config();
    const int64_t flat = static_cast<int64_t>(c.hc_mult) * c.dim, V = c.vocab_size;
    out->assign(seqs.size(), {});
    // The call's batch, streams and logits keep their capacity between calls
    // (the model's step workspace, model/v4/workspace.h).
    std::vector<v4::V4Seq>& batch = batch_;
    std::vector<float>& x = x_;
    batch.clear();
    x.clear();
    for (const DraftSeq& d : seqs) {
      if (d.forward_index < 0 || d.forward_index >= static_cast<int>(fwd_->size()))
        Fail(ErrorKind::kInternal, "MTP drafter: forward_index {} outside the last Forward's {} sequences",
             d.forward_index, fwd_->size());
      const BackendSeq& f = (*fwd_)[static_cast<size_t>(d.forward_index)];
      if (d.kept < 1 || d.kept > f.len)
        Fail(ErrorKind::kInternal, "MTP drafter: {} kept rows of a {}-row chunk", d.kept, f.len);
      const float* h = streams_->data() + (*row0_)[static_cast<size_t>(d.forward_index)] * flat;
      x.insert(x.end(), h, h + d.kept * flat);
      batch.push_back({d.next_tokens, d.kept, f.start_pos, d.state, d.max_drafts > 0, false});
    }
    std::vector<float>& logits = logits_;
    model_->MtpInto(batch, x.data(), /*per_row_layout=*/true, &logits);
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].max_drafts < 1) continue;
      const float* lg = logits.data() + row++ * V;
      int64_t best = 0;
      for (int64_t t = 1; t < V; ++t)
        if (lg[t] > lg[best]) best = t;
      (*out)[i].ids.push_back(static_cast<int32_t>(best));
    }
  }

 private:
  v4::V4Model* model_;
  const std::vector<float>* streams_;
  const std::vector<BackendSeq>* fwd_;
  const std::vector<int64_t>* row0_;
  std::vector<v4::V4Seq> batch_;
  std::vector<float> x_, logits_;
};

class V4Backend : public ModelBackend {
 public:
  explicit V4Backend(std::unique_ptr<v4::V4Model> model) : model_(std::move(model)) {}
  const ModelConfig& config() const override { return model_->config(); }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  StateGeometry Geometry(int64_t block_size) const override { return model_->Geometry(block_size); }
  // Rollback (docs/speculative.md): window rings from the snapshot, compressor
  // carries replayed from the capture (V4Model::RollbackCarry); paged rows
  // (compressed KV, indexer keys) of rejected positions are never read.
  bool supports_speculative_rollback() const override { return true; }
  int64_t CarryCaptureFloats(const StateGeometry& g, int64_t len) const override {
    return model_->CarryCaptureFloats(g, len);
  }
  void RollbackSpeculative(const SequenceStateView& view, const FixedStateSnapshot& snap, int64_t end,
                           const float* capture, const int32_t*, int64_t) override {
    RollbackWindowRings(view, snap, end, model_->config().n_layers);  // the MTP ring is the drafter's
    model_->RollbackCarry(view, snap.carry, snap.start, snap.len, end, capture);
  }
  ModelDrafter* EnableDrafter(const SpeculativeConfig& spec) override {
    if (spec.method != "mtp" || model_->config().n_mtp_layers < 1) return nullptr;
    mtp_ = std::make_unique<MtpDrafter>(model_.get(), &streams_, &fwd_, &row0_);
    return mtp_.get();
  }
  // Every row in the per-row layout: identical whatever the batch or chunking.
  void Forward(const std::vector<BackendSeq>& seqs, std::vector<float>* logits) override {
    std::vector<v4::V4Seq>& batch = batch_;  // capacity kept between calls, as *logits and streams_
    batch.clear();
    for (const BackendSeq& s : seqs) {
      batch.push_back({s.tokens, s.len, s.start_pos, s.state, s.want_logits, s.all_logits});
      batch.back().carry_capture = s.carry_capture;
    }
    if (!mtp_) {
      model_->ForwardInto(batch, /*per_row_layout=*/true, logits);
      return;
    }
    // The drafter reads this call's final streams (MtpDrafter).
    fwd_ = seqs;
    row0_.clear();
    int64_t r = 0;
    for (const BackendSeq& s : seqs) {
      row0_.push_back(r);
      r += s.len;
    }
    model_->ForwardInto(batch, /*per_row_layout=*/true, logits, &streams_);
  }

 private:
  std::unique_ptr<v4::V4Model> model_;
  std::unique_ptr<MtpDrafter> mtp_;
  std::vector<v4::V4Seq> batch_;  // the last Forward's batch (reused)
  std::vector<float> streams_;   // [rows, hc, dim] of the last Forward (with the drafter on)
  std::vector<BackendSeq> fwd_;  // its seqs
  std::vector<int64_t> row0_;    // first stream row of each
};

}  // namespace

std::unique_ptr<ModelBackend> OpenV4Backend(const std::filesystem::path& dir) {
  return std::make_unique<V4Backend>(v4::V4Model::Load(dir));
}

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
