// Checkpoint tensor inventory (model-spec §2.3, §2.4) and validation.
#include "model/tensor_plan.h"

#include <algorithm>
#include <string_view>

#include "base/error.h"
#include "format/safetensors.h"

namespace deepinfer {

const char* TensorRoleName(TensorRole r) {
  switch (r) {
    case TensorRole::kBf16: return "bf16";
    case TensorRole::kF32: return "f32";
    case TensorRole::kFp8Weight: return "fp8_weight";
    case TensorRole::kFp8Scale: return "fp8_scale";
    case TensorRole::kFp4Weight: return "fp4_weight";
    case TensorRole::kFp4Scale: return "fp4_scale";
    case TensorRole::kEngramTable: return "engram_table";
    case TensorRole::kEngramScale: return "engram_scale";
    case TensorRole::kI64: return "i64";
  }
  return "?";
}

int64_t ExpectedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
int64_t ExpectedTensor::params() const {
  return role == TensorRole::kFp4Weight ? 2 * numel() : numel();
}
uint64_t ExpectedTensor::nbytes() const {
  return static_cast<uint64_t>(numel()) * static_cast<uint64_t>(DTypeSize(dtype));
}

namespace {

constexpr int64_t kFp4Group = 32;  // FP4 expert scale group along `in` (both versions)
constexpr int64_t kMaxTensorElements = int64_t{1} << 46;  // 64 Ti elements
constexpr int64_t kMaxTotalElements = int64_t{1} << 52;  // releases: < 2^40
constexpr int64_t kMaxTensors = 2'000'000;               // releases: < 100k

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Planner {
 public:
  explicit Planner(const ModelConfig& c) : B_(c.weight_block_size) {}

  void Bf16(const std::string& name, std::vector<int64_t> shape) {
    Add(name, DType::kBF16, shape, TensorRole::kBf16, shape);
  }
  void F32(const std::string& name, std::vector<int64_t> shape) {
    Add(name, DType::kF32, shape, TensorRole::kF32, shape);
  }
  // FP8 block-quantised linear `base` ("...wq_a"): base.weight + base.scale.
  void Fp8(const std::string& base, int64_t out, int64_t in) {
    Add(base + ".weight", DType::kF8E4M3, {out, in}, TensorRole::kFp8Weight, {out, in});
    Add(base + ".scale", DType::kF8E8M0, {CeilDiv(out, B_), CeilDiv(in, B_)},
        TensorRole::kFp8Scale, {out, in});
  }
  // FP4 routed-expert linear.
  void Fp4(const std::string& base, int64_t out, int64_t in) {
    if (in % kFp4Group != 0)
      Fail(ErrorKind::kInvalidArgument,
           "tensor {}.weight: FP4 expert input dim {} is not a multiple of {} (scale groups)",
           base, in, kFp4Group);
    Add(base + ".weight", DType::kI8, {out, in / 2}, TensorRole::kFp4Weight, {out, in});
    Add(base + ".scale", DType::kF8E8M0, {out, in / kFp4Group}, TensorRole::kFp4Scale, {out, in});
  }
  void Engram(const std::string& base, int64_t rows, int64_t hd) {
    Add(base + ".weight", DType::kF8E4M3, {rows, hd}, TensorRole::kEngramTable, {rows, hd});
    Add(base + ".scale", DType::kF8E8M0, {rows, hd / B_}, TensorRole::kEngramScale, {rows, hd});
  }
  void I64(const std::string& name, std::vector<int64_t> shape) {
    Add(name, DType::kI64, shape, TensorRole::kI64, shape);
  }

  std::vector<ExpectedTensor> Take() {
    std::sort(out_.begin(), out_.end(),
              [](const ExpectedTensor& a, const ExpectedTensor& b) { return a.name < b.name; });
    for (size_t i = 1; i < out_.size(); ++i)
      if (out_[i].name == out_[i - 1].name)
        Fail(ErrorKind::kInternal, "tensor plan lists {} twice", out_[i].name);
    return std::move(out_);
  }

 private:
  void Add(const std::string& name, DType dt, std::vector<int64_t> shape, TensorRole role,
           std::vector<int64_t> logical) {
    // Config values are individually bounded, but their products need not be:
    // refuse tensors no machine could hold rather than overflow.
    int64_t n = 1;
    for (int64_t d : logical) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxTensorElements)
        Fail(ErrorKind::kInvalidArgument,
             "config.json implies tensor {} of shape {}, more than {} elements", name,
             ShapeString(logical), kMaxTensorElements);
    }
    total_elements_ += n;
    if (total_elements_ > kMaxTotalElements)
      Fail(ErrorKind::kInvalidArgument,
           "config.json implies more than {} parameters in total (at tensor {})",
           kMaxTotalElements, name);
    ExpectedTensor t;
    t.name = name;
    t.dtype = dt;
    t.shape = std::move(shape);
    t.role = role;
    t.logical_shape = std::move(logical);
    out_.push_back(std::move(t));
  }
  int64_t B_;
  int64_t total_elements_ = 0;
  std::vector<ExpectedTensor> out_;
};

