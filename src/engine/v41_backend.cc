// Engine::Open and RunFollower: the DeepSeek-V4.1 model behind the engine's
// ModelBackend interface, plus the tokenizer and the Engram token map of the
// model directory. Under mpirun the leader's backend drives the followers
// with the step protocol of engine/parallel_runner.h.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "base/parallel.h"
#include "base/region_timer.h"
#include "cache/cache_pool.h"
#include "deepinfer/engine.h"
#include "engine/backend.h"
#include "engine/parallel_runner.h"
#include "engine/v4_backend.h"
#include "model/v41/dspark.h"
#include "model/v41/model.h"
#include "parallel/communicator.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

int CpSize(const EngineArgs& args) { return std::max(1, args.context_parallel_size); }

v41::ForwardSeq::Logits LogitsMode(bool all, bool last) {
  return all ? v41::ForwardSeq::Logits::kAll : last ? v41::ForwardSeq::Logits::kLast : v41::ForwardSeq::Logits::kNone;
}

// Every rank validates its batch, then all agree (one AllReduce of a flag per
// rank) before the collective forward, so a bad batch on one rank never
// leaves the others waiting inside it. Returns the ranks that failed.
std::vector<int> AgreeValid(Communicator& comm, v41::V41Model& model, const v41::ForwardBatch& batch,
                            std::string* my_error) {
  std::vector<int64_t> failed(static_cast<size_t>(comm.size()), 0);
  try {
    model.Validate(batch);
  } catch (const Error& e) {
    failed[static_cast<size_t>(comm.rank())] = 1;
    *my_error = e.what();
  }
  comm.AllReduce(failed.data(), static_cast<int64_t>(failed.size()), ReduceOp::kSum);
  std::vector<int> bad;
  for (size_t q = 0; q < failed.size(); ++q)
    if (failed[q]) bad.push_back(static_cast<int>(q));
  return bad;
}

// The DSpark drafter (v41/dspark.h, method "dspark"; backend.h ModelDrafter):
// for each sequence's kept rows it seeds the DSpark rings from the main
// hidden states the last Forward captured (ForwardSeq::dspark_hidden) and,
// when asked, drafts after the last kept row: the block starts with that
// row's next token (the step's sampled or accepted one), and the first
// max_drafts of out_1 .. out_bs (greedy, one-hot) are the proposal.
class DsparkDrafter : public ModelDrafter {
 public:
  DsparkDrafter(v41::V41Model& model, const std::vector<float>* hidden, const std::vector<BackendSeq>* fwd,
                const std::vector<int64_t>* row0)
      : dspark_(model), hidden_(hidden), fwd_(fwd), row0_(row0) {}
  int64_t hidden_width() const { return dspark_.hidden_width(); }
  void Draft(const std::vector<DraftSeq>& seqs, std::vector<DraftProposal>* out) override {
    const int64_t W = dspark_.hidden_width();
    std::vector<v41::DsparkSeq>& batch = batch_;  // kept between steps, as the drafts (no allocation)
    batch.clear();
    for (const DraftSeq& d : seqs) {
      if (d.forward_index < 0 || d.forward_index >= static_cast<int>(fwd_->size()))
        Fail(ErrorKind::kInternal, "DSpark drafter: forward_index {} outside the last Forward's {} sequences",
             d.forward_index, fwd_->size());
      const BackendSeq& f = (*fwd_)[static_cast<size_t>(d.forward_index)];
      if (d.kept < 1 || d.kept > f.len)
        Fail(ErrorKind::kInternal, "DSpark drafter: {} kept rows of a {}-row chunk", d.kept, f.len);
      const float* h = hidden_->data() + (*row0_)[static_cast<size_t>(d.forward_index)] * W;
      batch.push_back({h, d.kept, f.start_pos, d.state, d.max_drafts > 0 ? d.next_tokens[d.kept - 1] : -1});
    }
    dspark_.Run(batch, /*want_logits=*/false, &drafts_);
    out->resize(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      DraftProposal& p = (*out)[i];
      p.q.clear();
      p.ids.clear();
      if (seqs[i].max_drafts < 1) continue;
      const std::vector<int32_t>& ids = drafts_[i].ids;
      p.ids.assign(ids.begin(), ids.begin() + std::min<int64_t>(static_cast<int64_t>(ids.size()), seqs[i].max_drafts));
    }
  }

