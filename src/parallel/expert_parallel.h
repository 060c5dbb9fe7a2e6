// deepinfer/parallel/expert_parallel.h — routed experts over expert-parallel
// ranks (`--ep N`; docs/parallel.md "Expert parallelism").
//
// Experts are split in contiguous ranges: rank q owns experts
// [q·E/N, (q+1)·E/N) (E divisible by N, checked at start-up). A MoE layer's
// routed part is: each row r has k distinct experts idx[r,t] with weights
// wts[r,t]; the expert's SwiGLU runs on the row (weight applied inside, as
// the reference's Expert.forward); the row's result is the sum of its k
// outputs in increasing expert id, in FP32, starting from 0 — exactly the
// single-process order of MoE.forward (model-spec §3.3.5). Per-(row, expert)
// outputs are computed on the expert's owner and sent to the row's owner,
// never pre-summed across ranks, so the sum and its bits do not depend on N.
// A row's expert output must not depend on which other rows share the call
// (the kernels' row-invariance rule), which makes every exchange below give
// the same bits.
//
// Exchanges (every rank of the communicator calls with the same `exchange`):
//  * kReplicated — every rank holds the same rows (expert parallelism
//    without data parallelism): each computes its experts' (row, slot)
//    outputs, one AllGatherV shares them (sizes known from the routing, no
//    host sync).
//  * kGeneral — ranks hold different rows (data-parallel attention; prefill
//    and mixed steps): counts by AllToAll, rows by AllToAllV to the experts'
//    owners, outputs back by AllToAllV.
//  * kStatic — ranks hold different rows, each exactly `static_rows` (a
//    decode-shaped step padded to its batch bucket): one AllGather of every
//    rank's rows with their routing, experts run densely on the rows routed
//    to them, one fixed-size AllToAll returns [rows, k, dim] slot outputs.
#pragma once

#include <cstdint>
#include <functional>

#include "parallel/communicator.h"

namespace deepinfer {

enum class EpExchange : int32_t { kReplicated = 0, kGeneral = 1, kStatic = 2 };
const char* EpExchangeName(EpExchange e);  // "replicated", "general", "static"

// Which experts a rank owns.
struct ExpertShard {
  int num_experts = 0;  // E, routed experts of the model
  int size = 1;         // N ranks
  int rank = 0;
  int per_rank() const { return num_experts / size; }
  int first() const { return rank * per_rank(); }
  int end() const { return first() + per_rank(); }
  bool owns(int e) const { return e >= first() && e < end(); }
  int owner(int e) const { return e / per_rank(); }
};

// Runs expert `e` (owned by this rank) on m rows: x [m, dim] FP32, rw [m]
// routing weights; writes out [m, dim] FP32. Called concurrently for
// different experts from an OpenMP loop.
using ExpertFn = std::function<void(int e, const float* x, int64_t m, const float* rw, float* out)>;

// y [n, dim] = per row, Σ over its k experts in increasing expert id of the
// expert outputs (FP32, from 0). x [n, dim], idx [n, k] int32 expert ids in
// [0, E) distinct per row, wts [n, k]. `comm` may be null (one process: every
// expert local). With kStatic, n must equal static_rows on every rank.
// `alongside`, when set and comm is null or of size 1, runs as one more task
// of the experts' parallel loop (first in line), on whichever thread takes
// it: the MoE's shared expert at decode sizes, so it neither waits for the
// routed experts nor opens its own parallel regions. It must not touch y or
// the rows' outputs. With several ranks it runs first, on the calling thread.
// Throws Error(kInternal) on inconsistent arguments, RankLostError from comm.
void RoutedExperts(Communicator* comm, EpExchange exchange, const ExpertShard& shard, const float* x, int64_t n,
                   int64_t dim, const int32_t* idx, const float* wts, int k, const ExpertFn& fn, float* y,
                   const std::function<void()>& alongside = {});

// Makes the calling thread's per-expert scratch of RoutedExperts (the gathered
// rows, their route weights and outputs) hold m rows of dim floats; it only
// grows. A caller that knows the largest rows per expert of its steps (a
// decode batch of n rows: n) calls it on every thread of the team once, so a
// later step whose routing puts more rows on one expert allocates nothing.
void ReserveRoutedExpertScratch(int64_t m, int64_t dim);

// Bytes this rank sent and received in RoutedExperts calls since start-up
// (for the benchmark's traffic report).
struct EpTraffic {
  int64_t bytes_sent = 0, bytes_received = 0, calls = 0;
};
EpTraffic GetEpTraffic();

}  // namespace deepinfer
