// ModelConfig: config.json reading (explicit keys only) and the layer schedule.
// See config.h for the key mapping and model-spec §1.1, §1.3, §1.4, §3.3.4.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace deepinfer {

using json = nlohmann::json;

const char* ArchName(Arch a) {
  switch (a) {
    case Arch::kDeepseekV4: return "deepseek_v4";
    case Arch::kDeepseekV41: return "deepseek_v41";
  }
  return "?";
}

const char* CsaModeName(CsaMode m) {
  switch (m) {
    case CsaMode::kSwa: return "SWA";
    case CsaMode::kFull: return "Full";
    case CsaMode::kReuse: return "Reuse";
    case CsaMode::kReindex: return "Reindex";
    case CsaMode::kC4: return "C4";
    case CsaMode::kC128: return "C128";
  }
  return "?";
}

namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out;
}

// "an integer 5", "a string \"x\"", "an array", ... for "found ..." parts.
std::string Found(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::boolean: return std::string("a boolean ") + (v.get<bool>() ? "true" : "false");
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer " + v.dump();
    case json::value_t::number_float: return "a number " + v.dump();
    case json::value_t::string: {
      std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
      if (s.size() > 64) s = s.substr(0, 60) + "...\"";
      return "a string " + Printable(s);
    }
    default: return "an unsupported value";
  }
}

// Reads typed values from one JSON object; every message names the source
// file and the key path (e.g. "config.json: text_config.hidden_size: ...").
class Reader {
 public:
  Reader(const json& j, const std::string& src, std::string prefix)
      : j_(j), src_(src), prefix_(std::move(prefix)) {}

  std::string Path(std::string_view key) const { return prefix_ + std::string(key); }
  const std::string& src() const { return src_; }
  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  bool Has(const char* key) const { return Find(key) != nullptr; }
  const json& Need(const char* key) const {
    const json* v = Find(key);
    if (!v) Fail(ErrorKind::kNotFound, "{}: missing required key {}", src_, Path(key));
    return *v;
  }
  [[noreturn]] void Bad(const char* key, std::string_view expected, const json& found) const {
    Fail(ErrorKind::kCorruptData, "{}: {}: expected {}, found {}", src_, Path(key), expected,
         Found(found));
  }
  [[noreturn]] void BadValue(std::string_view path, std::string_view msg) const {
    Fail(ErrorKind::kInvalidArgument, "{}: {}: {}", src_, path, msg);
  }

  static bool AsInt(const json& v, int64_t* out) {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(kI64Max)) return false;
      *out = static_cast<int64_t>(u);
      return true;
    }
    if (v.is_number_integer()) {
      *out = v.get<int64_t>();
      return true;
    }
    return false;
  }
  int64_t IntValue(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (!AsInt(v, &x))
      Fail(ErrorKind::kCorruptData, "{}: {}: expected an integer, found {}", src_, path, Found(v));
    if (x < lo || x > hi)
      Fail(ErrorKind::kInvalidArgument, "{}: {}: expected an integer in [{}, {}], found {}", src_,
           path, lo, hi, x);
    return x;
  }
  int64_t Int(const char* key, int64_t lo = 0, int64_t hi = kI64Max) const {
    return IntValue(Need(key), Path(key), lo, hi);
  }
  int I32(const char* key, int64_t lo = 0, int64_t hi = kIntMax) const {
    return static_cast<int>(Int(key, lo, hi));
  }
  double Num(const char* key) const {
    const json& v = Need(key);
    if (!v.is_number()) Bad(key, "a number", v);
    double d = v.get<double>();
    if (!std::isfinite(d)) Bad(key, "a finite number", v);
    return d;
  }
  double PositiveNum(const char* key) const {
    double d = Num(key);
    if (!(d > 0))
      BadValue(Path(key), fmt::format("expected a number > 0, found {}", Need(key).dump()));
    return d;
  }
  bool Bool(const char* key) const {
    const json& v = Need(key);
    if (!v.is_boolean()) Bad(key, "a boolean", v);
    return v.get<bool>();
  }
  std::string Str(const char* key) const {
    const json& v = Need(key);
    if (!v.is_string()) Bad(key, "a string", v);
    return v.get<std::string>();
  }
  // A string key that must equal `want` when present (optional keys that only
  // confirm a fixed architectural choice, e.g. hidden_act "silu").
  void OptionalEquals(const char* key, std::string_view want) const {
    const json* v = Find(key);
    if (!v) return;
    if (!v->is_string()) Bad(key, fmt::format("the string \"{}\"", want), *v);
    if (v->get<std::string>() != want)
      BadValue(Path(key), fmt::format("expected \"{}\" (the only supported value), found {}", want,
                                      Found(*v)));
  }
  std::vector<int64_t> IntList(const char* key, int64_t lo = 0, int64_t hi = kI64Max) const {
    const json& v = Need(key);
    if (!v.is_array()) Bad(key, "an array of integers", v);
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(IntValue(v[i], fmt::format("{}[{}]", Path(key), i), lo, hi));
    return out;
  }
  std::vector<int> IntList32(const char* key, int64_t lo = 0, int64_t hi = kIntMax) const {
    std::vector<int> out;
    for (int64_t x : IntList(key, lo, hi)) out.push_back(static_cast<int>(x));
    return out;
  }
  Reader Obj(const char* key) const {
    const json& v = Need(key);
    if (!v.is_object()) Bad(key, "an object", v);
    return Reader(v, src_, Path(key) + ".");
  }

 private:
  const json& j_;
  std::string src_;
  std::string prefix_;
};