 private:
  v41::Dspark dspark_;
  std::vector<v41::DsparkSeq> batch_;
  std::vector<v41::DsparkDraft> drafts_;
  const std::vector<float>* hidden_;
  const std::vector<BackendSeq>* fwd_;
  const std::vector<int64_t>* row0_;
};

// Whether --speculative-config asks for the DSpark drafter (its rings are
// then part of the state geometry). A malformed config is reported by Open.
bool WantsDspark(const EngineArgs& args) {
  if (args.speculative_config.empty()) return false;
  try {
    return ParseSpeculativeConfig(args.speculative_config).method == "dspark";
  } catch (const Error&) {
    return false;
  }
}

class V41Backend : public ModelBackend {
 public:
  // comm: null for one process; else this is the leader (rank 0) of a parallel job.
  V41Backend(std::unique_ptr<v41::V41Model> model, Communicator* comm, const EngineArgs& args)
      : model_(std::move(model)), comm_(comm), args_(args), dspark_rings_(WantsDspark(args) && !comm) {}
  ~V41Backend() override {
    if (!comm_ || comm_->broken()) return;  // a lost rank: the others stop by themselves
    try {
      StepMessage stop;
      stop.kind = StepMessage::kStop;
      Send(stop);
    } catch (const std::exception& e) {
      spdlog::warn("could not stop the follower ranks: {}", e.what());
    }
  }
  const ModelConfig& config() const override { return model_->config(); }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  StateGeometry Geometry(int64_t block_size) const override {
    return model_->geometry(block_size, false, dspark_rings_);
  }
  // DSpark (v41/dspark.h): one process only (the engine refuses speculation
  // in parallel jobs); Forward then captures every row's main_hidden.
  ModelDrafter* EnableDrafter(const SpeculativeConfig& spec) override {
    const ModelConfig& c = model_->config();
    if (spec.method != "dspark" || comm_ || !dspark_rings_ || c.n_mtp_layers < 1 || c.dspark_block_size < 2)
      return nullptr;
    dspark_ = std::make_unique<DsparkDrafter>(*model_, &hidden_, &fwd_, &row0_);
    return dspark_.get();
  }
  // Prefix caching is off with --cp: its window history is paged, and a hit
  // would rebuild the ring from rows stored on other ranks.
  bool supports_prefix_caching() const override { return CpSize(args_) == 1; }
  bool supports_speculative_rollback() const override { return CpSize(args_) == 1; }
  int context_parallel_size() const override { return CpSize(args_); }
  StateGeometry CachingGeometry(int64_t block_size) const override { return model_->geometry(block_size, true); }
  int data_parallel_size() const override { return args_.data_parallel_size; }
  void CheckPeers() override {
    if (comm_) comm_->CheckPeers();
  }

  void Forward(const std::vector<BackendSeq>& seqs, std::vector<float>* logits) override {
    std::vector<std::vector<float>> out(1);
    ForwardShards({seqs}, false, &out);
    logits->swap(out[0]);
  }

