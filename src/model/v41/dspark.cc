// The DSpark drafter (dspark.h; model-spec §3.3.6). The steps read like the
// reference's forward_spec: forward_embed (main_x, the draft block's
// embedding), the DSpark blocks (Block.forward with DSparkAttention), then
// forward_head (head, Markov head, confidence head).
#include "model/v41/dspark.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "base/error.h"
#include "format/numerics.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "model/v41/kernels.h"
#include "model/v41/weights.h"
#include "model/v41/workspace.h"
#include "parallel/expert_parallel.h"

namespace deepinfer::v41 {

// The drafter's step plan, as v41/workspace.h is the main model's: every
// buffer of Run is kept between calls and refilled with Zeroed() (which keeps
// its capacity), so a draft step of a batch shape already seen makes no heap
// allocation (v41_step_plan_test counts them). A buffer's old contents never
// reach a result: each use starts from Zeroed() or is fully overwritten.
struct DsparkWorkspace {
  explicit DsparkWorkspace(const ModelConfig& c)
      : rope(c.rope_head_dim, c.rope_theta, 0, 1.0, c.beta_fast, c.beta_slow) {}  // sliding-window blocks
  ref::RopeTable rope;
  // Run: seeding and the head.
  std::vector<int> drafting;
  std::vector<float> hidden, main_x, kv, X, pre, y, h, logits, e, bias, cat;
  // DraftPass: per-row vector-path counts, the block's mHC and activations.
  std::vector<int32_t> sig_vec, soft_vec;
  std::vector<float> pre_a, post_a, comb_a, pre_f, post_f, comb_f, x, v, X2;
  // DraftPass::Attention.
  std::vector<float> qr, q, akv, o, z;
  std::vector<uint16_t> kvb, ring;
  std::vector<const uint16_t*> rows;
  std::vector<int32_t> slots;
  // DraftPass::Moe.
  std::vector<int32_t> idx;
  std::vector<float> wts, moe_y, moe_sh;
  std::vector<const float*> moe_bias;
  int64_t moe_reserved_rows = 0;  // the experts' per-thread scratch holds this many rows
  int moe_reserved_threads = 0;   // ... on a team of this many threads
};

namespace {

// One DSpark block on the draft rows (Block.forward with DSparkAttention).
class DraftPass {
 public:
  DraftPass(const ModelConfig& c, const ModelWeights& w, DsparkWorkspace& ws, const std::vector<DsparkSeq>& seqs,
            const std::vector<int>& drafting)
      : c_(c), w_(w), ws_(ws), rope_(ws.rope), seqs_(seqs), drafting_(drafting) {
    const int bs = c_.dspark_block_size;
    M_ = static_cast<int64_t>(drafting_.size()) * bs;
    ws_.sig_vec.clear();
    ws_.soft_vec.clear();
    for (int64_t r = 0; r < M_; ++r) {
      ws_.sig_vec.push_back(ref::VectorPathCount(r % bs, bs, c_.hc_mult, 16));
      ws_.soft_vec.push_back(ref::VectorPathCount(r % bs, bs, c_.dspark_n_routed_experts, 16));
    }
  }
  int64_t rows() const { return M_; }
  // Absolute position of draft row r: p + 1 + j for block token j.
  int64_t Pos(int64_t r) const {
    const DsparkSeq& q = seqs_[drafting_[r / c_.dspark_block_size]];
    return q.start_pos + q.n + r % c_.dspark_block_size;
  }
  const SequenceStateView& St(int64_t r) const { return seqs_[drafting_[r / c_.dspark_block_size]].state; }

