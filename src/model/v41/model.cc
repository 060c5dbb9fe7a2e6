// The DeepSeek-V4.1 forward pass (model.h). Reference semantics per
// model-spec §3.3 (what each step computes) and §4 (where it rounds); the
// comments name the reference step each block reproduces.
//
// Organisation of one Forward call: all rows of all sequences are processed
// together layer by layer. Row-wise operators (linears, norms, mHC, MoE,
// Engram) treat every row independently; attention, the compressor and the
// indexer work per sequence on that sequence's rows and state. Nothing reads
// another sequence's rows, so results are batch-invariant.
//
// Attention candidate list (the order matters: probabilities are rounded to
// BF16 per 64-wide chunk of the list, and chunk sums follow torch's order):
//   * window part: a start_pos-0 call uses the reference prefill layout —
//     min(T, window) slots, the query's window positions oldest first, absent
//     slots last; any other call uses the reference decode layout — window
//     slots, positions p−window+1 .. p oldest first (absent = before the
//     sequence start, first);
//   * compressed part (ratio > 0): min(index_topk, E) slots with
//     E = ⌊(start_pos+T)/ratio⌋, the selected compressed positions ascending,
//     absent slots last.
#include "model/v41/model.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "format/numerics.h"
#include "base/region_timer.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "model/v41/engram.h"
#include "model/v41/kernels.h"
#include "model/v41/workspace.h"
#include "parallel/context_parallel.h"
#include "parallel/sharded_rows.h"
#include "model/v41/weights.h"

namespace deepinfer::v41 {

struct Tables {
  ref::RopeTable rope_swa;       // ratio 0: rope_theta, no YaRN
  ref::RopeTable rope_compress;  // ratio > 0: compress_rope_theta with YaRN
  const ref::RopeTable& For(int ratio) const { return ratio > 0 ? rope_compress : rope_swa; }
};

V41Model::~V41Model() = default;

std::unique_ptr<V41Model> V41Model::Load(const std::filesystem::path& model_dir, const V41Options& options) {
  std::unique_ptr<V41Model> m(new V41Model());
  m->cfg_ = ModelConfig::Load(model_dir);
  const ModelConfig& c = m->cfg_;
  if (c.arch != Arch::kDeepseekV41)
    Fail(ErrorKind::kInvalidArgument, "{}: model_type {} is not deepseek_v41", model_dir.string(), c.model_type);
  if (c.n_shared_experts != 1)
    Fail(ErrorKind::kInvalidArgument, "{}: n_shared_experts {} not supported, expected 1", model_dir.string(),
         c.n_shared_experts);
  if (c.score_func != "sqrtsoftplus")
    Fail(ErrorKind::kInvalidArgument, "{}: scoring_func {} not supported, expected sqrtsoftplus",
         model_dir.string(), c.score_func);
  if (c.rope_head_dim % 2 != 0 || c.rope_head_dim > c.head_dim || c.rope_head_dim > c.index_head_dim ||
      c.rope_head_dim > 1024)
    Fail(ErrorKind::kInvalidArgument, "{}: qk_rope_head_dim {} not supported", model_dir.string(),
         c.rope_head_dim);
  if (c.head_dim % 32 != 0 || c.index_head_dim % 32 != 0)
    Fail(ErrorKind::kInvalidArgument, "{}: head_dim {} / index_head_dim {} must be multiples of 32",
         model_dir.string(), c.head_dim, c.index_head_dim);
  for (int l = 0; l < c.n_layers; ++l)
    if (c.compress_ratios[l] < 0 || c.compress_ratios[l] > 2)
      Fail(ErrorKind::kInvalidArgument, "{}: layer {} compress ratio {} is not a V4.1 ratio (0, 1, 2)",
           model_dir.string(), l, c.compress_ratios[l]);
  m->comm_ = options.comm;
  m->cp_comm_ = options.context_parallel;
  const int ep = m->comm_ ? m->comm_->size() : 1;
  const int ep_rank = m->comm_ ? m->comm_->rank() : 0;
  if (c.n_routed_experts % ep != 0)
    Fail(ErrorKind::kInvalidArgument, "--ep {} does not divide the model's {} routed experts (n_routed_experts)", ep,
         c.n_routed_experts);
  m->shard_ = ExpertShard{static_cast<int>(c.n_routed_experts), ep, ep_rank};
  m->store_ = TensorStore::Open(model_dir);
  if (options.fp8_format == Fp8Format::kE4M3Ieee) {
    bool any_fp8 = false;
    for (const auto& [name, t] : m->store_->all()) any_fp8 = any_fp8 || t.dtype == DType::kF8E4M3;
    if (!any_fp8)
      Fail(ErrorKind::kInvalidArgument,
           "--fp8-format e4m3-ieee: {} has no FP8 weights (no F8_E4M3 tensor); the mode rescales a checkpoint's "
           "FP8 weights, use --fp8-format e4m3fn",
           model_dir.string());
  }
  m->w_ = ModelWeights::Bind(*m->store_, c, ep, ep_rank, options.fp8_format);
  if (options.fp8_format == Fp8Format::kE4M3Ieee) {
    const IeeeTransformReport& r = m->w_->ieee_report;
    spdlog::info("--fp8-format e4m3-ieee: {} FP8 tensors transformed at load ({} codes halved, {} inexact "
                 "rounded half to even; {} UE8M0 scales + 1)",
                 r.tensors, r.values, r.inexact, r.scales);
  }
  if (!options.reference_kernels) m->weight_bytes_.packed = static_cast<int64_t>(m->w_->PackForCpu());
  m->weight_bytes_.routed_experts = m->w_->bytes.routed_experts;
  m->weight_bytes_.engram_rows = m->w_->bytes.engram_rows;
  m->weight_bytes_.replicated = m->w_->bytes.other;
  if (!c.engram_layer_ids.empty()) {
    std::vector<int32_t> map = options.engram_token_map;
    if (map.empty()) {
      if (options.engram_token_map_file.empty())
        Fail(ErrorKind::kInvalidArgument,
             "{}: the model has Engram layers; an Engram token map is required (V41Options)", model_dir.string());
      map = LoadEngramTokenMap(options.engram_token_map_file);
    }
    m->engram_ = std::make_unique<EngramHasher>(c, std::move(map));
  }
  m->debug_dump_dir_ = options.debug_dump_dir;
  if (m->debug_dump_dir_.empty()) {
    if (const char* env = std::getenv("DEEPINFER_DEBUG_DUMP"); env && *env) m->debug_dump_dir_ = env;
  }
  if (options.reuse_step_workspace) m->ws_ = std::make_unique<StepWorkspace>();
  m->tables_ = std::make_unique<Tables>();
  m->tables_->rope_swa = ref::RopeTable(c.rope_head_dim, c.rope_theta, 0, 1.0, c.beta_fast, c.beta_slow);
  m->tables_->rope_compress = ref::RopeTable(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len,
                                             c.rope_factor, c.beta_fast, c.beta_slow);
  return m;
}

// ---------------------------------------------------------------------------

class ForwardPass {
 public:
  ForwardPass(V41Model& m, const ForwardBatch& b, ForwardOutput* out, StepWorkspace& ws)
      : m_(m), c_(m.cfg_), w_(*m.w_), t_(*m.tables_), b_(b), out_(out), ws_(ws) {}

  void Run();
  void ValidateOnly() { Validate(); }

 private:
  // Per-row bookkeeping.
  using SeqInfo = StepSeq;

  void Validate();
  void Engram(int l);
  void Block(int l);
  void Attention(int l, const float* x, float* v);
  void Compressor(int l, int s, const float* x);
  void Indexer(int l, int s, const float* x, const float* qr);
  void Moe(int l, const float* x, float* v, int64_t r0, int64_t r1);

  // Context-parallel prefill (docs/parallel.md): with --cp N and a step of at
  // least kCpSplitMinRows rows, a row-wise computation runs on this rank's
  // slice [n·q/N, n·(q+1)/N) of the n rows and one AllGatherV shares the
  // slices. f(a, b) fills rows [a, b) of y [n, width]. The kernels are
  // row-invariant, so every row has the bits one rank would compute. Without
  // a split: f(0, n).
  static constexpr int64_t kCpSplitMinRows = 32;
  template <class F>
  void SplitRows(int64_t n, int64_t width, float* y, F&& f) {
    if (!cp_split_) {
      f(0, n);
      return;
    }
    Communicator& cp = *m_.cp_comm_;
    const int N = cp.size();
    f(n * cp.rank() / N, n * (cp.rank() + 1) / N);
    std::vector<int64_t> counts(static_cast<size_t>(N));
    for (int p = 0; p < N; ++p) counts[p] = (n * (p + 1) / N - n * p / N) * width * static_cast<int64_t>(sizeof(float));
    std::vector<float> all(static_cast<size_t>(n * width));
    {
      RegionScope scope(Region::kCollective);
      cp.AllGatherV(y + n * cp.rank() / N * width, counts, all.data());
    }
    std::memcpy(y, all.data(), all.size() * sizeof(float));
  }
  // Context-parallel prefill: after Indexer scored this rank's rows of
  // sequence s, every rank gets every row's selection (and candidate mask).
  void ShareSelections(int l, int s, bool cand_source);
  bool cp_split_ = false;      // this step splits its rows over the CP ranks
  int64_t cp_r0_ = 0, cp_r1_ = 0;  // this rank's rows [cp_r0_, cp_r1_) of the step
  void Head();
  void DsparkCapture(int l);
  void Record(int l, bool block_done);