// Tensors every block has (model-spec §2.3/§2.4 "all" rows), both versions.
void CommonBlock(Planner& p, const ModelConfig& c, const std::string& pre) {
  const int64_t d = c.dim, hd = c.head_dim, nh = c.n_heads, hc = c.hc_mult;
  const int64_t mix = c.hc_mix_dim();
  p.Bf16(pre + "attn_norm.weight", {d});
  p.Bf16(pre + "ffn_norm.weight", {d});
  for (const char* site : {"attn", "ffn"}) {
    p.F32(pre + "hc_" + site + "_fn", {mix, hc * d});
    p.F32(pre + "hc_" + site + "_base", {mix});
    p.F32(pre + "hc_" + site + "_scale", {3});
  }
  const std::string a = pre + "attn.";
  p.Fp8(a + "wq_a", c.q_lora_rank, d);
  p.Bf16(a + "q_norm.weight", {c.q_lora_rank});
  p.Fp8(a + "wq_b", nh * hd, c.q_lora_rank);
  p.Fp8(a + "wkv", hd, d);
  p.Bf16(a + "kv_norm.weight", {hd});
  p.Fp8(a + "wo_a", c.o_groups * c.o_lora_rank, nh * hd / c.o_groups);
  p.Fp8(a + "wo_b", d, c.o_groups * c.o_lora_rank);
  p.F32(a + "attn_sink", {nh});
}

void Experts(Planner& p, const ModelConfig& c, const std::string& f, int n_experts) {
  const int64_t d = c.dim, inter = c.moe_inter_dim;
  for (int e = 0; e < n_experts; ++e) {
    const std::string x = f + "experts." + std::to_string(e) + ".";
    p.Fp4(x + "w1", inter, d);
    p.Fp4(x + "w2", d, inter);
    p.Fp4(x + "w3", inter, d);
  }
  p.Fp8(f + "shared_experts.w1", inter, d);
  p.Fp8(f + "shared_experts.w2", d, inter);
  p.Fp8(f + "shared_experts.w3", inter, d);
}

