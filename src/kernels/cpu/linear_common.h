// deepinfer/kernels/cpu/linear_common.h — target-independent plumbing shared
// by the kernels/cpu linear translation units (not a public header).
#pragma once

#include <cstdint>
#include <vector>

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
  const uint8_t* w = nullptr;     // FP8 codes / FP4 nibbles
  const uint16_t* wb = nullptr;   // BF16 weights
  const float* wf = nullptr;      // FP32 weights (LinearF32)
  const float* ws = nullptr;      // FP8: per 16 rows × 32 columns scales
  const uint8_t* s = nullptr;     // FP4: UE8M0 scale bytes [tile][group][64]
  const float* q = nullptr;       // quantised activations ×256 [M, K] (or FP32 x for BF16)
  int64_t ldq = 0;                // row stride of q (elements)
  const float* sa = nullptr;      // activation scales [M, K/ab]
  float* y = nullptr;             // output [M, ldy]
  int64_t ldy = 0;
  // BF16 linears
  bool pairs = false;             // ref::DotBf16 pair order
  bool round = true;              // round the output to BF16
  int64_t group_rows = 0;         // grouped wo_a: outputs per group (R), 0 = plain
  int64_t group_in = 0;           // grouped wo_a: input columns per group (Kg)
};

// Per-thread activation scratch (grows, never shrinks).
struct ActBuffers {
  std::vector<float> q, sa;
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
// (cpu_ops.h SetMinParallelMacs).
inline int64_t g_min_parallel_macs = int64_t{1} << 20;

// Runs fn over all (tile, m-chunk) items on the OpenMP team (NumThreads()),
// or on the calling thread for small calls. Each output element is produced
// by exactly one item, so the split never changes a result.
template <typename Fn>
void ParallelItems(QArgs& a, Fn* fn) {
  constexpr int64_t kChunk = 96;  // a multiple of every micro-tile height
  a.mchunk = a.M <= kChunk ? a.M : kChunk;
  a.mchunks = (a.M + a.mchunk - 1) / a.mchunk;
  const int64_t items = a.tiles * a.mchunks;
  const QArgs& ca = a;
  if (a.M * a.N * a.K < g_min_parallel_macs) {
    fn(ca, 0, items);
  } else if (a.mchunks == 1) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < items; ++i) fn(ca, i, i + 1);
  } else {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) fn(ca, i, i + 1);
  }
}

}  // namespace deepinfer::cpu
