// deepinfer/tools/make_tiny.cc — see make_tiny.h. Spec: shared/golden/TINY_V41_SPEC.md.
#include "tools/make_tiny.h"
#include "tools/py_json.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include <omp.h>

#include "base/error.h"
#include "format/dtype.h"
#include "format/numerics.h"
#include "tokenizer/tiny_tokenizer_files.h"

namespace deepinfer::tiny {
namespace {

constexpr int kBlock = 32;  // FP8 weight blocks 32×32; FP4 / Engram groups of 32

// ============================================================================
// Small helpers
// ============================================================================
bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

bool IsPrime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string ShapeList(const std::vector<int64_t>& s, const char* sep) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) {
    if (k) out += sep;
    out += std::to_string(s[k]);
  }
  return out + "]";
}

std::string ScaleName(const std::string& weight_name) {
  constexpr std::string_view kW = ".weight";
  DI_CHECK(weight_name.size() > kW.size() &&
           weight_name.compare(weight_name.size() - kW.size(), kW.size(), kW) == 0);
  return weight_name.substr(0, weight_name.size() - kW.size()) + ".scale";
}

bool IsQuantised(TinyKind k) {
  return k == TinyKind::kFp8Block || k == TinyKind::kEngramRows || k == TinyKind::kFp4Rows ||
         k == TinyKind::kFp8Block128;
}

// Square block size of an FP8 block kind (32 for V4.1, 128 for V4).
int FpBlock(TinyKind k) { return k == TinyKind::kFp8Block128 ? 128 : kBlock; }

std::vector<int64_t> StoredShape(const PlannedTensor& t) {
  if (t.kind == TinyKind::kFp4Rows) return {t.shape[0], t.shape[1] / 2};
  return t.shape;
}

std::vector<int64_t> ScaleShape(const PlannedTensor& t) {
  if (t.kind == TinyKind::kFp8Block || t.kind == TinyKind::kFp8Block128)
    return {t.shape[0] / FpBlock(t.kind), t.shape[1] / FpBlock(t.kind)};
  return {t.shape[0], t.shape[1] / kBlock};
}

DType WeightDType(TinyKind k) {
  switch (k) {
    case TinyKind::kBf16: return DType::kBF16;
    case TinyKind::kF32: return DType::kF32;
    case TinyKind::kFp8Block:
    case TinyKind::kFp8Block128:
    case TinyKind::kEngramRows: return DType::kF8E4M3;
    case TinyKind::kFp4Rows: return DType::kI8;
    case TinyKind::kTid2eid: return DType::kI64;
  }
  return DType::kF32;
}

// ============================================================================
// Encoders of one work range. Pure functions of (name hash, index): the output
// does not depend on how a tensor is split into ranges.
// ============================================================================
inline void StoreU16(uint8_t* p, uint16_t v) { p[0] = static_cast<uint8_t>(v); p[1] = static_cast<uint8_t>(v >> 8); }
inline void StoreU32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v); p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16); p[3] = static_cast<uint8_t>(v >> 24);
}

// UE8M0 byte for amax·c (spec §3); false if t is not a normal float (the rule
// then does not apply; never happens for these tensors).
inline bool ScaleByte(float amax, float c, uint8_t* byte) {
  const float t = amax * c;
  if (!(t >= 0x1p-126f)) return false;
  const uint8_t b = Pow2CeilE8M0(t);
  if (b == 0xFF) return false;
  *byte = b;
  return true;
}

// Elements [e0, e1) of a BF16 / F32 tensor.
void EncodeElems(const PlannedTensor& t, uint64_t h, int64_t e0, int64_t e1, uint8_t* data) {
  if (t.kind == TinyKind::kBf16) {
    for (int64_t i = e0; i < e1; ++i)
      StoreU16(data + 2 * i, FloatToBf16(RuleValue(h, static_cast<uint64_t>(i), t.center, t.amp)));
  } else {
    for (int64_t i = e0; i < e1; ++i)
      StoreU32(data + 4 * i, FloatBits(RuleValue(h, static_cast<uint64_t>(i), t.center, t.amp)));
  }
}

// Row strips [s0, s1) (B rows each, B = 32 or 128 by kind) of an FP8 block-quantised [out, in] tensor.
// scratch: B·in floats.
bool EncodeFp8Strips(const PlannedTensor& t, uint64_t h, int64_t s0, int64_t s1, uint8_t* data,
                     uint8_t* scale, float* scratch) {
  const int B = FpBlock(t.kind);
  const int64_t in = t.shape[1], nb = in / B;
  bool ok = true;
  for (int64_t s = s0; s < s1; ++s) {
    const uint64_t base = static_cast<uint64_t>(s * B * in);
    for (int64_t k = 0; k < B * in; ++k) scratch[k] = RuleValue(h, base + k, t.center, t.amp);
    for (int64_t cb = 0; cb < nb; ++cb) {
      float amax = 0.0f;
      for (int r = 0; r < B; ++r) {
        const float* row = scratch + r * in + cb * B;
        for (int c = 0; c < B; ++c) amax = std::max(amax, std::fabs(row[c]));
      }
      uint8_t sb = 0;
      ok &= ScaleByte(amax, kInv448, &sb);
      scale[s * nb + cb] = sb;
      const double inv = std::ldexp(1.0, 127 - static_cast<int>(sb));  // exact: x = v / 2^(sb−127)
      for (int r = 0; r < B; ++r) {
        const float* row = scratch + r * in + cb * B;
        uint8_t* q = data + (s * B + r) * in + cb * B;
        for (int c = 0; c < B; ++c) q[c] = DoubleToE4M3(static_cast<double>(row[c]) * inv);
      }
    }
  }
  return ok;
}