  // X [M, hc, d] and pre [M, hc] in/out (the block's FFN `pre` on return).
  void Block(int b, std::vector<float>* X, std::vector<float>* pre) {
    const LayerWeights& L = w_.dspark.blocks[b];
    const int hc = c_.hc_mult;
    const int64_t d = c_.dim, n = M_;
    std::vector<float>& pre_a = Zeroed(ws_.pre_a, n * hc);
    std::vector<float>& post_a = Zeroed(ws_.post_a, n * hc);
    std::vector<float>& comb_a = Zeroed(ws_.comb_a, n * hc * hc);
    std::vector<float>& pre_f = Zeroed(ws_.pre_f, n * hc);
    std::vector<float>& post_f = Zeroed(ws_.post_f, n * hc);
    std::vector<float>& comb_f = Zeroed(ws_.comb_f, n * hc * hc);
    std::vector<float>& x = Zeroed(ws_.x, n * d);
    std::vector<float>& v = Zeroed(ws_.v, n * d);
    std::vector<float>& X2 = Zeroed(ws_.X2, static_cast<int64_t>(X->size()));
    HcMixes(X->data(), n, hc, d, L.hc_attn_fn, L.hc_attn_base.data(), L.hc_attn_scale.data(), c_.norm_eps,
            c_.hc_sinkhorn_iters, c_.hc_eps, ws_.sig_vec.data(), pre_a.data(), post_a.data(), comb_a.data());
    HcCollapse(w_.packed_for_cpu, X->data(), pre->data(), n, hc, d, x.data());
    ref::RmsNorm(x.data(), n, d, L.attn_norm.data, c_.norm_eps, x.data());
    Attention(b, x.data(), v.data());
    HcExpand(w_.packed_for_cpu, v.data(), X->data(), post_a.data(), comb_a.data(), n, hc, d, X2.data());
    HcMixes(X2.data(), n, hc, d, L.hc_ffn_fn, L.hc_ffn_base.data(), L.hc_ffn_scale.data(), c_.norm_eps,
            c_.hc_sinkhorn_iters, c_.hc_eps, ws_.sig_vec.data(), pre_f.data(), post_f.data(), comb_f.data());
    HcCollapse(w_.packed_for_cpu, X2.data(), pre_a.data(), n, hc, d, x.data());
    ref::RmsNorm(x.data(), n, d, L.ffn_norm.data, c_.norm_eps, x.data());
    Moe(b, x.data(), v.data());
    HcExpand(w_.packed_for_cpu, v.data(), X2.data(), post_f.data(), comb_f.data(), n, hc, d, X->data());
    pre->swap(pre_f);  // both the workspace's: the buffers trade places
  }

 private:
  // DSparkAttention.forward (decode): q and K of the block tokens at p+1 ..
  // p+bs; each query attends to ring slots 0 .. min(window, p+1)−1 (slot
  // order) and then to every block token.
  void Attention(int b, const float* x, float* v) {
    const AttentionWeights& A = w_.dspark.blocks[b].attn;
    const int64_t n = M_, H = c_.n_heads, D = c_.head_dim, rd = c_.rope_head_dim, qr_dim = c_.q_lora_rank;
    const int64_t win = c_.window_size, d = c_.dim;
    const int bs = c_.dspark_block_size, ab = c_.act_block_size;
    std::vector<float>& qr = Zeroed(ws_.qr, n * qr_dim);
    std::vector<float>& q = Zeroed(ws_.q, n * H * D);
    std::vector<float>& kv = Zeroed(ws_.akv, n * D);
    Linear(x, n, A.wq_a, ab, qr.data());
    ref::RmsNorm(qr.data(), n, qr_dim, A.q_norm.data, c_.norm_eps, qr.data());
    Linear(qr.data(), n, A.wq_b, ab, q.data());
    Linear(x, n, A.wkv, ab, kv.data());
    ref::RmsNorm(kv.data(), n, D, A.kv_norm.data, c_.norm_eps, kv.data());
    std::vector<uint16_t>& kvb = Zeroed(ws_.kvb, n * D);
    for (int64_t r = 0; r < n; ++r) {
      rope_.ApplyHeads(q.data() + r * H * D + D - rd, H, D, Pos(r), false);
      rope_.Apply(kv.data() + r * D + D - rd, Pos(r), false);
      Fp8Qdq(w_.packed_for_cpu, kv.data() + r * D, D, 32, w_.fp8_format);
      for (int64_t i = 0; i < D; ++i) kvb[r * D + i] = FloatToBf16(kv[r * D + i]);
    }
    const int region = St(0).geometry->of(StateKind::kWindow).RegionOf(c_.n_layers + b);
    std::vector<float>& o = Zeroed(ws_.o, n * H * D);
    const float scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
    std::vector<uint16_t>& ring = Zeroed(ws_.ring, win * D);
    std::vector<const uint16_t*>& rows = ws_.rows;
    std::vector<int32_t>& slots = ws_.slots;
    ReserveInSteps(rows, win + bs, 1);
    ReserveInSteps(slots, win + bs, 1);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t r0 = r - r % bs;  // the block's first row
      const int64_t p = Pos(r0) - 1;  // the last main position
      const int64_t m = std::min<int64_t>(win, p + 1);
      rows.clear();
      slots.clear();
      for (int64_t s = 0; s < m; ++s) {
        std::memcpy(ring.data() + s * D, St(r).Row(StateKind::kWindow, region, s), D * 2);
        rows.push_back(ring.data() + s * D);
        slots.push_back(static_cast<int32_t>(s));
      }
      for (int j = 0; j < bs; ++j) {
        rows.push_back(kvb.data() + (r0 + j) * D);
        slots.push_back(static_cast<int32_t>(m + j));
      }
      float* orow = o.data() + r * H * D;
      (w_.packed_for_cpu ? cpu::SparseAttention : ref::SparseAttention)(
          q.data() + r * H * D, static_cast<int>(H), D, rows.data(), slots.data(), static_cast<int>(rows.size()),
          static_cast<int32_t>(m + bs), A.attn_sink.data(), scale, orow);
      rope_.ApplyHeads(orow + D - rd, H, D, Pos(r), true);
    }
    std::vector<float>& z = Zeroed(ws_.z, n * c_.o_groups * c_.o_lora_rank);
    GroupedLinearBf16(o.data(), n, c_.o_groups, A.wo_a, z.data());
    Linear(z.data(), n, A.wo_b, ab, v);
    (void)d;
  }