  // State row accessors (memcpy: the pool's alignment is the caller's business).
  const SequenceStateView& St(int s) const { return b_.seqs[s].state; }
  uint8_t* Row(int s, StateKind k, int layer, int64_t row) const {
    const int region = St(s).geometry->of(k).RegionOf(layer);
    return St(s).Row(k, region, row);
  }
  // Context parallelism: whether this rank stores the paged row (model/state.h).
  bool Owns(int s, StateKind k, int layer, int64_t row) const {
    return St(s).OwnsRow(k, St(s).geometry->of(k).RegionOf(layer), row);
  }

  V41Model& m_;
  const ModelConfig& c_;
  const ModelWeights& w_;
  const Tables& t_;
  const ForwardBatch& b_;
  ForwardOutput* out_;
  StepWorkspace& ws_;  // this call's buffers (workspace.h); the members below live there

  int64_t R_ = 0;
  std::vector<SeqInfo>& seq_ = ws_.seq;
  std::vector<int32_t>& row_seq_ = ws_.row_seq;
  std::vector<int64_t>& row_pos_ = ws_.row_pos;
  std::vector<int64_t>& row_in_seq_ = ws_.row_in_seq;
  std::vector<uint8_t>& row_image_ = ws_.row_image;  // 1: an image-span position (token type >= 0)
  static bool IsImage(const ForwardSeq& q, int64_t i) { return q.token_types && q.token_types[i] >= 0; }
  std::vector<float>& X_ = ws_.X;
  std::vector<float>& pre_in_ = ws_.pre_in;
  std::vector<int64_t>& hash_ids_ = ws_.hash_ids;  // [R][n_engram][cols]
  // Compressed selection per layer (index sources; Reuse layers copy their source):
  // per row, the selected compressed positions ascending.
  std::vector<std::vector<std::vector<int32_t>>>& sel_ = ws_.sel;
  // Candidate mask of the candidate source, per row over [0, E).
  std::vector<std::vector<uint8_t>>& cand_ = ws_.cand;
  bool have_cand_ = false;
  std::vector<int32_t>& sig_vec_ = ws_.sig_vec;   // per row: vectorised-path count for [T, hc] sigmoids
  std::vector<int32_t>& soft_vec_ = ws_.soft_vec;  // per row: vectorised-path count for [T, E] softplus
  // Debug scratch.
  std::vector<int32_t> dbg_router_idx_;
  std::vector<float> dbg_router_w_;
};

void V41Model::Validate(const ForwardBatch& batch) {
  ForwardOutput unused;
  StepWorkspace ws;  // untouched by the checks
  ForwardPass p(*this, batch, &unused, ws);
  p.ValidateOnly();
}

void V41Model::Forward(const ForwardBatch& batch, ForwardOutput* out) {
  // The model's workspace unless another call holds it (then a fresh one).
  const bool reuse = ws_ && !ws_busy_.exchange(true, std::memory_order_acquire);
  std::optional<StepWorkspace> fresh;
  if (!reuse) fresh.emplace();
  StepWorkspace& ws = reuse ? *ws_ : *fresh;
  struct Release {
    std::atomic<bool>* busy;
    ~Release() {
      if (busy) busy->store(false, std::memory_order_release);
    }
  } release{reuse ? &ws_busy_ : nullptr};
  if (debug_dump_dir_.empty()) {
    ForwardPass p(*this, batch, out, ws);
    p.Run();
    return;
  }
  // Debug switch: record the first sequence (unless a caller's record is set) and write it out.
  DebugRecord local;
  DebugRecord* const saved = debug_;
  const int saved_seq = debug_seq_;
  if (!debug_) SetDebug(&local, 0);
  try {
    ForwardPass p(*this, batch, out, ws);
    p.Run();
  } catch (...) {
    SetDebug(saved, saved_seq);
    throw;
  }
  DebugRecord* rec = debug_;
  SetDebug(saved, saved_seq);
  WriteDebugDump(*rec, debug_dump_dir_ / fmt::format("call{:05}", debug_calls_++));
}

void ForwardPass::Validate() {
  if (b_.seqs.empty()) Fail(ErrorKind::kInvalidArgument, "Forward: empty batch");
  const bool paged = !c_.kv_source_layers.empty();
  for (size_t s = 0; s < b_.seqs.size(); ++s) {
    const ForwardSeq& q = b_.seqs[s];
    if (q.len < 1 || q.tokens == nullptr)
      Fail(ErrorKind::kInvalidArgument, "Forward: sequence {} has an empty chunk (len {})", s, q.len);
    if (q.start_pos < 0)
      Fail(ErrorKind::kInvalidArgument, "Forward: sequence {} has negative start_pos {}", s, q.start_pos);
    if (q.state.pools == nullptr || q.state.geometry == nullptr || q.state.slot < 0)
      Fail(ErrorKind::kInvalidArgument, "Forward: sequence {} has no state view (pools/geometry/slot)", s);
    const StateGeometry& g = *q.state.geometry;
    const auto& wr = g.of(StateKind::kWindow).regions;
    const bool dspark_rings = wr.size() == static_cast<size_t>(c_.n_layers + c_.n_mtp_layers) &&
                              c_.dspark_block_size > 0;
    if ((wr.size() != static_cast<size_t>(c_.n_layers) && !dspark_rings) || wr[0].row_bytes != c_.head_dim * 2 ||
        wr[0].rows_per_block != c_.window_size)
      Fail(ErrorKind::kInvalidArgument,
           "Forward: sequence {}: state geometry does not match the model (window regions {}, expected {} of {} "
           "rows of {} bytes); build it with V41Model::geometry()",
           s, wr.size(), c_.n_layers, c_.window_size, c_.head_dim * 2);
    if (paged || g.has_window_history()) {
      const int64_t need = g.BlocksForTokens(q.start_pos + q.len);
      if (q.state.block_table == nullptr || q.state.num_blocks < need)
        Fail(ErrorKind::kInvalidArgument,
             "Forward: sequence {}: block table has {} blocks, expected at least {} for {} tokens", s,
             q.state.num_blocks, need, q.start_pos + q.len);
    }
    if (q.token_types) {
      for (int64_t i = 0; i < q.len; ++i) {
        const int8_t ty = q.token_types[i];
        if (ty < -1 || ty > 3)
          Fail(ErrorKind::kInvalidArgument, "Forward: sequence {} token type {} at position {} outside [-1, 3]", s,
               ty, q.start_pos + i);
        if (ty >= 0 && (!c_.vision_enabled() || q.embeds == nullptr))
          Fail(ErrorKind::kInvalidArgument,
               "Forward: sequence {} position {} is an image position but {}", s, q.start_pos + i,
               c_.vision_enabled() ? "no embeddings were given" : "the model has no vision tower");
      }
    }
    for (int64_t i = 0; i < q.len; ++i) {
      const int32_t t = q.tokens[i];
      if (t < 0 || t >= c_.vocab_size)
        Fail(ErrorKind::kInvalidArgument, "Forward: sequence {} token {} at position {} outside [0, {})", s, t,
             q.start_pos + i, c_.vocab_size);
      if (m_.engram_ && t >= m_.engram_->map_size())
        Fail(ErrorKind::kInvalidArgument,
             "Forward: sequence {} token {} at position {} outside the Engram token map ({} entries)", s, t,
             q.start_pos + i, m_.engram_->map_size());
    }
  }
}

void ForwardPass::Run() {
  Validate();
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim;
  const int S = static_cast<int>(b_.seqs.size());
  seq_.resize(S);
  for (int s = 0; s < S; ++s) {
    seq_[s] = {R_, b_.seqs[s].len, b_.seqs[s].start_pos};
    R_ += b_.seqs[s].len;
  }
  cp_split_ = m_.cp_comm_ && m_.cp_comm_->size() > 1 && R_ >= kCpSplitMinRows && b_.per_row_layout;
  cp_r0_ = cp_split_ ? R_ * m_.cp_comm_->rank() / m_.cp_comm_->size() : 0;
  cp_r1_ = cp_split_ ? R_ * (m_.cp_comm_->rank() + 1) / m_.cp_comm_->size() : R_;
  row_seq_.resize(R_);
  row_pos_.resize(R_);
  row_in_seq_.resize(R_);
  row_image_.assign(R_, 0);
  sig_vec_.resize(R_);
  soft_vec_.resize(R_);
  for (int s = 0; s < S; ++s)
    for (int64_t i = 0; i < seq_[s].T; ++i) {
      const int64_t r = seq_[s].row0 + i;
      row_seq_[r] = s;
      row_pos_[r] = seq_[s].start + i;
      row_in_seq_[r] = i;
      row_image_[r] = b_.seqs[s].token_types && b_.seqs[s].token_types[i] >= 0;
      // Which rows of the [T, hc] sigmoids and [T, E] softplus take torch's
      // vectorised path (SLEEF exp) in the reference's call of T rows; those
      // kernels are dispatched with AVX-512 (16 lanes, 32 floats per step).
      // Per-row layout computes every row as a one-token call.
      const int64_t r_in = b_.per_row_layout ? 0 : i;
      const int64_t rows = b_.per_row_layout ? 1 : seq_[s].T;
      sig_vec_[r] = ref::VectorPathCount(r_in, rows, hc, 16);
      soft_vec_[r] = ref::VectorPathCount(r_in, rows, c_.n_routed_experts, 16);
    }
  DebugRecord* dbg = (m_.debug_ && m_.debug_seq_ < S) ? m_.debug_ : nullptr;
  if (dbg) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    *dbg = DebugRecord();
    dbg->len = q.T;
    dbg->start_pos = q.start;
    dbg->hc = hc;
    dbg->dim = d;
    dbg->topk = c_.n_activated_experts;
    dbg->out_streams.resize(c_.n_layers);
    dbg->out_pre_mix.resize(c_.n_layers);
    dbg->ffn_in_streams.resize(c_.n_layers);
    dbg->router_indices.resize(c_.n_layers);
    dbg->router_weights.resize(c_.n_layers);
  }

