// deepinfer/kernels/cpu/linear_common.h — target-independent plumbing shared
// by the kernels/cpu linear translation units (not a public header).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "base/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace deepinfer::cpu {

// Operand scaling of the FP8/FP4 kernels. The kernels multiply
// q·2^119 (QuantizeActRows) by w·2^-120 (the E4M3 code turned into an FP32
// bit pattern by a sign-extend, a shift and a mask; the E2M1 table scaled the
// same way), so every product is (q·w)/2 exactly and every partial sum is
// exactly half the reference's (binary scaling commutes with rounding while
// nothing is subnormal: the smallest nonzero |q·w|/2 is 2^-19 resp. 2^-11).
// The activation scale handed to the kernels is 2·s_act, so
// (partial/2)·(2·s_act) is the same real number as partial·s_act and rounds
// identically. q·2^119 stays finite: |q| <= 448 < 2^9.
inline constexpr float kActOperandScale = 0x1p119f;
inline constexpr float kActScaleFactor = 2.0f;

// Software prefetch distance of the weight streams: measured on Zen 5 (one
// core, 256 MB FP8 matrix from DRAM), 8 KiB ahead lifted the FP8 GEMV from
// ~19 to ~26 GB/s and BF16 from ~20 to ~26 GB/s; no effect in cache.
inline constexpr int64_t kPrefetchBytes = 8192;

// Everything one linear call needs; items are (tile, m-chunk) pairs.
struct QArgs {
  int64_t K = 0, N = 0, M = 0;
  int ab = 32;                    // activation block (quantised linears)
  int64_t tiles = 0;
  int64_t mchunk = 1, mchunks = 1;
  // Largest m-chunk ParallelItems may take (MChunkRows; a multiple of
  // kMChunk), 0 = kMChunk: set by the AVX2 block GEMM's entries
  // (hwy_util-inl.h RunLinearCall, linear_bf16.cc RunBf16Call).
  int64_t max_mchunk = 0;
  // Row slices (ParallelItems): 0 = items are (tile, m-chunk); else each item
  // is one slice of kSliceRows output rows (all M rows, M < kBlockGemmMinM).
  int64_t slices = 0;
  const uint8_t* w = nullptr;     // FP8 codes / FP4 nibbles
  const uint16_t* wb = nullptr;   // BF16 weights
  const float* wf = nullptr;      // FP32 weights (LinearF32)
  int64_t wf_rows = 0;            // LinearF32: rows per packed tile (PackedF32::rows)
  bool no_slices = false;         // never split rows into slices (ParallelItems)
  const float* ws = nullptr;      // FP8: per 16 rows × 32 columns scales
  const uint8_t* s = nullptr;     // FP4: UE8M0 scale bytes [tile][group][64]
  const float* q = nullptr;       // quantised activations ×256 [M, K] (or FP32 x for BF16)
  int64_t ldq = 0;                // row stride of q (elements)
  const float* sa = nullptr;      // activation scales [M, K/ab]
  const uint32_t* qp = nullptr;   // FP4, few rows: q as BF16 pairs (bf16_dot.h), or null
  // FP4 below the block GEMM on AVX2: every activation row's product tables
  // (linear_fp4.cc BuildFp4ProductTables: 32 bytes per column, row m at
  // pt + 32·K·m), or null; fp4_rowwise: run the rows one by one over each
  // tile (the integer-dot / table GEMV) instead of the multi-row micro-tile.
  const uint8_t* pt = nullptr;
  bool fp4_rowwise = false;
  // ... and every row's integer operands (BuildFp4IntActs: kFp4IntActBytes
  // per column) with each group's correction, INT32_MIN where the group takes
  // the tables or the FP32 path instead (AVX2; AVX-512 without the pair dots).
  const int8_t* pqi = nullptr;
  const int32_t* pcorr = nullptr;
  float* y = nullptr;             // output [M, ldy]
  int64_t ldy = 0;
  // BF16 linears
  bool pairs = false;             // ref::DotBf16 pair order
  bool round = true;              // round the output to BF16
  int64_t group_rows = 0;         // grouped wo_a: outputs per group (R), 0 = plain
  int64_t group_in = 0;           // grouped wo_a: input columns per group (Kg)
  bool fma = false;               // BF16: every product exact (Bf16FmaExact)
  // BF16: the products also take the BF16 pair dots (fma, and no operand or
  // partial sum subnormal: Bf16PairDotsExactRanges); qp then holds the pairs.
  bool pair_dots_exact = false;
  // BF16 linears, small M: the weight's 8-bit decode copy (PackedBf16::w8,
  // s8), used when set (RunBf16 checks that every x·s8 and product is exact).
  const uint8_t* w8 = nullptr;
  const float* s8 = nullptr;
  // FP8/FP4 block GEMM (AVX2): binary exponent range of the weight scales
  // (PackedFp8/PackedFp4::scale_exp_lo/hi), and whether this call's operands
  // are prescaled (BlockPrescaleExact below; set by RunLinearCall).
  int w_exp_lo = -1000, w_exp_hi = 1000;
  bool prescaled = false;
};