  // MoE.forward with the DSpark expert counts: routed experts in increasing
  // id, FP32 combine, plus the shared expert, BF16.
  void Moe(int b, const float* x, float* v) {
    const MoeWeights& F = w_.dspark.blocks[b].ffn;
    const int64_t n = M_, d = c_.dim, I = c_.moe_inter_dim;
    const int k = c_.dspark_n_activated_experts, ab = c_.act_block_size;
    const float lim = c_.swiglu_limit;
    std::vector<int32_t>& idx = Zeroed(ws_.idx, n * k);
    std::vector<float>& wts = Zeroed(ws_.wts, n * k);
    std::vector<const float*>& bias = ws_.moe_bias;
    bias.assign(static_cast<size_t>(n), F.bias.data());  // drafts are text: no VL bias
    Router(x, n, F.gate, bias.data(), k, c_.gate_temp, c_.norm_topk_prob, c_.route_scale, ws_.soft_vec.data(),
           idx.data(), wts.data());
    // Every thread's expert scratch for the most rows one expert can get (all
    // n), made once per new largest n or larger team (as ForwardPass::Moe).
    ReserveExpertScratch(n, d, I, &ws_.moe_reserved_rows, &ws_.moe_reserved_threads);
    std::vector<float>& y = Zeroed(ws_.moe_y, n * d);
    std::vector<float>& sh = Zeroed(ws_.moe_sh, n * d);
    const auto routed = [&](int e, const float* xin, int64_t m, const float* rw, float* out) {
      const ExpertWeights& ew = F.experts[e];
      ExpertSwiGlu(xin, m, ew.w1, ew.w3, ew.w13.get(), ew.w2, I, ab, lim, rw, out);
    };
    // std::ref: the std::function holds a reference, no heap copy of the closure.
    RoutedExperts(nullptr, EpExchange::kReplicated, ExpertShard{c_.dspark_n_routed_experts, 1, 0}, x, n, d,
                  idx.data(), wts.data(), k, std::ref(routed), y.data());
    ExpertSwiGlu(x, n, F.shared_w1, F.shared_w3, F.shared_w13.get(), F.shared_w2, I, ab, lim, nullptr, sh.data());
    for (int64_t i = 0; i < n * d; ++i) v[i] = RoundBf16(y[i] + sh[i]);
  }