  // Engram hash ids for every row and Engram layer (model-spec §3.3.2), from
  // the sequence's own history: chunk tokens and the look-back state.
  if (m_.engram_) {
    const EngramHasher& eh = *m_.engram_;
    const int N = eh.lookback() + 1;
    const int per_row = eh.n_layers() * eh.cols();
    hash_ids_.assign(static_cast<size_t>(R_ * per_row), 0);
    for (int s = 0; s < S; ++s) {
      const ForwardSeq& q = b_.seqs[s];
      const int32_t* st = reinterpret_cast<const int32_t*>(Row(s, StateKind::kEngram, -1, 0));
      std::vector<int32_t>& back = Zeroed(ws_.engram_back, eh.lookback());
      std::memcpy(back.data(), st, back.size() * sizeof(int32_t));  // positions start-L .. start-1
      for (int64_t i = 0; i < q.len; ++i) {
        int32_t hist[16];
        for (int sft = 0; sft < N; ++sft) {
          const int64_t p = q.start_pos + i - sft;
          if (p < 0) hist[sft] = -1;
          else if (p >= q.start_pos) hist[sft] = IsImage(q, p - q.start_pos) ? -1 : q.tokens[p - q.start_pos];
          else hist[sft] = back[eh.lookback() - (q.start_pos - p)];
        }
        eh.Hash(hist, hash_ids_.data() + (seq_[s].row0 + i) * per_row);
      }
    }
    if (dbg) {
      const SeqInfo& q = seq_[m_.debug_seq_];
      dbg->engram_cols = eh.cols();
      dbg->engram_hash_ids.assign(hash_ids_.begin() + q.row0 * per_row,
                                  hash_ids_.begin() + (q.row0 + q.T) * per_row);
    }
  }

  // Embedding, four identical streams, one-hot `pre` (model-spec §3.3.1).
  std::optional<RegionScope> embed_scope(std::in_place, Region::kEmbed);
  X_.assign(static_cast<size_t>(R_ * hc * d), 0.0f);
  for (int64_t r = 0; r < R_; ++r) {
    const int s = row_seq_[r];
    const int32_t tok = b_.seqs[s].tokens[row_in_seq_[r]];
    const uint16_t* e = w_.embed.data + static_cast<int64_t>(tok) * d;
    if (row_image_[r]) {  // image span: the vision embeddings replace the lookup (§3.3.7)
      const float* v = b_.seqs[s].embeds + row_in_seq_[r] * d;
      for (int j = 0; j < hc; ++j) std::memcpy(&X_[(r * hc + j) * d], v, d * sizeof(float));
      continue;
    }
    for (int j = 0; j < hc; ++j)
      for (int64_t i = 0; i < d; ++i) X_[(r * hc + j) * d + i] = Bf16ToFloat(e[i]);
  }
  pre_in_.assign(static_cast<size_t>(R_ * hc), 0.0f);
  for (int64_t r = 0; r < R_; ++r) pre_in_[r * hc] = 1.0f;

  embed_scope.reset();
  sel_.resize(c_.n_layers);  // each layer's rows are (re)set by Attention
  for (int l = 0; l < c_.n_layers; ++l) {
    if (w_.layers[l].has_engram) Engram(l);
    if (c_.layers[l].dspark_target) DsparkCapture(l);
    Block(l);
  }
  Head();

  // Engram look-back state: raw ids of the last positions (after all layers).
  if (m_.engram_) {
    const int L = m_.engram_->lookback();
    for (int s = 0; s < S; ++s) {
      const ForwardSeq& q = b_.seqs[s];
      int32_t* st = reinterpret_cast<int32_t*>(Row(s, StateKind::kEngram, -1, 0));
      DI_CHECK(L <= 64);
      int32_t back[64], nb[64];
      std::memcpy(back, st, L * sizeof(int32_t));
      const int64_t end = q.start_pos + q.len;
      for (int i = 0; i < L; ++i) {
        const int64_t p = end - L + i;
        if (p < 0) nb[i] = -1;
        else if (p >= q.start_pos) nb[i] = IsImage(q, p - q.start_pos) ? -1 : q.tokens[p - q.start_pos];
        else nb[i] = back[L - (q.start_pos - p)];
      }
      std::memcpy(st, nb, L * sizeof(int32_t));
    }
  }
}

// ------------------------------------------------------------------ Engram

void ForwardPass::Engram(int l) {
  RegionScope region(Region::kEmbed);
  const EngramWeights& G = w_.layers[l].engram;
  const EngramHasher& eh = *m_.engram_;
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim, hd = c_.engram_head_dim;
  const int slot = c_.layers[l].engram_slot;
  const int cols = eh.cols();
  const int per_row = eh.n_layers() * cols;
  const int64_t ein = static_cast<int64_t>(cols) * hd;
  // Table rows (raw E4M3 codes and UE8M0 scales), from the ranks that hold
  // them when the table is sharded (parallel/sharded_rows.h), then
  // E4M3 × UE8M0 per 32 → FP32 → BF16 (ParallelEngramEmbedding).
  const int64_t row_bytes = hd + hd / 32;
  std::vector<int64_t>& ids = Zeroed(ws_.eg_ids, R_ * cols);
  for (int64_t r = 0; r < R_; ++r)
    for (int k = 0; k < cols; ++k) ids[r * cols + k] = hash_ids_[r * per_row + slot * cols + k];
  std::vector<uint8_t>& raw = Zeroed(ws_.eg_raw, R_ * cols * row_bytes);
  FetchShardedRows(
      m_.comm_, b_.exchange, G.rows, ids.data(), R_ * cols, row_bytes,
      [&](int64_t row, uint8_t* dst) {
        DI_CHECK(row >= G.row_begin && row < G.row_end);
        std::memcpy(dst, G.table + row * hd, static_cast<size_t>(hd));
        std::memcpy(dst + hd, G.table_scale + row * (hd / 32), static_cast<size_t>(hd / 32));
      },
      raw.data());
  std::vector<float>& e = Zeroed(ws_.eg_e, R_ * ein);
  for (int64_t r = 0; r < R_; ++r)
    for (int k = 0; k < cols; ++k) {
      const uint8_t* q = raw.data() + (r * cols + k) * row_bytes;
      if (G.halve_codes) {  // e4m3-ieee: the load-time transform applied to this row (weights.h)
        for (int64_t i = 0; i < hd; ++i) {
          uint8_t sb = 0;
          RaiseE8M0ForIeee(q[hd + i / 32], &sb);  // never 254: checked at load
          e[r * ein + k * hd + i] = RoundBf16(E4M3ToFloat(kHalvedE4M3[q[i]]) * E8M0ToFloat(sb));
        }
      } else {
        for (int64_t i = 0; i < hd; ++i)
          e[r * ein + k * hd + i] = RoundBf16(E4M3ToFloat(q[i]) * E8M0ToFloat(q[hd + i / 32]));
      }
    }
  std::vector<float>& kv = Zeroed(ws_.eg_kv, R_ * (hc + 1) * d);
  Linear(e.data(), R_, G.wkv, c_.act_block_size, kv.data());
  const float eps = c_.norm_eps;
  const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
#pragma omp parallel if(R_ * hc * d > (int64_t{1} << 16))
  {
    thread_local std::vector<float> tmp;
    Zeroed(tmp, d);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R_; ++r) {
      if (row_image_[r]) continue;  // image positions: Engram gate 0 (X unchanged)
      const float* value = kv.data() + r * (hc + 1) * d + hc * d;
      for (int j = 0; j < hc; ++j) {
        float* h = X_.data() + (r * hc + j) * d;
        const float* key = kv.data() + r * (hc + 1) * d + j * d;
        const float* wqk = G.qk.data() + j * d;
        for (int64_t i = 0; i < d; ++i) tmp[i] = h[i] * h[i];
        const float ms_h = ref::TorchSum(tmp.data(), d) / static_cast<float>(d);
        for (int64_t i = 0; i < d; ++i) tmp[i] = key[i] * key[i];
        const float ms_k = ref::TorchSum(tmp.data(), d) / static_cast<float>(d);
        const float rstd = (1.0f / std::sqrt(ms_h + eps)) * (1.0f / std::sqrt(ms_k + eps));
        for (int64_t i = 0; i < d; ++i) tmp[i] = (h[i] * wqk[i]) * key[i];
        const float dot = (ref::TorchSum(tmp.data(), d) * rstd) * inv_sqrt_dim;
        const float mag = std::sqrt(std::max(std::fabs(dot), 1e-6f));
        const float gate = ref::TorchSigmoid(std::copysign(mag, dot), j < sig_vec_[r]);
        for (int64_t i = 0; i < d; ++i) h[i] = RoundBf16(h[i] + gate * value[i]);
      }
    }
  }
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size())) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->engram_out[l].assign(X_.begin() + q.row0 * hc * d, X_.begin() + (q.row0 + q.T) * hc * d);
  }
}