  void ForwardShards(const std::vector<std::vector<BackendSeq>>& shards, bool decode_step,
                     std::vector<std::vector<float>>* logits) override {
    DI_CHECK(static_cast<int>(shards.size()) == args_.data_parallel_size && logits->size() == shards.size());
    const EpExchange exchange = StepExchange(args_, decode_step);
    if (comm_) {
      StepMessage msg;
      msg.exchange = exchange;
      msg.shards.resize(shards.size());
      for (size_t i = 0; i < shards.size(); ++i)
        for (const BackendSeq& s : shards[i]) {
          StepChunk c;
          c.len = s.len;
          c.start_pos = s.start_pos;
          c.slot = s.state.slot;
          c.logits = s.all_logits ? 2 : s.want_logits ? 1 : 0;
          c.reset = s.reset_state ? 1 : 0;
          c.restore_prefix = s.restore_prefix;
          if (s.restore_prefix > 0) c.restore_tokens.assign(s.restore_tokens, s.restore_tokens + s.num_restore_tokens);
          c.tokens.assign(s.tokens, s.tokens + s.len);
          c.block_table.assign(s.state.block_table, s.state.block_table + s.state.num_blocks);
          msg.shards[i].push_back(std::move(c));
        }
      Send(msg);
    }
    // This rank's batch: shard 0 (the engine's own pool).
    v41::ForwardBatch batch;
    batch.per_row_layout = true;  // chunk- and batch-invariant rows (model.h)
    batch.exchange = exchange;
    batch.seqs.reserve(shards[0].size());
    for (const BackendSeq& s : shards[0]) {
      v41::ForwardSeq f;
      f.tokens = s.tokens;
      f.token_types = s.token_types;
      f.embeds = s.embeds;
      f.len = s.len;
      f.start_pos = s.start_pos;
      f.state = s.state;
      f.logits = LogitsMode(s.all_logits, s.want_logits);
      f.carry_capture = s.carry_capture;
      batch.seqs.push_back(f);
    }
    if (dspark_) {
      // The drafter reads this call's main_hidden rows (DsparkDrafter).
      fwd_ = shards[0];
      row0_.clear();
      int64_t rows = 0;
      for (const BackendSeq& s : shards[0]) {
        row0_.push_back(rows);
        rows += s.len;
      }
      const int64_t W = dspark_->hidden_width();
      hidden_.resize(static_cast<size_t>(rows * W));
      for (size_t i = 0; i < batch.seqs.size(); ++i) batch.seqs[i].dspark_hidden = hidden_.data() + row0_[i] * W;
    }
    if (comm_) {
      std::string err;
      const std::vector<int> bad = AgreeValid(*comm_, *model_, batch, &err);
      if (!bad.empty())
        Fail(ErrorKind::kInvalidArgument, "{}", err.empty() ? fmt::format("rank {}'s batch failed validation", bad[0]) : err);
    }
    model_->Forward(batch, &out_);
    (*logits)[0].swap(out_.logits);
    if (comm_ && shards.size() > 1) {
      // Data parallelism: every rank's logits rows to the leader.
      const int64_t vocab = vocab_size();
      std::vector<int64_t> counts(shards.size());
      int64_t total = 0;
      for (size_t i = 0; i < shards.size(); ++i) {
        int64_t rows = 0;
        for (const BackendSeq& s : shards[i]) rows += LogitsRows(s);
        counts[i] = rows * vocab * static_cast<int64_t>(sizeof(float));
        total += rows * vocab;
      }
      std::vector<float> all(static_cast<size_t>(total));
      {
        RegionScope region(Region::kCollective);
        comm_->GatherV((*logits)[0].data(), counts, all.data(), 0);
      }
      int64_t at = 0;
      for (size_t i = 0; i < shards.size(); ++i) {
        const int64_t n = counts[i] / static_cast<int64_t>(sizeof(float));
        if (i > 0) (*logits)[i].assign(all.begin() + at, all.begin() + at + n);
        at += n;
      }
    }
  }

 private:
  void Send(const StepMessage& msg) {
    std::vector<uint8_t> bytes = msg.Serialize();
    int64_t n = static_cast<int64_t>(bytes.size());
    comm_->Broadcast(&n, sizeof(n), 0);
    comm_->Broadcast(bytes.data(), n, 0);
  }

  std::unique_ptr<v41::V41Model> model_;
  Communicator* comm_;
  EngineArgs args_;
  v41::ForwardOutput out_;
  bool dspark_rings_ = false;           // --speculative-config method "dspark" (one process)
  std::unique_ptr<DsparkDrafter> dspark_;
  std::vector<float> hidden_;           // [rows, n_targets·dim] main_hidden of the last Forward (drafter on)
  std::vector<BackendSeq> fwd_;         // its seqs
  std::vector<int64_t> row0_;           // first row of each
};

struct LoadedModel {
  ModelConfig cfg;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<v41::V41Model> model;
};