std::string ListString(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Key names used in schedule messages (HF config.json names per architecture).
struct KeyNames {
  std::string ratios, kv_sources, index_sources, candidate, cand_blocks, cand_bs, index_topk,
      engram_ids, engram_rows, dspark_targets;
};

// Ids strictly ascending, each in [0, n).
void CheckLayerList(const std::vector<int>& ids, int n, const std::string& src,
                    const std::string& key) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= n)
      Fail(ErrorKind::kInvalidArgument,
           "{}: {}[{}] = {}: expected a main-layer id in [0, {}) (num_hidden_layers)", src, key, i,
           ids[i], n);
    if (i && ids[i] <= ids[i - 1])
      Fail(ErrorKind::kInvalidArgument, "{}: {} = {}: expected strictly ascending layer ids", src,
           key, ListString(ids));
  }
}

uint64_t MulMod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) % m);
}
uint64_t PowMod(uint64_t a, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  a %= m;
  for (; e; e >>= 1) {
    if (e & 1) r = MulMod(r, a, m);
    a = MulMod(a, a, m);
  }
  return r;
}
// Deterministic Miller-Rabin, exact for every 64-bit n (bases: first 12 primes).
bool IsPrime(int64_t sn) {
  if (sn < 2) return false;
  const uint64_t n = static_cast<uint64_t>(sn);
  for (uint64_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) { d >>= 1; ++s; }
  for (uint64_t a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    uint64_t x = PowMod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s; ++r) {
      x = MulMod(x, x, n);
      if (x == n - 1) { composite = false; break; }
    }
    if (composite) return false;
  }
  return true;
}

// Engram bucket primes (model-spec §3.3.2): one global set of used primes; for
// each Engram layer (config order), for each n-gram order n = 2..N, a cursor
// starts at engram_vocab_size - 1 and each head takes the smallest unused
// prime > cursor (the cursor then moves to it).
std::vector<std::vector<int64_t>> EngramPrimes(const ModelConfig& c) {
  std::set<int64_t> used;
  std::vector<std::vector<int64_t>> out;
  for (size_t k = 0; k < c.engram_layer_ids.size(); ++k) {
    std::vector<int64_t> primes;
    for (int n = 2; n <= c.engram_max_ngram_size; ++n) {
      int64_t cursor = c.engram_vocab_size - 1;
      for (int h = 0; h < c.engram_n_heads; ++h) {
        int64_t p = cursor + 1;
        while (!IsPrime(p) || used.count(p)) ++p;
        used.insert(p);
        primes.push_back(p);
        cursor = p;
      }
    }
    out.push_back(std::move(primes));
  }
  return out;
}

void ReadRopeScaling(const Reader& r, ModelConfig* c) {
  Reader rs = r.Obj("rope_scaling");
  const char* type_key = rs.Has("rope_type") ? "rope_type" : "type";
  std::string type = rs.Str(type_key);
  if (type != "yarn")
    rs.BadValue(rs.Path(type_key),
                fmt::format("expected \"yarn\" (the only supported RoPE scaling), found \"{}\"",
                            Printable(type)));
  c->rope_factor = rs.PositiveNum("factor");
  c->original_seq_len = rs.Int("original_max_position_embeddings", 1);
  c->beta_fast = rs.Num("beta_fast");
  c->beta_slow = rs.Num("beta_slow");
}