// ------------------------------------------------------------------ block

void ForwardPass::Block(int l) {
  const LayerWeights& L = w_.layers[l];
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim;
  const int64_t n = R_;
  std::vector<float>& pre_a = Zeroed(ws_.pre_a, n * hc);
  std::vector<float>& post_a = Zeroed(ws_.post_a, n * hc);
  std::vector<float>& comb_a = Zeroed(ws_.comb_a, n * hc * hc);
  std::vector<float>& pre_f = Zeroed(ws_.pre_f, n * hc);
  std::vector<float>& post_f = Zeroed(ws_.post_f, n * hc);
  std::vector<float>& comb_f = Zeroed(ws_.comb_f, n * hc * hc);
  std::vector<float>& x = Zeroed(ws_.x, n * d);
  std::vector<float>& v = Zeroed(ws_.v, n * d);
  std::vector<float>& X2 = Zeroed(ws_.X2, static_cast<int64_t>(X_.size()));
  // Single-pass mHC (model-spec §3.3.3): each site's `pre` is used by the next site.
  {
    RegionScope region(Region::kMhc);
    HcMixes(X_.data(), n, hc, d, L.hc_attn_fn, L.hc_attn_base.data(), L.hc_attn_scale.data(), c_.norm_eps,
            c_.hc_sinkhorn_iters, c_.hc_eps, sig_vec_.data(), pre_a.data(), post_a.data(), comb_a.data());
    HcCollapse(w_.packed_for_cpu, X_.data(), pre_in_.data(), n, hc, d, x.data());
  }
  {
    RegionScope region(Region::kNorm);
    ref::RmsNorm(x.data(), n, d, L.attn_norm.data, c_.norm_eps, x.data());
  }
  Attention(l, x.data(), v.data());
  {
    RegionScope region(Region::kMhc);
    HcExpand(w_.packed_for_cpu, v.data(), X_.data(), post_a.data(), comb_a.data(), n, hc, d, X2.data());
  }
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size())) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->ffn_in_streams[l].assign(X2.begin() + q.row0 * hc * d, X2.begin() + (q.row0 + q.T) * hc * d);
  }
  {
    RegionScope region(Region::kMhc);
    HcMixes(X2.data(), n, hc, d, L.hc_ffn_fn, L.hc_ffn_base.data(), L.hc_ffn_scale.data(), c_.norm_eps,
            c_.hc_sinkhorn_iters, c_.hc_eps, sig_vec_.data(), pre_f.data(), post_f.data(), comb_f.data());
    HcCollapse(w_.packed_for_cpu, X2.data(), pre_a.data(), n, hc, d, x.data());
  }
  {
    RegionScope region(Region::kNorm);
    ref::RmsNorm(x.data(), n, d, L.ffn_norm.data, c_.norm_eps, x.data());
  }
  if (cp_split_ && !(m_.comm_ && m_.comm_->size() > 1))  // with --ep the experts are split instead
    SplitRows(n, d, v.data(), [&](int64_t a, int64_t b) { Moe(l, x.data(), v.data(), a, b); });
  else
    Moe(l, x.data(), v.data(), 0, n);
  {
    RegionScope region(Region::kMhc);
    HcExpand(w_.packed_for_cpu, v.data(), X2.data(), post_f.data(), comb_f.data(), n, hc, d, X_.data());
  }
  pre_in_.swap(pre_f);  // pre_f is refilled by the next Block
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size())) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->out_streams[l].assign(X_.begin() + q.row0 * hc * d, X_.begin() + (q.row0 + q.T) * hc * d);
    m_.debug_->out_pre_mix[l].assign(pre_in_.begin() + q.row0 * hc, pre_in_.begin() + (q.row0 + q.T) * hc);
  }
}

// ------------------------------------------------------------------ attention

