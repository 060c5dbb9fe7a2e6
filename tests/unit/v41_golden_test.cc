// Golden tests of the DeepSeek-V4.1 forward pass against DeepSeek's official
// reference run on the tiny checkpoint (tests/data/golden-tiny-v41, copied
// from the shared golden vectors, variant fixed_index_k).
//
// Needs the tiny checkpoint: DEEPINFER_TINY_DIR names its directory (the
// output of `deepinfer make-tiny --arch deepseek_v41 DIR`, byte-identical to
// make_tiny_v41.py). Without it every test here is skipped.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/state.h"
#include "model/v41/model.h"

namespace deepinfer::v41 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kData = fs::path(DEEPINFER_TEST_DATA) / "golden-tiny-v41";

std::vector<float> ReadF32(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  f.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

const json& Golden() {
  static const json j = [] {
    std::ifstream f(kData / "golden.json");
    return json::parse(f);
  }();
  return j;
}

std::vector<int32_t> PromptIds(int k) { return Golden()["prompts"][k]["prompt"].get<std::vector<int32_t>>(); }

std::vector<int64_t> TopK(const float* v, int64_t n, int k) {
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  idx.resize(k);
  return idx;
}

int Overlap(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::set<int64_t> s(a.begin(), a.end());
  int n = 0;
  for (int64_t x : b) n += s.count(x);
  return n;
}

// One model for the whole test binary.
class V41Golden : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("DEEPINFER_TINY_DIR");
    if (!dir || !*dir) return;
    V41Options opt;
    opt.engram_token_map_file = kData / "engram_token_map.i32";
    model_ = V41Model::Load(dir, opt).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "DEEPINFER_TINY_DIR is not set: run `deepinfer make-tiny --arch deepseek_v41 DIR` "
                                 "and export DEEPINFER_TINY_DIR=DIR";
  }

  // A sequence with its own dense state.
  struct Seq {
    std::unique_ptr<DenseStateArena> arena;
    std::vector<int32_t> table;
    StateGeometry geo;
    SequenceStateView view;
  };
  static Seq NewSeq(int64_t max_tokens) {
    Seq s;
    s.geo = model_->geometry(16);
    const int64_t blocks = s.geo.BlocksForTokens(max_tokens);
    s.arena = std::make_unique<DenseStateArena>(s.geo, 1, blocks);
    for (int64_t b = 0; b < blocks; ++b) s.table.push_back(static_cast<int32_t>(blocks - 1 - b));  // scrambled
    s.view = s.arena->View(0, s.table.data(), blocks);
    return s;
  }
  // Runs tokens in chunks of `chunk` (0 = whole) and returns the last logits.
  static std::vector<float> Run(Seq& s, const std::vector<int32_t>& toks, int64_t start, int64_t chunk = 0,
                                bool per_row = false) {
    ForwardOutput out;
    int64_t pos = 0;
    const int64_t n = static_cast<int64_t>(toks.size());
    if (chunk <= 0) chunk = n;
    while (pos < n) {
      const int64_t len = std::min(chunk, n - pos);
      ForwardBatch b;
      ForwardSeq q;
      q.tokens = toks.data() + pos;
      q.len = len;
      q.start_pos = start + pos;
      q.state = s.view;
      q.logits = pos + len == n ? ForwardSeq::Logits::kLast : ForwardSeq::Logits::kNone;
      b.seqs.push_back(q);
      b.per_row_layout = per_row;
      model_->Forward(b, &out);
      pos += len;
    }
    return out.logits;
  }

  static V41Model* model_;
};
V41Model* V41Golden::model_ = nullptr;