// ---------------------------------------------------------------- FMAs
// An FMA rounds a·b + c once, a multiply then an add rounds a·b first: the
// two give the same bits for every c whenever a·b is exact in FP32
// (tests/unit/fma_exact_test.cc checks every code pair). E4M3×E4M3 and
// E2M1×E4M3 products (also in the scaled operand units above: |product| >=
// 2^-19, at most 8 significant bits) always are, so the FP8/FP4 kernels use
// FMAs unconditionally. A BF16×BF16 product (8 significant bits each) is
// exact unless it underflows or overflows: with ea, eb the binary exponents
// (floor(log2|v|)) of the nonzero operands, exactly when ea + eb lies in
// [kBf16FmaMinExpSum, kBf16FmaMaxExpSum] (the product's lowest bit is at
// least 2^-149; it stays below 2^127). The BF16 GEMM checks that per call
// (activations: every value BF16-exact and finite, weights: their range at
// pack time) and otherwise multiplies then adds.
inline constexpr int kBf16FmaMinExpSum = -135;
inline constexpr int kBf16FmaMaxExpSum = 125;
// The same guard on ranges of biased FP32 exponent fields of BF16-exact
// values, as the sparse attention tracks them (attention.cc): field 0 (a BF16
// subnormal, M·2^-133 with M < 128) counts as 1, i.e. exponent -126, which
// gives its lowest bit correctly; field 255 (Inf, NaN) fails. True when
// every product of nonzero values with fields in [amin, amax] and
// [bmin, bmax] is exact (fma_exact_test covers normals and subnormals).
inline bool Bf16FieldsProductsExact(int amin, int amax, int bmin, int bmax) {
  return amax < 255 && bmax < 255 && (amin - 127) + (bmin - 127) >= kBf16FmaMinExpSum &&
         (amax - 127) + (bmax - 127) <= kBf16FmaMaxExpSum;
}

// The guard of the sparse attention's BF16 pair dots (attention_bf16.cc),
// which flush subnormal inputs and outputs (VDPBF16PS): on top of
// Bf16FieldsProductsExact, no operand is subnormal (fields >= 2: a field 1
// is refused too, as the ranges count a subnormal's 0 as 1) and the smallest
// product's lowest bit, 2^(amin + bmin - 268) for significands of 8 bits, is
// at least 2^-126, so every partial sum (a multiple of it) is 0 or normal.
inline constexpr int kBf16PairMinFieldSum = 142;
inline bool Bf16PairDotsExact(int amin, int amax, int bmin, int bmax) {
  return Bf16FieldsProductsExact(amin, amax, bmin, bmax) && amin >= 2 && bmin >= 2 &&
         amin + bmin >= kBf16PairMinFieldSum;
}