void ForwardPass::Attention(int l, const float* x, float* v) {
  RegionScope region(Region::kAttention);
  const LayerSchedule& sch = c_.layers[l];
  const AttentionWeights& A = w_.layers[l].attn;
  const int64_t n = R_, H = c_.n_heads, D = c_.head_dim, rd = c_.rope_head_dim, qr_dim = c_.q_lora_rank;
  const int64_t win = c_.window_size;
  const int ratio = sch.compress_ratio;
  const ref::RopeTable& rope = t_.For(ratio);
  const int ab = c_.act_block_size;

  // Query: c_q = q_norm(wq_a(x)); q = wq_b(c_q), RoPE on each head's last rd dims.
  // Context-parallel prefill: c_q and the window K of every row are shared
  // (SplitRows); q, the attention core and the output projection run on this
  // rank's rows [r0, r1) only, and the output rows are shared at the end.
  const int64_t d = c_.dim, r0 = cp_r0_, r1 = cp_r1_;
  std::vector<float>& qr = Zeroed(ws_.qr, n * qr_dim);
  std::vector<float>& q = Zeroed(ws_.q, n * H * D);
  SplitRows(n, qr_dim, qr.data(), [&](int64_t a, int64_t b) {
    Linear(x + a * d, b - a, A.wq_a, ab, qr.data() + a * qr_dim);
    ref::RmsNorm(qr.data() + a * qr_dim, b - a, qr_dim, A.q_norm.data, c_.norm_eps, qr.data() + a * qr_dim);
  });
  Linear(qr.data() + r0 * qr_dim, r1 - r0, A.wq_b, ab, q.data() + r0 * H * D);
  // Window K (= V): kv_norm(wkv(x)), RoPE, FP8 QDQ over all D dims in blocks of 32.
  std::vector<float>& kv = Zeroed(ws_.kv, n * D);
  SplitRows(n, D, kv.data(), [&](int64_t a, int64_t b) {
    Linear(x + a * d, b - a, A.wkv, ab, kv.data() + a * D);
    ref::RmsNorm(kv.data() + a * D, b - a, D, A.kv_norm.data, c_.norm_eps, kv.data() + a * D);
    RegionScope core(Region::kAttnCore);
#pragma omp parallel for schedule(static) if((b - a) * D > (int64_t{1} << 16))
    for (int64_t r = a; r < b; ++r) {
      rope.Apply(kv.data() + r * D + D - rd, row_pos_[r], false);
      Fp8QdqInPlace(kv.data() + r * D, D, 32, w_.fp8_format);
    }
  });
  std::optional<RegionScope> core(std::in_place, Region::kAttnCore);
#pragma omp parallel for schedule(static) if((r1 - r0) * H * D > (int64_t{1} << 16))
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t h = 0; h < H; ++h) rope.Apply(q.data() + (r * H + h) * D + D - rd, row_pos_[r], false);
  std::vector<uint16_t>& kvb = Zeroed(ws_.kvb, n * D);
  for (int64_t i = 0; i < n * D; ++i) kvb[i] = FloatToBf16(kv[i]);

  core.reset();
  // Compressed branch: KV sources publish new entries; index sources select.
  const int S = static_cast<int>(seq_.size());
  if (ratio > 0) {
    if (sch.kv_source)
      for (int s = 0; s < S; ++s) Compressor(l, s, x);
    if (sch.index_source) {
      sel_[l].resize(n);
      for (std::vector<int32_t>& row : sel_[l]) row.clear();
      for (int s = 0; s < S; ++s) Indexer(l, s, x, qr.data());
    } else {
      sel_[l].resize(n);
      for (int64_t r = 0; r < n; ++r) {
        ReserveInSteps(sel_[l][r], c_.index_topk, 1);
        sel_[l][r] = sel_[sch.index_from][r];
      }
    }
  }

  // Context parallelism: the selected compressed rows stored on other ranks
  // are gathered first, in row order then selection order
  // (parallel/context_parallel.h; the same bytes, the same candidate list).
  std::vector<uint8_t> cp_kv;
  std::vector<int64_t> cp_at;
  if (ratio > 0 && St(0).sharding) {
    std::vector<PagedRowRef> refs;
    cp_at.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      cp_at[r] = static_cast<int64_t>(refs.size());
      for (int32_t j : sel_[l][r]) refs.push_back({&St(row_seq_[r]), j});
    }
    cp_kv.resize(refs.size() * static_cast<size_t>(D * 2));
    GatherPagedRows(m_.cp_comm_, StateKind::kCompressedKv,
                    St(0).geometry->of(StateKind::kCompressedKv).RegionOf(sch.kv_from), refs.data(),
                    static_cast<int64_t>(refs.size()), cp_kv.data());
  }
  // Sparse attention with sink over window + selected compressed positions.
  core.emplace(Region::kAttnCore);
  std::vector<float>& o = Zeroed(ws_.o, n * H * D);
  const float scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
  // One query row: the window and selected rows, then the attention kernel.
  // Several rows run in parallel, one row per thread; a single row (a batch-1
  // decode step) runs outside any parallel region, so the kernel can split
  // its own work over the team (cpu::SparseAttention).
  auto attend_row = [&](int64_t r) {
    thread_local std::vector<const uint16_t*> rows;
    thread_local std::vector<int32_t> slots;
    thread_local std::vector<uint16_t> ringbuf, cbuf;
    {
      const int s = row_seq_[r];
      const SeqInfo& qi = seq_[s];
      const int64_t p = row_pos_[r];
      rows.clear();
      slots.clear();
      ReserveInSteps(rows, win + c_.index_topk, 1);
      ReserveInSteps(slots, win + c_.index_topk, 1);
      ringbuf.resize(static_cast<size_t>(win * D));
      const bool prefill_layout = qi.start == 0 && !b_.per_row_layout;
      const int64_t W = prefill_layout ? std::min<int64_t>(qi.T, win) : win;
      const int64_t first = std::max<int64_t>(0, p - win + 1);
      for (int64_t qpos = first; qpos <= p; ++qpos) {
        const int64_t slot = prefill_layout ? qpos - first : win - 1 - (p - qpos);
        if (qpos >= qi.start) {
          rows.push_back(kvb.data() + (qi.row0 + qpos - qi.start) * D);
        } else {
          uint16_t* dst = ringbuf.data() + (qpos % win) * D;
          std::memcpy(dst, Row(s, StateKind::kWindow, l, qpos % win), D * 2);
          rows.push_back(dst);
        }
        slots.push_back(static_cast<int32_t>(slot));
      }
      int64_t list_len = W;
      if (ratio > 0) {
        const int64_t E = b_.per_row_layout ? (p + 1) / ratio : (qi.start + qi.T) / ratio;
        const int64_t K = std::min<int64_t>(c_.index_topk, E);
        const std::vector<int32_t>& sel = sel_[l][r];
        ReserveInSteps(cbuf, c_.index_topk * D, 1);
        Zeroed(cbuf, static_cast<int64_t>(sel.size()) * D);
        for (size_t i = 0; i < sel.size(); ++i) {
          const uint8_t* src = cp_kv.empty() || !St(s).sharding
                                   ? Row(s, StateKind::kCompressedKv, sch.kv_from, sel[i])
                                   : cp_kv.data() + (cp_at[r] + static_cast<int64_t>(i)) * D * 2;
          std::memcpy(cbuf.data() + i * D, src, D * 2);
          rows.push_back(cbuf.data() + i * D);
          slots.push_back(static_cast<int32_t>(W + i));
        }
        list_len = W + K;
      }
      float* orow = o.data() + r * H * D;
      (w_.packed_for_cpu ? cpu::SparseAttention : ref::SparseAttention)(q.data() + r * H * D, static_cast<int>(H), D, rows.data(), slots.data(),
                           static_cast<int>(rows.size()), static_cast<int32_t>(list_len), A.attn_sink.data(),
                           scale, orow);
      for (int64_t h = 0; h < H; ++h) rope.Apply(orow + h * D + D - rd, p, true);
    }
  };
  if (r1 - r0 == 1) {
    attend_row(r0);
  } else {
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = r0; r < r1; ++r) attend_row(r);
  }
  // Window ring: positions of this chunk into slot p mod window (last `win` only).
  for (int s = 0; s < S; ++s) {
    const SeqInfo& qi = seq_[s];
    for (int64_t i = std::max<int64_t>(0, qi.T - win); i < qi.T; ++i)
      std::memcpy(Row(s, StateKind::kWindow, l, (qi.start + i) % win), kvb.data() + (qi.row0 + i) * D, D * 2);
    // Prefix caching: every position's window row also goes to the paged
    // history, from which a cache hit rebuilds the ring (model/state.h).
    if (St(s).geometry->has_window_history())
      for (int64_t i = 0; i < qi.T; ++i)
        if (Owns(s, StateKind::kWindowHistory, l, qi.start + i))
          std::memcpy(Row(s, StateKind::kWindowHistory, l, qi.start + i), kvb.data() + (qi.row0 + i) * D, D * 2);
  }
  core.reset();
  // Grouped BF16 wo_a, then FP8 wo_b.
  const int64_t zw = c_.o_groups * c_.o_lora_rank;
  std::vector<float>& z = Zeroed(ws_.z, n * zw);
  SplitRows(n, d, v, [&](int64_t a, int64_t b) {
    GroupedLinearBf16(o.data() + a * H * D, b - a, c_.o_groups, A.wo_a, z.data() + a * zw);
    Linear(z.data() + a * zw, b - a, A.wo_b, ab, v + a * d);
  });
}