LoadedModel LoadModel(const EngineArgs& args, Communicator* comm) {
  namespace fs = std::filesystem;
  const fs::path dir(args.model);
  if (args.model.empty()) Fail(ErrorKind::kInvalidArgument, "--model is required");
  v41::V41Options opts;
  if (!ParseFp8Format(args.fp8_format, &opts.fp8_format))
    Fail(ErrorKind::kInvalidArgument, "--fp8-format: unknown format '{}' (expected e4m3fn or e4m3-ieee)",
         args.fp8_format);
  if (!fs::is_directory(dir)) Fail(ErrorKind::kNotFound, "model directory {} does not exist", args.model);
  LoadedModel lm;
  lm.cfg = ModelConfig::Load(dir);
  if (lm.cfg.arch != Arch::kDeepseekV41)
    Fail(ErrorKind::kInvalidArgument, "{}: model_type {} is not supported yet (only deepseek_v41)", args.model,
         lm.cfg.model_type);
  if (fs::exists(dir / "tokenizer.json")) lm.tokenizer = std::make_unique<Tokenizer>(Tokenizer::Load(dir));
  // Expert parallelism over the ranks when --ep > 1; context parallelism
  // (--cp > 1) over the same ranks: the paged state is split, the rows replicated.
  opts.comm = comm && (args.expert_parallel_size > 1 || CpSize(args) == 1) ? comm : nullptr;
  opts.context_parallel = comm && CpSize(args) > 1 ? comm : nullptr;
  if (!args.engram_token_map.empty()) {
    opts.engram_token_map_file = args.engram_token_map;
  } else if (!lm.cfg.engram_layer_ids.empty()) {
    if (!lm.tokenizer)
      Fail(ErrorKind::kNotFound,
           "{}: the model has Engram layers, whose token map is built from tokenizer.json, which is missing "
           "(or pass --engram-token-map FILE)",
           args.model);
    opts.engram_token_map =
        BuildCheckedEngramTokenMap(*lm.tokenizer, lm.cfg.engram_compressed_vocab_size, lm.cfg.vocab_size, args.model)
            .ids;
  }
  lm.model = v41::V41Model::Load(dir, opts);
  const auto& wb = lm.model->weight_bytes();
  if (comm) {
    const ExpertShard& sh = lm.model->expert_shard();
    spdlog::info("rank {}/{} (pid {} on {}): routed experts [{}, {}) = {:.1f} MiB, Engram rows {:.1f} MiB, replicated "
                 "{:.1f} MiB",
                 comm->rank(), comm->size(), getpid(), comm->hosts()[static_cast<size_t>(comm->rank())], sh.first(), sh.end(),
                 wb.routed_experts / 1048576.0, wb.engram_rows / 1048576.0, wb.replicated / 1048576.0);
  }
  if (comm && CpSize(args) > 1) {
    const StateGeometry g = lm.model->geometry(args.block_size);
    const int64_t per_rank = KvBlocksFor(args, g);
    spdlog::info("rank {}/{}: context parallelism --cp {}: {} KV blocks = {} tokens per rank (global blocks b with "
                 "b % {} == {}), {} tokens in the group; --max-model-len {}",
                 comm->rank(), comm->size(), CpSize(args), per_rank, per_rank * args.block_size, CpSize(args),
                 comm->rank(), per_rank * args.block_size * CpSize(args), args.max_model_len);
  }
  spdlog::debug("loaded {} ({} layers, dim {})", args.model, lm.cfg.n_layers, lm.cfg.dim);
  return lm;
}

Communicator* ParallelWorld(const EngineArgs& args) {
  Communicator& world = World();
  CheckParallelArgs(args, world.size());
  if (world.size() == 1) return nullptr;
  world.set_timeout(args.distributed_timeout_s);
  return &world;
}

}  // namespace

std::unique_ptr<Engine> Engine::Open(const EngineArgs& args) {
  // The model type in config.json picks the model (deepseek_v4: engine/v4_backend.h).
  if (!args.model.empty() && std::filesystem::is_regular_file(std::filesystem::path(args.model) / "config.json") &&
      ModelConfig::Load(args.model).arch == Arch::kDeepseekV4)
    return OpenV4Engine(args);
  Communicator* comm = ParallelWorld(args);
  if (comm && comm->rank() != 0)
    Fail(ErrorKind::kInternal, "Engine::Open on follower rank {} (call RunFollower)", comm->rank());
  LoadedModel lm = LoadModel(args, comm);
  auto engine =
      OpenWithBackend(args, std::make_unique<V41Backend>(std::move(lm.model), comm, args), std::move(lm.tokenizer));
  // Every rank has loaded its share and built its pool: "ready" means the whole job.
  if (comm) comm->Barrier();
  return engine;
}

