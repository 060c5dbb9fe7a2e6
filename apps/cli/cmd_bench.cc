// deepinfer bench kernels --json OUT [--png PNG] [--threads N] [--reps N] [--quick]
// deepinfer bench e2e --model DIR --json OUT ...            (bench_e2e.cc)
//
// `bench kernels` measures, in one run on this machine:
//   * the machine limit: STREAM-style copy / triad bandwidth (and a read-only
//     pass), `triad_gbps` at the top level of the JSON;
//   * GEMV (decode, M = 1) GB/s of the fast kernels per weight format at
//     DeepSeek-V4.1-Flash decode shapes, each as `fraction_of_triad`; the
//     weights of one case are repacked into enough distinct copies (>= 8× the
//     L3 size, >= 512 MiB) that every call streams them from DRAM, as decode
//     does layer after layer; the scalar reference ops are timed on two shapes
//     for comparison;
//   * GEMM (prefill, M = 64 … 2048) GFLOP/s of the fast kernels against
//     OpenBLAS `cblas_sgemm` on the dequantised FP32 weights, same shapes and
//     threads, each as `fraction_of_sgemm`.
// Every number is the median of --reps timed passes (the per-pass samples are
// in the JSON). A PNG plot (gnuplot) is written next to the JSON unless
// --png says otherwise. Errors print one line and exit with status 2.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "bench_util.h"
#include "commands.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/membw.h"
#include "kernels/ref/ref_ops.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);

namespace deepinfer::cli {
namespace bench {

using nlohmann::json;
namespace fs = std::filesystem;

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}

bool CpuFlag(const std::string& flag) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) return (" " + line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

int64_t L3Bytes() {
  const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return v > 0 ? v : int64_t{32} << 20;
}

// Fast deterministic fill (splitmix64).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float Unit() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

// Gaussian weights quantised as the checkpoints are (E4M3 with a UE8M0 scale
// per 32×32 block, amax/448 rounded up to a power of two), so the code
// distribution — and how rarely codes are subnormal — resembles a real model.
void QuantizedFp8(int64_t N, int64_t K, uint64_t seed, std::vector<uint8_t>* w, std::vector<uint8_t>* s) {
  Rng r(seed);
  std::vector<float> v(N * K);
  for (auto& x : v) {  // Box-Muller
    const double u1 = (r.Next() >> 11) * 0x1p-53 + 0x1p-60, u2 = (r.Next() >> 11) * 0x1p-53;
    x = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  const int64_t sr = (N + 31) / 32, sc = (K + 31) / 32;
  w->assign(N * K, 0);
  s->assign(sr * sc, 127);
  for (int64_t bn = 0; bn < sr; ++bn)
    for (int64_t bk = 0; bk < sc; ++bk) {
      float amax = 0;
      for (int64_t n = bn * 32; n < std::min(N, bn * 32 + 32); ++n)
        for (int64_t k = bk * 32; k < std::min(K, bk * 32 + 32); ++k) amax = std::max(amax, std::fabs(v[n * K + k]));
      const uint8_t sb = Pow2CeilE8M0(std::max(amax, 1e-30f) * kInv448);
      (*s)[bn * sc + bk] = sb;
      const float scale = E8M0ToFloat(sb);
      for (int64_t n = bn * 32; n < std::min(N, bn * 32 + 32); ++n)
        for (int64_t k = bk * 32; k < std::min(K, bk * 32 + 32); ++k)
          (*w)[n * K + k] = FloatToE4M3(v[n * K + k] / scale);
    }
}

// Gaussian weights as FP4 experts: E2M1 with a UE8M0 scale per row and 32.
void QuantizedFp4(int64_t N, int64_t K, uint64_t seed, std::vector<uint8_t>* w, std::vector<uint8_t>* s) {
  Rng r(seed);
  w->assign(N * K / 2, 0);
  s->assign(N * (K / 32), 127);
  std::vector<float> g(32);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K / 32; ++b) {
      float amax = 0;
      for (auto& x : g) {
        const double u1 = (r.Next() >> 11) * 0x1p-53 + 0x1p-60, u2 = (r.Next() >> 11) * 0x1p-53;
        x = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
        amax = std::max(amax, std::fabs(x));
      }
      const uint8_t sb = Pow2CeilE8M0(amax * kInv6);
      (*s)[n * (K / 32) + b] = sb;
      const float scale = E8M0ToFloat(sb);
      for (int i = 0; i < 32; ++i) {
        const int64_t k = b * 32 + i;
        const uint8_t c = FloatToE2M1(g[i] / scale);
        (*w)[n * (K / 2) + k / 2] |= static_cast<uint8_t>((k & 1) ? c << 4 : c);
      }
    }
}

std::vector<uint16_t> Bf16Values(int64_t n, uint64_t seed, float amp) {
  std::vector<uint16_t> w(n);
  Rng r(seed);
  for (auto& v : w) v = FloatToBf16((2.0f * r.Unit() - 1.0f) * amp);
  return w;
}
std::vector<float> Acts(int64_t n, uint64_t seed) {
  std::vector<float> x(n);
  Rng r(seed);
  for (auto& v : x) v = RoundBf16((2.0f * r.Unit() - 1.0f) * 4.0f);
  return x;
}

}  // namespace