// Fields common to both architectures, read from `r` (the top level for V4,
// text_config for V4.1).
void ReadCommon(const Reader& r, ModelConfig* c) {
  r.OptionalEquals("hidden_act", "silu");
  r.OptionalEquals("topk_method", "noaux_tc");
  if (const json* t = r.Find("tie_word_embeddings")) {
    if (!t->is_boolean()) r.Bad("tie_word_embeddings", "a boolean", *t);
    if (t->get<bool>())
      r.BadValue(r.Path("tie_word_embeddings"),
                 "expected false (the DeepSeek-V4 family has a separate head.weight), found true");
  }
  c->vocab_size = r.Int("vocab_size", 1, kIntMax);
  c->dim = r.Int("hidden_size", 1, kIntMax);
  c->moe_inter_dim = r.Int("moe_intermediate_size", 1, kIntMax);
  c->n_layers = r.I32("num_hidden_layers", 1, 100000);
  c->n_mtp_layers = r.I32("num_nextn_predict_layers", 0, 1000);
  c->n_heads = r.I32("num_attention_heads", 1, 1 << 20);
  r.Int("num_key_value_heads", 1, 1);  // shared K=V latent: exactly one head
  c->head_dim = r.Int("head_dim", 1, 1 << 20);
  c->rope_head_dim = r.Int("qk_rope_head_dim", 2, 1 << 20);
  c->q_lora_rank = r.Int("q_lora_rank", 1, kIntMax);
  c->o_groups = r.I32("o_groups", 1, 1 << 20);
  c->o_lora_rank = r.Int("o_lora_rank", 1, kIntMax);
  c->window_size = r.Int("sliding_window", 1, kIntMax);
  c->compress_ratios = r.IntList32("compress_ratios", 0, 1 << 20);
  c->index_n_heads = r.I32("index_n_heads", 1, 1 << 20);
  c->index_head_dim = r.Int("index_head_dim", 1, 1 << 20);
  c->index_topk = r.I32("index_topk", 1, kIntMax);
  c->n_routed_experts = r.I32("n_routed_experts", 1, 1 << 20);
  c->n_activated_experts = r.I32("num_experts_per_tok", 1, 1 << 20);
  c->n_shared_experts = r.I32("n_shared_experts", 1, 1);
  c->score_func = r.Str("scoring_func");
  if (c->score_func != "sqrtsoftplus" && c->score_func != "softmax" && c->score_func != "sigmoid")
    r.BadValue(r.Path("scoring_func"),
               fmt::format("expected \"sqrtsoftplus\", \"softmax\" or \"sigmoid\", found \"{}\"",
                           Printable(c->score_func)));
  c->norm_topk_prob = r.Bool("norm_topk_prob");
  c->route_scale = static_cast<float>(r.PositiveNum("routed_scaling_factor"));
  c->swiglu_limit = static_cast<float>(r.Num("swiglu_limit"));
  if (c->swiglu_limit < 0)
    r.BadValue(r.Path("swiglu_limit"), fmt::format("expected >= 0, found {}", c->swiglu_limit));
  c->norm_eps = static_cast<float>(r.PositiveNum("rms_norm_eps"));
  c->hc_mult = r.I32("hc_mult", 1, 64);
  c->hc_sinkhorn_iters = r.I32("hc_sinkhorn_iters", 1, 1000);
  c->hc_eps = static_cast<float>(r.PositiveNum("hc_eps"));
  c->rope_theta = r.PositiveNum("rope_theta");
  c->compress_rope_theta = r.PositiveNum("compress_rope_theta");
  ReadRopeScaling(r, c);
  c->max_position_embeddings = r.Int("max_position_embeddings", 1);

  // Shape relations every tensor shape depends on.
  if (c->rope_head_dim % 2 != 0 || c->rope_head_dim > c->head_dim)
    r.BadValue(r.Path("qk_rope_head_dim"),
               fmt::format("expected an even value <= head_dim ({}), found {}", c->head_dim,
                           c->rope_head_dim));
  if (c->rope_head_dim > c->index_head_dim)
    r.BadValue(r.Path("index_head_dim"),
               fmt::format("expected >= qk_rope_head_dim ({}), found {}", c->rope_head_dim,
                           c->index_head_dim));
  if (c->n_heads % c->o_groups != 0)
    r.BadValue(r.Path("o_groups"),
               fmt::format("expected a divisor of num_attention_heads ({}), found {}", c->n_heads,
                           c->o_groups));
  if (c->n_activated_experts > c->n_routed_experts)
    r.BadValue(r.Path("num_experts_per_tok"),
               fmt::format("expected <= n_routed_experts ({}), found {}", c->n_routed_experts,
                           c->n_activated_experts));
}

