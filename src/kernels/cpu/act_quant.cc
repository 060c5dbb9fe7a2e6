// Fused activation quantisation (model-spec §3.1(b) step 1) for the FP8/FP4
// kernels, bit-identical to QuantizeActE4M3 + E4M3ToFloat (format/numerics.h).
// Also home of the dispatch-control functions of cpu_ops.h.
//
// Per block of B: a = max(max|x|, 1e-4); s = 2^ceil(log2(a·fp32(1/448))) from
// the FP32 bits (Pow2CeilE8M0); v = clamp(x/s, ±448) (x/s == x·(1/s) exactly:
// s is a power of two whose reciprocal is a normal float, so both are the one
// rounding of the exact x·2^-e); then v is rounded to the E4M3 grid with the
// FP32 "add and subtract a magic number" identity: for E = exponent of
// max(|v|, 2^-6), c = 2^(E+20) has ulp 2^(E-3), which is the E4M3 spacing
// around |v| (2^-9 below 2^-6: the subnormal grid), and |v| + c stays in c's
// binade, so (|v| + c) − c is |v| rounded to nearest-even on that grid, exact.
// The sign is copied back (−0 kept, as the reference's sign-preserving cast).
// Rows containing NaN/Inf take the scalar quantiser.
// The e4m3-ieee mode (Fp8Format::kE4M3Ieee) is the same code with 224 and
// fp32(1/224) in place of 448 and fp32(1/448): the clamp bounds |v| <= 224, so
// the magic-number rounding is unchanged (E <= 7).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/act_quant.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"
#include "kernels/cpu/linear_common.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

// A row with a NaN or infinity: false (the callers take the scalar code).
HWY_INLINE bool RowFinite(const float* x, int64_t K) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const auto exp_mask = hn::Set(du, 0x7F800000u);
  auto bad = hn::Zero(du);
  int64_t k = 0;
  for (; k + static_cast<int64_t>(kLanes) <= K; k += kLanes) {
    const auto u = hn::BitCast(du, hn::LoadU(df, x + k));
    bad = hn::Or(bad, hn::VecFromMask(du, hn::Eq(hn::And(u, exp_mask), exp_mask)));
  }
  if (!hn::AllFalse(du, hn::Ne(bad, hn::Zero(du)))) return false;
  for (; k < K; ++k)
    if (!std::isfinite(x[k])) return false;
  return true;
}

// max|x[0..B)| of one block.
HWY_INLINE float BlockAmax(const float* x, int B) {
  const DF df;
  float amax = 0.0f;
  int i = 0;
  if (B % static_cast<int>(kLanes) == 0) {
    auto m = hn::Zero(df);
    for (; i < B; i += static_cast<int>(kLanes)) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + i)));
    amax = hn::GetLane(hn::MaxOfLanes(df, m));
  }
  for (; i < B; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// v (already clamped to ±vmax, vmax <= 448) rounded to the E4M3 grid, its
// sign kept (−0 too): the magic-number identity of the header comment.
HWY_INLINE VF E4M3Grid(VF v) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const auto a = hn::Abs(v);
  const auto e = hn::And(hn::BitCast(du, hn::Max(a, hn::Set(df, 0.015625f))), hn::Set(du, 0x7F800000u));  // 2^-6
  const auto c = hn::BitCast(df, hn::Add(e, hn::Set(du, 20u << 23)));
  return hn::CopySignToAbs(hn::Sub(hn::Add(a, c), c), v);
}

// Returns false (and writes nothing) when the row has a NaN or infinity.
bool QuantizeRow(const float* x, int64_t K, int B, float* q, float* sa, float vmax, float inv_max) {
  if (!RowFinite(x, K)) return false;
  const DF df;
  const auto v448 = hn::Set(df, vmax);
  const auto vneg448 = hn::Set(df, -vmax);
  const auto qscale = hn::Set(df, kActOperandScale);
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    const float amax = std::max(BlockAmax(x + b0, B), 1e-4f);
    // s = 2^(b-127) with b = Pow2CeilE8M0(t) in [105, 254) for finite rows
    // (amax >= 1e-4; one more for 1/224), so s and 1/s = 2^(127-b) are normal floats.
    const uint32_t sb = Pow2CeilE8M0(amax * inv_max);
    sa[b0 / B] = BitsFloat(sb << 23) * kActScaleFactor;
    const auto inv = hn::Set(df, BitsFloat((254u - sb) << 23));
    int j = 0;
    for (; j + static_cast<int>(kLanes) <= B; j += static_cast<int>(kLanes)) {
      const auto v = hn::Min(hn::Max(hn::Mul(hn::LoadU(df, x + b0 + j), inv), vneg448), v448);
      hn::StoreU(hn::Mul(E4M3Grid(v), qscale), df, q + b0 + j);
    }
    const float inv_s = BitsFloat((254u - sb) << 23);
    for (; j < B; ++j) {
      const float v = std::min(std::max(x[b0 + j] * inv_s, -vmax), vmax);
      q[b0 + j] = E4M3ToFloat(FloatToE4M3(v)) * kActOperandScale;
    }
  }
  return true;
}