// Rows [r0, r1) of a row-group tensor (Engram table: E4M3, c = 1/448; FP4
// expert: packed E2M1, c = 1/6). scratch: `in` floats.
bool EncodeRows(const PlannedTensor& t, uint64_t h, int64_t r0, int64_t r1, uint8_t* data,
                uint8_t* scale, float* scratch) {
  const int64_t in = t.shape[1], ng = in / kBlock;
  const bool fp4 = t.kind == TinyKind::kFp4Rows;
  const float c = fp4 ? kInv6 : kInv448;
  bool ok = true;
  for (int64_t r = r0; r < r1; ++r) {
    const uint64_t base = static_cast<uint64_t>(r * in);
    for (int64_t k = 0; k < in; ++k) scratch[k] = RuleValue(h, base + k, t.center, t.amp);
    for (int64_t g = 0; g < ng; ++g) {
      const float* v = scratch + g * kBlock;
      float amax = 0.0f;
      for (int k = 0; k < kBlock; ++k) amax = std::max(amax, std::fabs(v[k]));
      uint8_t sb = 0;
      ok &= ScaleByte(amax, c, &sb);
      scale[r * ng + g] = sb;
      const double inv = std::ldexp(1.0, 127 - static_cast<int>(sb));
      if (fp4) {
        uint8_t* q = data + r * (in / 2) + g * (kBlock / 2);
        for (int k = 0; k < kBlock; k += 2) {
          const uint8_t lo = DoubleToE2M1(static_cast<double>(v[k]) * inv);
          const uint8_t hi = DoubleToE2M1(static_cast<double>(v[k + 1]) * inv);
          q[k / 2] = static_cast<uint8_t>(lo | (hi << 4));
        }
      } else {
        uint8_t* q = data + r * in + g * kBlock;
        for (int k = 0; k < kBlock; ++k) q[k] = DoubleToE4M3(static_cast<double>(v[k]) * inv);
      }
    }
  }
  return ok;
}

// Rows [r0, r1) of the hash-routing table [vocab, k] (TINY_V4_SPEC.md §2):
// for token t, u = u_t; e0 = u mod E, e1 = (e0 + 1 + ((u >> 3) mod (E − 1)))
// mod E — the spec's rule, k = 2. For k > 2 (larger presets only) the same step
// continues, e_i = (e_{i−1} + 1 + ((u >> 3i) mod (E − 1))) mod E, moving on
// by one while e_i is already taken, so the k ids are distinct. I64 LE.
void EncodeTid2eid(const PlannedTensor& t, uint64_t h, int64_t r0, int64_t r1, uint8_t* data) {
  const uint64_t E = static_cast<uint64_t>(t.tid2eid_experts);
  const int64_t k = t.shape[1];
  std::vector<uint64_t> ids(static_cast<size_t>(k));
  for (int64_t r = r0; r < r1; ++r) {
    const uint64_t u = SplitMix64(h ^ (static_cast<uint64_t>(r) * kGolden));
    ids[0] = u % E;
    for (int64_t i = 1; i < k; ++i) {
      uint64_t e = (ids[i - 1] + 1 + ((u >> (3 * i)) % (E - 1))) % E;
      while (std::find(ids.begin(), ids.begin() + i, e) != ids.begin() + i) e = (e + 1) % E;
      ids[i] = e;
    }
    for (int64_t i = 0; i < k; ++i)
      for (int b = 0; b < 8; ++b) data[(r * k + i) * 8 + b] = static_cast<uint8_t>(ids[i] >> (8 * b));
  }
}

// One unit of parallel work: a range of one tensor.
struct WorkItem {
  int plan = 0;
  int64_t lo = 0, hi = 0;  // elements (BF16/F32), 32-row strips (FP8), rows (rows kinds)
};

// Splits every planned tensor into ranges of roughly `target` elements.
std::vector<WorkItem> MakeWork(const std::vector<PlannedTensor>& plan, int64_t target) {
  std::vector<WorkItem> work;
  for (size_t p = 0; p < plan.size(); ++p) {
    const PlannedTensor& t = plan[p];
    int64_t units = 0, per_unit = 1;
    switch (t.kind) {
      case TinyKind::kBf16:
      case TinyKind::kF32: units = Numel(t.shape); per_unit = 1; break;
      case TinyKind::kFp8Block:
      case TinyKind::kFp8Block128:
        units = t.shape[0] / FpBlock(t.kind); per_unit = FpBlock(t.kind) * t.shape[1]; break;
      case TinyKind::kTid2eid: units = t.shape[0]; per_unit = t.shape[1]; break;
      case TinyKind::kEngramRows:
      case TinyKind::kFp4Rows: units = t.shape[0]; per_unit = t.shape[1]; break;
    }
    const int64_t step = std::max<int64_t>(1, target / std::max<int64_t>(1, per_unit));
    for (int64_t lo = 0; lo < units; lo += step)
      work.push_back({static_cast<int>(p), lo, std::min(units, lo + step)});
  }
  return work;
}

// Fills the data section: data_base[0 .. layout.data_bytes).
void FillData(const std::vector<PlannedTensor>& plan, const Layout& layout, uint8_t* data_base) {
  std::vector<uint8_t*> wptr(plan.size(), nullptr), sptr(plan.size(), nullptr);
  for (const FileTensor& ft : layout.tensors)
    (ft.is_scale ? sptr : wptr)[ft.plan_index] = data_base + ft.begin;
  std::vector<uint64_t> hashes(plan.size());
  int64_t max_in = 0;
  for (size_t p = 0; p < plan.size(); ++p) {
    hashes[p] = Fnv1a64(plan[p].name);
    if (plan[p].shape.size() == 2) max_in = std::max(max_in, plan[p].shape[1]);
  }
  const std::vector<WorkItem> work = MakeWork(plan, int64_t{1} << 18);
  std::atomic<bool> ok{true};
#pragma omp parallel
  {
    std::vector<float> scratch(static_cast<size_t>(128 * std::max<int64_t>(max_in, 1)));
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < static_cast<int64_t>(work.size()); ++w) {
      const WorkItem& it = work[w];
      const PlannedTensor& t = plan[it.plan];
      const uint64_t h = hashes[it.plan];
      bool good = true;
      switch (t.kind) {
        case TinyKind::kBf16:
        case TinyKind::kF32: EncodeElems(t, h, it.lo, it.hi, wptr[it.plan]); break;
        case TinyKind::kFp8Block:
        case TinyKind::kFp8Block128:
          good = EncodeFp8Strips(t, h, it.lo, it.hi, wptr[it.plan], sptr[it.plan], scratch.data());
          break;
        case TinyKind::kTid2eid: EncodeTid2eid(t, h, it.lo, it.hi, wptr[it.plan]); break;
        case TinyKind::kEngramRows:
        case TinyKind::kFp4Rows:
          good = EncodeRows(t, h, it.lo, it.hi, wptr[it.plan], sptr[it.plan], scratch.data());
          break;
      }
      if (!good) ok.store(false, std::memory_order_relaxed);
    }
  }
  if (!ok.load())
    Fail(ErrorKind::kInternal, "make-tiny: a quantisation group's amax is too small for the UE8M0 rule");
}