void ReadQuantization(const Reader& qc, ModelConfig* c) {
  qc.OptionalEquals("quant_method", "fp8");
  qc.OptionalEquals("scale_fmt", "ue8m0");
  qc.OptionalEquals("fmt", "e4m3");
  std::vector<int64_t> wbs = qc.IntList("weight_block_size", 1, 1 << 16);
  if (wbs.size() != 2 || wbs[0] != wbs[1])
    qc.BadValue(qc.Path("weight_block_size"),
                "expected two equal block sizes [B, B] (square weight blocks)");
  c->weight_block_size = static_cast<int>(wbs[0]);
  c->act_block_size = c->weight_block_size;
}

// Token ids must index the vocabulary.
void CheckTokenId(const Reader& r, const char* key, int64_t id, int64_t vocab) {
  if (id >= vocab)
    r.BadValue(r.Path(key), fmt::format("expected a token id < vocab_size ({}), found {}", vocab, id));
}

void CheckExpertDtype(const Reader& r, const char* key, const ModelConfig& c) {
  if (c.expert_dtype != "fp4" && c.expert_dtype != "fp8")
    r.BadValue(r.Path(key), fmt::format("expected \"fp4\" or \"fp8\", found \"{}\"",
                                        Printable(c.expert_dtype)));
}

// ---------------------------------------------------------------------------
// Layer schedules.

