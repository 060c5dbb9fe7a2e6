// Rows of a table split over ranks: see sharded_rows.h.
#include "parallel/sharded_rows.h"

#include <vector>

#include "base/region_timer.h"

namespace deepinfer {

void FetchShardedRows(Communicator* comm, EpExchange exchange, int64_t rows, const int64_t* ids, int64_t n,
                      int64_t row_bytes, const ReadRowFn& read, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= rows) Fail(ErrorKind::kOutOfRange, "table row {} outside [0, {})", ids[i], rows);
  const int N = comm ? comm->size() : 1;
  if (N == 1) {
    for (int64_t i = 0; i < n; ++i) read(ids[i], out + i * row_bytes);
    return;
  }
  const int me = comm->rank();
  if (exchange == EpExchange::kReplicated) {
    std::vector<int64_t> counts(N, 0);
    std::vector<uint8_t> mine;
    for (int64_t i = 0; i < n; ++i) {
      const int q = RowOwner(rows, N, ids[i]);
      counts[q] += row_bytes;
      if (q == me) {
        mine.resize(mine.size() + static_cast<size_t>(row_bytes));
        read(ids[i], mine.data() + mine.size() - row_bytes);
      }
    }
    std::vector<uint8_t> all(static_cast<size_t>(n * row_bytes));
    {
      RegionScope region(Region::kCollective);
      comm->AllGatherV(mine.data(), counts, all.data());
    }
    std::vector<int64_t> at(N, 0);
    for (int q = 1; q < N; ++q) at[q] = at[q - 1] + counts[q - 1];
    for (int64_t i = 0; i < n; ++i) {
      const int q = RowOwner(rows, N, ids[i]);
      std::memcpy(out + i * row_bytes, all.data() + at[q], static_cast<size_t>(row_bytes));
      at[q] += row_bytes;
    }
    return;
  }
  // Ranks hold different ids: requests to the owners, rows back.
  std::vector<std::vector<int64_t>> req(N);
  for (int64_t i = 0; i < n; ++i) req[RowOwner(rows, N, ids[i])].push_back(ids[i]);
  std::vector<int64_t> send_n(N), recv_n(N);
  for (int q = 0; q < N; ++q) send_n[q] = static_cast<int64_t>(req[q].size());
  RegionScope region(Region::kCollective);
  comm->AllToAll(send_n.data(), sizeof(int64_t), recv_n.data());
  std::vector<int64_t> sbytes(N), rbytes(N), flat;
  int64_t total_in = 0;
  for (int q = 0; q < N; ++q) {
    sbytes[q] = send_n[q] * static_cast<int64_t>(sizeof(int64_t));
    rbytes[q] = recv_n[q] * static_cast<int64_t>(sizeof(int64_t));
    flat.insert(flat.end(), req[q].begin(), req[q].end());
    total_in += recv_n[q];
  }
  std::vector<int64_t> asked(static_cast<size_t>(total_in));
  comm->AllToAllV(flat.data(), sbytes, asked.data(), rbytes);
  std::vector<uint8_t> reply(static_cast<size_t>(total_in * row_bytes));
  {
    RegionScope inner(Region::kEmbed);
    for (int64_t i = 0; i < total_in; ++i) {
      if (RowOwner(rows, N, asked[i]) != me)
        Fail(ErrorKind::kInternal, "rank {} asked for table row {} it does not own", me, asked[i]);
      read(asked[i], reply.data() + i * row_bytes);
    }
  }
  std::vector<int64_t> back_s(N), back_r(N);
  for (int q = 0; q < N; ++q) {
    back_s[q] = recv_n[q] * row_bytes;
    back_r[q] = send_n[q] * row_bytes;
  }
  std::vector<uint8_t> got(static_cast<size_t>(n * row_bytes));
  comm->AllToAllV(reply.data(), back_s, got.data(), back_r);
  std::vector<int64_t> at(N, 0);
  for (int q = 1; q < N; ++q) at[q] = at[q - 1] + back_r[q - 1];
  for (int64_t i = 0; i < n; ++i) {
    const int q = RowOwner(rows, N, ids[i]);
    std::memcpy(out + i * row_bytes, got.data() + at[q], static_cast<size_t>(row_bytes));
    at[q] += row_bytes;
  }
}

}  // namespace deepinfer