void ForwardPass::Compressor(int l, int s, const float* x) {
  RegionScope region(Region::kCompressor);
  const LayerSchedule& sch = c_.layers[l];
  const AttentionWeights& A = w_.layers[l].attn;
  const SeqInfo& qi = seq_[s];
  const int r = sch.compress_ratio;
  const int64_t D = c_.head_dim, d = c_.dim, rd = c_.rope_head_dim, ID = c_.index_head_dim;
  const ref::RopeTable& rope = t_.For(r);
  const float* xs = x + qi.row0 * d;
  // Latents of the groups completed in this chunk, pre-RoPE, BF16.
  std::vector<int64_t>& js = ws_.cmp_js;
  std::vector<float>& lat = ws_.cmp_lat;
  js.clear();
  lat.clear();
  if (r == 1) {
    Zeroed(lat, qi.T * D);
    LinearBf16(xs, qi.T, A.compressor_wkv, lat.data());
    ref::RmsNorm(lat.data(), qi.T, D, A.compressor_norm.data, c_.norm_eps, lat.data());
    for (int64_t i = 0; i < qi.T; ++i) js.push_back(qi.start + i);
  } else {
    // FP32 projections a = x·wkvᵀ, g = x·wgateᵀ; softmax over the r tokens of
    // a group per channel, weighted sum, BF16, RMSNorm (Compressor.forward).
    std::vector<float>& a = Zeroed(ws_.cmp_a, qi.T * D);
    std::vector<float>& g = Zeroed(ws_.cmp_g, qi.T * D);
    LinearF32Bf16W(xs, qi.T, A.compressor_wkv, a.data());
    LinearF32Bf16W(xs, qi.T, A.compressor_wgate, g.data());
    std::vector<const float*>& ga = Zeroed(ws_.cmp_ga, r);
    std::vector<const float*>& gg = Zeroed(ws_.cmp_gg, r);
    std::vector<float>& carry = Zeroed(ws_.cmp_carry, (r - 1) * 2 * D);
    for (int i = 0; i < r - 1; ++i)
      std::memcpy(carry.data() + i * 2 * D, Row(s, StateKind::kCompressorCarry, l, i), 2 * D * sizeof(float));
    for (int64_t i = 0; i < qi.T; ++i) {
      const int64_t p = qi.start + i;
      if ((p + 1) % r != 0) continue;
      const int64_t j = p / r;
      for (int t = 0; t < r; ++t) {
        const int64_t pt = j * r + t;
        if (pt >= qi.start) {
          ga[t] = a.data() + (pt - qi.start) * D;
          gg[t] = g.data() + (pt - qi.start) * D;
        } else {
          ga[t] = carry.data() + (pt % r) * 2 * D;
          gg[t] = carry.data() + (pt % r) * 2 * D + D;
        }
      }
      std::vector<float>& row = Zeroed(ws_.cmp_row, D);
      float e[8];
      for (int64_t ch = 0; ch < D; ++ch) {
        float mx = gg[0][ch];
        for (int t = 1; t < r; ++t) mx = std::max(mx, gg[t][ch]);
        float sum = 0.0f;
        for (int t = 0; t < r; ++t) {
          e[t] = ref::SleefExpf(gg[t][ch] - mx);
          sum += e[t];
        }
        float acc = 0.0f;
        for (int t = 0; t < r; ++t) acc += ga[t][ch] * (e[t] / sum);
        row[ch] = RoundBf16(acc);
      }
      ref::RmsNorm(row.data(), 1, D, A.compressor_norm.data, c_.norm_eps, row.data());
      lat.insert(lat.end(), row.begin(), row.end());
      js.push_back(j);
    }
    if (float* cap = b_.seqs[s].carry_capture) {
      const int region = St(s).geometry->of(StateKind::kCompressorCarry).RegionOf(l);
      float* dst = cap + static_cast<int64_t>(region) * qi.T * 2 * D;
      for (int64_t i = 0; i < qi.T; ++i) {
        std::memcpy(dst + i * 2 * D, a.data() + i * D, D * sizeof(float));
        std::memcpy(dst + i * 2 * D + D, g.data() + i * D, D * sizeof(float));
      }
    }
    // Carry the incomplete group's rows (FP32 a, g) to the next call.
    const int64_t end = qi.start + qi.T;
    for (int64_t p = (end / r) * r; p < end; ++p) {
      if (p < qi.start) continue;  // already in the carry
      float* dst = reinterpret_cast<float*>(Row(s, StateKind::kCompressorCarry, l, p % r));
      std::memcpy(dst, a.data() + (p - qi.start) * D, D * sizeof(float));
      std::memcpy(dst + D, g.data() + (p - qi.start) * D, D * sizeof(float));
    }
  }
  if (js.empty()) return;
  const int64_t nj = static_cast<int64_t>(js.size());
  // Index keys from the pre-RoPE latent: k_norm(wk(ℓ)), RoPE at r·j, FP4 QDQ (UE8M0, 32).
  std::vector<float>& k = Zeroed(ws_.cmp_k, nj * ID);
  LinearBf16(lat.data(), nj, A.indexer_wk, k.data());
  ref::RmsNorm(k.data(), nj, ID, A.indexer_k_norm.data, c_.norm_eps, k.data());
  for (int64_t i = 0; i < nj; ++i) {
    const int64_t pos = js[i] * r;
    float* kr = k.data() + i * ID;
    rope.Apply(kr + ID - rd, pos, false);
    Fp4QdqUe8m0InPlace(kr, ID, 32);
    // Context parallelism: only the rank that stores position js[i] keeps it.
    const bool own = Owns(s, StateKind::kIndexKey, l, js[i]);
    uint16_t* dst = own ? reinterpret_cast<uint16_t*>(Row(s, StateKind::kIndexKey, l, js[i])) : nullptr;
    for (int64_t c = 0; c < ID && own; ++c) {
      const uint16_t b = FloatToBf16(kr[c]);
      std::memcpy(dst + c, &b, 2);
    }
    // Compressed entry: RoPE at r·j, FP4 QDQ with E4M3 scales in blocks of 16.
    float* lr = lat.data() + i * D;
    rope.Apply(lr + D - rd, pos, false);
    Fp4QdqE4m3InPlace(lr, D, 16, w_.fp8_format);
    uint16_t* cdst = own ? reinterpret_cast<uint16_t*>(Row(s, StateKind::kCompressedKv, l, js[i])) : nullptr;
    for (int64_t c = 0; c < D && own; ++c) {
      const uint16_t b = FloatToBf16(lr[c]);
      std::memcpy(cdst + c, &b, 2);
    }
  }
}

void ForwardPass::Indexer(int l, int s, const float* x, const float* qr) {
  RegionScope region(Region::kIndexer);
  const LayerSchedule& sch = c_.layers[l];
  const AttentionWeights& A = w_.layers[l].attn;
  const SeqInfo& qi = seq_[s];
  const int r = sch.compress_ratio;
  const int64_t E = (qi.start + qi.T) / r;
  if (E == 0) return;  // nothing compressed yet: empty selections
  const int64_t nh = c_.index_n_heads, ID = c_.index_head_dim, rd = c_.rope_head_dim, d = c_.dim;
  const ref::RopeTable& rope = t_.For(r);
  const int64_t T = qi.T;
  // Context-parallel prefill: this rank scores its rows [i0, i1) of the
  // sequence; the selections are shared after the loop.
  const int64_t i0 = std::clamp<int64_t>(cp_r0_ - qi.row0, 0, T), i1 = std::clamp<int64_t>(cp_r1_ - qi.row0, 0, T);
  // Query heads: FP8 wq_b(c_q), RoPE on each head's last rd dims, FP4 QDQ (UE8M0, 32).
  std::vector<float>& qI = Zeroed(ws_.idx_q, T * nh * ID);
  Linear(qr + (qi.row0 + i0) * c_.q_lora_rank, i1 - i0, A.indexer_wq_b, c_.act_block_size, qI.data() + i0 * nh * ID);
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t h = 0; h < nh; ++h) rope.Apply(qI.data() + (i * nh + h) * ID + ID - rd, qi.start + i, false);
    Fp4QdqUe8m0InPlace(qI.data() + i * nh * ID, nh * ID, 32);
  }
  // Head weights: BF16 weights_proj(x) × (index_head_dim^-½ · n_heads^-½), BF16.
  std::vector<float>& wts = Zeroed(ws_.idx_w, T * nh);
  LinearBf16(x + (qi.row0 + i0) * d, i1 - i0, A.indexer_weights_proj, wts.data() + i0 * nh);
  const float wscale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5) *
                                          std::pow(static_cast<double>(nh), -0.5));
  for (auto& v : wts) v = RoundBf16(v * wscale);
  // Index keys of the KV source (the fixed publication: always this layer's source).
  // Context parallelism: the keys stored on other ranks are gathered first
  // (parallel/context_parallel.h; the same bytes).
  // FP32 keys: row-major for the scalar loop, cpu::IndexerScores' blocked
  // layout (padded to whole key blocks) for the fast path.
  const bool fast = w_.packed_for_cpu;
  const int64_t Ep = fast ? (E + cpu::kIndexKeyBlock - 1) / cpu::kIndexKeyBlock * cpu::kIndexKeyBlock : E;
  ReserveInSteps(ws_.idx_keys, Ep * ID, kGrowPositions * ID);
  std::vector<float>& keys = Zeroed(ws_.idx_keys, Ep * ID);
  std::vector<uint8_t> cp_keys;
  if (St(s).sharding) {
    std::vector<PagedRowRef> refs(static_cast<size_t>(E));
    for (int64_t j = 0; j < E; ++j) refs[j] = {&St(s), j};
    cp_keys.resize(static_cast<size_t>(E * ID * 2));
    GatherPagedRows(m_.cp_comm_, StateKind::kIndexKey, St(s).geometry->of(StateKind::kIndexKey).RegionOf(sch.kv_from),
                    refs.data(), E, cp_keys.data());
  }
  for (int64_t j = 0; j < E; ++j) {
    const uint16_t* kr = St(s).sharding ? reinterpret_cast<const uint16_t*>(cp_keys.data() + j * ID * 2)
                                        : reinterpret_cast<const uint16_t*>(Row(s, StateKind::kIndexKey, sch.kv_from, j));
    if (fast) {
      cpu::PackIndexKey(kr, j, ID, keys.data());
      continue;
    }
    for (int64_t c = 0; c < ID; ++c) {
      uint16_t b;
      std::memcpy(&b, kr + c, 2);
      keys[j * ID + c] = Bf16ToFloat(b);
    }
  }
  const bool is_cand_source = sch.candidate_source;
  const bool uses_cand = sch.candidate_from >= 0;
  if (is_cand_source) {
    cand_.resize(static_cast<size_t>(R_));  // every row's mask is (re)set below
    have_cand_ = true;
  }
  const int64_t K = std::min<int64_t>(c_.index_topk, E);
  const int64_t bs = c_.candidate_block_size;
  const float ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel if(T * E * nh * ID > (int64_t{1} << 20))
  {
    thread_local std::vector<float> score, bsc;
    thread_local std::vector<int64_t> idx;
    ReserveInSteps(score, E, kGrowPositions);
    ReserveInSteps(bsc, E / bs + 1, kGrowPositions);
    ReserveInSteps(idx, std::max<int64_t>(c_.index_topk, c_.candidate_topk_blocks), 1);
    Zeroed(score, E);
    Zeroed(idx, std::max<int64_t>(K, c_.candidate_topk_blocks));
#pragma omp for schedule(dynamic)
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = qi.start + i;
      const int64_t row = qi.row0 + i;
      const int64_t V = (p + 1) / r;  // visible compressed positions
      // Per-row layout: the row is scored exactly as a one-token decode at p would be.
      const int64_t Er = b_.per_row_layout ? V : E;
      const int64_t Kr = std::min<int64_t>(c_.index_topk, Er);
      if (Er == 0) {
        if (is_cand_source) {
          ReserveInSteps(cand_[row], E, kGrowPositions);
          cand_[row].assign(E, 0);
        }
        sel_[l][row].clear();
        continue;
      }
      const float* qrow = qI.data() + i * nh * ID;
      if (fast) {
        // The same scores (bit-identical); keys j >= V are -inf without scoring.
        const int64_t n = std::min(Er, V);
        cpu::IndexerScores(qrow, wts.data() + i * nh, nh, ID, keys.data(), n, score.data());
        for (int64_t j = n; j < Er; ++j) score[j] = ninf;
      } else {
        for (int64_t j = 0; j < Er; ++j) {
          // score(p, j) = Σ_h w_h·ReLU(q_h·k_j), each product and the head sum BF16.
          float acc = 0.0f;
          for (int64_t h = 0; h < nh; ++h) {
            const float* qh = qrow + h * ID;
            const float* kj = keys.data() + j * ID;
            float dot = 0.0f;
            for (int64_t c = 0; c < ID; ++c) dot += qh[c] * kj[c];
            const float rl = std::max(RoundBf16(dot), 0.0f);
            acc += RoundBf16(rl * wts[i * nh + h]);
          }
          score[j] = j < V ? RoundBf16(acc) : ninf;
        }
      }
      if (is_cand_source) {
        // Candidate blocks: block score = max over its positions; the newest
        // visible block forced to +inf; keep the top blocks that are not −inf.
        const int64_t nb = (Er + bs - 1) / bs;
        bsc.assign(static_cast<size_t>(nb), ninf);
        for (int64_t j = 0; j < Er; ++j) bsc[j / bs] = std::max(bsc[j / bs], score[j]);
        const int64_t last = V >= 1 ? (V - 1) / bs : -1;
        if (last >= 0) bsc[last] = std::numeric_limits<float>::infinity();
        const int64_t kb = std::min<int64_t>(c_.candidate_topk_blocks, nb);
        ref::TorchTopK(bsc.data(), nb, kb, /*sorted=*/true, idx.data());
        std::vector<uint8_t>& mask = cand_[row];
        ReserveInSteps(mask, E, kGrowPositions);
        mask.assign(E, 0);
        for (int64_t t = 0; t < kb; ++t) {
          const int64_t bk = idx[t];
          if (!(bsc[bk] > ninf)) continue;
          for (int64_t j = bk * bs; j < std::min(Er, (bk + 1) * bs); ++j) mask[j] = 1;
        }
      } else if (uses_cand) {
        const std::vector<uint8_t>& mask = cand_[row];
        for (int64_t j = 0; j < Er; ++j)
          if (!mask[j]) score[j] = ninf;
      }
      ref::TorchTopK(score.data(), Er, Kr, /*sorted=*/false, idx.data());
      std::vector<int32_t>& chosen = sel_[l][row];
      chosen.clear();
      ReserveInSteps(chosen, c_.index_topk, 1);
      for (int64_t t = 0; t < Kr; ++t)
        if (idx[t] < V) chosen.push_back(static_cast<int32_t>(idx[t]));
      std::sort(chosen.begin(), chosen.end());
    }
  }
  if (cp_split_) ShareSelections(l, s, is_cand_source);
  if (m_.debug_ && m_.debug_seq_ == s) {
    const int64_t offset = qi.start == 0 ? qi.T : c_.window_size;
    std::vector<int32_t> lists(T * K, -1);
    for (int64_t i = 0; i < T; ++i) {
      const auto& ch = sel_[l][qi.row0 + i];
      for (size_t t = 0; t < ch.size(); ++t) lists[i * K + t] = static_cast<int32_t>(ch[t] + offset);
    }
    m_.debug_->indexer_topk[l] = std::move(lists);
    m_.debug_->indexer_k[l] = static_cast<int>(K);
  }
}