void BuildScheduleV41(ModelConfig* c, const std::string& src, const KeyNames& k) {
  const int n = c->n_layers;
  const int total = n + c->n_mtp_layers;
  if (static_cast<int>(c->compress_ratios.size()) != total)
    Fail(ErrorKind::kInvalidArgument,
         "{}: {}: expected {} entries (num_hidden_layers {} + num_nextn_predict_layers {}), "
         "found {}",
         src, k.ratios, total, n, c->n_mtp_layers, c->compress_ratios.size());
  for (int i = 0; i < total; ++i) {
    int r = c->compress_ratios[i];
    if (i >= n && r != 0)
      Fail(ErrorKind::kInvalidArgument,
           "{}: {}[{}] = {}: expected 0 (DSpark block mtp.{} is sliding-window only)", src,
           k.ratios, i, r, i - n);
    if (r != 0 && r != 1 && r != 2)
      Fail(ErrorKind::kInvalidArgument, "{}: {}[{}] = {}: expected 0, 1 or 2 for deepseek_v41",
           src, k.ratios, i, r);
  }
  CheckLayerList(c->kv_source_layers, n, src, k.kv_sources);
  CheckLayerList(c->index_source_layers, n, src, k.index_sources);
  CheckLayerList(c->dspark_target_layer_ids, n, src, k.dspark_targets);
  CheckLayerList(c->engram_layer_ids, n, src, k.engram_ids);

  for (int s : c->kv_source_layers) {
    if (c->compress_ratios[s] == 0)
      Fail(ErrorKind::kInvalidArgument,
           "{}: {}: layer {} has compress ratio 0, expected > 0 for a KV source", src,
           k.kv_sources, s);
    if (!Contains(c->index_source_layers, s))
      Fail(ErrorKind::kInvalidArgument,
           "{}: {}: KV source layer {} is not in {}; expected every KV source to be an index "
           "source (its layers would otherwise reuse a top-k computed over another cache)",
           src, k.index_sources, s, k.index_sources);
  }
  for (int s : c->index_source_layers) {
    if (c->compress_ratios[s] == 0)
      Fail(ErrorKind::kInvalidArgument,
           "{}: {}: layer {} has compress ratio 0, expected > 0 for an index source", src,
           k.index_sources, s);
  }
  const int cand = c->candidate_source_layer;
  if (cand >= n)
    Fail(ErrorKind::kInvalidArgument,
         "{}: {} = {}: expected a main-layer id in [0, {}) or -1 (off)", src, k.candidate, cand, n);
  if (cand >= 0) {
    if (!Contains(c->index_source_layers, cand))
      Fail(ErrorKind::kInvalidArgument, "{}: {} = {}: expected one of {} = {}", src, k.candidate,
           cand, k.index_sources, ListString(c->index_source_layers));
    if (c->candidate_topk_blocks < 1 || c->candidate_block_size < 1)
      Fail(ErrorKind::kInvalidArgument,
           "{}: {} and {}: expected >= 1 when the candidate source is on, found {} and {}", src,
           k.cand_blocks, k.cand_bs, c->candidate_topk_blocks, c->candidate_block_size);
    const int64_t pool = static_cast<int64_t>(c->candidate_topk_blocks) * c->candidate_block_size -
                         (c->candidate_block_size - 1);
    if (pool < c->index_topk)
      Fail(ErrorKind::kInvalidArgument,
           "{}: {} {} x {} {} - ({} - 1) = {} candidate positions, expected >= {} {} "
           "(model-spec §3.3.4)",
           src, k.cand_blocks, c->candidate_topk_blocks, k.cand_bs, c->candidate_block_size,
           c->candidate_block_size, pool, k.index_topk, c->index_topk);
  }

  c->layers.clear();
  int last_kv = -1, last_index = -1;
  for (int i = 0; i < total; ++i) {
    LayerSchedule L;
    L.layer = i;
    L.is_mtp = i >= n;
    L.compress_ratio = c->compress_ratios[i];
    if (!L.is_mtp) {
      L.kv_source = Contains(c->kv_source_layers, i);
      L.index_source = Contains(c->index_source_layers, i);
      L.candidate_source = i == cand;
      L.dspark_target = Contains(c->dspark_target_layer_ids, i);
      auto e = std::find(c->engram_layer_ids.begin(), c->engram_layer_ids.end(), i);
      if (e != c->engram_layer_ids.end())
        L.engram_slot = static_cast<int>(e - c->engram_layer_ids.begin());
      if (L.kv_source) last_kv = i;
      if (L.index_source) last_index = i;
    }
    if (L.compress_ratio == 0) {
      L.mode = CsaMode::kSwa;
    } else {
      if (last_kv < 0)
        Fail(ErrorKind::kInvalidArgument,
             "{}: layer {} has compress ratio {} but no KV source at or before it; expected a "
             "layer <= {} in {} = {}",
             src, i, L.compress_ratio, i, k.kv_sources, ListString(c->kv_source_layers));
      if (c->compress_ratios[last_kv] != L.compress_ratio)
        Fail(ErrorKind::kInvalidArgument,
             "{}: layer {} has compress ratio {} but would read the compressed KV of layer {} "
             "(ratio {}); expected a KV source of ratio {} at or before layer {} in {}",
             src, i, L.compress_ratio, last_kv, c->compress_ratios[last_kv], L.compress_ratio, i,
             k.kv_sources);
      L.kv_from = last_kv;
      if (last_index < last_kv)
        Fail(ErrorKind::kInternal, "layer {}: index source {} precedes KV source {}", i,
             last_index, last_kv);  // impossible: every KV source is an index source
      L.index_from = last_index;
      L.mode = L.kv_source ? CsaMode::kFull : (L.index_source ? CsaMode::kReindex : CsaMode::kReuse);
      if (L.index_source && cand >= 0 && cand < i) {
        if (L.kv_from != c->layers[cand].kv_from)
          Fail(ErrorKind::kInvalidArgument,
               "{}: index source layer {} follows the candidate source {} but reads the "
               "compressed KV of layer {}, expected layer {} (the candidate mask is over that "
               "cache)",
               src, i, cand, L.kv_from, c->layers[cand].kv_from);
        L.candidate_from = cand;
      }
    }
    c->layers.push_back(L);
  }
}

