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
// This file: loading, Forward and its checks, the step layout (ForwardPass::Run:
// rows, Engram hash ids, embedding, the layer loop), the DSpark main_hidden
// capture, the final collapse / norm / FP32 head (model-spec §3.3.1) and the
// debug dump. The layers are in block.cc (Engram, mHC), attention.cc
// (attention, compressor, indexer) and moe.cc (MoE); ForwardPass is declared
// in forward_pass.h.
#include "model/v41/model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/parallel.h"
#include "base/region_timer.h"
#include "format/numerics.h"
#include "kernels/ref/ref_ops.h"
#include "model/v41/engram.h"
#include "model/v41/forward_pass.h"
#include "model/v41/kernels.h"
#include "model/v41/weights.h"
#include "model/v41/workspace.h"

namespace deepinfer::v41 {

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
  if (!options.reference_kernels) {
    m->weight_bytes_.packed = static_cast<int64_t>(m->w_->PackForCpu());
    m->weight_bytes_.wo_a_decode = m->w_->wo_a_decode_bytes;
  }
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
  // Every element of every row is written below (rows over the team).
  X_.resize(static_cast<size_t>(R_ * hc * d));
  ParallelFor(R_, R_ * hc * d > (int64_t{1} << 16), [&](int64_t r) {
    const int s = row_seq_[r];
    const int32_t tok = b_.seqs[s].tokens[row_in_seq_[r]];
    const uint16_t* e = w_.embed.data + static_cast<int64_t>(tok) * d;
    if (row_image_[r]) {  // image span: the vision embeddings replace the lookup (§3.3.7)
      const float* v = b_.seqs[s].embeds + row_in_seq_[r] * d;
      for (int j = 0; j < hc; ++j) std::memcpy(&X_[(r * hc + j) * d], v, d * sizeof(float));
      return;
    }
    for (int j = 0; j < hc; ++j)
      for (int64_t i = 0; i < d; ++i) X_[(r * hc + j) * d + i] = Bf16ToFloat(e[i]);
  });
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