// Prefill of all 10 prompts: last-position logits vs the reference's.
TEST_F(V41Golden, PrefillLastLogits) {
  const json& P = Golden()["prompts"];
  std::printf("prompt  len  max|d|      bit-identical  top1  margin   top20-overlap\n");
  for (size_t k = 0; k < P.size(); ++k) {
    const auto ids = PromptIds(static_cast<int>(k));
    Seq s = NewSeq(static_cast<int64_t>(ids.size()));
    const std::vector<float> got = Run(s, ids, 0);
    char name[64];
    std::snprintf(name, sizeof(name), "prompt%02zu_prefill_last.f32", k);
    const std::vector<float> want = ReadF32(kData / "prefill_last" / name);
    ASSERT_EQ(got.size(), want.size());
    float maxd = 0;
    for (size_t i = 0; i < got.size(); ++i) maxd = std::max(maxd, std::fabs(got[i] - want[i]));
    const bool bit = std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
    const auto tg = TopK(got.data(), got.size(), 20), tw = TopK(want.data(), want.size(), 20);
    const double margin = P[k]["prefill"]["margin_top1_top2"].get<double>();
    const int ov = Overlap(tg, tw);
    std::printf("%6zu %4zu  %-10.6g  %-13s  %-4s  %-7.3f  %d/20\n", k, ids.size(), maxd, bit ? "yes" : "no",
                tg[0] == tw[0] ? "eq" : "DIFF", margin, ov);
    if (margin >= 0.05) {
      EXPECT_EQ(tg[0], tw[0]) << "prompt " << k;
    }
    EXPECT_GE(ov, 18) << "prompt " << k;
    if (ids.size() <= 33) {
      EXPECT_LE(maxd, 0.05f) << "prompt " << k;
    }
  }
}

}  // namespace
}  // namespace deepinfer::v41

namespace deepinfer::v41 {
namespace {

// Elements of a and b that differ by more than `ulps` BF16 ulps (of the larger magnitude).
int64_t CountBeyondBf16Ulps(const std::vector<float>& a, const std::vector<float>& b, int ulps) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float m = std::max(std::fabs(a[i]), std::fabs(b[i]));
    const float ulp = m == 0 ? 0.0f : std::ldexp(1.0f, std::ilogb(m) - 7);
    if (std::fabs(a[i] - b[i]) > ulps * ulp) ++bad;
  }
  return bad;
}