  const ModelConfig& c_;
  const ModelWeights& w_;
  DsparkWorkspace& ws_;
  const ref::RopeTable& rope_;
  const std::vector<DsparkSeq>& seqs_;
  const std::vector<int>& drafting_;
  int64_t M_ = 0;
};

}  // namespace

Dspark::Dspark(V41Model& model) : m_(model) {
  if ((m_.comm_ && m_.comm_->size() > 1) || (m_.cp_comm_ && m_.cp_comm_->size() > 1))
    Fail(ErrorKind::kInvalidArgument, "the DSpark drafter runs in one process only (not with --ep or --cp)");
  m_.w_->BindDspark(*m_.store_, m_.cfg_);
  ws_ = std::make_unique<DsparkWorkspace>(m_.cfg_);
}

Dspark::~Dspark() = default;

int Dspark::block_size() const { return m_.cfg_.dspark_block_size; }
int64_t Dspark::hidden_width() const {
  return static_cast<int64_t>(m_.cfg_.dspark_target_layer_ids.size()) * m_.cfg_.dim;
}

void Dspark::Run(const std::vector<DsparkSeq>& seqs, bool want_logits, std::vector<DsparkDraft>* out) {
  const ModelConfig& c = m_.cfg_;
  const ModelWeights& w = *m_.w_;
  const int hc = c.hc_mult, bs = c.dspark_block_size;
  const int64_t d = c.dim, D = c.head_dim, rd = c.rope_head_dim, win = c.window_size, V = c.vocab_size;
  const int64_t width = hidden_width();
  DsparkWorkspace& ws = *ws_;
  std::vector<int>& drafting = ws.drafting;
  drafting.clear();
  int64_t N = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const DsparkSeq& q = seqs[s];
    if (q.n < 1 || q.start_pos < 0 || q.main_hidden == nullptr)
      Fail(ErrorKind::kInvalidArgument, "DSpark: sequence {}: {} rows at start_pos {}{}", s, q.n, q.start_pos,
           q.main_hidden ? "" : " without main_hidden");
    if (q.state.geometry == nullptr || q.state.pools == nullptr ||
        q.state.geometry->of(StateKind::kWindow).RegionOf(c.n_layers + c.n_mtp_layers - 1) < 0)
      Fail(ErrorKind::kInvalidArgument,
           "DSpark: sequence {}: the state geometry has no DSpark rings (V41Model::geometry(.., dspark_rings))", s);
    if (q.input_token >= V)
      Fail(ErrorKind::kInvalidArgument, "DSpark: sequence {}: input token {} outside [0, {})", s, q.input_token, V);
    if (q.input_token >= 0) drafting.push_back(static_cast<int>(s));
    N += q.n;
  }
  // Emptied entries keep their capacity (a steady-state step allocates nothing).
  out->resize(seqs.size());
  for (DsparkDraft& dr : *out) {
    dr.ids.clear();
    dr.logits.clear();
    dr.confidence.clear();
  }
  const ref::RopeTable& rope = ws.rope;

  // forward_embed: main_x = main_norm(main_proj(main_hidden)).
  std::vector<float>& hidden = Zeroed(ws.hidden, N * width);
  std::vector<float>& main_x = Zeroed(ws.main_x, N * d);
  {
    int64_t r = 0;
    for (const DsparkSeq& q : seqs) {
      std::memcpy(hidden.data() + r * width, q.main_hidden, static_cast<size_t>(q.n * width) * sizeof(float));
      r += q.n;
    }
  }
  Linear(hidden.data(), N, w.dspark.main_proj, c.act_block_size, main_x.data());
  ref::RmsNorm(main_x.data(), N, d, w.dspark.main_norm.data, c.norm_eps, main_x.data());

  // Every block seeds its ring with the K of main_x at the given positions.
  std::vector<float>& kv = Zeroed(ws.kv, N * D);
  for (int b = 0; b < c.n_mtp_layers; ++b) {
    const AttentionWeights& A = w.dspark.blocks[b].attn;
    Linear(main_x.data(), N, A.wkv, c.act_block_size, kv.data());
    ref::RmsNorm(kv.data(), N, D, A.kv_norm.data, c.norm_eps, kv.data());
    int64_t r = 0;
    for (const DsparkSeq& q : seqs) {
      const int region = q.state.geometry->of(StateKind::kWindow).RegionOf(c.n_layers + b);
      for (int64_t i = 0; i < q.n; ++i, ++r) {
        if (i < q.n - win) continue;  // overwritten later in this call
        float* k = kv.data() + r * D;
        rope.Apply(k + D - rd, q.start_pos + i, false);
        Fp8Qdq(w.packed_for_cpu, k, D, 32, w.fp8_format);
        uint8_t* dst = q.state.Row(StateKind::kWindow, region, (q.start_pos + i) % win);
        for (int64_t t = 0; t < D; ++t) {
          const uint16_t bits = FloatToBf16(k[t]);
          std::memcpy(dst + t * 2, &bits, 2);
        }
      }
    }
  }
  if (drafting.empty()) return;

  // The draft block: [input token, noise × (bs−1)], hc identical streams, identity pre.
  DraftPass pass(c, w, ws, seqs, drafting);
  const int64_t M = pass.rows();
  std::vector<float>& X = Zeroed(ws.X, M * hc * d);
  std::vector<float>& pre = Zeroed(ws.pre, M * hc);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t tok = r % bs == 0 ? seqs[drafting[r / bs]].input_token : c.dspark_noise_token_id;
    const uint16_t* e = w.embed.data + tok * d;
    for (int j = 0; j < hc; ++j)
      for (int64_t i = 0; i < d; ++i) X[(r * hc + j) * d + i] = Bf16ToFloat(e[i]);
    pre[r * hc] = 1.0f;
  }
  for (int b = 0; b < c.n_mtp_layers; ++b) pass.Block(b, &X, &pre);

  // forward_head: logits of the bs positions, then the Markov head in order.
  std::vector<float>& y = Zeroed(ws.y, M * d);
  std::vector<float>& h = Zeroed(ws.h, M * d);
  std::vector<float>& logits = Zeroed(ws.logits, M * V);
  HcCollapse(w.packed_for_cpu, X.data(), pre.data(), M, hc, d, y.data());
  ref::RmsNorm(y.data(), M, d, w.dspark.norm.data, c.norm_eps, h.data());
  LinearF32Bf16W(h.data(), M, w.head, logits.data());
  const int64_t R = c.dspark_markov_rank;
  std::vector<float>& e = Zeroed(ws.e, R);
  std::vector<float>& bias = Zeroed(ws.bias, V);
  std::vector<float>& cat = Zeroed(ws.cat, d + R);
  for (size_t k = 0; k < drafting.size(); ++k) {
    DsparkDraft& dr = (*out)[static_cast<size_t>(drafting[k])];
    int32_t prev = seqs[drafting[k]].input_token;
    for (int i = 0; i < bs; ++i) {
      const int64_t r = static_cast<int64_t>(k) * bs + i;
      const uint16_t* er = w.dspark.markov_embed.data + static_cast<int64_t>(prev) * R;
      for (int64_t t = 0; t < R; ++t) e[t] = Bf16ToFloat(er[t]);
      LinearF32Bf16W(e.data(), 1, w.dspark.markov_head, bias.data());
      float* lg = logits.data() + r * V;
      for (int64_t t = 0; t < V; ++t) lg[t] += bias[t];
      int64_t best = 0;
      for (int64_t t = 1; t < V; ++t)
        if (lg[t] > lg[best]) best = t;
      dr.ids.push_back(static_cast<int32_t>(best));
      prev = static_cast<int32_t>(best);
      std::memcpy(cat.data(), y.data() + r * d, d * sizeof(float));
      std::memcpy(cat.data() + d, e.data(), R * sizeof(float));
      float conf = 0.0f;
      LinearF32Bf16W(cat.data(), 1, w.dspark.confidence_proj, &conf);
      dr.confidence.push_back(conf);
    }
    if (want_logits)
      dr.logits.assign(logits.begin() + static_cast<int64_t>(k) * bs * V,
                       logits.begin() + static_cast<int64_t>(k + 1) * bs * V);
  }
}

}  // namespace deepinfer::v41