void BuildScheduleV4(ModelConfig* c, const std::string& src, const KeyNames& k) {
  const int n = c->n_layers;
  const int total = n + c->n_mtp_layers;
  if (static_cast<int>(c->compress_ratios.size()) != total)
    Fail(ErrorKind::kInvalidArgument,
         "{}: {}: expected {} entries (num_hidden_layers {} + num_nextn_predict_layers {}), "
         "found {}",
         src, k.ratios, total, n, c->n_mtp_layers, c->compress_ratios.size());
  c->layers.clear();
  for (int i = 0; i < total; ++i) {
    int r = c->compress_ratios[i];
    LayerSchedule L;
    L.layer = i;
    L.is_mtp = i >= n;
    L.compress_ratio = r;
    if (L.is_mtp && r != 0)
      Fail(ErrorKind::kInvalidArgument,
           "{}: {}[{}] = {}: expected 0 (MTP block mtp.{} is sliding-window only)", src, k.ratios,
           i, r, i - n);
    if (r == 0) {
      L.mode = CsaMode::kSwa;
    } else if (r == 4) {
      L.mode = CsaMode::kC4;
      L.kv_source = L.index_source = true;
      L.kv_from = L.index_from = i;
    } else if (r == 128) {
      L.mode = CsaMode::kC128;
      L.kv_source = true;
      L.kv_from = i;
    } else {
      Fail(ErrorKind::kInvalidArgument, "{}: {}[{}] = {}: expected 0, 4 or 128 for deepseek_v4",
           src, k.ratios, i, r);
    }
    L.hash_routed = !L.is_mtp && i < c->n_hash_layers;
    c->layers.push_back(L);
  }
}

// ---------------------------------------------------------------------------