// ============================================================================
// Tensor plan (spec §4; block_plan()/full_plan() of the script)
// ============================================================================
class Planner {
 public:
  explicit Planner(const TinyConfig& c) : c_(c) {}
  std::vector<PlannedTensor> items;

  void Add(std::string name, TinyKind kind, std::vector<int64_t> shape) {
    const double amp = LinearAmp(shape.back());
    items.push_back({std::move(name), kind, std::move(shape), 0.0, amp});
  }
  void Add(std::string name, TinyKind kind, std::vector<int64_t> shape, double center, double amp) {
    items.push_back({std::move(name), kind, std::move(shape), center, amp});
  }
  void Norm(std::string name, int64_t dim) { Add(std::move(name), TinyKind::kBf16, {dim}, 1.0, 0.125); }

  void Block(const std::string& pre, int layer_id) {
    const TinyConfig& c = c_;
    const int64_t d = c.dim, hd = c.head_dim, nh = c.n_heads, hc = c.hc_mult;
    const int64_t mix = (2 + hc) * hc;
    const bool is_mtp = layer_id >= c.n_layers;
    const int ratio = c.compress_ratios[layer_id];
    Norm(pre + "attn_norm.weight", d);
    Norm(pre + "ffn_norm.weight", d);
    for (const char* site : {"attn", "ffn"}) {
      Add(pre + "hc_" + site + "_fn", TinyKind::kF32, {mix, hc * d});
      Add(pre + "hc_" + site + "_base", TinyKind::kF32, {mix}, 0.0, 0.125);
      Add(pre + "hc_" + site + "_scale", TinyKind::kF32, {3}, 1.0, 0.125);
    }
    const std::string a = pre + "attn.";
    Add(a + "wq_a.weight", TinyKind::kFp8Block, {c.q_lora_rank, d});
    Norm(a + "q_norm.weight", c.q_lora_rank);
    Add(a + "wq_b.weight", TinyKind::kFp8Block, {nh * hd, c.q_lora_rank});
    Add(a + "wkv.weight", TinyKind::kFp8Block, {hd, d});
    Norm(a + "kv_norm.weight", hd);
    Add(a + "wo_a.weight", TinyKind::kFp8Block, {c.o_groups * c.o_lora_rank, nh * hd / c.o_groups});
    Add(a + "wo_b.weight", TinyKind::kFp8Block, {d, c.o_groups * c.o_lora_rank});
    Add(a + "attn_sink", TinyKind::kF32, {nh}, 0.0, 0.5);
    if (!is_mtp && Contains(c.kv_source_layers, layer_id)) {
      Add(a + "compressor.wkv.weight", TinyKind::kBf16, {hd, d});
      if (ratio > 1) Add(a + "compressor.wgate.weight", TinyKind::kBf16, {hd, d});
      Norm(a + "compressor.norm.weight", hd);
      Add(a + "indexer.wk.weight", TinyKind::kBf16, {c.index_head_dim, hd});
      Norm(a + "indexer.k_norm.weight", c.index_head_dim);
    }
    if (!is_mtp && Contains(c.index_source_layers, layer_id)) {
      Add(a + "indexer.wq_b.weight", TinyKind::kFp8Block, {c.index_n_heads * c.index_head_dim, c.q_lora_rank});
      Add(a + "indexer.weights_proj.weight", TinyKind::kBf16, {c.index_n_heads, d});
    }
    const int n_exp = is_mtp ? c.dspark_n_routed_experts : c.n_routed_experts;
    const std::string f = pre + "ffn.";
    Add(f + "gate.weight", TinyKind::kBf16, {n_exp, d});
    Add(f + "gate.bias", TinyKind::kF32, {n_exp}, 0.0, 0.125);
    Add(f + "gate.bias_vl", TinyKind::kF32, {n_exp}, 0.0, 0.125);
    const int64_t inter = c.moe_inter_dim;
    for (int e = 0; e < n_exp; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      Add(x + "w1.weight", TinyKind::kFp4Rows, {inter, d});
      Add(x + "w2.weight", TinyKind::kFp4Rows, {d, inter});
      Add(x + "w3.weight", TinyKind::kFp4Rows, {inter, d});
    }
    Add(f + "shared_experts.w1.weight", TinyKind::kFp8Block, {inter, d});
    Add(f + "shared_experts.w2.weight", TinyKind::kFp8Block, {d, inter});
    Add(f + "shared_experts.w3.weight", TinyKind::kFp8Block, {inter, d});
    if (!is_mtp && Contains(c.engram_layer_ids, layer_id)) {
      const size_t k = std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), layer_id) -
                       c.engram_layer_ids.begin();
      const std::string g = pre + "engram.";
      const int64_t n_cols = static_cast<int64_t>(c.engram_max_ngram_size - 1) * c.engram_n_heads;
      Add(g + "embed.weight", TinyKind::kEngramRows, {c.engram_num_embeddings[k], c.engram_head_dim}, 0.0, 1.0);
      Add(g + "wkv.weight", TinyKind::kFp8Block, {d * (hc + 1), n_cols * c.engram_head_dim});
      Add(g + "q_weight", TinyKind::kBf16, {hc, d}, 1.0, 0.125);
      Add(g + "k_weight", TinyKind::kBf16, {hc, d}, 1.0, 0.125);
    }
  }

  void Full() {
    const TinyConfig& c = c_;
    const int64_t d = c.dim, v = c.vocab_size;
    Add("embed.weight", TinyKind::kBf16, {v, d}, 0.0, 1.0);
    Add("head.weight", TinyKind::kBf16, {v, d}, 0.0, 0.5);
    Norm("norm.weight", d);
    for (int i = 0; i < c.n_layers; ++i) Block("layers." + std::to_string(i) + ".", i);
    for (int s = 0; s < c.n_mtp_layers; ++s) {
      const std::string pre = "mtp." + std::to_string(s) + ".";
      Block(pre, c.n_layers + s);
      if (s == 0) {
        Add(pre + "main_proj.weight", TinyKind::kFp8Block,
            {d, d * static_cast<int64_t>(c.dspark_target_layer_ids.size())});
        Norm(pre + "main_norm.weight", d);
      }
      if (s == c.n_mtp_layers - 1) {
        const int64_t r = c.dspark_markov_rank;
        Norm(pre + "norm.weight", d);
        Add(pre + "markov_head.embed.weight", TinyKind::kBf16, {v, r}, 0.0, 1.0);
        Add(pre + "markov_head.head.weight", TinyKind::kBf16, {v, r});
        Add(pre + "confidence_head.proj.weight", TinyKind::kBf16, {1, d + r});
      }
    }
  }

 private:
  const TinyConfig& c_;
};