// The 33-token debug prompt: per-layer output streams, the returned `pre`, the
// Engram outputs, router choices and indexer top-k lists against the
// reference's dumps (golden README: debug/*.f32 and the JSON `debug` section).
TEST_F(V41Golden, DebugPromptPerLayer) {
  const json& D = Golden()["debug"];
  const int k = D["prompt_index"].get<int>();
  const auto ids = PromptIds(k);
  Seq s = NewSeq(static_cast<int64_t>(ids.size()));
  DebugRecord rec;
  model_->SetDebug(&rec, 0);
  Run(s, ids, 0);
  model_->SetDebug(nullptr);
  ASSERT_EQ(rec.len, static_cast<int64_t>(ids.size()));
  const int n_layers = model_->config().n_layers;
  int64_t exact = 0, total = 0;
  for (int l = 0; l < n_layers; ++l) {
    const json& L = D["layers"][std::to_string(l)];
    auto check = [&](const std::string& file, const std::vector<float>& got, const char* what) {
      const std::vector<float> want = ReadF32(kData / "debug" / file);
      ASSERT_EQ(got.size(), want.size()) << what << " layer " << l;
      const int64_t beyond = CountBeyondBf16Ulps(got, want, 1);
      int64_t same = 0;
      for (size_t i = 0; i < got.size(); ++i) same += std::memcmp(&got[i], &want[i], 4) == 0;
      exact += same;
      total += static_cast<int64_t>(got.size());
      std::printf("layer %d %-12s: %6lld/%6zu bit-identical, %lld beyond 1 BF16 ulp\n", l, what,
                  static_cast<long long>(same), got.size(), static_cast<long long>(beyond));
      EXPECT_LE(beyond * 100, static_cast<int64_t>(got.size())) << what << " layer " << l << ": >1% beyond 1 ulp";
    };
    check("layer" + std::to_string(l) + "_out_streams.f32", rec.out_streams[l], "streams");
    if (L.contains("engram_out_streams"))
      check("layer" + std::to_string(l) + "_engram_out.f32", rec.engram_out[l], "engram");
    // The FFN `pre` the block returns is FP32: compare with a relative tolerance.
    const std::vector<float> want_pre = ReadF32(kData / "debug" / ("layer" + std::to_string(l) + "_out_pre_mix.f32"));
    ASSERT_EQ(rec.out_pre_mix[l].size(), want_pre.size());
    for (size_t i = 0; i < want_pre.size(); ++i)
      EXPECT_NEAR(rec.out_pre_mix[l][i], want_pre[i], 1e-5f * std::fabs(want_pre[i]) + 1e-7f) << "layer " << l;
    // Router: indices equal, weights to FP32 rounding.
    const auto ri = L["router_indices"].get<std::vector<std::vector<int32_t>>>();
    const auto rw = L["router_weights"].get<std::vector<std::vector<double>>>();
    for (size_t t = 0; t < ri.size(); ++t)
      for (size_t j = 0; j < ri[t].size(); ++j) {
        EXPECT_EQ(rec.router_indices[l][t * rec.topk + j], ri[t][j]) << "layer " << l << " token " << t;
        EXPECT_NEAR(rec.router_weights[l][t * rec.topk + j], rw[t][j], 1e-6 * std::fabs(rw[t][j]));
      }
    // Indexer top-k lists (reference convention: + prompt length, −1 absent).
    if (L.contains("indexer_topk")) {
      const auto want = L["indexer_topk"].get<std::vector<std::vector<int32_t>>>();
      ASSERT_TRUE(rec.indexer_topk.count(l)) << "layer " << l;
      const int kk = rec.indexer_k.at(l);
      for (size_t t = 0; t < want.size(); ++t) {
        std::vector<int32_t> got(rec.indexer_topk[l].begin() + t * kk, rec.indexer_topk[l].begin() + (t + 1) * kk);
        EXPECT_EQ(got, want[t]) << "indexer layer " << l << " token " << t;
      }
    }
  }
  std::printf("debug prompt: %lld/%lld stream/Engram elements bit-identical\n", static_cast<long long>(exact),
              static_cast<long long>(total));
  // Engram hash ids [T][layer][cols].
  const auto want_ids = D["engram_hash_ids"].get<std::vector<std::vector<std::vector<int64_t>>>>();
  ASSERT_EQ(static_cast<int64_t>(want_ids.size()), rec.len);
  for (size_t t = 0; t < want_ids.size(); ++t)
    for (size_t L = 0; L < want_ids[t].size(); ++L)
      for (size_t c = 0; c < want_ids[t][L].size(); ++c)
        EXPECT_EQ(rec.engram_hash_ids[(t * want_ids[t].size() + L) * rec.engram_cols + c], want_ids[t][L][c]);
}

