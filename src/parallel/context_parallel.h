// deepinfer/parallel/context_parallel.h — context parallelism (--cp N,
// docs/parallel.md "Context parallelism"): one sequence's paged state split
// over N ranks, read back exactly.
//
// Every CP rank runs the same rows (the computation is replicated, like
// expert parallelism's attention), so every rank knows which paged rows a
// step needs and which rank stores each (model/state.h PagedSharding: global
// block g on rank g % N). A read of rows that live on other ranks is one
// AllGatherV: each owner packs the requested rows it stores, in request
// order; every rank then has every requested row, byte for byte what one rank
// holding everything would have read. Nothing is summed or rounded here, so
// the values (and therefore the candidate order, the BF16 rounding points and
// the sum order of the single-rank path, which run unchanged on the gathered
// rows) are those of one rank.
#pragma once

#include <cstdint>
#include <vector>

#include "model/state.h"
#include "parallel/communicator.h"

namespace deepinfer {

// One requested paged row: row `row` (a compressed position of the region's
// layer) of the sequence addressed by `view`.
struct PagedRowRef {
  const SequenceStateView* view = nullptr;
  int64_t row = 0;
};

// out[n][row_bytes of (kind, region)] = the rows refs[0..n) of paged kind
// `kind`, region `region`, in request order. Collective over comm when any
// view is sharded: every rank of comm must pass the same refs (same
// sequences' block tables, same rows) in the same order. comm null, size 1,
// or no sharded view: local copies only, no communication. Throws
// Error(kInternal) if a row's block is outside its table, RankLostError from comm.
void GatherPagedRows(Communicator* comm, StateKind kind, int region, const PagedRowRef* refs, int64_t n,
                     uint8_t* out);

// Blocks per rank for a context-parallel group of `cp` ranks that must hold
// `total_blocks` blocks in all: ceil(total_blocks / cp).
inline int64_t BlocksPerCpRank(int64_t total_blocks, int cp) { return (total_blocks + cp - 1) / cp; }

}  // namespace deepinfer