// Binary exponent range of the nonzero values (subnormals count as -150, so
// they fail the guard), whether every value is finite, and whether every
// value is exactly a BF16.
struct ExpRange {
  int lo = 1000, hi = -1000;
  bool finite = true, bf16 = true, any_nonzero = false;
  void Add(uint32_t u) {
    const uint32_t e = (u >> 23) & 0xFFu;
    if (e == 0xFFu) finite = false;
    if ((u & 0x7FFFFFFFu) == 0) return;
    any_nonzero = true;
    const int x = e == 0 ? -150 : static_cast<int>(e) - 127;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  // The range of the union of two sets of values.
  void Merge(const ExpRange& o) {
    lo = std::min(lo, o.lo);
    hi = std::max(hi, o.hi);
    finite = finite && o.finite;
    bf16 = bf16 && o.bf16;
    any_nonzero = any_nonzero || o.any_nonzero;
  }
};
inline ExpRange Bf16CodesExpRange(const uint16_t* w, int64_t n) {
  ExpRange r;
  for (int64_t i = 0; i < n; ++i) r.Add(static_cast<uint32_t>(w[i]) << 16);
  return r;
}
// Rows x[m·ld + k], m < M, k < K. Branch-free per element: the definition
// the vectorised scan (hwy_util-inl.h ActExpRangeV, ActivationExpRange
// below) is tested against; the kernels call that one.
inline ExpRange FloatsExpRange(const float* x, int64_t M, int64_t K, int64_t ld) {
  uint32_t low_bits = 0, e_lo = 0xFF, e_hi = 0, any = 0, inf_nan = 0;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ld;
    for (int64_t k = 0; k < K; ++k) {
      uint32_t u;
      std::memcpy(&u, xr + k, 4);
      const uint32_t mag = u & 0x7FFFFFFFu, e = mag >> 23;
      const uint32_t nz = mag != 0 ? 1u : 0u;
      low_bits |= u & 0xFFFFu;
      inf_nan |= e == 0xFFu ? 1u : 0u;
      any |= nz;
      e_lo = std::min(e_lo, nz ? e : 0xFFu);
      e_hi = std::max(e_hi, nz ? e : 0u);
    }
  }
  // As ExpRange::Add: biased exponent 0 (a subnormal) counts as -150.
  ExpRange r;
  r.bf16 = low_bits == 0;
  r.finite = inf_nan == 0;
  r.any_nonzero = any != 0;
  if (r.any_nonzero) {
    r.lo = e_lo == 0 ? -150 : static_cast<int>(e_lo) - 127;
    r.hi = e_hi == 0 ? -150 : static_cast<int>(e_hi) - 127;
  }
  return r;
}
// FloatsExpRange with the dispatch target's vectors, the rows split over the
// OpenMP team from 2^16 values (linear_bf16.cc ActExpRangeTeam: the guard of
// the BF16 GEMMs of 16 rows or more): the same result for every target and
// thread count.
ExpRange ActivationExpRange(const float* x, int64_t M, int64_t K, int64_t ld);
// True when every product x·w of the call is exact in FP32 (see above).
inline bool Bf16FmaExact(const ExpRange& x, const ExpRange& w) {
  if (!x.finite || !w.finite || !x.bf16) return false;
  if (!x.any_nonzero || !w.any_nonzero) return true;
  return x.lo + w.lo >= kBf16FmaMinExpSum && x.hi + w.hi <= kBf16FmaMaxExpSum;
}
// Bf16PairDotsExact's rule on ExpRanges (binary exponents, a subnormal
// counted as -150): the products exact, no operand subnormal (lo >= -126:
// the sum rule alone lets a subnormal weight through against activations of
// 2^38 or more, and the instruction reads it as 0), and the smallest
// product's lowest bit, 2^(x.lo + w.lo - 14), at least 2^-126.
inline bool Bf16PairDotsExactRanges(const ExpRange& x, const ExpRange& w) {
  if (!Bf16FmaExact(x, w)) return false;
  if (!x.any_nonzero || !w.any_nonzero) return true;
  return x.lo >= -126 && w.lo >= -126 && x.lo + w.lo >= kBf16PairMinFieldSum - 2 * 127;
}