// ============================================================================
// Files
// ============================================================================
void WriteWholeFile(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) Fail(ErrorKind::kInvalidArgument, "cannot create {}: {}", tmp.string(), std::strerror(errno));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) Fail(ErrorKind::kResourceExhausted, "cannot write {}", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) Fail(ErrorKind::kInvalidArgument, "cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
}

void WriteSafetensors(const std::vector<PlannedTensor>& plan, const Layout& layout,
                      const std::filesystem::path& path) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  const uint64_t total = layout.file_bytes();
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail(ErrorKind::kInvalidArgument, "cannot create {}: {}", tmp.string(), std::strerror(errno));
  auto fail_close = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    Fail(ErrorKind::kResourceExhausted, "cannot write {} ({} bytes): {}: {}", tmp.string(), total, what,
         std::strerror(err));
  };
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) fail_close("ftruncate");
  void* map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map != MAP_FAILED) {
    // Make sure the blocks exist (a full disk then fails here, not as SIGBUS).
    if (::posix_fallocate(fd, 0, static_cast<off_t>(total)) != 0) {
      ::munmap(map, total);
      errno = ENOSPC;
      fail_close("posix_fallocate");
    }
    uint8_t* base = static_cast<uint8_t*>(map);
    const uint64_t h = layout.header.size();
    for (int k = 0; k < 8; ++k) base[k] = static_cast<uint8_t>(h >> (8 * k));
    std::memcpy(base + 8, layout.header.data(), h);
    FillData(plan, layout, base + 8 + h);
    if (::munmap(map, total) != 0) fail_close("munmap");
  } else {
    // No mmap on this filesystem: build in memory and write once.
    std::vector<uint8_t> buf(total);
    const uint64_t h = layout.header.size();
    for (int k = 0; k < 8; ++k) buf[k] = static_cast<uint8_t>(h >> (8 * k));
    std::memcpy(buf.data() + 8, layout.header.data(), h);
    FillData(plan, layout, buf.data() + 8 + h);
    uint64_t off = 0;
    while (off < total) {
      const ssize_t n = ::pwrite(fd, buf.data() + off, std::min<uint64_t>(total - off, 1u << 30),
                                 static_cast<off_t>(off));
      if (n <= 0) fail_close("pwrite");
      off += static_cast<uint64_t>(n);
    }
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    Fail(ErrorKind::kResourceExhausted, "cannot close {}: {}", tmp.string(), std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) Fail(ErrorKind::kInvalidArgument, "cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
}

}  // namespace

// ============================================================================
// Presets
// ============================================================================
const char* PresetName(TinyPreset p) {
  switch (p) {
    case TinyPreset::kTiny: return "tiny";
    case TinyPreset::kSmall: return "small";
    case TinyPreset::kMedium: return "medium";
    case TinyPreset::kLarge: return "large";
  }
  return "?";
}

TinyPreset ParsePreset(std::string_view name) {
  for (TinyPreset p : {TinyPreset::kTiny, TinyPreset::kSmall, TinyPreset::kMedium, TinyPreset::kLarge})
    if (name == PresetName(p)) return p;
  Fail(ErrorKind::kInvalidArgument, "unknown --preset '{}': expected tiny, small, medium or large", name);
}

ScheduleShape PresetSchedule(TinyPreset p) {
  switch (p) {
    case TinyPreset::kTiny:
    case TinyPreset::kSmall: return {8, 2, 2, 2, 2, 2};
    case TinyPreset::kMedium: return {12, 4, 2, 2, 2, 2};
    case TinyPreset::kLarge: return {16, 6, 3, 2, 3, 3};
  }
  return {};
}

