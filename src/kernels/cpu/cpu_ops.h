// deepinfer/kernels/cpu/cpu_ops.h — fast CPU kernels for the linears of the
// DeepSeek-V4.1 forward pass, bit-identical to the scalar reference operators
// of kernels/ref/ref_ops.h (model-spec §3.1(b), §4.1).
//
// Why the results are bit-identical, and how that is kept fast:
//   * The reference sums each output element's products one after the other
//     in FP32 (per 32-wide K block for the quantised linears, then a separate
//     block accumulator in increasing K). FP32 addition is not associative and
//     the in-block sums are NOT exact in general (an E4M3×E4M3 product is a
//     multiple of 2^-18 up to 448² ≈ 2^17.6, so a block sum can need ~41 bits),
//     so the order of every addition is part of the result.
//   * These kernels therefore never split a sum across SIMD lanes. Each lane
//     owns one output element (one weight row n) and walks K in exactly the
//     reference's order. Multiply-adds are fused (FMA) only where every
//     product is exact in FP32, which makes an FMA give the multiply-then-add
//     bits: always for FP8/FP4, for BF16 when a per-call range check passes
//     (linear_common.h; tests/unit/fma_exact_test.cc); elsewhere separate
//     multiply and add (the build uses -ffp-contract=off). Rows are processed 64 at a time from a
//     load-time repacked layout in which the 64 rows' k-th elements are
//     adjacent, so one vector load feeds 16 (AVX-512) or 8 (AVX2) output rows.
//   * Products are exact in FP32, and power-of-two scalings commute with
//     rounding while nothing is subnormal, so the kernels may scale operands:
//     the FP8 kernel multiplies q·2^119 by w·2^-120 (an E4M3 code becomes that
//     FP32 bit pattern with a sign-extend, a shift and a mask), so every
//     product and partial sum is exactly half the reference's, and the
//     activation scale 2·s_act restores the same bits at the block step.
//   * A row's result never depends on M, on which other rows share the call,
//     on the micro-tile it lands in, or on the thread count.
// What is NOT used and why: AVX-512 BF16 (vdpbf16ps) and VNNI integer dot
// products reassociate the sum (pairs / groups of four summed before the
// accumulator, denormals flushed), which changes bits relative to the
// reference's sequential FP32 order; they are deliberately not used.
//
// Runtime dispatch (Highway 1.0.3): AVX-512 (HWY_AVX3), AVX2 (HWY_AVX2) and the
// portable HWY_SCALAR/HWY_EMU128 fallback; never -march=native.
//
// Special values: weights whose codes the repacked path cannot represent
// (E4M3 NaN codes 0x7F/0xFF, UE8M0 scales 0x00 and 0xFF) make the packed
// weight fall back to the scalar reference operator (`use_ref`). An activation
// row containing a NaN or ±Inf is quantised by the scalar quantiser, so NaN
// rows stay NaN exactly where the reference's are. The sign and payload of a
// NaN output are not part of the contract: when two NaNs meet, which one an
// add keeps depends on the operand order the compiler chose for that kernel
// variant, so they may differ from the reference's and between variants (a
// GEMV with fewer tiles than threads runs 16-row slices, so also between
// thread counts). Every non-NaN output is bit-identical.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/numerics.h"
#include "kernels/ref/ref_ops.h"