// FP8 QDQ of one finite row in place (cpu_ops.h Fp8QdqRows): QuantizeRow's
// scale and E4M3 grid, then bf16(value · s) as Fp8QdqInPlace (the value is
// exact, so value · s is its one rounding). False, nothing written, for a
// row with a NaN or infinity.
bool Fp8QdqRow(float* x, int64_t K, int B, float vmax, float inv_max) {
  if (!RowFinite(x, K)) return false;
  const DF df;
  const auto vpos = hn::Set(df, vmax), vneg = hn::Set(df, -vmax);
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    const float amax = std::max(BlockAmax(x + b0, B), 1e-4f);
    const uint32_t sb = Pow2CeilE8M0(amax * inv_max);  // [105, 254): s and 1/s normal (QuantizeRow)
    const float s = BitsFloat(sb << 23), inv_s = BitsFloat((254u - sb) << 23);
    const auto sv = hn::Set(df, s), inv = hn::Set(df, inv_s);
    int j = 0;
    for (; j + static_cast<int>(kLanes) <= B; j += static_cast<int>(kLanes)) {
      const auto v = hn::Min(hn::Max(hn::Mul(hn::LoadU(df, x + b0 + j), inv), vneg), vpos);
      hn::StoreU(RoundBf16V(hn::Mul(E4M3Grid(v), sv)), df, x + b0 + j);
    }
    for (; j < B; ++j) {
      const float v = std::min(std::max(x[b0 + j] * inv_s, -vmax), vmax);
      x[b0 + j] = RoundBf16(E4M3ToFloat(FloatToE4M3(v)) * s);
    }
  }
  return true;
}

// FP4 QDQ with UE8M0 scales of one finite row in place (cpu_ops.h
// Fp4QdqUe8m0Rows), as Fp4QdqUe8m0InPlace: a = max(max|x|, 6·2^-126),
// s = Pow2Ceil(a·fp32(1/6)) (a normal power of two, 1/s too), v =
// clamp(x·(1/s), ±6) (x/s exactly: one rounding of the same exact value),
// rounded to the E2M1 grid by the magic number of exponent E + 22 (E that of
// max(|v|, 1): spacing 2^(E-1), 0.5 below 1, nearest-even as the
// comparisons of DoubleToE2M1), then bf16(value · s). False, nothing
// written, for a row with a NaN or infinity.
bool Fp4QdqUe8m0Row(float* x, int64_t K, int B) {
  if (!RowFinite(x, K)) return false;
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const auto exp_mask = hn::Set(du, 0x7F800000u);
  const auto six = hn::Set(df, 6.0f), neg_six = hn::Set(df, -6.0f), one = hn::Set(df, 1.0f);
  const auto c22 = hn::Set(du, 22u << 23);
  const float floor_amax = 6.0f * 0x1p-126f;
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    const float amax = std::max(BlockAmax(x + b0, B), floor_amax);
    const uint32_t sb = Pow2CeilE8M0(amax * kInv6);  // [1, 254]: s and 1/s normal
    const float s = BitsFloat(sb << 23), inv_s = BitsFloat((254u - sb) << 23);
    const auto sv = hn::Set(df, s), inv = hn::Set(df, inv_s);
    int j = 0;
    for (; j + static_cast<int>(kLanes) <= B; j += static_cast<int>(kLanes)) {
      const auto v = hn::Min(hn::Max(hn::Mul(hn::LoadU(df, x + b0 + j), inv), neg_six), six);
      const auto a = hn::Abs(v);
      const auto c = hn::BitCast(df, hn::Add(hn::And(hn::BitCast(du, hn::Max(a, one)), exp_mask), c22));
      const auto r = hn::CopySignToAbs(hn::Sub(hn::Add(a, c), c), v);
      hn::StoreU(RoundBf16V(hn::Mul(r, sv)), df, x + b0 + j);
    }
    for (; j < B; ++j) {
      const float v = std::clamp(x[b0 + j] * inv_s, -6.0f, 6.0f);
      x[b0 + j] = RoundBf16(E2M1ToFloat(FloatToE2M1(v)) * s);
    }
  }
  return true;
}

int64_t ThisTarget() { return HWY_TARGET; }