// ---------------------------------------------------------------- block GEMM
// Prescaled operands. The reference's block step is
//   acc = acc + (partial·s_act)·s_w,   partial = Σ_k q[k]·w[k] in order,
// with q, w the E4M3 / E2M1 values and UE8M0 scales, i.e. powers of two. A
// multiplication by a power of two is exact, and rounding commutes with it,
// as long as no value involved leaves the normal range. Then running the
// block's sum over q·s_act and w·s_w (the dequantised operands) gives
// exactly partial·s_act·s_w at every step, and the fold is one add:
// acc = acc + partial'. It holds when, with e_a, e_w the scales' exponents:
// every nonzero q·s_act and w·s_w is normal (|q|, |w| >= 2^-9 and <= 448 for
// E4M3; E2M1 weights are 0.5 ... 6),
// every nonzero product and partial sum is normal and finite in both forms
// (a multiple of 2^-18·s (E4M3·E4M3; 2^-10·s for E2M1) and below
// K_block·448² < 2^31 times s, for s = s_act or s_act·s_w). Bounds with room:
//   e_a, e_w and e_a + e_w in [-100, 90].
// QuantizeActRows gives e_a in about [-22, 121] for finite rows; checkpoints have
// e_w in about [-30, 0]; a call outside the bounds (or with a non-finite
// row's scale) keeps the two multiplies per fold.
inline constexpr int kPrescaleMinExp = -100;
inline constexpr int kPrescaleMaxExp = 90;
// Exponent of a positive normal power of two, or INT32_MIN for anything else.
inline int Pow2Exponent(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t e = (u >> 23) & 0xFFu;
  if ((u & 0x807FFFFFu) != 0 || e == 0 || e == 0xFFu) return INT32_MIN;
  return static_cast<int>(e) - 127;
}
// Whether the block GEMM may run on prescaled operands: the weights' scale
// range [w_lo, w_hi] and the kernels' activation scales sa (n values,
// kActScaleFactor·s_act each) satisfy the bounds above.
inline bool BlockPrescaleExact(int w_lo, int w_hi, const float* sa, int64_t n) {
  if (w_lo < kPrescaleMinExp || w_hi > kPrescaleMaxExp || w_lo > w_hi) return false;
  static_assert(kActScaleFactor == 2.0f, "e_a = exponent(sa) - 1");
  for (int64_t i = 0; i < n; ++i) {
    const int e = Pow2Exponent(sa[i]);
    if (e == INT32_MIN) return false;
    const int ea = e - 1;
    if (ea < kPrescaleMinExp || ea > kPrescaleMaxExp || ea + w_lo < kPrescaleMinExp || ea + w_hi > kPrescaleMaxExp)
      return false;
  }
  return true;
}

// Prefill-sized calls (M >= kBlockGemmMinM) of the FP8/FP4 linears convert
// each (64-row tile, K block) of weights once into FP32 operands in
// BlockScratch::w and run every activation row of the m-chunk over it; the
// accumulators of the chunk live in BlockScratch::acc.
inline constexpr int64_t kBlockGemmMinM = 16;

// linear_fp4.cc BuildFp4IntActs: bytes of integer operands per activation
// column (AVX2, and AVX-512 without the pair dots; each row below
// kBlockGemmMinM).
inline constexpr int64_t kFp4IntActBytes = 2;
struct BlockScratch {
  AlignedArray<float> w, sw, acc;  // 64-byte aligned (StoreRows loads acc aligned)
  AlignedArray<uint32_t> wp;       // linear_fp8.cc RunFp8DotItems: one block's weight pairs
  int64_t nw = 0, nacc = 0, nwp = 0;
  void ResizePairs(int64_t want) {
    if (nwp < want) {
      wp = AllocateAligned<uint32_t>(static_cast<size_t>(want));
      nwp = want;
    }
  }
  void Resize(int64_t want_w, int64_t want_acc) {
    if (nw < want_w) {
      w = AllocateAligned<float>(static_cast<size_t>(want_w));
      nw = want_w;
    }
    if (sw == nullptr) sw = AllocateAligned<float>(kTileRows);
    if (nacc < want_acc) {
      acc = AllocateAligned<float>(static_cast<size_t>(want_acc));
      nacc = want_acc;
    }
  }
};
inline BlockScratch& ThreadBlockScratch() {
  thread_local BlockScratch s;
  return s;
}

// Per-thread activation scratch (grows, never shrinks).
struct ActBuffers {
  std::vector<float> q, sa;
  std::vector<uint32_t> qp;  // bf16_dot.h PackActPairs
  std::vector<uint8_t> pt;   // linear_fp4.cc BuildFp4ProductTables (AVX2)
  std::vector<int8_t> pqi;   // linear_fp4.cc BuildFp4IntActs
  std::vector<int32_t> pcorr;
  void Resize(int64_t nq, int64_t nsa) {
    if (static_cast<int64_t>(q.size()) < nq) q.resize(nq);
    if (static_cast<int64_t>(sa.size()) < nsa) sa.resize(nsa);
  }
};
inline ActBuffers& ThreadActBuffers() {
  thread_local ActBuffers b;
  return b;
}

