// deepinfer/kernels/cpu/bf16_dot.h — products as BF16 pair dots
// (VDPBF16PS) on x86 CPUs with AVX512_BF16 and AVX512_VBMI (Zen 4/5, Sapphire
// Rapids and later): the FP4 linears from 2 rows (RunFp4Call), the FP8
// linears from 96, the BF16 linears from 32 (linear_bf16.cc) and the sparse
// attention (attention.cc). Not a public header: used by those kernels'
// AVX-512 paths; cpu_ops.h exposes the switch.
//
// Exactness: VDPBF16PS computes, per FP32 lane, c + a_hi·b_hi then + a_lo·b_lo,
// each an FMA rounded to nearest even with denormal inputs and outputs
// flushed (Intel SDM). The operands here are the kernels' scaled operands
// (linear_common.h kActOperandScale): q·2^119 (an E4M3 value: 4 significant
// bits, normal) and the E2M1 value ·2^-120 (normal), both exact in BF16; their
// product (at most 6 significant bits) is exact in FP32, so each FMA gives the
// bits of the reference's multiply then add; every partial sum is 0 or at
// least 2^-12 in magnitude, so the flushing never applies. The CPU's
// instruction is checked once against that two-step definition
// (SelfCheck in bf16_dot.cc, crafted and pseudo-random lanes); a CPU
// whose VDPBF16PS differs keeps the FP32 path.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace deepinfer::cpu {

// One call's operands. qp [M, ldqp]: per activation row, dword p =
// (BF16 bits of q[2p]) << 16 | (BF16 bits of q[2p+1]) (PackActPairs); sa
// [M, K/ab]: the activation scales as the FP32 kernels take them (2·s_act).
struct Fp4DotArgs {
  int64_t K = 0;
  int ab = 32;
  const uint32_t* qp = nullptr;
  int64_t ldqp = 0;
  const float* sa = nullptr;
};

// Bf16DotSupported() and not switched off by SetBf16Dot(false)
// (both in cpu_ops.h).
bool Bf16DotActive();

// qp[m·K/2 + p] for rows m < M of q (row stride ldq, K a multiple of 32),
// each nonzero value first scaled by 2^-exp_shift (exact: an exponent
// change; 0 for FP4, 20 for FP8 below); false (qp unusable) when a value is
// not finite, not exactly a BF16 or too small to stay normal. swap: q[2p+1]
// in the high word instead (ref::DotBf16's pair order). Only call when
// Bf16DotActive().
bool PackActPairs(const float* q, int64_t M, int64_t K, int64_t ldq, uint32_t* qp, int exp_shift = 0,
                  bool swap = false);

// The micro-tile of rows [roff, roff + 16·v) of one packed 64-row tile (wt:
// its FP4 dwords, st: its UE8M0 scale bytes, pack.cc layout) × activation
// rows m0 .. m0+mt-1 (1 <= v <= 4, 1 <= mt <= 4) over all of K: out[m·v·16 +
// r] = the FP32 accumulator of row m and output roff + r, before the BF16
// rounding. Only call when Bf16DotActive().
void Fp4Bf16DotMicro(const Fp4DotArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0, int v,
                     int mt, float* out);

// ---- FP8 prefill GEMM (M >= 96, linear_fp8.cc): weights converted once per 32-column
// block of a 64-row tile into BF16 pairs, reused by every activation row of
// the m-chunk. Operands: the E4M3 value × 2^-100 (every code, subnormals
// included, is a normal BF16 then) and q × 2^99 (PackActPairs with
// exp_shift 20 from the kernels' q·2^119): the products are the FP32 path's
// (q·w/2) exactly.
//
// wt: the packed FP8 tile at column k0 (pack.cc: byte [k][r], 64 rows per
// column), 32 columns; wp[k2·64 + r] = (BF16 of w[r][k0+2k2]) << 16 | BF16 of
// w[r][k0+2k2+1], the values as the FP32 path decodes the codes.
void Fp8Bf16DotConvertBlock(const uint8_t* wt, uint32_t* wp);
// One activation block (npairs = act_block/2 pairs, wp: its 32-column
// blocks converted one after the other) of V (1..4) vectors of rows roff.. ×
// mt (1..6) activation rows: part = Σ over the pairs in order (per pair:
// column k, then k+1), then acc[m·64 + r] += (part·sa[m·lds])·sw[r/16] for r
// in the micro column, the reference's block step (sa: the rows' activation
// scales of this block, sw: the tile's 4 weight scales at the block's first
// column, per 16 rows, as the FP32 path reads them). qp: pairs of row m0 at
// the block's first pair, row stride ldqp.
void Fp8Bf16DotBlockMicro(const uint32_t* wp, int64_t npairs, int64_t roff, const uint32_t* qp, int64_t ldqp,
                          const float* sa, int64_t lds, const float* sw, float* acc, int v, int mt);