// The calling thread's scratch of the block GEMM path (hwy_util-inl.h: the
// packed activations and BlockScratch) for calls of up to M rows of K, on the
// targets that take that path (AVX2) from kBlockGemmMinM rows, with the
// accumulators of its largest m-chunk; on the others the accumulators of the
// BF16 pair dots' block paths (linear_fp4.cc RunFp4DotItems, from
// kBlockGemmMinM rows) and the FP8 one's weight pairs (linear_fp8.cc
// RunFp8DotItems).
void ReserveBlockScratch(int64_t M, int64_t K) {
  if (M < kBlockGemmMinM) return;
  if constexpr (kUseBlockGemm) {
    PackedActBuffer(M, K);
    constexpr int64_t kMaxBlock = 128;  // the widest K block a block GEMM converts (FP8, 128×128 scales)
    // The largest m-chunk such a call may take (linear_common.h MChunkRows).
    const int64_t chunk = M <= kMChunk ? M : std::min((M + kMChunk - 1) / kMChunk * kMChunk, kBlockMaxMChunk);
    ThreadBlockScratch().Resize(kMaxBlock * kTileRows, chunk * kTileRows);
  } else {
    ThreadBlockScratch().Resize(0, std::min<int64_t>(M, kMChunk) * kTileRows);
    ThreadBlockScratch().ResizePairs(64 * kTileRows);  // RunFp8DotItems, activation blocks up to 128
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(QuantizeRow);
HWY_EXPORT(Fp8QdqRow);
HWY_EXPORT(Fp4QdqUe8m0Row);
HWY_EXPORT(ThisTarget);
HWY_EXPORT(ReserveBlockScratch);

void QuantizeActRows(const float* x, int64_t M, int64_t K, int B, float* q, float* sa, Fp8Format fmt) {
  auto* fn = HWY_DYNAMIC_DISPATCH(QuantizeRow);
  const int64_t kb = K / B;
  const float vmax = Fp8ActMax(fmt), inv_max = Fp8ActInvMax(fmt);
  if (M == 1) {
    if (!fn(x, K, B, q, sa, vmax, inv_max)) {
      thread_local std::vector<uint8_t> codes, sb;
      codes.assign(static_cast<size_t>(K), 0);
      sb.assign(static_cast<size_t>(kb), 0);
      QuantizeActE4M3(x, K, B, codes.data(), sb.data(), fmt);
      for (int64_t k = 0; k < K; ++k) q[k] = E4M3ToFloat(codes[k]) * kActOperandScale;
      for (int64_t b = 0; b < kb; ++b) sa[b] = E8M0ToFloat(sb[b]) * kActScaleFactor;
    }
    return;
  }
#pragma omp parallel if (M * K >= (int64_t{1} << 16))
  {
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      if (fn(x + m * K, K, B, q + m * K, sa + m * kb, vmax, inv_max)) continue;
      // Declared here, reached only by a row with a NaN or infinity: a
      // thread_local's first use registers its destructor, a heap
      // allocation, which a finite step must not make.
      thread_local std::vector<uint8_t> codes, sb;
      codes.resize(K);
      sb.resize(kb);
      QuantizeActE4M3(x + m * K, K, B, codes.data(), sb.data(), fmt);
      for (int64_t k = 0; k < K; ++k) q[m * K + k] = E4M3ToFloat(codes[k]) * kActOperandScale;
      for (int64_t b = 0; b < kb; ++b) sa[m * kb + b] = E8M0ToFloat(sb[b]) * kActScaleFactor;
    }
  }
}

void Fp8QdqRows(float* x, int64_t M, int64_t K, int B, Fp8Format fmt) {
  auto* fn = HWY_DYNAMIC_DISPATCH(Fp8QdqRow);
  const float vmax = Fp8ActMax(fmt), inv_max = Fp8ActInvMax(fmt);
  for (int64_t m = 0; m < M; ++m)
    if (!fn(x + m * K, K, B, vmax, inv_max)) Fp8QdqInPlace(x + m * K, K, B, fmt);
}

void Fp4QdqUe8m0Rows(float* x, int64_t M, int64_t K, int B) {
  auto* fn = HWY_DYNAMIC_DISPATCH(Fp4QdqUe8m0Row);
  for (int64_t m = 0; m < M; ++m)
    if (!fn(x + m * K, K, B)) Fp4QdqUe8m0InPlace(x + m * K, K, B);
}

std::string TargetName(int64_t target) { return hwy::TargetName(target); }

std::string ActiveTarget() { return TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)()); }

std::vector<int64_t> AvailableTargets() {
  std::vector<int64_t> r;
  for (int64_t t = hwy::SupportedTargets() & HWY_TARGETS; t != 0; t &= t - 1) r.push_back(t & -t);
  return r;
}

void ReserveLinearScratch(int64_t M, int64_t K) {
  ActBuffers& buf = ThreadActBuffers();
  buf.Resize(M * K, M * (K / 32));
  if (static_cast<int64_t>(buf.qp.size()) < M * (K / 2)) buf.qp.resize(static_cast<size_t>(M * (K / 2)));
  const int64_t few = std::min<int64_t>(M, kBlockGemmMinM - 1);  // linear_fp4.cc: each row below the block GEMM
  if (static_cast<int64_t>(buf.pt.size()) < few * 32 * K) buf.pt.resize(static_cast<size_t>(few * 32 * K));
  if (static_cast<int64_t>(buf.pqi.size()) < few * kFp4IntActBytes * K)
    buf.pqi.resize(static_cast<size_t>(few * kFp4IntActBytes * K));
  if (static_cast<int64_t>(buf.pcorr.size()) < few * (K / 32)) buf.pcorr.resize(static_cast<size_t>(few * (K / 32)));
  HWY_DYNAMIC_DISPATCH(ReserveBlockScratch)(M, K);
}

void ForceTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

// DEEPINFER_TARGET applies to every program that links the kernels (tests
// included: this translation unit is always linked) before main runs.
static const bool kEnvTargetApplied = ApplyTargetFromEnv();

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