// Decode: prefill the prompt, then feed the recorded `fed_token`s one per call.
// The reference's own decode path is reproduced bit for bit (top-5 ids and
// values of every step, prompts whose prefill is bit-identical). Against the
// teacher-forced prefill of the same tokens (golden README, finding 2) the
// engine must agree at least wherever the reference's decode agrees: the
// reference's prefill and decode paths differ by more than noise on this
// random model (its own decode misses the teacher-forced top-1 on 19 of the
// 142 steps with margin >= 0.05).
TEST_F(V41Golden, DecodeMatchesReference) {
  const json& P = Golden()["prompts"];
  int steps = 0, bit_ref = 0, checked = 0, top1_ok = 0, ref_top1_ok = 0, top5_ok = 0, ref_top5_ok = 0;
  for (size_t k = 0; k < P.size(); ++k) {
    const auto ids = PromptIds(static_cast<int>(k));
    const json& steps_k = P[k]["decode_steps"];
    Seq s = NewSeq(static_cast<int64_t>(ids.size() + steps_k.size()));
    const std::vector<float> pre = Run(s, ids, 0);
    const bool prefill_exact =
        std::memcmp(pre.data(), ReadF32(kData / "prefill_last" / fmt::format("prompt{:02}_prefill_last.f32", k)).data(),
                    pre.size() * 4) == 0;
    for (const json& st : steps_k) {
      const int32_t tok = st["fed_token"].get<int32_t>();
      const int64_t pos = st["start_pos"].get<int64_t>();
      const std::vector<float> got = Run(s, {tok}, pos);
      const auto g5 = TopK(got.data(), static_cast<int64_t>(got.size()), 5);
      const json& dec = st["decode"];
      const json& tf = st["teacher_forced"];
      ++steps;
      // Bit-exact with the reference's decode (when the prefill state is).
      const auto dec_ids = dec["top_ids"].get<std::vector<int64_t>>();
      const auto dec_vals = dec["top_vals"].get<std::vector<double>>();
      bool same = g5 == dec_ids;
      for (int i = 0; i < 5 && same; ++i) same = got[dec_ids[i]] == static_cast<float>(dec_vals[i]);
      bit_ref += same;
      if (prefill_exact) {
        EXPECT_TRUE(same) << "prompt " << k << " step " << st["step"] << ": not the reference's decode";
      }
      // Against teacher forcing: never worse than the reference's decode.
      const auto tf_ids = tf["top_ids"].get<std::vector<int64_t>>();
      const int ov = Overlap(g5, tf_ids), ref_ov = Overlap(dec_ids, tf_ids);
      top5_ok += ov >= 4;
      ref_top5_ok += ref_ov >= 4;
      if (ref_ov >= 4) {
        EXPECT_GE(ov, 4) << "prompt " << k << " step " << st["step"];
      }
      if (tf["margin_top1_top2"].get<double>() >= 0.05) {
        ++checked;
        const bool ok = g5[0] == tf["argmax"].get<int64_t>();
        const bool ref_ok = dec["argmax"].get<int64_t>() == tf["argmax"].get<int64_t>();
        top1_ok += ok;
        ref_top1_ok += ref_ok;
        if (ref_ok) {
          EXPECT_TRUE(ok) << "prompt " << k << " step " << st["step"];
        }
      }
    }
  }
  std::printf("decode: %d steps; bit-identical to the reference's decode on %d\n", steps, bit_ref);
  std::printf("vs teacher-forced: top-1 equal on %d/%d steps with margin >= 0.05 (reference's decode: %d); "
              "top-5 overlap >= 4 on %d/%d (reference's decode: %d)\n",
              top1_ok, checked, ref_top1_ok, top5_ok, steps, ref_top5_ok);
}

// Greedy continuation of `n` tokens after prefilling `prompt` in chunks of `chunk` (0 = whole).
std::vector<int64_t> Greedy(V41Golden::Seq& s, const std::vector<int32_t>& prompt, int64_t chunk, int n,
                            bool per_row) {
  std::vector<float> lg = V41Golden::Run(s, prompt, 0, chunk, per_row);
  std::vector<int64_t> out;
  int64_t pos = static_cast<int64_t>(prompt.size());
  for (int i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(TopK(lg.data(), static_cast<int64_t>(lg.size()), 1)[0]);
    out.push_back(t);
    if (i + 1 < n) lg = V41Golden::Run(s, {t}, pos++, 0, per_row);
  }
  return out;
}

// Chunked prefill (chunks of 1, 3, 16, 64) carries every state across calls.
// With the per-row layout (the serving engine's) every row is computed as the
// reference's one-token decode at its position, so chunked == whole bit for bit
// and the greedy tokens are the same. With the reference's own layout a call's
// top-k tie-breaking and list layout follow the call's shape (as the
// reference's do), so only agreement statistics are printed for it.
TEST_F(V41Golden, ChunkedPrefillSameGreedyTokens) {
  const json& P = Golden()["prompts"];
  constexpr int kNew = 4;
  int ref_same = 0, ref_total = 0;
  for (size_t k = 0; k < P.size(); ++k) {
    const auto ids = PromptIds(static_cast<int>(k));
    const int64_t n = static_cast<int64_t>(ids.size());
    Seq whole = NewSeq(n + kNew);
    const std::vector<float> whole_logits = Run(whole, ids, 0, 0, /*per_row=*/true);
    Seq whole2 = NewSeq(n + kNew);
    const auto want = Greedy(whole2, ids, 0, kNew, true);
    Seq whole_ref = NewSeq(n + kNew);
    const auto want_ref = Greedy(whole_ref, ids, 0, kNew, false);
    if (P[k]["prefill"]["margin_top1_top2"].get<double>() >= 0.05) {
      EXPECT_EQ(want_ref[0], P[k]["prefill"]["argmax"].get<int64_t>()) << "prompt " << k;
    }
    for (int64_t chunk : {1, 3, 16, 64}) {
      if (chunk >= n && chunk != 1) continue;
      Seq s = NewSeq(n + kNew);
      const std::vector<float> got = Run(s, ids, 0, chunk, /*per_row=*/true);
      EXPECT_EQ(0, std::memcmp(got.data(), whole_logits.data(), got.size() * 4)) << "prompt " << k << " chunk " << chunk;
      Seq s2 = NewSeq(n + kNew);
      EXPECT_EQ(Greedy(s2, ids, chunk, kNew, true), want) << "prompt " << k << " chunk " << chunk;
      Seq s3 = NewSeq(n + kNew);
      ref_same += Greedy(s3, ids, chunk, kNew, false) == want_ref;
      ++ref_total;
    }
  }
  std::printf("reference layout: chunked greedy tokens equal to whole-prompt prefill in %d/%d cases\n", ref_same,
              ref_total);
}