ModelConfig ParseV41(const json& root, const std::string& src) {
  ModelConfig c;
  c.arch = Arch::kDeepseekV41;
  Reader top(root, src, "");
  c.model_type = "deepseek_v41";
  Reader t = top.Obj("text_config");
  t.OptionalEquals("model_type", "deepseek_v41_text");
  ReadCommon(t, &c);

  c.kv_source_layers = t.IntList32("kv_source_layer_ids", 0, kIntMax);
  c.index_source_layers = t.IntList32("index_source_layer_ids", 0, kIntMax);
  c.candidate_source_layer = t.I32("candidate_source_layer_id", -1, kIntMax);
  c.candidate_topk_blocks = t.I32("candidate_topk_blocks", 0);
  c.candidate_block_size = t.I32("candidate_block_size", 0);
  if (const json* g = t.Find("gate_temp")) {
    (void)g;
    c.gate_temp = static_cast<float>(t.PositiveNum("gate_temp"));
  } else {
    c.gate_temp = 1.0f;  // absent in the release; the reference defaults it (model-spec §1.3)
  }

  // Engram.
  c.engram_layer_ids = t.IntList32("engram_layer_ids", 0, kIntMax);
  c.engram_num_embeddings = t.IntList("engram_num_embeddings", 1);
  c.engram_max_ngram_size = t.I32("engram_max_ngram_size", 2, 64);
  c.engram_vocab_size = t.Int("engram_vocab_size", 1, int64_t{1} << 48);
  c.engram_n_heads = t.I32("engram_n_heads", 1, 4096);
  c.engram_head_dim = t.Int("engram_head_dim", 1, 1 << 20);
  // The pad key is spelled engram_pad_token_id in the release's text_config
  // (model-spec §1.3) and engram_pad_id in the flat reference config.
  const char* pad_key = t.Has("engram_pad_token_id") ? "engram_pad_token_id" : "engram_pad_id";
  if (!t.Has(pad_key))
    Fail(ErrorKind::kNotFound, "{}: missing required key {}", src,
         t.Path("engram_pad_token_id"));
  c.engram_pad_id = t.I32(pad_key, 0, kIntMax);
  c.engram_compressed_vocab_size = t.Int("engram_compressed_vocab_size", 1, kIntMax);

  // DSpark.
  c.dspark_block_size = t.I32("dspark_block_size", 1, 1 << 16);
  c.dspark_noise_token_id = t.Int("dspark_noise_token_id", 0, kIntMax);
  c.dspark_target_layer_ids = t.IntList32("dspark_target_layer_ids", 0, kIntMax);
  c.dspark_markov_rank = t.Int("dspark_markov_rank", 1, 1 << 20);
  c.dspark_n_routed_experts = t.I32("dspark_n_routed_experts", 1, 1 << 20);
  c.dspark_n_activated_experts = t.I32("dspark_num_experts_per_tok", 1, 1 << 20);
  if (c.dspark_n_activated_experts > c.dspark_n_routed_experts)
    t.BadValue(t.Path("dspark_num_experts_per_tok"),
               fmt::format("expected <= dspark_n_routed_experts ({}), found {}",
                           c.dspark_n_routed_experts, c.dspark_n_activated_experts));
  if (c.n_mtp_layers > 0 && c.dspark_target_layer_ids.empty())
    t.BadValue(t.Path("dspark_target_layer_ids"),
               "expected at least one layer when num_nextn_predict_layers > 0");

  // Top level: special tokens, quantisation, vision.
  c.bos_token_id = top.Int("bos_token_id", 0, kIntMax);
  c.eos_token_id = top.Int("eos_token_id", 0, kIntMax);
  if (const json* p = top.Find("pad_token_id"); p && !p->is_null())
    c.pad_token_id = top.Int("pad_token_id", 0, kIntMax);
  c.image_token_id = top.Int("image_token_id", 0, kIntMax);
  CheckTokenId(top, "bos_token_id", c.bos_token_id, c.vocab_size);
  CheckTokenId(top, "eos_token_id", c.eos_token_id, c.vocab_size);
  CheckTokenId(top, "pad_token_id", c.pad_token_id, c.vocab_size);
  CheckTokenId(top, "image_token_id", c.image_token_id, c.vocab_size);
  CheckTokenId(t, "dspark_noise_token_id", c.dspark_noise_token_id, c.vocab_size);
  CheckTokenId(t, pad_key, c.engram_pad_id, c.vocab_size);
  Reader qc = top.Obj("quantization_config");
  ReadQuantization(qc, &c);
  c.expert_dtype = qc.Str("expert_dtype");
  CheckExpertDtype(qc, "expert_dtype", c);
  if (const json* v = top.Find("vision_config"); v && !v->is_null()) {
    Reader vc = top.Obj("vision_config");
    c.vision_n_layers = vc.I32("num_hidden_layers", 0, 10000);
    c.vision_dim = vc.Int("hidden_size", 1, 1 << 20);
    c.vision_n_heads = vc.I32("num_attention_heads", 1, 1 << 16);
    c.vision_inter_dim = vc.Int("intermediate_size", 1, 1 << 24);
    c.vision_patch_size = vc.I32("patch_size", 1, 4096);
    c.vision_downsample_ratio = vc.I32("downsample_ratio", 1, 64);
    c.vision_max_n_token = vc.Find("max_n_token") ? vc.Int("max_n_token", 3, 1 << 24) : 16384;
    c.vision_min_pixels = vc.Find("min_pixels") ? vc.Int("min_pixels", 0, int64_t{1} << 40) : 0;
    if (const json* r = vc.Find("max_wh_ratio"); r && !r->is_null()) c.vision_max_wh_ratio = vc.PositiveNum("max_wh_ratio");
    if (vc.Find("rope_theta")) c.vision_rope_theta = vc.PositiveNum("rope_theta");
    if (c.vision_n_layers > 0 && c.vision_dim % (4 * c.vision_n_heads) != 0)
      vc.BadValue(vc.Path("hidden_size"), fmt::format("expected a multiple of 4 x num_attention_heads ({}), found {}",
                                                       c.vision_n_heads, c.vision_dim));
  }

  // Engram consistency (model-spec §3.3.2).
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
    t.BadValue(t.Path("engram_num_embeddings"),
               fmt::format("expected {} entries (one per engram_layer_ids entry), found {}",
                           c.engram_layer_ids.size(), c.engram_num_embeddings.size()));
  if (c.engram_head_dim % c.weight_block_size != 0)
    t.BadValue(t.Path("engram_head_dim"),
               fmt::format("expected a multiple of the quantisation block {} (row scale groups), "
                           "found {}",
                           c.weight_block_size, c.engram_head_dim));
  // Bounded so that deriving the bucket primes stays cheap (release: 2 x 3 x 8 = 48).
  const int64_t n_primes = static_cast<int64_t>(c.engram_layer_ids.size()) *
                           (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  if (n_primes > 4096)
    t.BadValue(t.Path("engram_n_heads"),
               fmt::format("{} Engram layers x {} n-gram orders x {} heads = {} hash tables, "
                           "expected at most 4096",
                           c.engram_layer_ids.size(), c.engram_max_ngram_size - 1,
                           c.engram_n_heads, n_primes));
  c.engram_primes = EngramPrimes(c);
  for (size_t k = 0; k < c.engram_primes.size(); ++k) {
    int64_t sum = 0;
    for (int64_t p : c.engram_primes[k]) sum += p;
    if (sum != c.engram_num_embeddings[k])
      t.BadValue(fmt::format("{}[{}]", t.Path("engram_num_embeddings"), k),
                 fmt::format("expected {} rows (sum of layer {}'s bucket primes from "
                             "engram_vocab_size {}, {} orders x {} heads), found {}",
                             sum, c.engram_layer_ids[k], c.engram_vocab_size,
                             c.engram_max_ngram_size - 1, c.engram_n_heads,
                             c.engram_num_embeddings[k]));
  }

  KeyNames k{t.Path("compress_ratios"),
             t.Path("kv_source_layer_ids"),
             t.Path("index_source_layer_ids"),
             t.Path("candidate_source_layer_id"),
             t.Path("candidate_topk_blocks"),
             t.Path("candidate_block_size"),
             t.Path("index_topk"),
             t.Path("engram_layer_ids"),
             t.Path("engram_num_embeddings"),
             t.Path("dspark_target_layer_ids")};
  BuildScheduleV41(&c, src, k);
  return c;
}

ModelConfig ParseV4(const json& root, const std::string& src) {
  ModelConfig c;
  c.arch = Arch::kDeepseekV4;
  c.model_type = "deepseek_v4";
  Reader top(root, src, "");
  ReadCommon(top, &c);
  c.n_hash_layers = top.I32("num_hash_layers", 0, c.n_layers);
  c.gate_temp = 1.0f;
  c.bos_token_id = top.Int("bos_token_id", 0, kIntMax);
  c.eos_token_id = top.Int("eos_token_id", 0, kIntMax);
  if (const json* p = top.Find("pad_token_id"); p && !p->is_null())
    c.pad_token_id = top.Int("pad_token_id", 0, kIntMax);
  CheckTokenId(top, "bos_token_id", c.bos_token_id, c.vocab_size);
  CheckTokenId(top, "eos_token_id", c.eos_token_id, c.vocab_size);
  CheckTokenId(top, "pad_token_id", c.pad_token_id, c.vocab_size);
  Reader qc = top.Obj("quantization_config");
  ReadQuantization(qc, &c);
  // The current V4 revision has a top-level expert_dtype (model-spec §0.2);
  // V4.1 moved it into quantization_config. Accept either, require one.
  if (top.Has("expert_dtype")) {
    c.expert_dtype = top.Str("expert_dtype");
    CheckExpertDtype(top, "expert_dtype", c);
  } else if (qc.Has("expert_dtype")) {
    c.expert_dtype = qc.Str("expert_dtype");
    CheckExpertDtype(qc, "expert_dtype", c);
  } else {
    Fail(ErrorKind::kNotFound,
         "{}: missing required key expert_dtype (top level, or in quantization_config)", src);
  }
  KeyNames k{"compress_ratios", "", "", "", "", "", "index_topk", "", "", ""};
  BuildScheduleV4(&c, src, k);
  return c;
}

}  // namespace

