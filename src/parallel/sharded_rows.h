// deepinfer/parallel/sharded_rows.h — reading rows of a table that is split
// over ranks (the Engram embedding tables with N ranks; docs/parallel.md
// "Sharded Engram tables").
//
// Rank q holds rows [RowBegin(rows, N, q), RowBegin(rows, N, q+1)): contiguous,
// balanced shares. A caller that needs rows by absolute id gets their raw
// bytes from their owners in one request/response exchange; the caller
// dequantises them where it uses them, so the values are exactly those of the
// unsharded table.
#pragma once

#include <cstdint>
#include <functional>

#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace deepinfer {

inline int64_t RowBegin(int64_t rows, int n, int q) { return rows * q / n; }
inline int RowOwner(int64_t rows, int n, int64_t row) {
  int q = static_cast<int>(row * n / rows);
  while (q + 1 < n && RowBegin(rows, n, q + 1) <= row) ++q;
  while (q > 0 && RowBegin(rows, n, q) > row) --q;
  return q;
}

// Copies row `row` (owned by this rank) into dst[row_bytes].
using ReadRowFn = std::function<void(int64_t row, uint8_t* dst)>;

// out [n, row_bytes] = rows ids[0..n) of a table of `rows` rows split over
// comm's ranks. kReplicated: every rank passes the same ids (each shares the
// rows it owns, one AllGatherV); otherwise ranks pass their own ids (ids to
// the owners by AllToAllV, rows back by AllToAllV). comm may be null (one
// process: every row local). Throws Error(kOutOfRange) for an id outside
// [0, rows), RankLostError from comm.
void FetchShardedRows(Communicator* comm, EpExchange exchange, int64_t rows, const int64_t* ids, int64_t n,
                      int64_t row_bytes, const ReadRowFn& read, uint8_t* out);

}  // namespace deepinfer