void ApplySchedule(const ScheduleShape& s, TinyConfig* c) {
  if (s.n_layers < 4)
    Fail(ErrorKind::kInvalidArgument, "n_layers {} is too small: a V4.1 schedule needs at least 4 layers "
         "(2 SWA, 1 ratio-2, 1 ratio-1)", s.n_layers);
  if (s.n_ratio2 < 1 || s.n_ratio2 > s.n_layers - 3)
    Fail(ErrorKind::kInvalidArgument, "ratio-2 layer count {} must be in [1, {}] for {} layers", s.n_ratio2,
         s.n_layers - 3, s.n_layers);
  if (s.kv_group < 1 || s.reindex_every < 1)
    Fail(ErrorKind::kInvalidArgument, "kv_group and reindex_every must be >= 1");
  if (s.n_mtp_layers < 1)
    Fail(ErrorKind::kInvalidArgument, "n_mtp_layers {} must be >= 1 (DSpark blocks)", s.n_mtp_layers);
  const int n = s.n_layers, d0 = 2 + s.n_ratio2;
  if (s.n_dspark_targets < 1 || s.n_dspark_targets > n - d0)
    Fail(ErrorKind::kInvalidArgument, "DSpark target count {} must be in [1, {}]", s.n_dspark_targets, n - d0);
  c->n_layers = n;
  c->n_mtp_layers = s.n_mtp_layers;
  c->compress_ratios.assign(n + s.n_mtp_layers, 0);
  c->kv_source_layers.clear();
  c->index_source_layers.clear();
  for (int i = 2; i < n; ++i) c->compress_ratios[i] = i < d0 ? 2 : 1;
  for (int i = 2; i < d0; i += s.kv_group) {
    c->kv_source_layers.push_back(i);
    c->index_source_layers.push_back(i);
  }
  c->kv_source_layers.push_back(d0);
  for (int i = d0; i < n; i += s.reindex_every) c->index_source_layers.push_back(i);
  c->candidate_source_layer = d0;
  c->dspark_target_layer_ids.clear();
  for (int i = n - s.n_dspark_targets; i < n; ++i) c->dspark_target_layer_ids.push_back(i);
}

TinyConfig PresetConfig(TinyPreset p) {
  TinyConfig c;  // defaults = the golden tiny config
  if (p == TinyPreset::kTiny) return c;
  switch (p) {
    case TinyPreset::kSmall:
      c.dim = 256; c.moe_inter_dim = 512; c.n_heads = 8; c.head_dim = 128; c.q_lora_rank = 256;
      c.o_groups = 2; c.o_lora_rank = 128; c.window_size = 64;
      c.index_n_heads = 4; c.index_topk = 32; c.candidate_topk_blocks = 16; c.candidate_block_size = 4;
      c.n_routed_experts = 64; c.n_activated_experts = 4;
      c.dspark_n_routed_experts = 8; c.dspark_n_activated_experts = 2; c.dspark_markov_rank = 32;
      c.engram_vocab_size = 4096; c.engram_n_heads = 2; c.engram_head_dim = 64;
      break;
    case TinyPreset::kMedium:
      c.dim = 768; c.moe_inter_dim = 512; c.n_heads = 12; c.head_dim = 256; c.q_lora_rank = 512;
      c.o_groups = 4; c.o_lora_rank = 256; c.window_size = 128;
      c.index_n_heads = 8; c.index_topk = 64; c.candidate_topk_blocks = 32; c.candidate_block_size = 8;
      c.n_routed_experts = 64; c.n_activated_experts = 6;
      c.dspark_n_routed_experts = 8; c.dspark_n_activated_experts = 2; c.dspark_markov_rank = 64;
      c.engram_vocab_size = 16384; c.engram_n_heads = 4; c.engram_head_dim = 64;
      break;
    case TinyPreset::kLarge:
      c.dim = 1024; c.moe_inter_dim = 512; c.n_heads = 16; c.head_dim = 512; c.q_lora_rank = 512;
      c.o_groups = 8; c.o_lora_rank = 512; c.window_size = 128;
      c.index_n_heads = 16; c.index_topk = 512; c.candidate_topk_blocks = 2048; c.candidate_block_size = 8;
      c.n_routed_experts = 128; c.n_activated_experts = 6;
      c.dspark_n_routed_experts = 16; c.dspark_n_activated_experts = 3; c.dspark_markov_rank = 128;
      c.dspark_block_size = 5;
      c.engram_vocab_size = 65536; c.engram_n_heads = 4; c.engram_head_dim = 128;
      break;
    case TinyPreset::kTiny: break;
  }
  ApplySchedule(PresetSchedule(p), &c);
  DeriveEngramRows(&c);
  return c;
}

// ============================================================================
// Derived values and validation
// ============================================================================
std::vector<int64_t> EngramBucketPrimes(const TinyConfig& c, int slot) {
  if (slot < 0 || slot >= static_cast<int>(c.engram_layer_ids.size()))
    Fail(ErrorKind::kInvalidArgument, "Engram slot {} out of range", slot);
  std::set<int64_t> used;
  std::vector<int64_t> mine;
  for (int k = 0; k <= slot; ++k) {
    mine.clear();
    for (int n = 2; n <= c.engram_max_ngram_size; ++n) {
      int64_t cursor = c.engram_vocab_size - 1;
      for (int head = 0; head < c.engram_n_heads; ++head) {
        int64_t p = cursor + 1;
        while (!IsPrime(p) || used.count(p)) ++p;
        used.insert(p);
        mine.push_back(p);
        cursor = p;
      }
    }
  }
  return mine;
}

void DeriveEngramRows(TinyConfig* c) {
  c->engram_num_embeddings.clear();
  for (size_t k = 0; k < c->engram_layer_ids.size(); ++k) {
    int64_t rows = 0;
    for (int64_t p : EngramBucketPrimes(*c, static_cast<int>(k))) rows += p;
    c->engram_num_embeddings.push_back(rows);
  }
}