// A batch of 4 sequences at different lengths and positions gives each sequence
// bit-identical logits to running it alone: whole prefills together, then a
// mixed call (decode steps, a chunk, a new prompt).
TEST_F(V41Golden, BatchEqualsAlone) {
  for (bool per_row : {false, true}) {
  SCOPED_TRACE(per_row ? "per-row layout" : "reference layout");
  const std::vector<int> which = {2, 4, 5, 7};
  std::vector<std::vector<int32_t>> prompts;
  for (int k : which) prompts.push_back(PromptIds(k));
  const StateGeometry geo = model_->geometry(16);
  const int64_t per_seq = geo.BlocksForTokens(128);
  DenseStateArena arena(geo, 4, 4 * per_seq);
  std::vector<std::vector<int32_t>> tables(4);
  for (int s = 0; s < 4; ++s)
    for (int64_t b = 0; b < per_seq; ++b) tables[s].push_back(static_cast<int32_t>(b * 4 + (3 - s)));  // interleaved
  // Alone.
  std::vector<std::vector<float>> alone_prefill(4), alone_step(4);
  const std::vector<int32_t> extra = {1000, 2000, 3000, 4000, 5000};
  for (int s = 0; s < 4; ++s) {
    Seq q = NewSeq(128);
    alone_prefill[s] = Run(q, prompts[s], 0, 0, per_row);
    // second call: seq 0, 1 decode one token; seq 2 a 5-token chunk; seq 3 restarts with a new prompt.
    if (s < 2) alone_step[s] = Run(q, {extra[s]}, static_cast<int64_t>(prompts[s].size()), 0, per_row);
    else if (s == 2) alone_step[s] = Run(q, extra, static_cast<int64_t>(prompts[s].size()), 0, per_row);
    else {
      Seq fresh = NewSeq(128);
      alone_step[s] = Run(fresh, std::vector<int32_t>(prompts[0].begin(), prompts[0].end()), 0, 0, per_row);
    }
  }
  // Together.
  ForwardBatch b;
  b.per_row_layout = per_row;
  for (int s = 0; s < 4; ++s) {
    ForwardSeq q;
    q.tokens = prompts[s].data();
    q.len = static_cast<int64_t>(prompts[s].size());
    q.start_pos = 0;
    q.state = arena.View(s, tables[s].data(), per_seq);
    b.seqs.push_back(q);
  }
  ForwardOutput out;
  model_->Forward(b, &out);
  ASSERT_EQ(out.row_seq.size(), 4u);
  const int64_t V = out.vocab;
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(0, std::memcmp(out.logits.data() + s * V, alone_prefill[s].data(), V * 4)) << "prefill seq " << s;
  // Mixed second call, in a different order.
  arena.ResetSlot(3);
  ForwardBatch b2;
  b2.per_row_layout = per_row;
  auto add = [&](int s, const int32_t* t, int64_t len, int64_t start) {
    ForwardSeq q;
    q.tokens = t;
    q.len = len;
    q.start_pos = start;
    q.state = arena.View(s, tables[s].data(), per_seq);
    b2.seqs.push_back(q);
  };
  add(3, prompts[0].data(), static_cast<int64_t>(prompts[0].size()), 0);
  add(2, extra.data(), 5, static_cast<int64_t>(prompts[2].size()));
  add(1, &extra[1], 1, static_cast<int64_t>(prompts[1].size()));
  add(0, &extra[0], 1, static_cast<int64_t>(prompts[0].size()));
  model_->Forward(b2, &out);
  const int order[4] = {3, 2, 1, 0};
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(0, std::memcmp(out.logits.data() + i * V, alone_step[order[i]].data(), V * 4)) << "step seq " << order[i];
  }
}