ModelConfig ModelConfig::FromJsonText(const std::string& text, const std::string& source) {
  const std::string src = Printable(source);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    std::string w = e.what();
    if (!w.empty() && w[0] == '[') {
      size_t close = w.find("] ");
      if (close != std::string::npos) w = w.substr(close + 2);
    }
    if (w.size() > 240) w = w.substr(0, 240) + "...";
    Fail(ErrorKind::kCorruptData, "{}: not valid JSON: {}", src, Printable(w));
  }
  if (!root.is_object())
    Fail(ErrorKind::kCorruptData, "{}: expected a JSON object at the top level, found {}", src,
         Found(root));
  Reader top(root, src, "");
  const std::string mt = top.Str("model_type");
  try {
    if (mt == "deepseek_v41") return ParseV41(root, src);
    if (mt == "deepseek_v4") return ParseV4(root, src);
  } catch (const json::exception& e) {
    // Should not happen (every access is type-checked), but never let a
    // library exception escape without context.
    Fail(ErrorKind::kInternal, "{}: unexpected JSON access error: {}", src, Printable(e.what()));
  }
  Fail(ErrorKind::kInvalidArgument,
       "{}: model_type: expected \"deepseek_v41\" or \"deepseek_v4\", found \"{}\"", src,
       Printable(mt));
}

ModelConfig ModelConfig::Load(const std::filesystem::path& model_dir) {
  const std::filesystem::path p = model_dir / "config.json";
  std::ifstream in(p, std::ios::binary);
  if (!in)
    Fail(ErrorKind::kNotFound, "{}: cannot open (expected the model's config.json)",
         Printable(p.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad())
    Fail(ErrorKind::kInvalidArgument, "{}: read failed", Printable(p.string()));
  return FromJsonText(ss.str(), p.string());
}

}  // namespace deepinfer