void ForwardPass::ShareSelections(int l, int s, bool cand_source) {
  // Per row a fixed-size record every rank can size: k_r = min(index_topk,
  // ⌊(p+1)/ratio⌋) int32 slots (the ascending selection, −1 padded) and, for
  // a candidate source, the E-byte mask. Rows are split in contiguous
  // ascending slices, so the AllGatherV output is in row order.
  DI_CHECK(b_.per_row_layout);  // k_r from the row alone (the engine's layout)
  const SeqInfo& qi = seq_[s];
  const int r = c_.layers[l].compress_ratio;
  const int64_t E = (qi.start + qi.T) / r;
  Communicator& cp = *m_.cp_comm_;
  const int N = cp.size();
  auto kr = [&](int64_t i) { return std::min<int64_t>(c_.index_topk, (qi.start + i + 1) / r); };
  auto bytes = [&](int64_t i) { return kr(i) * 4 + (cand_source ? E : 0); };
  std::vector<int64_t> counts(static_cast<size_t>(N), 0);
  for (int p = 0; p < N; ++p) {
    const int64_t a = std::clamp<int64_t>(R_ * p / N - qi.row0, 0, qi.T), b = std::clamp<int64_t>(R_ * (p + 1) / N - qi.row0, 0, qi.T);
    for (int64_t i = a; i < b; ++i) counts[p] += bytes(i);
  }
  const int64_t i0 = std::clamp<int64_t>(cp_r0_ - qi.row0, 0, qi.T), i1 = std::clamp<int64_t>(cp_r1_ - qi.row0, 0, qi.T);
  std::vector<uint8_t> mine, all;
  mine.reserve(static_cast<size_t>(counts[cp.rank()]));
  for (int64_t i = i0; i < i1; ++i) {
    const std::vector<int32_t>& sel = sel_[l][qi.row0 + i];
    DI_CHECK(static_cast<int64_t>(sel.size()) <= kr(i));
    std::vector<int32_t> rec(static_cast<size_t>(kr(i)), -1);
    std::copy(sel.begin(), sel.end(), rec.begin());
    const uint8_t* p = reinterpret_cast<const uint8_t*>(rec.data());
    mine.insert(mine.end(), p, p + rec.size() * 4);
    if (cand_source) {
      const std::vector<uint8_t>& m = cand_[qi.row0 + i];
      DI_CHECK(static_cast<int64_t>(m.size()) == E);
      mine.insert(mine.end(), m.begin(), m.end());
    }
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  all.resize(static_cast<size_t>(total));
  {
    RegionScope scope(Region::kCollective);
    cp.AllGatherV(mine.data(), counts, all.data());
  }
  int64_t at = 0;
  for (int64_t i = 0; i < qi.T; ++i) {
    const int64_t k = kr(i);
    std::vector<int32_t> rec(static_cast<size_t>(k));
    std::memcpy(rec.data(), all.data() + at, static_cast<size_t>(k * 4));
    at += k * 4;
    std::vector<int32_t>& sel = sel_[l][qi.row0 + i];
    sel.clear();
    for (int32_t j : rec)
      if (j >= 0) sel.push_back(j);
    if (cand_source) {
      cand_[qi.row0 + i].assign(all.begin() + at, all.begin() + at + E);
      at += E;
    }
  }
}

// ------------------------------------------------------------------ MoE

void ForwardPass::Moe(int l, const float* x_all, float* v_all, int64_t r0, int64_t r1) {
  RegionScope region(Region::kMoe);
  const MoeWeights& F = w_.layers[l].ffn;
  const int64_t n = r1 - r0, d = c_.dim, I = c_.moe_inter_dim;
  const float* x = x_all + r0 * d;  // rows [r0, r1) of the step
  float* v = v_all + r0 * d;
  const int k = c_.n_activated_experts;
  const int ab = c_.act_block_size;
  const float lim = c_.swiglu_limit;
  std::vector<int32_t>& idx = Zeroed(ws_.moe_idx, n * k);
  std::vector<float>& wts = Zeroed(ws_.moe_w, n * k);
  std::vector<const float*>& bias = ws_.moe_bias;  // text tokens: `bias`; image spans: `bias_vl`
  bias.assign(static_cast<size_t>(n), F.bias.data());
  for (int64_t r = 0; r < n; ++r)
    if (row_image_[r]) bias[r] = F.bias_vl.data();
  std::optional<RegionScope> router(std::in_place, Region::kRouter);
  Router(x, n, F.gate, bias.data(), k, c_.gate_temp, c_.norm_topk_prob, c_.route_scale,
              soft_vec_.data() + r0, idx.data(), wts.data());
  router.reset();
  // Routed experts in increasing expert id, FP32 combine (MoE.forward).
  std::vector<float>& y = Zeroed(ws_.moe_y, n * d);
  auto swiglu = [&](const float* xin, int64_t m, const Fp4Linear* w1, const Fp4Linear* w3,
                    const Fp4Linear* w2, const Fp8Linear* s1, const Fp8Linear* s3,
                    const Fp8Linear* s2, const float* rw, float* out) {
    // Per thread: the routed experts run in parallel (RoutedExperts).
    thread_local std::vector<float> gt, up, neg;
    Zeroed(gt, m * I);
    Zeroed(up, m * I);
    if (w1) {
      Linear(xin, m, *w1, ab, gt.data());
      Linear(xin, m, *w3, ab, up.data());
    } else {
      Linear(xin, m, *s1, ab, gt.data());
      Linear(xin, m, *s3, ab, up.data());
    }
    SwiGlu(gt.data(), up.data(), m, I, lim, rw, neg);
    if (w2) Linear(gt.data(), m, *w2, ab, out);
    else Linear(gt.data(), m, *s2, ab, out);
  };
  // Routed experts: each on its owner rank (one process: all local), the
  // experts' SwiGLUs in parallel (each on one thread; the kernels inside run
  // on that thread), then per row the combine in increasing expert id, as
  // the reference sums (parallel/expert_parallel.h).
  RoutedExperts(
      m_.comm_, b_.exchange, m_.shard_, x, n, d, idx.data(), wts.data(), k,
      [&](int e, const float* xin, int64_t m, const float* rw, float* out) {
        const ExpertWeights& ew = F.experts[e];
        DI_CHECK(ew.bound);
        swiglu(xin, m, &ew.w1, &ew.w3, &ew.w2, nullptr, nullptr, nullptr, rw, out);
      },
      y.data());
  std::vector<float>& sh = Zeroed(ws_.moe_sh, n * d);
  swiglu(x, n, nullptr, nullptr, nullptr, &F.shared_w1, &F.shared_w3, &F.shared_w2, nullptr, sh.data());
  for (int64_t i = 0; i < n * d; ++i) v[i] = RoundBf16(y[i] + sh[i]);
  if (m_.debug_ && m_.debug_seq_ < static_cast<int>(seq_.size()) && r0 == 0 && r1 == R_) {
    const SeqInfo& q = seq_[m_.debug_seq_];
    m_.debug_->router_indices[l].assign(idx.begin() + q.row0 * k, idx.begin() + (q.row0 + q.T) * k);
    m_.debug_->router_weights[l].assign(wts.begin() + q.row0 * k, wts.begin() + (q.row0 + q.T) * k);
  }
}

// ------------------------------------------------------------------ DSpark capture

// main_hidden (model-spec §3.3.1, §3.3.6): the mean over the streams of the
// layer's input, BF16 (torch's bf16 mean: FP32 sum in stream order, ÷ hc),
// into columns [t·dim, (t+1)·dim) for the layer's rank t among the targets.
void ForwardPass::DsparkCapture(int l) {
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim;
  int t = 0;
  for (int x : c_.dspark_target_layer_ids) t += x < l;
  const int64_t width = static_cast<int64_t>(c_.dspark_target_layer_ids.size()) * d;
  for (size_t s = 0; s < seq_.size(); ++s) {
    float* cap = b_.seqs[s].dspark_hidden;
    if (!cap) continue;
    for (int64_t i = 0; i < seq_[s].T; ++i) {
      const float* X = X_.data() + (seq_[s].row0 + i) * hc * d;
      float* dst = cap + i * width + t * d;
      for (int64_t c = 0; c < d; ++c) {
        float acc = 0.0f;
        for (int j = 0; j < hc; ++j) acc += X[j * d + c];
        dst[c] = RoundBf16(acc / static_cast<float>(hc));
      }
    }
  }
}

// ------------------------------------------------------------------ head

void ForwardPass::Head() {
  RegionScope region(Region::kHead);
  const int hc = c_.hc_mult;
  const int64_t d = c_.dim, V = c_.vocab_size;
  std::vector<int64_t>& rows = ws_.head_rows;
  rows.clear();
  out_->row_seq.clear();
  out_->row_pos.clear();
  for (size_t s = 0; s < seq_.size(); ++s) {
    const auto mode = b_.seqs[s].logits;
    if (mode == ForwardSeq::Logits::kNone) continue;
    const int64_t i0 = mode == ForwardSeq::Logits::kAll ? 0 : seq_[s].T - 1;
    for (int64_t i = i0; i < seq_[s].T; ++i) {
      rows.push_back(seq_[s].row0 + i);
      out_->row_seq.push_back(static_cast<int32_t>(s));
      out_->row_pos.push_back(seq_[s].start + i);
    }
  }
  out_->vocab = V;
  const int64_t m = static_cast<int64_t>(rows.size());
  out_->logits.assign(static_cast<size_t>(m * V), 0.0f);
  if (m == 0) return;
  // Final collapse with the last `pre`, norm, FP32 head (model-spec §3.3.1).
  std::vector<float>& Xs = Zeroed(ws_.head_X, m * hc * d);
  std::vector<float>& pre = Zeroed(ws_.head_pre, m * hc);
  std::vector<float>& y = Zeroed(ws_.head_y, m * d);
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(Xs.data() + i * hc * d, X_.data() + rows[i] * hc * d, hc * d * sizeof(float));
    std::memcpy(pre.data() + i * hc, pre_in_.data() + rows[i] * hc, hc * sizeof(float));
  }
  HcCollapse(w_.packed_for_cpu, Xs.data(), pre.data(), m, hc, d, y.data());
  ref::RmsNorm(y.data(), m, d, w_.norm.data, c_.norm_eps, y.data());
  LinearF32Bf16W(y.data(), m, w_.head, out_->logits.data());
}