void PlanV41(Planner& p, const ModelConfig& c) {
  const int64_t d = c.dim, v = c.vocab_size, hd = c.head_dim, hc = c.hc_mult;
  p.Bf16("embed.weight", {v, d});
  p.Bf16("head.weight", {v, d});
  p.Bf16("norm.weight", {d});
  for (const LayerSchedule& L : c.layers) {
    const std::string pre =
        L.is_mtp ? "mtp." + std::to_string(L.layer - c.n_layers) + "." :
                   "layers." + std::to_string(L.layer) + ".";
    CommonBlock(p, c, pre);
    const std::string a = pre + "attn.";
    if (L.kv_source) {
      p.Bf16(a + "compressor.wkv.weight", {hd, d});
      if (L.compress_ratio > 1) p.Bf16(a + "compressor.wgate.weight", {hd, d});
      p.Bf16(a + "compressor.norm.weight", {hd});
      p.Bf16(a + "indexer.wk.weight", {c.index_head_dim, hd});
      p.Bf16(a + "indexer.k_norm.weight", {c.index_head_dim});
    }
    if (L.index_source) {
      p.Fp8(a + "indexer.wq_b", static_cast<int64_t>(c.index_n_heads) * c.index_head_dim,
            c.q_lora_rank);
      p.Bf16(a + "indexer.weights_proj.weight", {c.index_n_heads, d});
    }
    const int n_exp = L.is_mtp ? c.dspark_n_routed_experts : c.n_routed_experts;
    const std::string f = pre + "ffn.";
    p.Bf16(f + "gate.weight", {n_exp, d});
    p.F32(f + "gate.bias", {n_exp});
    p.F32(f + "gate.bias_vl", {n_exp});
    Experts(p, c, f, n_exp);
    if (L.engram_slot >= 0) {
      const std::string g = pre + "engram.";
      const int64_t cols =
          static_cast<int64_t>(c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim;
      p.Engram(g + "embed", c.engram_num_embeddings[L.engram_slot], c.engram_head_dim);
      p.Fp8(g + "wkv", d * (hc + 1), cols);
      p.Bf16(g + "q_weight", {hc, d});
      p.Bf16(g + "k_weight", {hc, d});
    }
    if (L.is_mtp) {
      const int s = L.layer - c.n_layers;
      if (s == 0) {
        p.Fp8(pre + "main_proj", d, d * static_cast<int64_t>(c.dspark_target_layer_ids.size()));
        p.Bf16(pre + "main_norm.weight", {d});
      }
      if (s == c.n_mtp_layers - 1) {
        const int64_t r = c.dspark_markov_rank;
        p.Bf16(pre + "norm.weight", {d});
        p.Bf16(pre + "markov_head.embed.weight", {v, r});
        p.Bf16(pre + "markov_head.head.weight", {v, r});
        p.Bf16(pre + "confidence_head.proj.weight", {1, d + r});
      }
    }
  }
  if (c.vision_n_layers > 0) {
    // model-spec §2.4 "Vision" (all BF16).
    const int64_t vd = c.vision_dim, vi = c.vision_inter_dim, ps = c.vision_patch_size;
    const int64_t ds = c.vision_downsample_ratio;
    p.Bf16("vision.patch_embed.proj.weight", {vd, 3 * ps * ps});
    p.Bf16("vision.patch_embed.proj.bias", {vd});
    for (int b = 0; b < c.vision_n_layers; ++b) {
      const std::string x = "vision.blocks." + std::to_string(b) + ".";
      p.Bf16(x + "norm1.weight", {vd});
      p.Bf16(x + "attn.wqkv.weight", {3 * vd, vd});
      p.Bf16(x + "attn.wqkv.bias", {3 * vd});
      p.Bf16(x + "attn.wo.weight", {vd, vd});
      p.Bf16(x + "attn.wo.bias", {vd});
      p.Bf16(x + "norm2.weight", {vd});
      p.Bf16(x + "mlp.w1.weight", {2 * vi, vd});
      p.Bf16(x + "mlp.w2.weight", {vd, vi});
    }
    p.Bf16("vision.norm.weight", {vd});
    p.Bf16("aligner.w1.weight", {d, vd * ds * ds});
    p.Bf16("aligner.w1.bias", {d});
    p.Bf16("aligner.w2.weight", {d, d});
    p.Bf16("aligner.w2.bias", {d});
    p.Bf16("image_start", {d});
    p.Bf16("image_end", {d});
    p.Bf16("image_newline", {d});
  }
}

void PlanV4(Planner& p, const ModelConfig& c) {
  const int64_t d = c.dim, v = c.vocab_size, hd = c.head_dim, hc = c.hc_mult;
  p.Bf16("embed.weight", {v, d});
  p.Bf16("head.weight", {v, d});
  p.Bf16("norm.weight", {d});
  p.F32("hc_head_fn", {hc, hc * d});
  p.F32("hc_head_base", {hc});
  p.F32("hc_head_scale", {1});
  for (const LayerSchedule& L : c.layers) {
    const std::string pre =
        L.is_mtp ? "mtp." + std::to_string(L.layer - c.n_layers) + "." :
                   "layers." + std::to_string(L.layer) + ".";
    CommonBlock(p, c, pre);
    const std::string a = pre + "attn.";
    if (L.compress_ratio > 0) {
      const int64_t coff = L.compress_ratio == 4 ? 2 : 1;  // C4 overlap: double width
      p.F32(a + "compressor.ape", {L.compress_ratio, coff * hd});
      p.Bf16(a + "compressor.wkv.weight", {coff * hd, d});
      p.Bf16(a + "compressor.wgate.weight", {coff * hd, d});
      p.Bf16(a + "compressor.norm.weight", {hd});
    }
    if (L.compress_ratio == 4) {
      const int64_t ihd = c.index_head_dim;
      p.Fp8(a + "indexer.wq_b", static_cast<int64_t>(c.index_n_heads) * ihd, c.q_lora_rank);
      p.Bf16(a + "indexer.weights_proj.weight", {c.index_n_heads, d});
      p.F32(a + "indexer.compressor.ape", {4, 2 * ihd});
      p.Bf16(a + "indexer.compressor.wkv.weight", {2 * ihd, d});
      p.Bf16(a + "indexer.compressor.wgate.weight", {2 * ihd, d});
      p.Bf16(a + "indexer.compressor.norm.weight", {ihd});
    }
    const std::string f = pre + "ffn.";
    p.Bf16(f + "gate.weight", {c.n_routed_experts, d});
    if (L.hash_routed) {
      p.I64(f + "gate.tid2eid", {v, c.n_activated_experts});
    } else {
      p.F32(f + "gate.bias", {c.n_routed_experts});
    }
    Experts(p, c, f, c.n_routed_experts);
    if (L.is_mtp) {
      p.Fp8(pre + "e_proj", d, d);
      p.Fp8(pre + "h_proj", d, d);
      p.Bf16(pre + "enorm.weight", {d});
      p.Bf16(pre + "hnorm.weight", {d});
      p.Bf16(pre + "norm.weight", {d});
      p.F32(pre + "hc_head_fn", {hc, hc * d});
      p.F32(pre + "hc_head_base", {hc});
      p.F32(pre + "hc_head_scale", {1});
    }
  }
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  if (c.expert_dtype != "fp4")
    Fail(ErrorKind::kInvalidArgument,
         "config.json: expert_dtype \"{}\": only \"fp4\" routed experts have a known checkpoint "
         "layout (I8 packed E2M1 + F8_E8M0 scales)",
         c.expert_dtype);
  if (c.weight_block_size <= 0)
    Fail(ErrorKind::kInvalidArgument, "config: weight_block_size {} must be positive",
         c.weight_block_size);
  if (c.layers.size() != static_cast<size_t>(c.n_layers + c.n_mtp_layers))
    Fail(ErrorKind::kInternal, "tensor plan: config has {} layer schedule entries, expected {}",
         c.layers.size(), c.n_layers + c.n_mtp_layers);
  // Rough upper bound of the tensor count before building any names.
  const int64_t per_block =
      64 + 6 * static_cast<int64_t>(std::max(c.n_routed_experts, c.dspark_n_routed_experts));
  const int64_t estimate = static_cast<int64_t>(c.layers.size()) * per_block +
                           8 * static_cast<int64_t>(c.vision_n_layers) + 64;
  if (estimate > kMaxTensors)
    Fail(ErrorKind::kInvalidArgument,
         "config.json implies about {} tensors ({} blocks x {} experts), more than {}", estimate,
         c.layers.size(), std::max(c.n_routed_experts, c.dspark_n_routed_experts), kMaxTensors);
  Planner p(c);
  if (c.arch == Arch::kDeepseekV41) {
    PlanV41(p, c);
  } else {
    PlanV4(p, c);
  }
  return p.Take();
}

TensorStats SummarizeTensors(const std::vector<ExpectedTensor>& tensors) {
  TensorStats s;
  for (const ExpectedTensor& t : tensors) {
    s.n_tensors += 1;
    s.params += t.params();
    if (t.role == TensorRole::kFp8Scale || t.role == TensorRole::kFp4Scale ||
        t.role == TensorRole::kEngramScale)
      s.scale_params += t.params();
    s.bytes += t.nbytes();
    s.bytes_by_dtype[t.dtype] += t.nbytes();
    s.tensors_by_dtype[t.dtype] += 1;
    s.bytes_by_role[t.role] += t.nbytes();
  }
  return s;
}

bool IsToleratedExtraTensor(const ModelConfig& c, const std::string& name) {
  if (c.arch == Arch::kDeepseekV41 && c.vision_n_layers == 0) {
    if (StartsWith(name, "vision.") || StartsWith(name, "aligner.") || name == "image_start" ||
        name == "image_end" || name == "image_newline")
      return true;
  }
  // mtp.{i}.embed.weight / mtp.{i}.head.weight
  if (StartsWith(name, "mtp.")) {
    size_t i = 4, j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j > i && j < name.size() && name[j] == '.') {
      std::string_view rest = std::string_view(name).substr(j + 1);
      if (rest == "embed.weight" || rest == "head.weight") return true;
    }
  }
  return false;
}