// Bad input gets a one-line error naming the sequence, not a crash.
TEST_F(V41Golden, RejectsBadInput) {
  Seq s = NewSeq(16);
  ForwardOutput out;
  auto run = [&](std::vector<int32_t> toks, int64_t start) {
    ForwardBatch b;
    ForwardSeq q;
    q.tokens = toks.data();
    q.len = static_cast<int64_t>(toks.size());
    q.start_pos = start;
    q.state = s.view;
    b.seqs.push_back(q);
    model_->Forward(b, &out);
  };
  auto expect_error = [&](std::vector<int32_t> toks, int64_t start, const std::string& needle) {
    try {
      run(std::move(toks), start);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({5, -1}, 0, "token -1");
  expect_error({5, static_cast<int32_t>(model_->config().vocab_size)}, 0, "outside [0, 129280)");
  expect_error({}, 0, "empty chunk");
  expect_error({5}, -3, "negative start_pos");
  expect_error(std::vector<int32_t>(40, 7), 0, "block table");
}

}  // namespace
}  // namespace deepinfer::v41

namespace deepinfer::v41 {
namespace {

// The debug switch writes the golden dump layout: per-layer streams, `pre`,
// Engram outputs as float32 files and the router/indexer/hash JSON.
TEST_F(V41Golden, DebugDumpSwitchWritesGoldenLayout) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("v41_dump_{}", ::getpid());
  fs::remove_all(dir);
  V41Options opt;
  opt.engram_token_map_file = kData / "engram_token_map.i32";
  opt.debug_dump_dir = dir;
  auto m = V41Model::Load(std::getenv("DEEPINFER_TINY_DIR"), opt);
  const json& D = Golden()["debug"];
  const auto ids = PromptIds(D["prompt_index"].get<int>());
  const StateGeometry geo = m->geometry(16);
  const int64_t blocks = geo.BlocksForTokens(static_cast<int64_t>(ids.size()));
  DenseStateArena arena(geo, 1, blocks);
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  ForwardBatch batch;
  ForwardSeq q;
  q.tokens = ids.data();
  q.len = static_cast<int64_t>(ids.size());
  q.state = arena.View(0, table.data(), blocks);
  batch.seqs.push_back(q);
  ForwardOutput out;
  m->Forward(batch, &out);
  const fs::path call = dir / "call00000";
  for (const auto& e : fs::directory_iterator(kData / "debug")) {
    const std::vector<float> want = ReadF32(e.path());
    const std::vector<float> got = ReadF32(call / e.path().filename());
    ASSERT_EQ(got.size(), want.size()) << e.path().filename();
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << e.path().filename();
  }
  std::ifstream f(call / "debug.json");
  const json j = json::parse(f);
  for (const auto& [l, L] : D["layers"].items()) {
    EXPECT_EQ(j["layers"][l]["router_indices"], L["router_indices"]) << "layer " << l;
    if (L.contains("indexer_topk")) {
      EXPECT_EQ(j["layers"][l]["indexer_topk"], L["indexer_topk"]) << "layer " << l;
    }
  }
  EXPECT_EQ(j["engram_hash_ids"], D["engram_hash_ids"]);
  fs::remove_all(dir);
}

// The fast CPU kernels (weights repacked at load, the default) and the scalar
// reference operators (V41Options::reference_kernels) give the same bits:
// every position's logits of the longest golden prompt, whole-prompt prefill
// (M = 300 rows per linear) and then one-token decode steps (M = 1).
TEST_F(V41Golden, FastKernelsEqualReferenceKernels) {
  V41Options opt;
  opt.engram_token_map_file = kData / "engram_token_map.i32";
  opt.reference_kernels = true;
  auto ref_model = V41Model::Load(std::getenv("DEEPINFER_TINY_DIR"), opt);
  const json& P = Golden()["prompts"];
  int longest = 0;
  for (int i = 0; i < static_cast<int>(P.size()); ++i)
    if (PromptIds(i).size() > PromptIds(longest).size()) longest = i;
  const std::vector<int32_t> ids = PromptIds(longest);
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t steps = 4;
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> toks = ids;
  for (V41Model* m : {model_, ref_model.get()}) {
    const StateGeometry geo = m->geometry(16);
    const int64_t blocks = geo.BlocksForTokens(n + steps);
    DenseStateArena arena(geo, 1, blocks);
    std::vector<int32_t> table(blocks);
    for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
    std::vector<float> all;
    for (int64_t step = 0; step <= steps; ++step) {
      ForwardBatch batch;
      ForwardSeq q;
      q.tokens = step == 0 ? toks.data() : toks.data() + n + step - 1;
      q.len = step == 0 ? n : 1;
      q.start_pos = step == 0 ? 0 : n + step - 1;
      q.state = arena.View(0, table.data(), blocks);
      q.logits = ForwardSeq::Logits::kAll;
      batch.seqs.push_back(q);
      ForwardOutput out;
      m->Forward(batch, &out);
      ASSERT_EQ(static_cast<int64_t>(out.logits.size()), q.len * out.vocab);
      all.insert(all.end(), out.logits.begin(), out.logits.end());
      // Greedy next tokens come from the fast model's run; the reference run reuses them.
      if (m == model_) {
        const float* last = out.logits.data() + (q.len - 1) * out.vocab;
        toks.push_back(static_cast<int32_t>(std::max_element(last, last + out.vocab) - last));
      }
    }
    logits.push_back(std::move(all));
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  int64_t differ = 0;
  for (size_t i = 0; i < logits[0].size(); ++i)
    differ += std::memcmp(&logits[0][i], &logits[1][i], 4) != 0;
  EXPECT_EQ(differ, 0) << "of " << logits[0].size() << " logits";
}

// Every position's logits of the longest golden prompt (whole-prompt
// prefill) and then `steps` greedy one-token decode steps (tokens chosen by
// this run), concatenated.
std::vector<float> LongestPromptLogits(V41Model* m, int64_t steps) {
  const json& P = Golden()["prompts"];
  int longest = 0;
  for (int i = 0; i < static_cast<int>(P.size()); ++i)
    if (PromptIds(i).size() > PromptIds(longest).size()) longest = i;
  std::vector<int32_t> toks = PromptIds(longest);
  const int64_t n = static_cast<int64_t>(toks.size());
  const StateGeometry geo = m->geometry(16);
  const int64_t blocks = geo.BlocksForTokens(n + steps);
  DenseStateArena arena(geo, 1, blocks);
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  std::vector<float> all;
  for (int64_t step = 0; step <= steps; ++step) {
    ForwardBatch batch;
    ForwardSeq q;
    q.tokens = step == 0 ? toks.data() : toks.data() + n + step - 1;
    q.len = step == 0 ? n : 1;
    q.start_pos = step == 0 ? 0 : n + step - 1;
    q.state = arena.View(0, table.data(), blocks);
    q.logits = ForwardSeq::Logits::kAll;
    batch.seqs.push_back(q);
    ForwardOutput out;
    m->Forward(batch, &out);
    const float* last = out.logits.data() + (q.len - 1) * out.vocab;
    toks.push_back(static_cast<int32_t>(std::max_element(last, last + out.vocab) - last));
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  return all;
}

// The same bits on every SIMD target this CPU runs (AVX-512, AVX2, the
// portable fallback; cpu::ForceTarget, as `--target`) and for 1, 2 and 3
// threads: every logit of a 300-token prefill and 3 decode steps.
TEST_F(V41Golden, SameBitsOnEveryTargetAndThreadCount) {
  const int threads0 = NumThreads();
  std::vector<float> want;
  std::string want_name;
  int runs = 0;
  const std::vector<int64_t> targets = cpu::AvailableTargets();  // before any ForceTarget
  for (int64_t t : targets) {
    cpu::ForceTarget(t);
    for (int threads : {1, 2, 3}) {
      // Thread counts 1, 2, 3 on the best target; 1 and 3 on the next; the
      // (slow) fallback once.
      if (t != targets.front() && threads == 2 && t != targets.back()) continue;
      if (t == targets.back() && targets.size() > 1 && threads != 2) continue;
      SetNumThreads(threads);
      const std::string name = cpu::TargetName(t) + "/" + std::to_string(threads) + " threads";
      std::vector<float> got = LongestPromptLogits(model_, 3);
      ++runs;
      if (want.empty()) {
        want = std::move(got);
        want_name = name;
        continue;
      }
      ASSERT_EQ(got.size(), want.size()) << name;
      int64_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
      EXPECT_EQ(differ, 0) << name << " vs " << want_name << ": of " << got.size() << " logits";
    }
  }
  cpu::ForceTarget(0);
  SetNumThreads(threads0);
  EXPECT_GE(runs, targets.size() > 1 ? 4 : 3);  // a SIMD target at three thread counts + the fallback
}

// A prefill long enough that the per-row loops run over the team (the
// window K copy, the compressor's rows, the MoE's final sum: from 2^16
// values, > 512 rows here), then 3 greedy decode steps that read every
// compressed row and index key it wrote: the last prefill position's logits
// and each step's, at 1 and 3 threads and in one call against chunks of 200
// rows (those loops serial), the same bits.
TEST_F(V41Golden, LongPrefillSameBitsOnTeamAndSerialPaths) {
  const int threads0 = NumThreads();
  std::vector<int32_t> prompt;
  for (int i = 0; prompt.size() < 1100; i = (i + 1) % static_cast<int>(Golden()["prompts"].size())) {
    const auto ids = PromptIds(i);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  prompt.resize(1100);
  constexpr int kSteps = 3;
  auto run = [&](int64_t chunk) {
    std::vector<int32_t> toks = prompt;
    const int64_t n = static_cast<int64_t>(toks.size());
    Seq s = NewSeq(n + kSteps);
    std::vector<float> logits;
    auto forward = [&](int64_t pos, int64_t len, bool last) {
      ForwardBatch b;
      ForwardSeq q;
      q.tokens = toks.data() + pos;
      q.len = len;
      q.start_pos = pos;
      q.state = s.view;
      q.logits = last ? ForwardSeq::Logits::kLast : ForwardSeq::Logits::kNone;
      b.seqs.push_back(q);
      b.per_row_layout = true;  // chunked == whole bit for bit (ChunkedPrefillSameGreedyTokens)
      ForwardOutput out;
      model_->Forward(b, &out);
      if (!last) return;
      logits.insert(logits.end(), out.logits.begin(), out.logits.end());
      toks.push_back(static_cast<int32_t>(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin()));
    };
    for (int64_t pos = 0; pos < n; pos += chunk) forward(pos, std::min(chunk, n - pos), pos + chunk >= n);
    for (int step = 0; step < kSteps; ++step) forward(n + step, 1, true);
    return logits;
  };
  SetNumThreads(1);
  const std::vector<float> want = run(1100);
  SetNumThreads(3);
  const std::vector<float> team = run(1100);
  const std::vector<float> chunked = run(200);
  SetNumThreads(threads0);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps + 1) * model_->config().vocab_size);
  ASSERT_EQ(team.size(), want.size());
  ASSERT_EQ(chunked.size(), want.size());
  EXPECT_EQ(std::memcmp(team.data(), want.data(), want.size() * 4), 0) << "3 threads vs 1";
  EXPECT_EQ(std::memcmp(chunked.data(), want.data(), want.size() * 4), 0) << "chunks of 200 vs one call";
}

}  // namespace
}  // namespace deepinfer::v41
