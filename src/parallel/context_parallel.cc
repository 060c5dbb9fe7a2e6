// Context-parallel paged-row reads: see context_parallel.h.
#include "parallel/context_parallel.h"

#include <cstring>

#include "base/error.h"
#include "base/region_timer.h"

namespace deepinfer {

void GatherPagedRows(Communicator* comm, StateKind kind, int region, const PagedRowRef* refs, int64_t n,
                     uint8_t* out) {
  if (n <= 0) return;
  const StateGeometry& g = *refs[0].view->geometry;
  const int64_t rb = g.of(kind).regions[static_cast<size_t>(region)].row_bytes;
  bool sharded = false;
  for (int64_t i = 0; i < n; ++i) {
    const SequenceStateView& v = *refs[i].view;
    const int64_t rpb = g.of(kind).regions[static_cast<size_t>(region)].rows_per_block;
    if (refs[i].row < 0 || refs[i].row / rpb >= v.num_blocks)
      Fail(ErrorKind::kInternal, "GatherPagedRows: row {} outside a table of {} blocks", refs[i].row, v.num_blocks);
    sharded = sharded || v.sharding != nullptr;
  }
  if (!sharded || comm == nullptr || comm->size() == 1) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * rb, refs[i].view->Row(kind, region, refs[i].row), rb);
    return;
  }
  const int N = comm->size(), me = comm->rank();
  // Owner of each request (the same on every rank: same tables), then per
  // owner its requests in request order: the AllGatherV output is owner-major.
  std::vector<int> owner(static_cast<size_t>(n));
  std::vector<int64_t> counts(static_cast<size_t>(N), 0);
  for (int64_t i = 0; i < n; ++i) {
    const SequenceStateView& v = *refs[i].view;
    DI_CHECK(v.sharding && v.sharding->size == N);
    owner[i] = v.sharding->Owner(v.BlockOf(kind, region, refs[i].row));
    counts[owner[i]] += rb;
  }
  std::vector<uint8_t> mine(static_cast<size_t>(counts[me]));
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i)
    if (owner[i] == me) {
      std::memcpy(mine.data() + at, refs[i].view->Row(kind, region, refs[i].row), rb);
      at += rb;
    }
  std::vector<uint8_t> all(static_cast<size_t>(n * rb));
  {
    RegionScope scope(Region::kCollective);
    comm->AllGatherV(mine.data(), counts, all.data());
  }
  std::vector<int64_t> next(static_cast<size_t>(N), 0);
  for (int q = 1; q < N; ++q) next[q] = next[q - 1] + counts[q - 1];
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * rb, all.data() + next[owner[i]], rb);
    next[owner[i]] += rb;
  }
}

}  // namespace deepinfer