// ---- BF16 prefill GEMM (linear_bf16.cc, Bf16PairDotsExactRanges): one
// running FP32 sum per output over all K, as ref::LinearBf16 / DotBf16, two
// columns per VDPBF16PS. wt: a packed BF16 tile at column 2·p0 (pack.cc:
// [k][64 rows]); wp[k2·64 + r] = the BF16 bits of w[r][2k2] << 16 | w[r][2k2+1]
// (relative to the block), the two swapped when pairs_order (column 2k2+1
// added first).
void Bf16Bf16DotConvertBlock(const uint16_t* wt, int64_t npairs, bool pairs_order, uint32_t* wp);
// acc[m·64 + r] (the running sums of activation rows m0 + m, m < mt <= 6, and
// outputs r < 16·v <= 64) continued over npairs pairs: per pair, the high
// word's product, then the low word's. qp: the rows' pairs at the block
// (PackActPairs, swapped for pairs_order), row stride ldqp; acc 64-byte aligned.
void Bf16Bf16DotBlockMicro(const uint32_t* wp, int64_t npairs, const uint32_t* qp, int64_t ldqp, float* acc, int v,
                           int mt);

// ---- FP4 prefill GEMM (M >= kFp4BlockDotMinM, linear_fp4.cc): the tile's
// 32-column group g converted once per m-chunk into BF16 pairs and run by
// every 6-row group of the chunk (instead of converted per 4 rows inside
// Fp4Bf16DotMicro). wt, st: the packed FP4 tile and its scale bytes (pack.cc);
// wp[k2·64 + r] = (BF16 of w[r][32g+2k2]) << 16 | BF16 of w[r][32g+2k2+1]
// (E2M1 values × 2^-120, as Fp4Bf16DotMicro); sw[r] = 2^(s_w[r][g] - 127).
void Fp4Bf16DotConvertGroup(const uint8_t* wt, const uint8_t* st, int64_t g, uint32_t* wp, float* sw);
// Fp8Bf16DotBlockMicro's step for one such group (16 pairs) with per-row
// weight scales: part = Σ over the pairs in order, then acc[m·64 + r] +=
// (part·sa[m·lds])·sw[r], the reference's group step (ref::LinearFp4). qp:
// pairs of row m0 at the group's first pair, row stride ldqp.
void Fp4Bf16DotBlockMicro(const uint32_t* wp, int64_t roff, const uint32_t* qp, int64_t ldqp, const float* sa,
                          int64_t lds, const float* sw, float* acc, int v, int mt);

// ---- Sparse attention (attention.cc, AVX-512 target, D a multiple of 64):
// the q·k and pb·k products two elements per VDPBF16PS where
// Bf16PairDotsExact (linear_common.h) holds for the operands' exponent
// fields (attention_bf16.cc has the argument): the same bits as the FP32
// path. Only call when Bf16DotActive().
//
// A key row as pairs, element d in the high word: dst[p] = src[2p] << 16 |
// src[2p+1] for p < D/2 (D even), and the row's exponent fields as
// WidenBf16Row (cpu_ops.h) gives them.
void AttnKeyPairsRow(const uint16_t* src, int64_t D, uint32_t* dst, int32_t* emin, int32_t* emax);
// dots[j·Hp + h] = Σ_d q[h][d]·k_j[d] in increasing d for candidates
// j < nc (1..8) and the 16 heads h0..h0+15; qp [D/2][Hp]: the query's pairs
// (q[h][2p] << 16 | q[h][2p+1], BF16 bits), kp: the candidates' pair rows
// (AttnKeyPairsRow), row stride ldk dwords; qp and dots 64-byte aligned.
void AttnScorePairs(const uint32_t* qp, int64_t Hp, int64_t D, const uint32_t* kp, int64_t ldk, int nc, int64_t h0,
                    float* dots);
// One P·V register tile over one chunk's members i0..i1-1: heads h0..h0+ht-1
// (ht 1..4) × d0..d0+63 of the BF16 rows kv[i]; part = Σ_i pb[i][h]·k_i[d] in
// member order, then acc = acc·rescale[t] + part, acc [ht][64] FP32 (64-byte
// aligned, natural d order). pbp[i·Hp + h] for i = i0, i0+2, ...: pb[i][h]
// << 16 | pb[i+1][h] (BF16 bits; 0 past the chunk's last member).
void AttnPvPairs(const uint16_t* const* kv, const uint32_t* pbp, int64_t Hp, int i0, int i1, int64_t h0, int ht,
                 int64_t d0, const float* rescale, float* acc);

}  // namespace deepinfer::cpu