namespace deepinfer::cpu {

// Rows per repacked tile: every packed layout groups 64 consecutive output
// rows; rows past `out` are zero padding whose results are discarded.
inline constexpr int64_t kTileRows = 64;

// 64-byte aligned heap array (the packed weights and the large scratch
// buffers). AllocateAligned(n): n elements, uninitialised below 2 MiB; from
// 2 MiB an anonymous mapping of its own (zero-filled) starting on a 2 MiB
// boundary with MADV_HUGEPAGE (pack.cc); std::bad_alloc when the size
// overflows or the memory cannot be had. AlignedFree frees either kind.
struct AlignedFree {
  void operator()(void* p) const;
};
template <typename T>
using AlignedArray = std::unique_ptr<T[], AlignedFree>;
template <typename T>
AlignedArray<T> AllocateAligned(size_t n);

// ------------------------------------------------------------------ packed weights
// FP8 E4M3 weight with UE8M0 block scales (block B ∈ {32, 128} or any multiple
// of 16), repacked: w[t][k][r] = src.w[(64t + r)·in + k] (E4M3 code, 0 for
// padding rows), ws[t][k/32][r/16] = scale of rows 64t+r at column k as FP32.
struct PackedFp8 {
  ref::Fp8Weight src;  // the checkpoint view (used by the scalar fallback)
  int64_t tiles = 0;
  AlignedArray<uint8_t> w;
  AlignedArray<float> ws;
  bool use_ref = false;  // NaN codes / unusual scales or block: scalar path
  // Binary exponent range of the block scales (2^e each), for the AVX2 block
  // GEMM's prescaled operands (linear_common.h BlockPrescaleExact); the
  // defaults fail that guard.
  int scale_exp_lo = -1000, scale_exp_hi = 1000;
  size_t bytes() const;  // bytes the kernel streams per call (weights + scales)
};
// FP4 E2M1 routed-expert weight (UE8M0 scale per row and 32 columns),
// repacked: w[t][j][r] = the little-endian dword of row 64t+r holding columns
// 8j..8j+7 (nibble i = column 8j+i: 4 checkpoint bytes copied);
// s[t][g][r] = UE8M0 scale byte of (row 64t+r, group g).
struct PackedFp4 {
  ref::Fp4Weight src;
  int64_t tiles = 0;
  AlignedArray<uint8_t> w;
  AlignedArray<uint8_t> s;
  bool use_ref = false;  // scale bytes 0x00 / 0xFF: scalar path
  int scale_exp_lo = -1000, scale_exp_hi = 1000;  // as PackedFp8
  size_t bytes() const;
};
// BF16 weight [out, in] repacked: w[t][k][r] = src.w[(64t + r)·in + k].
struct PackedBf16 {
  ref::Bf16Weight src;
  int64_t tiles = 0;
  AlignedArray<uint16_t> w;
  // Binary exponent range of the nonzero weights, and whether all are finite
  // (the FMA guard of the BF16 GEMM, linear_common.h Bf16FmaExact).
  // (defaults: no FMA unless PackBf16 measured the weights)
  int exp_lo = -1000, exp_hi = 1000;
  bool finite = true, any_nonzero = true;
  // The 8-bit decode copy, made by PackBf16 when every weight is an E4M3FN
  // value times a power of two shared by its block of 32 rows × 32 columns
  // (`wo_a`: the checkpoint's FP8 × its UE8M0 block scale, dequantised at
  // load, model-spec §2.5 item 3), else null: w8[t][k][r] the E4M3FN code of
  // row 64t+r, column k (0 for padding rows), s8[t][k/32][r/32] = 2^(e+120),
  // so that the weight is exactly (E4M3 value · 2^-120) · s8 (linear_bf16.cc
  // Bf16Micro8). The small-M calls (M <= kBf16CodesMaxM) stream it instead of
  // w when every product of the call is exact: the same bits from half the
  // bytes. s8_exp_lo/hi: the binary exponent range of s8 (blocks of zeros,
  // whose factor is 1, left out).
  AlignedArray<uint8_t> w8;
  AlignedArray<float> s8;
  int s8_exp_lo = 1000, s8_exp_hi = -1000;
  size_t bytes() const;         // bytes allocated for w (and w8, s8 when present)
  size_t decode_bytes() const;  // bytes a small-M call streams: w8 and s8 when present, else w
};
// Calls with at most this many rows may read PackedBf16::w8 where it exists
// (AVX-512 and AVX2: up to 4 rows, the portable targets 2; linear_bf16.cc
// kBf16CodesRows).
inline constexpr int64_t kBf16CodesMaxM = 4;

// FP32 weight [out, in] repacked like PackedBf16 (the mHC `hc_*_fn`), with
// `rows` rows per tile: 64, or 16 / 32 for out <= 16 / 32 (one tile), so a
// small weight (the mHC mixes: out = 24) streams no padding rows.
struct PackedF32 {
  int64_t out = 0, in = 0;
  int64_t tiles = 0;
  int64_t rows = 64;
  AlignedArray<float> w;
  size_t bytes() const;
};

// Load-time repacking (single pass over the weight; parallel over tiles;
// PackBf16 also makes the 8-bit decode copy where the weights allow, a second
// pass that stops at the first weight it cannot hold). The source views must
// outlive the packed weight only for the scalar fallback (use_ref); the
// packed arrays are self-contained otherwise.
PackedFp8 PackFp8(const ref::Fp8Weight& w);
PackedFp4 PackFp4(const ref::Fp4Weight& w);
PackedBf16 PackBf16(const ref::Bf16Weight& w);
PackedF32 PackF32(const float* w, int64_t out, int64_t in);

// Row concatenation of two packed weights: the packed form of [a; b] (a's
// rows first, out = a.out + b.out), copied from the two packed arrays — a
// merged linear as vLLM's MergedColumnParallelLinear (an expert's gate and up
// projections `w1‖w3`, the attention's `wq_a‖wkv`). Both must have the same
// `in` (FP8: the same block), a.out a multiple of kTileRows, and neither may
// take the scalar fallback (use_ref); otherwise the result is null. One call
// over the result gives every row the bits of the separate calls: each
// output row is computed on its own, and the activations are quantised the
// same way in both (same x, act_block and act_format). The result has no
// checkpoint view (src.w and src.scale null, src.out = a.out + b.out):
// LinearFp8/LinearFp4 raise Error(kInvalidArgument) for an act_block that
// would need the scalar path on it. scale_exp_lo/hi span both.
std::unique_ptr<PackedFp8> ConcatPackedRows(const PackedFp8& a, const PackedFp8& b);
std::unique_ptr<PackedFp4> ConcatPackedRows(const PackedFp4& a, const PackedFp4& b);

// ------------------------------------------------------------------ linears
// Same contracts as the ref:: operators of the same name (ref_ops.h), with the
// packed weight in place of the view; results are bit-identical to them for
// every M, thread count and dispatch target. x and y must not alias.
//
// FP8 linear: act_block must be a multiple of 32 that divides in (32 for
// V4.1), as for ref::LinearFp8; another act_block takes the reference's path,
// which raises Error(kInvalidArgument) when it does not divide in. act_format selects the activation quantiser
// (QuantizeActE4M3's fmt: maximum 448 or 224); the weight codes are used as
// they are (e4m3-ieee weights are transformed at load, HalveE4M3).
void LinearFp8(const float* x, int64_t M, const PackedFp8& w, int act_block, float* y,
               Fp8Format act_format = Fp8Format::kE4M3FN);
// FP4 routed-expert linear: act_block a multiple of 32 dividing in.
void LinearFp4(const float* x, int64_t M, const PackedFp4& w, int act_block, float* y,
               Fp8Format act_format = Fp8Format::kE4M3FN);
// BF16 linear, FP32 accumulation in increasing k; BF16 output. `pairs` selects
// the pair order (inside each pair (k, k+1) the k+1 product is added first,
// then k; an odd last element last), which the model is evaluating as the
// reference's BF16 matmul order. Note: g++ 12.2 -O2 vectorises and
// reassociates a scalar loop written in that pair order (wrong code); the
// scalar oracle in the test is compiled without tree vectorisation.
void LinearBf16(const float* x, int64_t M, const PackedBf16& w, float* y, bool pairs = false);
// FP32 input × BF16-upcast weight, FP32 output (head, router, ratio-2
// compressor): as ref::LinearF32Bf16W.
void LinearF32Bf16W(const float* x, int64_t M, const PackedBf16& w, float* y);
// FP32 × FP32 weight, FP32 output, products and sums in increasing k: as
// ref::LinearF32.
void LinearF32(const float* x, int64_t M, const PackedF32& w, float* y);
// Grouped BF16 `wo_a` (as ref::GroupedLinearBf16): wa.out = groups·R; when R
// is not a multiple of 64 a scalar loop (ref::GroupedLinearBf16, or in the
// pair order when `pairs`) is used.
void GroupedLinearBf16(const float* o, int64_t M, int groups, const PackedBf16& wa, float* z,
                       bool pairs = false);

// ------------------------------------------------------------------ non-GEMM ops
// The reference operators whose inner loops are long sequential FP32 dot
// products, with those dot products vectorised across outputs (same order per
// output) and everything else copied from ref_ops.cc; bit-identical to the
// ref:: operator of the same name (tests/unit/cpu_model_ops_test.cc checks them
// against the ref:: functions, so a change there shows up as a failure).
//
// As ref::Router, with the gate weight repacked (PackBf16(gate.weight())).
void Router(const float* x, int64_t M, const PackedBf16& gate, const float* const* bias, int topk, float gate_temp,
            bool norm_topk_prob, float route_scale, const int32_t* softplus_vec, int32_t* indices, float* weights);
// As ref::HcMixes, with `fn` repacked (PackF32(fn, (2+hc)·hc, hc·d)).
void HcMixes(const float* X, int64_t M, int hc, int64_t d, const PackedF32& fn, const float* base,
             const float* scale, float norm_eps, int sinkhorn_iters, float hc_eps, const int32_t* sig_vec,
             float* pre, float* post, float* comb);
// As ref::SparseAttention (one query row, all heads). The q·k dot products
// and the softmax statistics run 16 (AVX-512) heads per vector, each lane in
// the reference's order; P·V runs in register tiles of heads × d. On AVX-512
// CPUs with AVX512_BF16 the q·k and pb·k products take the BF16 pair dots
// where their exponent ranges allow (bf16_dot.h, "Sparse attention"). A large
// call made outside any parallel region splits the work over the OpenMP team
// (inside one, e.g. the model's row loop, it runs on the calling thread).
void SparseAttention(const float* q, int H, int64_t D, const uint16_t* const* kv, const int32_t* slot, int n,
                     int32_t list_len, const float* sink, float softmax_scale, float* out);
// The key-row widening inside SparseAttention, exposed for its tests:
// dst[d] = FP32 of the BF16 bits src[d] (d < D), *emin / *emax = the smallest
// and largest exponent fields of the row's nonzero elements (a subnormal's
// field 0 counted as 1; NaN and Inf 255), 255 / 0 when every element is ±0:
// the range Bf16FieldsProductsExact (kernels/cpu/linear_common.h) judges the FMA by.
void WidenBf16Row(const uint16_t* src, int64_t D, float* dst, int32_t* emin, int32_t* emax);
// As ref::HcCollapse / ref::HcExpand (mHC, model-spec §3.3.3): X [M, hc, d],
// pre/post [M, hc], comb [M, hc, hc], v and x [M, d], Xout [M, hc, d], all
// FP32 (outputs BF16 values). Vectorised along d, each lane doing the
// reference's operations on its element in the same order; rows split over
// the OpenMP team. Bit-identical on every target.
void HcCollapse(const float* X, const float* pre, int64_t M, int hc, int64_t d, float* x);
void HcExpand(const float* v, const float* X, const float* post, const float* comb, int64_t M, int hc, int64_t d,
              float* Xout);
// y[i] = ref::SleefExpf(x[i]), vectorised (bit-identical on every input).
void SleefExpfRow(const float* x, int64_t n, float* y);
// The experts' SwiGLU steps around the exp (model/v41/kernels.h SwiGlu,
// Expert.forward, model-spec §3.3.5), elementwise over n floats, each the
// scalar code's operations in its order (bit-identical on every target; a
// NaN stays a NaN, its payload is not specified). swiglu.cc.
// SwiGluClamp: when lim > 0, up[i] = std::min(std::max(up[i], -lim), lim)
// and gate[i] = std::min(gate[i], lim); then neg[i] = -gate[i].
void SwiGluClamp(float* gate, float* up, float* neg, int64_t n, float lim);
// SwiGluAct: a = (gate[i] / (1 + e[i]))·up[i] (e[i] = exp(-gate[i])), a = *w·a
// when w is not null, out[i] = RoundBf16(a) (out null or gate: in place;
// else n floats that overlap none of the inputs).
void SwiGluAct(float* gate, const float* up, const float* e, int64_t n, const float* w, float* out = nullptr);

// Lightning-indexer scores of one query row (model-spec indexer; the
// reference's score formula), bit-identical to the scalar loop
//   for j < n: acc = 0
//     for h < nh: dot = 0; for c < ID: dot += q[h·ID + c]·k_j[c]   (multiply, then add)
//                 acc += bf16(max(bf16(dot), 0.0f)·w[h])          (std::max: NaN, -0.0 kept)
//     score[j] = bf16(acc)
// q [nh, ID] FP32 (the FP4-QDQ'd query heads), w [nh] FP32 (BF16-rounded
// head weights), score [n] FP32 (BF16 values). The keys k_j (BF16 rows of ID
// elements, j < n) are read from the blocked FP32 layout kt written by
// PackIndexKey: kt[(j/16)·16·ID + c·16 + j%16] = k_j[c], kt sized to
// ceil(E/16)·16·ID elements with the padding keys zero. Each SIMD lane owns
// one key and performs exactly the loop's operations in its order (separate
// multiply and add: the product can underflow, so FMA would change bits), so
// the result does not depend on the target or on n.
inline constexpr int64_t kIndexKeyBlock = 16;
void PackIndexKey(const uint16_t* k, int64_t j, int64_t ID, float* kt);
void IndexerScores(const float* q, const float* w, int64_t nh, int64_t ID, const float* kt, int64_t n,
                   float* score);
// PackAndScoreIndexKeys: PackIndexKey(rows[j], j, ID, kt) for j < n (and
// zeros for the padding keys of the last block), then IndexerScores over the
// n keys: the same bits. The keys are split over the OpenMP team (NumThreads())
// in chunks of kIndexKeyChunk keys, each thread packing the keys it scores,
// when there are two chunks or more and n·nh·ID >= 2^19 multiply-adds; inside
// a parallel region it runs on the calling thread. For a single query row
// (a decode step), whose scores would otherwise run on one thread.
// rows[j]: key j's ID BF16 values; kt as for IndexerScores.
inline constexpr int64_t kIndexKeyChunk = 64;
static_assert(kIndexKeyChunk % kIndexKeyBlock == 0, "a chunk holds whole key blocks");
void PackAndScoreIndexKeys(const float* q, const float* w, int64_t nh, int64_t ID, const uint16_t* const* rows,
                           int64_t n, float* kt, float* score);

// ------------------------------------------------------------------ QDQ
// format/numerics.h Fp8QdqInPlace / Fp4QdqUe8m0InPlace on each of M rows of
// K floats (x [M, K] in place, blocks of B along a row), vectorised and
// bit-identical to them (a row with a NaN or infinity takes them as they
// are). The model's window-K QAT (FP8, B = 32) and the indexer's query and
// key QDQ (FP4, B = 32). The rows run on the calling thread. act_quant.cc.
void Fp8QdqRows(float* x, int64_t M, int64_t K, int B, Fp8Format fmt = Fp8Format::kE4M3FN);
void Fp4QdqUe8m0Rows(float* x, int64_t M, int64_t K, int B = 32);

// ------------------------------------------------------------------ activation quantiser
// Fused activation quantisation of rows x [M, K] (model-spec §3.1(b) step 1),
// bit-identical to QuantizeActE4M3 (with the same fmt) followed by
// E4M3ToFloat up to exact power-of-two operand scalings: writes q[m·K + k] =
// E4M3 value of the quantised element × 2^119 and sa[m·(K/B) + b] = the
// block's power-of-two scale × 2 (the FP8/FP4 kernels' operands; see
// kernels/cpu/linear_common.h).
void QuantizeActRows(const float* x, int64_t M, int64_t K, int B, float* q, float* sa,
                     Fp8Format fmt = Fp8Format::kE4M3FN);

// ------------------------------------------------------------------ threading
// The linears split output tiles (and row chunks) over the OpenMP team
// (base/parallel.h NumThreads()); a call with fewer than `macs` multiply-adds
// (M·N·K) runs on the calling thread, which avoids a fork/join for the small
// decode GEMVs (default 2^16, linear_common.h). Never changes a result.
void SetMinParallelMacs(int64_t macs);
// Makes the calling thread's activation scratch of the FP8/FP4 linears (the
// quantised rows, their scales, the BF16 pairs, the AVX2 FP4 product tables
// and, on AVX2 from 16 rows, the block GEMM's packed activations and
// converted-weight block) hold M rows of K (it only grows; act_block >= 32;
// for the active dispatch target). Rows with a NaN or infinity take the
// scalar quantiser, whose scratch is not covered. A forward pass
// whose threads take differently sized tasks (the MoE's experts) calls it on
// every thread of the team for the largest M first, so no later step allocates.
void ReserveLinearScratch(int64_t M, int64_t K);

// ------------------------------------------------------------------ dispatch control
// BF16 pair dots (kernels/cpu/bf16_dot.h has the exactness argument): on the
// AVX-512 target, when the CPU has AVX512_BF16 and AVX512_VBMI and its
// VDPBF16PS passed a self-check against the two-step FMA definition, FP4
// linears with M >= 2 (prefill GEMMs, decode calls of several rows; one row
// takes the integer dots, faster from DRAM: linear_fp4.cc RunFp4Call), FP8
// linears with M >= 96 (prefill), BF16 linears with M >= 32 whose operands'
// exponent ranges allow (Bf16PairDotsExactRanges) and the sparse attention's
// products (SparseAttention) run two products per VDPBF16PS: the same bits
// as the FP32 path. Bf16DotSupported() says whether this CPU can;
// SetBf16Dot(false) switches the paths off (tests and benchmarks compare the
// two; the default is on). Not thread-safe with concurrent kernel calls.
bool Bf16DotSupported();
void SetBf16Dot(bool enable);
// Name of the Highway target the kernels dispatch to now ("AVX3", "AVX2",
// "EMU128", "SCALAR", ...).
std::string ActiveTarget();
// The targets compiled into the kernels that this CPU supports, best first.
std::vector<int64_t> AvailableTargets();
// Restricts dispatch to `target` (one HWY_* bit from AvailableTargets()), or
// restores normal dispatch for 0. For tests and benchmarks; not thread-safe
// with concurrent kernel calls.
void ForceTarget(int64_t target);
std::string TargetName(int64_t target);
// The `--target` spelling of a target: "avx512" (HWY_AVX3), "avx2", else the
// lower-case Highway name ("emu128", "scalar").
std::string TargetFlagName(int64_t target);
// `--target NAME` / DEEPINFER_TARGET=NAME: "auto" (the best supported target),
// "avx512" (also "avx3"), "avx2", or the fallback's name ("emu128" or
// "scalar", as AvailableTargets() lists it); case-insensitive. Restricts
// dispatch like ForceTarget. Throws kInvalidArgument naming the value and the
// available names when this binary/CPU cannot run it. DEEPINFER_TARGET is
// applied when the program starts (a bad value exits with status 2), so the
// test binaries can be run under each target.
void SelectTarget(const std::string& name);
// Applies DEEPINFER_TARGET when set (returns whether it was); a bad value
// prints the error and exits with status 2. Called once at start-up.
bool ApplyTargetFromEnv();

}  // namespace deepinfer::cpu