// ------------------------------------------------------------------ debug dump

void WriteDebugDump(const DebugRecord& rec, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) Fail(ErrorKind::kInvalidArgument, "debug dump: cannot create {}: {}", dir.string(), ec.message());
  auto write = [&](const std::string& name, const std::vector<float>& v) {
    std::ofstream f(dir / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    if (!f) Fail(ErrorKind::kInvalidArgument, "debug dump: cannot write {}", (dir / name).string());
  };
  for (size_t l = 0; l < rec.out_streams.size(); ++l) {
    write("layer" + std::to_string(l) + "_out_streams.f32", rec.out_streams[l]);
    write("layer" + std::to_string(l) + "_out_pre_mix.f32", rec.out_pre_mix[l]);
  }
  for (const auto& [l, v] : rec.engram_out) write("layer" + std::to_string(l) + "_engram_out.f32", v);
  nlohmann::json j;
  j["length"] = rec.len;
  j["start_pos"] = rec.start_pos;
  nlohmann::json layers = nlohmann::json::object();
  for (size_t l = 0; l < rec.router_indices.size(); ++l) {
    nlohmann::json L;
    std::vector<std::vector<int32_t>> ri;
    std::vector<std::vector<float>> rw;
    for (int64_t t = 0; t < rec.len; ++t) {
      ri.emplace_back(rec.router_indices[l].begin() + t * rec.topk, rec.router_indices[l].begin() + (t + 1) * rec.topk);
      rw.emplace_back(rec.router_weights[l].begin() + t * rec.topk, rec.router_weights[l].begin() + (t + 1) * rec.topk);
    }
    L["router_indices"] = ri;
    L["router_weights"] = rw;
    auto it = rec.indexer_topk.find(static_cast<int>(l));
    if (it != rec.indexer_topk.end()) {
      const int k = rec.indexer_k.at(static_cast<int>(l));
      std::vector<std::vector<int32_t>> lists;
      for (int64_t t = 0; t < rec.len; ++t)
        lists.emplace_back(it->second.begin() + t * k, it->second.begin() + (t + 1) * k);
      L["indexer_topk"] = lists;
    }
    layers[std::to_string(l)] = L;
  }
  j["layers"] = layers;
  if (rec.engram_cols > 0) {
    const int64_t per_row = static_cast<int64_t>(rec.engram_hash_ids.size()) / std::max<int64_t>(rec.len, 1);
    const int64_t nl = per_row / rec.engram_cols;
    std::vector<std::vector<std::vector<int64_t>>> ids(rec.len);
    for (int64_t t = 0; t < rec.len; ++t)
      for (int64_t k = 0; k < nl; ++k)
        ids[t].emplace_back(rec.engram_hash_ids.begin() + t * per_row + k * rec.engram_cols,
                            rec.engram_hash_ids.begin() + t * per_row + (k + 1) * rec.engram_cols);
    j["engram_hash_ids"] = ids;
  }
  std::ofstream f(dir / "debug.json");
  f << j.dump(1) << "\n";
  if (!f) Fail(ErrorKind::kInvalidArgument, "debug dump: cannot write {}", (dir / "debug.json").string());
}

}  // namespace deepinfer::v41
