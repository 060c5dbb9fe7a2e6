// deepinfer/kernels/cpu/fp4_bf16dot.h — the FP4 linear's products as BF16
// pair dots (VDPBF16PS) on x86 CPUs with AVX512_BF16 and AVX512_VBMI (Zen 4/5,
// Sapphire Rapids and later), every M. Not a public header: used
// by linear_fp4.cc's AVX-512 path; cpu_ops.h exposes the switch.
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
// (SelfCheck in fp4_bf16dot.cc, crafted and pseudo-random lanes); a CPU
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

// Fp4Bf16DotSupported() and not switched off by SetFp4Bf16Dot(false)
// (both in cpu_ops.h).
bool Fp4Bf16DotActive();

// qp[m·K/2 + p] for rows m < M of q (row stride ldq, K even); false (qp
// unusable) when a value is not finite or not exactly a BF16. Only call when
// Fp4Bf16DotActive().
bool PackActPairs(const float* q, int64_t M, int64_t K, int64_t ldq, uint32_t* qp);

// The micro-tile of rows [roff, roff + 16·v) of one packed 64-row tile (wt:
// its FP4 dwords, st: its UE8M0 scale bytes, pack.cc layout) × activation
// rows m0 .. m0+mt-1 (1 <= v <= 4, 1 <= mt <= 4) over all of K: out[m·v·16 +
// r] = the FP32 accumulator of row m and output roff + r, before the BF16
// rounding. Only call when Fp4Bf16DotActive().
void Fp4Bf16DotMicro(const Fp4DotArgs& a, const uint8_t* wt, const uint8_t* st, int64_t roff, int64_t m0, int v,
                     int mt, float* out);

}  // namespace deepinfer::cpu