bool IsFollowerRank() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return false;
  return World().rank() > 0;
}

int RunFollower(const EngineArgs& args) {
  Communicator* comm = ParallelWorld(args);
  if (!comm || comm->rank() == 0) Fail(ErrorKind::kInternal, "RunFollower on the leader");
  const int me = comm->rank();
  ValidateEngineArgs(args);
  // mpirun forwards SIGINT/SIGTERM to every rank; a follower stops when the
  // leader's stop message arrives (after the leader has finished its shutdown).
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  LoadedModel lm = LoadModel(args, comm);
  if (args.num_threads != 0) SetNumThreads(args.num_threads);
  const StateGeometry geometry = lm.model->geometry(args.block_size, args.enable_prefix_caching && CpSize(args) == 1);
  CachePool pool(geometry, KvBlocksFor(args, geometry), args.max_num_seqs, CpSize(args), CpSize(args) > 1 ? me : 0);
  const int64_t vocab = lm.cfg.vocab_size;
  v41::ForwardOutput out;
  try {
    comm->Barrier();  // the leader's Engine::Open waits for every rank's load
    for (;;) {
      // Wait for the leader's next step for as long as it takes (an idle
      // server); the pid checks still notice a dead leader.
      comm->set_timeout(0);
      int64_t n = 0;
      comm->Broadcast(&n, sizeof(n), 0);
      comm->set_timeout(args.distributed_timeout_s);
      std::vector<uint8_t> bytes(static_cast<size_t>(n));
      comm->Broadcast(bytes.data(), n, 0);
      const StepMessage msg = StepMessage::Parse(bytes);
      if (msg.kind == StepMessage::kStop) break;
      const bool dp = msg.shards.size() > 1;
      const auto& mine = msg.shards[dp ? static_cast<size_t>(me) : 0];
      v41::ForwardBatch batch;
      batch.per_row_layout = true;
      batch.exchange = msg.exchange;
      for (const StepChunk& c : mine) {
        if (c.reset) pool.ResetSlot(c.slot);
        v41::ForwardSeq f;
        f.tokens = c.tokens.data();
        f.len = c.len;
        f.start_pos = c.start_pos;
        f.state = pool.View(c.slot, c.block_table.data(), static_cast<int64_t>(c.block_table.size()));
        if (c.restore_prefix > 0)
          RestoreFixedState(f.state, c.restore_prefix, c.restore_tokens.data(),
                            static_cast<int64_t>(c.restore_tokens.size()));
        // Replicated attention: the leader computes the logits; here only DP ranks do.
        f.logits = dp ? LogitsMode(c.logits == 2, c.logits == 1) : v41::ForwardSeq::Logits::kNone;
        batch.seqs.push_back(f);
      }
      std::string err;
      if (!AgreeValid(*comm, *lm.model, batch, &err).empty()) {
        if (!err.empty()) spdlog::warn("rank {}: step refused: {}", me, err);
        continue;
      }
      lm.model->Forward(batch, &out);
      if (dp) {
        std::vector<int64_t> counts(msg.shards.size());
        for (size_t i = 0; i < msg.shards.size(); ++i) {
          int64_t rows = 0;
          for (const StepChunk& c : msg.shards[i]) rows += ChunkLogitsRows(c);
          counts[i] = rows * vocab * static_cast<int64_t>(sizeof(float));
        }
        comm->GatherV(out.logits.data(), counts, nullptr, 0);
      }
    }
  } catch (const RankLostError& e) {
    spdlog::error("rank {}: {}", me, e.what());
    return 1;
  } catch (const std::exception& e) {
    // This rank cannot follow any more; the leader notices it is gone.
    spdlog::error("rank {}: follower stopped: {}", me, e.what());
    return 1;
  }
  return 0;
}

}  // namespace deepinfer