json MachineJson(int threads) {
  json j;
  j["cpu"] = CpuModel();
  j["hardware_threads"] = std::thread::hardware_concurrency();
  j["threads"] = threads;
  j["dispatch_target"] = cpu::ActiveTarget();
  j["avx512_bf16"] = CpuFlag("avx512_bf16");
  j["avx512_vnni"] = CpuFlag("avx512_vnni");
  j["l2_bytes"] = sysconf(_SC_LEVEL2_CACHE_SIZE);
  j["l3_bytes"] = L3Bytes();
  const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
  j["memory_bytes"] = static_cast<int64_t>(pages) * psz;
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) > 0) j["load_average_1min"] = load[0];
  return j;
}

json MeasureStream(int64_t floats, int reps) {
  std::unique_ptr<float[]> a(new float[floats]), b(new float[floats]), c(new float[floats]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < floats; ++i) {
    a[i] = 1.0f;
    b[i] = 2.0f;
    c[i] = 0.5f;
  }
  const double bytes = static_cast<double>(floats) * sizeof(float);
  std::vector<double> copy, triad, read;
  uint64_t sink = 0;
  cpu::StreamCopy(c.get(), a.get(), floats);  // warm
  for (int r = 0; r < reps; ++r) {
    double t = Now();
    cpu::StreamCopy(c.get(), a.get(), floats);
    copy.push_back(2 * bytes / (Now() - t) / 1e9);
    t = Now();
    cpu::StreamTriad(a.get(), b.get(), c.get(), 3.0f, floats);
    triad.push_back(3 * bytes / (Now() - t) / 1e9);
    t = Now();
    sink += cpu::StreamRead(reinterpret_cast<const uint8_t*>(b.get()), floats * 4);
    read.push_back(bytes / (Now() - t) / 1e9);
  }
  auto summary = [](const std::vector<double>& s) {
    return json{{"gbps", Median(s)}, {"best_gbps", *std::max_element(s.begin(), s.end())}, {"samples", s}};
  };
  json j;
  j["array_bytes"] = static_cast<int64_t>(bytes);
  j["copy"] = summary(copy);
  j["triad"] = summary(triad);
  j["read"] = summary(read);
  j["read"]["checksum"] = sink & 0xFF;
  return j;
}

bool RunGnuplot(const fs::path& png, const std::string& script) {
  const fs::path gp = fs::path(png).replace_extension(".gp");
  {
    std::ofstream f(gp);
    if (!f) Fail(ErrorKind::kNotFound, "cannot write {}", gp.string());
    f << script;
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "warning: gnuplot not found (apt-get install gnuplot-nox); wrote %s but no PNG\n",
                 gp.string().c_str());
    return false;
  }
  const std::string cmd = "gnuplot '" + gp.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "warning: gnuplot failed on %s\n", gp.string().c_str());
    return false;
  }
  return true;
}

void CheckWritable(const fs::path& path, const char* flag) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    Fail(ErrorKind::kInvalidArgument, "{} {}: is a directory, expected a file path", flag, path.string());
  const bool existed = fs::exists(path, ec);
  if (!existed && path.has_parent_path() && !fs::exists(path.parent_path(), ec)) {
    fs::create_directories(path.parent_path(), ec);  // out/kernels.json works in a fresh clone
    if (ec)
      Fail(ErrorKind::kInvalidArgument, "{} {}: cannot create the folder {}: {}", flag, path.string(),
           path.parent_path().string(), ec.message());
  }
  {
    std::ofstream f(path, std::ios::app);
    if (!f) Fail(ErrorKind::kInvalidArgument, "{} {}: cannot write there", flag, path.string());
  }
  if (!existed) fs::remove(path, ec);
}