ValidationReport ValidateCheckpoint(const ModelConfig& config, const TensorStore& store) {
  const std::vector<ExpectedTensor> plan = ExpectedTensors(config);
  const std::string dir = PrintableName(store.dir().string());
  std::vector<std::pair<ErrorKind, std::string>> missing, mismatched, unexpected;
  ValidationReport report;

  for (const ExpectedTensor& e : plan) {
    const TensorView* t = store.Find(e.name);
    if (!t) {
      missing.emplace_back(ErrorKind::kNotFound,
                           fmt::format("{}: missing tensor {}: expected dtype {} shape {} ({})",
                                       dir, e.name, DTypeName(e.dtype), ShapeString(e.shape),
                                       TensorRoleName(e.role)));
      continue;
    }
    if (t->dtype != e.dtype || t->shape != e.shape) {
      mismatched.emplace_back(
          ErrorKind::kCorruptData,
          fmt::format("{}: tensor {}: expected dtype {} shape {}, found {} {}",
                      PrintableName(t->file), e.name, DTypeName(e.dtype), ShapeString(e.shape),
                      DTypeName(t->dtype), ShapeString(t->shape)));
      continue;
    }
    report.n_checked += 1;
  }
  // Both lists are sorted by name: merge to find extras.
  auto pit = plan.begin();
  for (const auto& [name, t] : store.all()) {
    while (pit != plan.end() && pit->name < name) ++pit;
    if (pit != plan.end() && pit->name == name) continue;
    if (IsToleratedExtraTensor(config, name)) {
      report.ignored.push_back(name);
      continue;
    }
    unexpected.emplace_back(
        ErrorKind::kCorruptData,
        fmt::format("{}: unexpected tensor {}: {} {} is not part of a {} checkpoint for this "
                    "config.json",
                    PrintableName(t.file), PrintableName(name), DTypeName(t.dtype),
                    ShapeString(t.shape), ArchName(config.arch)));
  }
  const size_t total = missing.size() + mismatched.size() + unexpected.size();
  if (total == 0) return report;
  const auto& first = !missing.empty() ? missing.front()
                      : !mismatched.empty() ? mismatched.front()
                                            : unexpected.front();
  std::string msg = first.second;
  if (total > 1)
    msg += fmt::format(" (and {} more problems: {} missing, {} wrong dtype/shape, {} unexpected)",
                       total - 1, missing.size(), mismatched.size(), unexpected.size());
  throw Error(first.first, msg);
}

}  // namespace deepinfer