// Calls with fewer multiply-adds than this run on the calling thread only
// (cpu_ops.h SetMinParallelMacs). 2^16 (64 K weights, ~3 us of DRAM stream
// per core) lets the small matrices of a decode step (wq_a, wkv, the shared
// expert, the compressor: 0.5 M MACs at dim 1024) split over the team;
// measured on the `large` preset, 2 threads: the step time is the same as
// with 2^20 (23.3-23.5 ms) and 2^14 is slower (25.3 ms, fork/join cost).
inline int64_t g_min_parallel_macs = int64_t{1} << 16;

// Runs fn over all (tile, m-chunk) items on the OpenMP team (NumThreads()),
// or on the calling thread for small calls. Each output element is produced
// by exactly one item, so the split never changes a result.
// One m-chunk (decode GEMVs): static ranges with stealing from the back
// (base/parallel.h ParallelForStealing) instead of `schedule(static)`:
// measured, Zen 5, 2 threads, a 32 768 × 1 024 BF16 head-like GEMV from DRAM
// 1.11× (AVX-512) / 1.15× (AVX2) faster (medians of 11 alternated rounds);
// the decode step of the `large` preset 1.002-1.053× at batch 1 and
// 1.000-1.049× at batch 4 (ten runs, both targets, the two forms alternated
// every step). `dynamic` chunks were slower (0.96-0.97×): they break each
// thread's contiguous stream.
//
// A call with fewer tiles than threads and few rows (a decode GEMV with
// N <= 64 on 2 threads) splits its rows into slices of kSliceRows instead,
// one item each, so it does not run on one thread while the others wait —
// unless a.no_slices: a narrow PackedF32 (the mHC mixes, N = 24, 32 rows per
// k) streams its dense rows faster on one thread (measured, Zen 5, 24×4096
// from DRAM: 12.5 us on one thread, 16.5 us split into two slices, whose
// threads both pull every cache line; 25-38 us with the 64-row padded pack).
inline constexpr int64_t kSliceRows = 16;
// The m-chunk of ParallelItems' items: 96 rows (a multiple of every
// micro-tile height) or, where a.max_mchunk allows, a larger multiple of 96
// (at most a.max_mchunk) aiming at about 4 items per thread (the weight
// conversion of a prefill GEMM is paid once per m-chunk).
inline constexpr int64_t kMChunk = 96;
inline int64_t MChunkRows(const QArgs& a, int threads) {
  if (a.M <= kMChunk) return a.M;
  if (a.max_mchunk <= kMChunk || a.tiles <= 0) return kMChunk;
  const int64_t chunks = std::max<int64_t>(1, (4 * int64_t{threads} + a.tiles - 1) / a.tiles);
  const int64_t rows = (a.M + chunks - 1) / chunks;
  return std::clamp((rows + kMChunk - 1) / kMChunk * kMChunk, kMChunk, a.max_mchunk);
}
template <typename Fn>
void ParallelItems(QArgs& a, Fn* fn) {
  a.mchunk = MChunkRows(a, InParallelRegion() ? 1 : NumThreads());
  a.mchunks = (a.M + a.mchunk - 1) / a.mchunk;
  int64_t items = a.tiles * a.mchunks;
  const QArgs& ca = a;
  // Inside a parallel region (the MoE's experts, one per thread) the call
  // stays on its thread: a nested region would run with one thread anyway,
  // and opening it cost 1.5-4 us per call (measured, Zen 5, two experts'
  // 512×1024 FP4 GEMVs in parallel: 12 -> 10 us on AVX-512, 36 -> 32 us on AVX2).
  const bool parallel = a.M * a.N * a.K >= g_min_parallel_macs && !InParallelRegion();
  if (parallel && a.M < kBlockGemmMinM && items < NumThreads() && !a.no_slices) {
    a.slices = (a.N + kSliceRows - 1) / kSliceRows;
    items = a.slices;
  }
  if (!parallel || items == 1) {
    fn(ca, 0, items);
  } else if (a.mchunks == 1) {
    ParallelForStealing(items, [&](int64_t i) { fn(ca, i, i + 1); });
  } else {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) fn(ca, i, i + 1);
  }
}

}  // namespace deepinfer::cpu