void WriteJson(const fs::path& path, const json& j) {
  std::ofstream f(path);
  if (!f) Fail(ErrorKind::kNotFound, "cannot write {}", path.string());
  f << j.dump(2) << "\n";
  if (!f) Fail(ErrorKind::kNotFound, "error writing {}", path.string());
}

}  // namespace bench

namespace {

using bench::Median;
using bench::Now;
using nlohmann::json;
namespace fs = std::filesystem;

struct KernelArgs {
  std::string json_out, png_out;
  int threads = 0;
  std::string target;
  int reps = 5;
  bool quick = false;
  std::vector<int64_t> gemm_m;
};

// One GEMV case: `copies` distinct packed copies, run(i) does one call on copy i.
struct GemvCase {
  std::string name, format, kernel;  // kernel: "fast" | "fast-in-cache" | "ref" | "...-fp32-path"
  int64_t out = 0, in = 0;
  int64_t bytes_per_call = 0;
  int copies = 1;
  std::function<void(int)> run;
};

json TimeGemv(GemvCase& c, int reps, double triad) {
  for (int i = 0; i < c.copies; ++i) c.run(i);  // warm (page faults, dispatch init)
  std::vector<double> gbps, us;
  for (int r = 0; r < reps; ++r) {
    const double t = Now();
    for (int i = 0; i < c.copies; ++i) c.run(i);
    const double dt = Now() - t;
    gbps.push_back(static_cast<double>(c.bytes_per_call) * c.copies / dt / 1e9);
    us.push_back(dt / c.copies * 1e6);
  }
  const double g = Median(gbps);
  std::printf("  gemv %-26s %-6s %6lld x %-6lld %8.2f MB  %9.1f us  %7.2f GB/s  %5.1f%% of triad\n",
              c.name.c_str(), c.kernel.c_str(), static_cast<long long>(c.out), static_cast<long long>(c.in),
              c.bytes_per_call / 1e6, Median(us), g, 100 * g / triad);
  std::fflush(stdout);
  return json{{"name", c.name},         {"format", c.format},       {"kernel", c.kernel},
              {"out", c.out},           {"in", c.in},               {"bytes_per_call", c.bytes_per_call},
              {"copies", c.copies},     {"us_per_call", Median(us)}, {"gbps", g},
              {"fraction_of_triad", g / triad}, {"samples_gbps", gbps}};
}

void RunKernels(const KernelArgs& args) {
  if (args.json_out.empty()) Fail(ErrorKind::kInvalidArgument, "bench kernels: --json OUT is required");
  if (args.reps < 1 || args.reps > 1000)
    Fail(ErrorKind::kInvalidArgument, "bench kernels: --reps must be in [1, 1000], got {}", args.reps);
  for (const int64_t m : args.gemm_m)
    if (m < 1 || m > 65536) Fail(ErrorKind::kInvalidArgument, "bench kernels: --gemm-m must be in [1, 65536], got {}", m);
  bench::CheckWritable(args.json_out, "--json");
  if (!args.png_out.empty()) bench::CheckWritable(args.png_out, "--png");
  if (!args.target.empty()) cpu::SelectTarget(args.target);
  if (args.threads != 0) SetNumThreads(args.threads);
  const int threads = NumThreads();
  openblas_set_num_threads(threads);
  const fs::path json_path(args.json_out);
  const fs::path png = args.png_out.empty() ? fs::path(json_path).replace_extension(".png") : fs::path(args.png_out);

  json out;
  out["benchmark"] = "kernels";
  out["machine"] = bench::MachineJson(threads);
  // OpenBLAS picks its own kernels (OPENBLAS_CORETYPE=Haswell before the
  // program starts gives its AVX2 kernels, to compare with --target avx2).
  out["machine"]["openblas_core"] = openblas_get_corename();
  std::printf("OpenBLAS core: %s\n", openblas_get_corename());
  std::printf("bench kernels: %s, %d threads, target %s\n", out["machine"]["cpu"].get<std::string>().c_str(),
              threads, cpu::ActiveTarget().c_str());
  // AVX-512 with AVX512_BF16: the BF16 pair dots (FP4 always, FP8 for
  // M >= 96); the path of an AVX-512 CPU without them is measured beside
  // (GEMV kernel "...-fp32-path", GEMM formats "fp4-fp32-path",
  // "fp8-fp32-path"; the name is historical: for the FP4 GEMV that path is
  // now the integer dots of linear_fp4.cc, with FP32 for the groups they
  // cannot take; a one-row FP4 call takes them with the pair dots on too, so
  // the two FP4 GEMV rows measure the same code).
  const bool fp4_dot = cpu::Bf16DotSupported() && cpu::ActiveTarget().rfind("AVX3", 0) == 0;
  out["fp4_bf16_dot"] = fp4_dot;
  std::printf("  BF16 pair dots (VDPBF16PS; FP4 at M >= 2, FP8 at M >= 96): %s\n",
              fp4_dot ? "yes (the path without them measured beside: \"fp32-path\")" : "no");
  auto fp32_path = [](const std::function<void()>& f) {
    cpu::SetBf16Dot(false);
    f();
    cpu::SetBf16Dot(true);
  };

  // ---- machine limit
  const int64_t stream_floats = args.quick ? (int64_t{8} << 20) : (int64_t{32} << 20);
  json stream = bench::MeasureStream(stream_floats, std::max(args.reps, 5));
  const double triad = stream["triad"]["gbps"].get<double>();
  out["triad_gbps"] = triad;
  out["copy_gbps"] = stream["copy"]["gbps"];
  out["read_gbps"] = stream["read"]["gbps"];
  out["stream"] = stream;
  std::printf("  stream copy %.2f GB/s, triad %.2f GB/s, read %.2f GB/s (median of %zu; arrays %.0f MB)\n",
              stream["copy"]["gbps"].get<double>(), triad, stream["read"]["gbps"].get<double>(),
              stream["triad"]["samples"].size(), stream_floats * 4 / 1e6);

  // ---- GEMV at decode shapes
  const int64_t min_bytes = args.quick ? (int64_t{64} << 20) : std::max<int64_t>(int64_t{512} << 20, 8 * bench::L3Bytes());
  auto copies_for = [&](int64_t bytes) {
    return static_cast<int>(std::max<int64_t>(1, (min_bytes + bytes - 1) / bytes));
  };
  std::vector<json> gemv;
  std::vector<float> y(int64_t{129280} * 2);
  struct Fp8Shape { const char* name; int64_t out, in; };
  const std::vector<Fp8Shape> fp8_shapes =
      args.quick ? std::vector<Fp8Shape>{{"fp8 shared_w1 2304x5120", 2304, 5120}}
                 : std::vector<Fp8Shape>{{"fp8 wq_a 1280x5120", 1280, 5120},
                                         {"fp8 shared_w1 2304x5120", 2304, 5120},
                                         {"fp8 shared_w2 5120x2304", 5120, 2304},
                                         {"fp8 wo_b 5120x8192", 5120, 8192},
                                         {"fp8 wq_b 32768x1280", 32768, 1280}};
  for (const auto& s : fp8_shapes) {
    std::vector<uint8_t> w, sc;
    bench::QuantizedFp8(s.out, s.in, 1, &w, &sc);
    const std::vector<float> x = bench::Acts(s.in, 3);
    const ref::Fp8Weight view{w.data(), sc.data(), s.out, s.in, 32};
    auto packs = std::make_shared<std::vector<cpu::PackedFp8>>();
    packs->push_back(cpu::PackFp8(view));
    const int copies = copies_for(static_cast<int64_t>((*packs)[0].bytes()));
    for (int i = 1; i < copies; ++i) packs->push_back(cpu::PackFp8(view));
    GemvCase c{s.name, "fp8", "fast", s.out, s.in, static_cast<int64_t>((*packs)[0].bytes()), copies,
               [packs, x, &y](int i) { cpu::LinearFp8(x.data(), 1, (*packs)[i], 32, y.data()); }};
    gemv.push_back(TimeGemv(c, args.reps, triad));
    if (std::string(s.name).find("shared_w1") != std::string::npos) {
      // The scalar reference on the same shape (weights read in checkpoint layout).
      auto srcs = std::make_shared<std::vector<std::vector<uint8_t>>>();
      const int rc = std::min(copies, 8);
      for (int i = 0; i < rc; ++i) srcs->push_back(w);
      GemvCase r{s.name, "fp8", "ref", s.out, s.in, s.out * s.in + static_cast<int64_t>(sc.size()), rc,
                 [srcs, sc, x, s, &y](int i) {
                   ref::LinearFp8(x.data(), 1, {(*srcs)[i].data(), sc.data(), s.out, s.in, 32}, 32, y.data());
                 }};
      gemv.push_back(TimeGemv(r, 1, triad));
    }
  }
  // In-cache ceilings: the same small matrix (fits L2) called over and over,
  // so the kernels' arithmetic alone sets the rate (kernel "fast-in-cache");
  // when it is close to the DRAM rate above, the GEMV is compute-bound.
  {
    const int64_t N = 256, K = 2048;
    std::vector<uint8_t> w8, s8, w4, s4;
    bench::QuantizedFp8(N, K, 21, &w8, &s8);
    bench::QuantizedFp4(N, K, 22, &w4, &s4);
    const std::vector<float> x = bench::Acts(K, 23);
    auto p8 = std::make_shared<cpu::PackedFp8>(cpu::PackFp8({w8.data(), s8.data(), N, K, 32}));
    auto p4 = std::make_shared<cpu::PackedFp4>(cpu::PackFp4({w4.data(), s4.data(), N, K}));
    GemvCase c8{fmt::format("fp8 in-cache {}x{}", N, K), "fp8", "fast-in-cache", N, K,
                static_cast<int64_t>(p8->bytes()), 400,
                [p8, x, &y](int) { cpu::LinearFp8(x.data(), 1, *p8, 32, y.data()); }};
    gemv.push_back(TimeGemv(c8, args.reps, triad));
    GemvCase c4{fmt::format("fp4 in-cache {}x{}", N, K), "fp4", "fast-in-cache", N, K,
                static_cast<int64_t>(p4->bytes()), 400,
                [p4, x, &y](int) { cpu::LinearFp4(x.data(), 1, *p4, 32, y.data()); }};
    gemv.push_back(TimeGemv(c4, args.reps, triad));
    if (fp4_dot) {
      GemvCase f{fmt::format("fp4 in-cache {}x{}", N, K), "fp4", "fast-in-cache-fp32-path", N, K,
                 static_cast<int64_t>(p4->bytes()), 400,
                 [p4, x, &y, fp32_path](int) { fp32_path([&] { cpu::LinearFp4(x.data(), 1, *p4, 32, y.data()); }); }};
      gemv.push_back(TimeGemv(f, args.reps, triad));
    }
  }
  struct Fp4Shape { const char* name; int64_t out, in; };
  const std::vector<Fp4Shape> fp4_shapes =
      args.quick ? std::vector<Fp4Shape>{{"fp4 expert_w1 2304x5120", 2304, 5120}}
                 : std::vector<Fp4Shape>{{"fp4 expert_w1 2304x5120", 2304, 5120},
                                         {"fp4 expert_w2 5120x2304", 5120, 2304}};
  for (const auto& s : fp4_shapes) {
    std::vector<uint8_t> w, sc;
    bench::QuantizedFp4(s.out, s.in, 4, &w, &sc);
    const std::vector<float> x = bench::Acts(s.in, 6);
    const ref::Fp4Weight view{w.data(), sc.data(), s.out, s.in};
    auto packs = std::make_shared<std::vector<cpu::PackedFp4>>();
    packs->push_back(cpu::PackFp4(view));
    const int copies = copies_for(static_cast<int64_t>((*packs)[0].bytes()));
    for (int i = 1; i < copies; ++i) packs->push_back(cpu::PackFp4(view));
    GemvCase c{s.name, "fp4", "fast", s.out, s.in, static_cast<int64_t>((*packs)[0].bytes()), copies,
               [packs, x, &y](int i) { cpu::LinearFp4(x.data(), 1, (*packs)[i], 32, y.data()); }};
    gemv.push_back(TimeGemv(c, args.reps, triad));
    if (fp4_dot) {
      GemvCase f{s.name, "fp4", "fast-fp32-path", s.out, s.in, static_cast<int64_t>((*packs)[0].bytes()), copies,
                 [packs, x, &y, fp32_path](int i) {
                   fp32_path([&] { cpu::LinearFp4(x.data(), 1, (*packs)[i], 32, y.data()); });
                 }};
      gemv.push_back(TimeGemv(f, args.reps, triad));
    }
    if (std::string(s.name).find("w1") != std::string::npos) {
      auto srcs = std::make_shared<std::vector<std::vector<uint8_t>>>();
      const int rc = std::min(copies, 8);
      for (int i = 0; i < rc; ++i) srcs->push_back(w);
      GemvCase r{s.name, "fp4", "ref", s.out, s.in, static_cast<int64_t>(w.size() + sc.size()), rc,
                 [srcs, sc, x, s, &y](int i) {
                   ref::LinearFp4(x.data(), 1, {(*srcs)[i].data(), sc.data(), s.out, s.in}, 32, y.data());
                 }};
      gemv.push_back(TimeGemv(r, 1, triad));
    }
  }
  // BF16 grouped linears, 8 groups × [1024, 4096]: the model's wo_a (FP8
  // dequantised to BF16 at load, so its 8-bit decode copy streams: bytes =
  // that copy's), and the same shape over general BF16 values (the BF16 GEMV).
  for (const bool fp8_derived : {true, false}) {
    const int groups = 8;
    const int64_t R = 1024, Kg = 4096;
    std::vector<uint16_t> w;
    if (fp8_derived) {
      std::vector<uint8_t> c, sc;
      bench::QuantizedFp8(groups * R, Kg, 7, &c, &sc);
      w.resize(c.size());
      for (int64_t n = 0; n < groups * R; ++n)
        for (int64_t k = 0; k < Kg; ++k)
          w[n * Kg + k] = FloatToBf16(E4M3ToFloat(c[n * Kg + k]) * E8M0ToFloat(sc[(n / 32) * (Kg / 32) + k / 32]));
    } else {
      w = bench::Bf16Values(groups * R * Kg, 7, 0.05f);
    }
    const std::vector<float> x = bench::Acts(groups * Kg, 8);
    const ref::Bf16Weight view{w.data(), groups * R, Kg};
    auto packs = std::make_shared<std::vector<cpu::PackedBf16>>();
    packs->push_back(cpu::PackBf16(view));
    const int64_t bytes = static_cast<int64_t>((*packs)[0].decode_bytes());
    const int copies = args.quick ? 1 : copies_for(bytes);
    for (int i = 1; i < copies; ++i) packs->push_back(cpu::PackBf16(view));
    GemvCase c{fp8_derived ? "bf16 wo_a 8x1024x4096" : "bf16 8x1024x4096 grouped",
               fp8_derived && (*packs)[0].w8 ? "bf16 (8-bit copy)" : "bf16", "fast", groups * R, Kg, bytes, copies,
               [packs, x, &y, groups](int i) {
                 cpu::GroupedLinearBf16(x.data(), 1, groups, (*packs)[i], y.data());
               }};
    gemv.push_back(TimeGemv(c, args.reps, triad));
  }
  {  // FP32 head over BF16 weights: vocab × dim
    const int64_t V = args.quick ? 4096 : 129280, d = 5120;
    const std::vector<uint16_t> w = bench::Bf16Values(V * d, 9, 0.05f);
    std::vector<float> x(d);
    bench::Rng r(10);
    for (auto& v : x) v = 2.0f * r.Unit() - 1.0f;
    auto pack = std::make_shared<cpu::PackedBf16>(cpu::PackBf16({w.data(), V, d}));
    GemvCase c{fmt::format("f32 head {}x{}", V, d), "bf16->f32", "fast", V, d, static_cast<int64_t>(pack->bytes()), 1,
               [pack, x, &y](int) { cpu::LinearF32Bf16W(x.data(), 1, *pack, y.data()); }};
    gemv.push_back(TimeGemv(c, args.reps, triad));
  }
  out["gemv"] = gemv;

  // ---- GEMM at prefill shapes vs OpenBLAS sgemm
  std::vector<int64_t> ms = args.gemm_m;
  if (ms.empty()) ms = args.quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048};
  const int64_t N = 2304, K = 5120;
  std::vector<uint8_t> w8, s8, w4, s4;
  bench::QuantizedFp8(N, K, 11, &w8, &s8);
  bench::QuantizedFp4(N, K, 13, &w4, &s4);
  const std::vector<uint16_t> wb = bench::Bf16Values(N * K, 15, 0.05f);
  const cpu::PackedFp8 p8 = cpu::PackFp8({w8.data(), s8.data(), N, K, 32});
  const cpu::PackedFp4 p4 = cpu::PackFp4({w4.data(), s4.data(), N, K});
  const cpu::PackedBf16 pb = cpu::PackBf16({wb.data(), N, K});
  // Dequantised FP32 weights for sgemm (same values the kernels multiply).
  std::vector<float> f8(N * K), f4(N * K), fb(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      f8[n * K + k] = E4M3ToFloat(w8[n * K + k]) * E8M0ToFloat(s8[(n / 32) * (K / 32) + k / 32]);
      f4[n * K + k] = E2M1ToFloat(E2M1PackedCode(w4.data() + n * (K / 2), k)) * E8M0ToFloat(s4[n * (K / 32) + k / 32]);
      fb[n * K + k] = Bf16ToFloat(wb[n * K + k]);
    }
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const std::vector<float> xa = bench::Acts(max_m * K, 16);
  std::vector<float> ya(max_m * N);
  // Lets idle threads go to sleep between the two timings: OpenMP's team, and
  // OpenBLAS's own workers, which spin ~2^28 cycles (its default
  // THREAD_TIMEOUT, 70-90 ms here) after an sgemm. With a 50 ms pause they still
  // spun on both cores while the M = 32/64 calls ran (FP4 M = 64: 79 GFLOP/s
  // measured, 460 with a quiet machine).
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  std::vector<json> gemm;
  const int greps = std::max(1, std::min(args.reps, 5));  // sgemm / kernel pairs
  for (int64_t M : ms) {
    const double flop = 2.0 * M * N * K;
    struct Fmt { const char* name; const std::vector<float>* deq; std::function<void()> fast; };
    std::vector<Fmt> fmts = {
        {"fp8", &f8, [&] { cpu::LinearFp8(xa.data(), M, p8, 32, ya.data()); }},
        {"fp4", &f4, [&] { cpu::LinearFp4(xa.data(), M, p4, 32, ya.data()); }},
        {"bf16", &fb, [&] { cpu::LinearBf16(xa.data(), M, pb, ya.data()); }}};
    if (fp4_dot) {
      fmts.push_back({"fp8-fp32-path", &f8, [&] { fp32_path([&] { cpu::LinearFp8(xa.data(), M, p8, 32, ya.data()); }); }});
      fmts.push_back({"fp4-fp32-path", &f4, [&] { fp32_path([&] { cpu::LinearFp4(xa.data(), M, p4, 32, ya.data()); }); }});
    }
    for (const Fmt& f : fmts) {
      const auto sgemm = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                    static_cast<int>(K), 1.0f, xa.data(), static_cast<int>(K), f.deq->data(), static_cast<int>(K), 0.0f,
                    ya.data(), static_cast<int>(N));
      };
      // sgemm and the kernel alternate pass by pass (a pause before each),
      // and the fraction is the median of the pairs' ratios: on a shared VM
      // a neighbour's burst then hits one pair, not all of one side's passes
      // (timed back to back, single runs read 59% or 189% of sgemm where the
      // same build's other runs read 93-101%).
      const auto once = [](const std::function<void()>& fn) {
        const double t0 = Now();
        fn();
        return Now() - t0;
      };
      pause();
      sgemm();  // warm
      pause();
      f.fast();
      std::vector<double> gs, gf, ratio;
      for (int r = 0; r < greps; ++r) {
        pause();
        const double ts = once(sgemm);
        pause();
        const double tf = once(f.fast);
        gs.push_back(flop / ts / 1e9);
        gf.push_back(flop / tf / 1e9);
        ratio.push_back(ts / tf);
      }
      const double s = Median(gs), g = Median(gf), fr = Median(ratio);
      std::printf("  gemm %-13s M=%-5lld N=%lld K=%lld  %8.1f GFLOP/s  sgemm %8.1f GFLOP/s  %5.1f%% of sgemm\n", f.name,
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), g, s, 100 * fr);
      std::fflush(stdout);
      gemm.push_back(json{{"format", f.name}, {"M", M}, {"N", N}, {"K", K}, {"gflops", g}, {"sgemm_gflops", s},
                          {"fraction_of_sgemm", fr}, {"pair_fractions", ratio}, {"samples_gflops", gf},
                          {"sgemm_samples_gflops", gs}});
    }
  }
  out["gemm"] = gemm;
  out["notes"] = {
      "GEMV bytes_per_call = repacked weights + scales streamed per call; activations excluded (< 0.1%).",
      "Weights: Gaussian values quantised like the checkpoints (E4M3 per 32x32 block, E2M1 per row x 32).",
      "Every fast kernel is bit-identical to the scalar reference op (tests/unit/cpu_kernels_test.cc).",
      "sgemm runs on the dequantised FP32 weights (4x/8x the bytes of FP8/FP4); GEMM flops = 2*M*N*K."};
  bench::WriteJson(json_path, out);

  // ---- plot
  const fs::path base = fs::path(png).replace_extension("");
  {
    std::ofstream f(base.string() + ".gemv.dat");
    f << "# name gbps fraction_of_triad\n";
    for (const json& g : gemv)
      f << '"' << g["name"].get<std::string>() << (g["kernel"] == "ref" ? " (scalar ref)" : "")
        << (g["kernel"].get<std::string>().find("fp32-path") != std::string::npos ? " (fp32 path)" : "") << "\" "
        << g["gbps"].get<double>() << " " << g["fraction_of_triad"].get<double>() << "\n";
  }
  {
    std::ofstream f(base.string() + ".gemm.dat");
    f << "# M fp8 fp4 bf16 sgemm(fp8 weights)\n";
    for (int64_t M : ms) {
      f << M;
      double sg = 0;
      for (const json& g : gemm)
        if (g["M"] == M && g["format"].get<std::string>().find("fp32-path") == std::string::npos) {
          f << " " << g["gflops"].get<double>();
          if (g["format"] == "fp8") sg = g["sgemm_gflops"].get<double>();
        }
      f << " " << sg << "\n";
    }
  }
  const std::string script = fmt::format(
      R"GP(set terminal pngcairo size 1400,600 font ",10" noenhanced
set output '{png}'
set multiplot layout 1,2 title "deepinfer bench kernels — {cpu}, {threads} threads, {target}"
set title "GEMV (decode, M=1): GB/s; triad {triad:.1f} GB/s"
set style fill solid 0.8
set boxwidth 0.7
set yrange [0:*]
set xtics rotate by -35 left
set rmargin 8
set ylabel "GB/s"
set key top right
plot '{gemv}' using 0:2:xtic(1) with boxes lc rgb "#4477aa" title "kernel", \
     {triad} with lines lw 2 lc rgb "#cc3311" title "STREAM triad", \
     {copy} with lines lw 1 dt 2 lc rgb "#ee7733" title "STREAM copy"
set title "GEMM (prefill), N={N} K={K}: GFLOP/s"
set xtics norotate
set logscale x 2
set xlabel "M (tokens)"
set ylabel "GFLOP/s"
set key top left
plot '{gemm}' using 1:2 with linespoints lw 2 title "fp8", \
     '' using 1:3 with linespoints lw 2 title "fp4", \
     '' using 1:4 with linespoints lw 2 title "bf16", \
     '' using 1:5 with linespoints lw 2 dt 2 lc rgb "black" title "OpenBLAS sgemm (FP32)"
unset multiplot
)GP",
      fmt::arg("png", png.string()), fmt::arg("cpu", out["machine"]["cpu"].get<std::string>()),
      fmt::arg("threads", threads), fmt::arg("target", cpu::ActiveTarget()), fmt::arg("triad", triad),
      fmt::arg("copy", stream["copy"]["gbps"].get<double>()), fmt::arg("gemv", base.string() + ".gemv.dat"),
      fmt::arg("gemm", base.string() + ".gemm.dat"), fmt::arg("N", N), fmt::arg("K", K));
  const bool plotted = bench::RunGnuplot(png, script);
  std::printf("wrote %s%s\n", json_path.string().c_str(), plotted ? (" and " + png.string()).c_str() : "");
}

}  // namespace