#define BAD(...) Fail(ErrorKind::kInvalidArgument, __VA_ARGS__)
void ValidateConfig(const TinyConfig& c) {
  auto mult32 = [&](const char* what, int64_t v) {
    if (v <= 0 || v % kBlock != 0) BAD("invalid tiny config: {} = {} must be a positive multiple of 32", what, v);
  };
  if (c.vocab_size <= 0) BAD("invalid tiny config: vocab_size = {}", c.vocab_size);
  if (c.n_layers < 1 || c.n_mtp_layers < 1) BAD("invalid tiny config: n_layers {} / n_mtp_layers {} must be >= 1", c.n_layers, c.n_mtp_layers);
  if (c.n_heads < 1 || c.o_groups < 1 || c.hc_mult < 1 || c.index_n_heads < 1)
    BAD("invalid tiny config: n_heads, o_groups, hc_mult, index_n_heads must be >= 1");
  mult32("dim", c.dim);
  mult32("moe_inter_dim", c.moe_inter_dim);
  mult32("q_lora_rank", c.q_lora_rank);
  mult32("head_dim", c.head_dim);
  mult32("index_head_dim", c.index_head_dim);
  mult32("engram_head_dim", c.engram_head_dim);
  mult32("o_groups * o_lora_rank", c.o_groups * c.o_lora_rank);
  if ((c.n_heads * c.head_dim) % c.o_groups != 0)
    BAD("invalid tiny config: n_heads * head_dim = {} not divisible by o_groups = {}", c.n_heads * c.head_dim, c.o_groups);
  mult32("n_heads * head_dim / o_groups", c.n_heads * c.head_dim / c.o_groups);
  if (c.rope_head_dim <= 0 || c.rope_head_dim % 2 != 0 || c.rope_head_dim > c.head_dim ||
      c.rope_head_dim > c.index_head_dim)
    BAD("invalid tiny config: rope_head_dim = {} must be even and <= head_dim and index_head_dim", c.rope_head_dim);
  if (c.n_shared_experts != 1) BAD("invalid tiny config: n_shared_experts = {} (the generator writes exactly 1)", c.n_shared_experts);
  if (c.n_routed_experts < 1 || c.n_activated_experts < 1 || c.n_activated_experts > c.n_routed_experts)
    BAD("invalid tiny config: n_activated_experts = {} must be in [1, n_routed_experts = {}]", c.n_activated_experts, c.n_routed_experts);
  if (c.dspark_n_routed_experts < 1 || c.dspark_n_activated_experts < 1 ||
      c.dspark_n_activated_experts > c.dspark_n_routed_experts)
    BAD("invalid tiny config: dspark_n_activated_experts = {} must be in [1, dspark_n_routed_experts = {}]",
        c.dspark_n_activated_experts, c.dspark_n_routed_experts);
  if (c.vision_n_layers < 0 || c.vision_n_layers > 64) BAD("invalid tiny config: vision_n_layers = {}, expected 0..64", c.vision_n_layers);
  if (c.vision_n_layers > 0 && (c.vision_dim < 2 || c.vision_n_heads < 1 || c.vision_dim % (4 * c.vision_n_heads) != 0 ||
                                c.vision_inter_dim < 1 || c.vision_patch_size < 1 || c.vision_downsample_ratio < 1))
    BAD("invalid tiny config: vision sizes (vision_dim {} must be a multiple of 4·vision_n_heads {}; others >= 1)",
        c.vision_dim, c.vision_n_heads);
  if (c.dtype != "fp8" || c.expert_dtype != "fp4") BAD("invalid tiny config: dtype/expert_dtype must be fp8/fp4");
  if (c.dspark_markov_rank < 1 || c.dspark_block_size < 1) BAD("invalid tiny config: DSpark sizes must be >= 1");

  // Schedule.
  const int n = c.n_layers;
  if (static_cast<int>(c.compress_ratios.size()) != n + c.n_mtp_layers)
    BAD("invalid tiny config: compress_ratios has {} entries, expected n_layers + n_mtp_layers = {}",
        c.compress_ratios.size(), n + c.n_mtp_layers);
  for (int i = 0; i < n + c.n_mtp_layers; ++i) {
    const int r = c.compress_ratios[i];
    if (r < 0 || r > 2) BAD("invalid tiny config: compress_ratios[{}] = {}, expected 0, 1 or 2", i, r);
    if (i >= n && r != 0) BAD("invalid tiny config: compress_ratios[{}] = {} on a DSpark block, expected 0", i, r);
  }
  auto check_list = [&](const char* what, const std::vector<int>& v) {
    for (size_t k = 0; k < v.size(); ++k) {
      if (v[k] < 0 || v[k] >= n) BAD("invalid tiny config: {} holds {}, outside [0, {})", what, v[k], n);
      if (k && v[k] <= v[k - 1]) BAD("invalid tiny config: {} must be strictly increasing", what);
    }
  };
  check_list("kv_source_layers", c.kv_source_layers);
  check_list("index_source_layers", c.index_source_layers);
  check_list("engram_layer_ids", c.engram_layer_ids);
  check_list("dspark_target_layer_ids", c.dspark_target_layer_ids);
  if (c.dspark_target_layer_ids.empty()) BAD("invalid tiny config: dspark_target_layer_ids is empty");
  for (int l : c.kv_source_layers) {
    if (c.compress_ratios[l] == 0) BAD("invalid tiny config: KV source layer {} has compress ratio 0", l);
    if (!Contains(c.index_source_layers, l)) BAD("invalid tiny config: KV source layer {} is not an index source", l);
  }
  for (int l : c.index_source_layers)
    if (c.compress_ratios[l] == 0) BAD("invalid tiny config: index source layer {} has compress ratio 0", l);
  for (int i = 0; i < n; ++i) {
    const int r = c.compress_ratios[i];
    if (r == 0) continue;
    int kv = -1;
    for (int l : c.kv_source_layers)
      if (l <= i) kv = l;
    if (kv < 0) BAD("invalid tiny config: layer {} (ratio {}) has no preceding KV source", i, r);
    if (c.compress_ratios[kv] != r)
      BAD("invalid tiny config: layer {} (ratio {}) would read KV source {} of ratio {}", i, r, kv, c.compress_ratios[kv]);
    if (Contains(c.index_source_layers, i) && !Contains(c.kv_source_layers, i)) {  // Reindex
      if (c.candidate_source_layer < 0 || c.candidate_source_layer > i || c.candidate_source_layer < kv)
        BAD("invalid tiny config: Reindex layer {} needs the candidate source (layer {}) to be the KV source it "
            "reads ({}) or later", i, c.candidate_source_layer, kv);
    }
  }
  if (c.candidate_source_layer < 0 || c.candidate_source_layer >= n ||
      !Contains(c.kv_source_layers, c.candidate_source_layer))
    BAD("invalid tiny config: candidate_source_layer = {} must be a KV source layer", c.candidate_source_layer);
  if (c.candidate_topk_blocks < 1 || c.candidate_block_size < 1 || c.index_topk < 1)
    BAD("invalid tiny config: candidate_topk_blocks, candidate_block_size, index_topk must be >= 1");
  if (static_cast<int64_t>(c.candidate_topk_blocks) * c.candidate_block_size - (c.candidate_block_size - 1) <
      c.index_topk)
    BAD("invalid tiny config: candidate constraint violated: {}·{} − ({} − 1) < index_topk = {}",
        c.candidate_topk_blocks, c.candidate_block_size, c.candidate_block_size, c.index_topk);
  if (c.window_size < 1) BAD("invalid tiny config: window_size = {}", c.window_size);

  // Engram.
  if (c.engram_max_ngram_size < 2 || c.engram_n_heads < 1 || c.engram_vocab_size < 2)
    BAD("invalid tiny config: Engram needs max_ngram_size >= 2, n_heads >= 1, vocab_size >= 2");
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
    BAD("invalid tiny config: engram_num_embeddings has {} entries, engram_layer_ids {}",
        c.engram_num_embeddings.size(), c.engram_layer_ids.size());
  for (size_t k = 0; k < c.engram_layer_ids.size(); ++k) {
    int64_t rows = 0;
    for (int64_t p : EngramBucketPrimes(c, static_cast<int>(k))) rows += p;
    if (rows != c.engram_num_embeddings[k])
      BAD("invalid tiny config: engram_num_embeddings[{}] = {}, expected the sum of its bucket primes {}", k,
          c.engram_num_embeddings[k], rows);
  }
  mult32("(engram_max_ngram_size - 1) * engram_n_heads * engram_head_dim",
         (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim);
  mult32("dim * (hc_mult + 1)", c.dim * (c.hc_mult + 1));
  mult32("index_n_heads * index_head_dim", c.index_n_heads * c.index_head_dim);
}

#undef BAD

// ============================================================================
// Value rule, plan, layout
// ============================================================================
double LinearAmp(int64_t in_features) {
  int k = 0;
  int64_t p = 1;
  while (p < in_features) { p *= 4; ++k; }
  return std::ldexp(1.0, 1 - k);
}

std::vector<PlannedTensor> PlanTensors(const TinyConfig& c) {
  Planner p(c);
  p.Full();
  PlanVisionTensors(c, &p.items);
  return std::move(p.items);
}

uint64_t WeightBytes(const PlannedTensor& t) {
  const uint64_t n = static_cast<uint64_t>(Numel(t.shape));
  switch (t.kind) {
    case TinyKind::kBf16: return 2 * n;
    case TinyKind::kF32: return 4 * n;
    case TinyKind::kFp8Block:
    case TinyKind::kFp8Block128:
    case TinyKind::kEngramRows: return n;
    case TinyKind::kFp4Rows: return n / 2;
    case TinyKind::kTid2eid: return 8 * n;
  }
  return 0;
}

uint64_t ScaleBytes(const PlannedTensor& t) {
  if (!IsQuantised(t.kind)) return 0;
  return static_cast<uint64_t>(Numel(ScaleShape(t)));
}

Layout BuildLayout(const std::vector<PlannedTensor>& plan) {
  Layout L;
  for (size_t p = 0; p < plan.size(); ++p) {
    const PlannedTensor& t = plan[p];
    DI_CHECK(t.shape.size() == 1 || t.shape.size() == 2);
    if (IsQuantised(t.kind)) {
      DI_CHECK(t.shape.size() == 2 && t.shape[1] % kBlock == 0);
      DI_CHECK(t.kind != TinyKind::kFp8Block || t.shape[0] % kBlock == 0);
      DI_CHECK(t.kind != TinyKind::kFp8Block128 || (t.shape[0] % 128 == 0 && t.shape[1] % 128 == 0));
    }
    if (t.kind == TinyKind::kTid2eid) {
      DI_CHECK(t.shape.size() == 2 && t.shape[1] >= 1 && t.shape[1] <= t.tid2eid_experts && t.tid2eid_experts >= 2);
    }
    FileTensor w;
    w.name = t.name;
    w.dtype = std::string(DTypeName(WeightDType(t.kind)));
    w.shape = StoredShape(t);
    w.end = WeightBytes(t);
    w.plan_index = static_cast<int>(p);
    L.tensors.push_back(std::move(w));
    if (IsQuantised(t.kind)) {
      FileTensor s;
      s.name = ScaleName(t.name);
      s.dtype = std::string(DTypeName(DType::kF8E8M0));
      s.shape = ScaleShape(t);
      s.end = ScaleBytes(t);
      s.plan_index = static_cast<int>(p);
      s.is_scale = true;
      L.tensors.push_back(std::move(s));
    }
  }
  std::sort(L.tensors.begin(), L.tensors.end(),
            [](const FileTensor& a, const FileTensor& b) { return a.name < b.name; });
  for (size_t k = 1; k < L.tensors.size(); ++k)
    if (L.tensors[k].name == L.tensors[k - 1].name)
      Fail(ErrorKind::kInternal, "make-tiny: duplicate tensor name {}", L.tensors[k].name);
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t off = 0;
  for (FileTensor& ft : L.tensors) {
    const uint64_t n = ft.end;
    ft.begin = off;
    ft.end = off + n;
    off += n;
    header += ",\"" + ft.name + "\":{\"dtype\":\"" + ft.dtype + "\",\"shape\":" + ShapeList(ft.shape, ",") +
              ",\"data_offsets\":[" + std::to_string(ft.begin) + "," + std::to_string(ft.end) + "]}";
    L.n_params += ft.dtype == "I8" ? 2 * n : static_cast<uint64_t>(Numel(ft.shape));
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  L.header = std::move(header);
  L.data_bytes = off;
  return L;
}

void EncodeTensor(const PlannedTensor& t, uint8_t* data, uint8_t* scale) {
  const uint64_t h = Fnv1a64(t.name);
  std::vector<float> scratch;
  bool ok = true;
  switch (t.kind) {
    case TinyKind::kBf16:
    case TinyKind::kF32: EncodeElems(t, h, 0, Numel(t.shape), data); break;
    case TinyKind::kFp8Block:
    case TinyKind::kFp8Block128:
      scratch.resize(static_cast<size_t>(FpBlock(t.kind) * t.shape[1]));
      ok = EncodeFp8Strips(t, h, 0, t.shape[0] / FpBlock(t.kind), data, scale, scratch.data());
      break;
    case TinyKind::kTid2eid: EncodeTid2eid(t, h, 0, t.shape[0], data); break;
    case TinyKind::kEngramRows:
    case TinyKind::kFp4Rows:
      scratch.resize(static_cast<size_t>(t.shape[1]));
      ok = EncodeRows(t, h, 0, t.shape[0], data, scale, scratch.data());
      break;
  }
  if (!ok) Fail(ErrorKind::kInternal, "make-tiny: {}: a group's amax is too small for the UE8M0 rule", t.name);
}

// ============================================================================
// The index and the plan listing
// ============================================================================
std::string IndexJson(const Layout& layout) {
  // json.dumps(..., indent=2, sort_keys=True): "metadata" < "weight_map"; the
  // names are already in sorted (code point) order.
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(layout.data_bytes) +
                    "\n  },\n  \"weight_map\": {\n";
  for (size_t k = 0; k < layout.tensors.size(); ++k) {
    out += "    ";
    EmitString(layout.tensors[k].name, &out);
    out += ": \"model.safetensors\"";
    out += k + 1 < layout.tensors.size() ? ",\n" : "\n";
  }
  out += "  }\n}\n";
  return out;
}

std::string TensorListTsv(const TinyConfig& c) { return PlanListTsv(PlanTensors(c)); }

std::string PlanListTsv(const std::vector<PlannedTensor>& plan) {
  const Layout L = BuildLayout(plan);
  std::string out = "tensor\tdtype\tshape\tvalues_from\tlogical_shape\tcenter\tamp\tencoding\n";
  for (const FileTensor& ft : L.tensors) {
    const PlannedTensor& t = plan[ft.plan_index];
    std::string enc;
    if (ft.is_scale) {
      enc = "ue8m0 scale of " + t.name;
    } else {
      switch (t.kind) {
        case TinyKind::kBf16: enc = "bf16"; break;
        case TinyKind::kF32: enc = "f32"; break;
        case TinyKind::kFp8Block: enc = "fp8_block32x32"; break;
        case TinyKind::kEngramRows: enc = "fp8_row_group32"; break;
        case TinyKind::kFp4Rows: enc = "fp4_e2m1_group32_packed"; break;
        case TinyKind::kFp8Block128: enc = "fp8_block128x128"; break;
        case TinyKind::kTid2eid: enc = "tid2eid_hash"; break;
      }
    }
    out += ft.name + "\t" + ft.dtype + "\t" + ShapeList(ft.shape, ", ") + "\t" + t.name + "\t" +
           ShapeList(t.shape, ", ") + "\t" + PyFloatRepr(t.center) + "\t" + PyFloatRepr(t.amp) + "\t" + enc + "\n";
  }
  return out;
}

// ============================================================================
// Writing
// ============================================================================
void WriteTokenizerFiles(const TinyConfig& c, const std::filesystem::path& src_dir,
                         const std::filesystem::path& out_dir) {
  if (src_dir.empty()) return;
  WriteTinyTokenizerFiles(src_dir, out_dir, c.vocab_size);
}

WriteResult WritePlannedCheckpoint(const std::vector<PlannedTensor>& plan, std::string_view hf_config,
                                   std::string_view inference_config, int64_t vocab_size,
                                   const std::filesystem::path& out_dir, const WriteOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    if (!fs::is_directory(out_dir, ec))
      Fail(ErrorKind::kInvalidArgument, "{} exists and is not a directory", out_dir.string());
    if (!fs::is_empty(out_dir, ec) && !opts.force)
      Fail(ErrorKind::kInvalidArgument, "{} is not empty; refusing to overwrite (use --force)", out_dir.string());
  }
  fs::create_directories(out_dir / "inference", ec);
  if (ec) Fail(ErrorKind::kInvalidArgument, "cannot create {}: {}", (out_dir / "inference").string(), ec.message());

  WriteResult res;
  res.layout = BuildLayout(plan);
  const auto tw = std::chrono::steady_clock::now();
  WriteSafetensors(plan, res.layout, out_dir / "model.safetensors");
  res.weights_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tw).count();
  WriteWholeFile(out_dir / "model.safetensors.index.json", IndexJson(res.layout));
  WriteWholeFile(out_dir / "config.json", hf_config);
  WriteWholeFile(out_dir / "inference" / "config.json", inference_config);
  if (!opts.tokenizer_src_dir.empty()) WriteTinyTokenizerFiles(opts.tokenizer_src_dir, out_dir, vocab_size);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

WriteResult WriteTinyCheckpoint(const TinyConfig& c, const std::filesystem::path& out_dir,
                                const WriteOptions& opts) {
  ValidateConfig(c);
  return WritePlannedCheckpoint(PlanTensors(c), HfConfigJson(c), InferenceConfigJson(c), c.vocab_size, out_dir,
                                opts);
}

}  // namespace deepinfer::tiny