void RegisterBench(CLI::App& app) {
  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks: kernels (GEMV/GEMM vs memory bandwidth), e2e and structured");
  bench_cmd->require_subcommand(1);
  auto args = std::make_shared<KernelArgs>();
  auto* k = bench_cmd->add_subcommand("kernels", "STREAM bandwidth, GEMV GB/s and GEMM GFLOP/s vs OpenBLAS sgemm");
  k->add_option("--json", args->json_out, "Output JSON file")->required();
  k->add_option("--png", args->png_out, "Output PNG plot (default: JSON path with .png)");
  k->add_option("--threads", args->threads, "Worker threads (default: all hardware threads)");
  k->add_option("--target", args->target, "SIMD target: auto | avx512 | avx2 | the fallback (default auto)");
  k->add_option("--reps", args->reps, "Timed passes per measurement (median reported)")->capture_default_str();
  k->add_flag("--quick", args->quick, "Small sizes (a smoke run, not a measurement)");
  k->add_option("--gemm-m", args->gemm_m, "GEMM row counts (default 64 128 256 512 1024 2048)");
  k->callback([args] { RunKernels(*args); });
  bench::RegisterBenchE2e(*bench_cmd);
  bench::RegisterBenchStructured(*bench_cmd);
}

}  // namespace deepinfer::cli
