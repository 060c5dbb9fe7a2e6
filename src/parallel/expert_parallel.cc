// Routed experts over expert-parallel ranks: see expert_parallel.h.
#include "parallel/expert_parallel.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "base/parallel.h"
#include "base/region_timer.h"

namespace deepinfer {

namespace {

std::atomic<int64_t> g_sent{0}, g_recv{0}, g_calls{0};

// Items are (row, slot) pairs whose expert a rank computes.
struct Items {
  std::vector<float> x;     // [m, dim], or empty when `rows` is set
  std::vector<float> w;     // [m]
  std::vector<int32_t> e;   // [m]
  int64_t m = 0;
  // One rank: item i is the step's (row i / per_row, slot i % per_row), its
  // activation row read in place at rows + (i / per_row)·dim (no copy).
  const float* rows = nullptr;
  int64_t per_row = 1;
  const float* X(int64_t i, int64_t dim) const {
    return rows != nullptr ? rows + (i / per_row) * dim : x.data() + i * dim;
  }
};

// Runs the local experts over items (grouped by expert, experts in parallel,
// each expert's rows in item order); out [m, dim] in item order.
// Scratch is the calling thread's and per worker thread (grows, never
// shrinks: a steady-state decode step allocates nothing here).
// The per-expert gather/scatter scratch of each thread (RunLocal).
struct LocalScratch {
  std::vector<float> xin, rw, o;
};
thread_local LocalScratch tl_local;

void RunLocal(const ExpertFn& fn, int64_t dim, const Items& it, float* out,
              const std::function<void()>& alongside = {}) {
  // Items grouped by expert (experts in increasing id, each group's items in
  // item order) by a counting sort into flat arrays sized by it.m alone, so a
  // step with as many items as an earlier one allocates nothing, whatever its
  // routing.
  thread_local std::vector<int> experts_buf;
  thread_local std::vector<int32_t> sorted;
  thread_local std::vector<int64_t> order_buf, start_buf, fill;
  std::vector<int>& experts = experts_buf;  // shared with the team below
  std::vector<int64_t>& order = order_buf;
  std::vector<int64_t>& start = start_buf;
  {
    sorted.assign(it.e.begin(), it.e.end());
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    experts.assign(sorted.begin(), sorted.end());
    const size_t ng = experts.size();
    order.resize(static_cast<size_t>(it.m));
    start.assign(static_cast<size_t>(it.m) + 1, 0);
    fill.assign(static_cast<size_t>(it.m) + 1, 0);
    for (int64_t i = 0; i < it.m; ++i) {
      const size_t g = static_cast<size_t>(std::lower_bound(experts.begin(), experts.end(), it.e[i]) - experts.begin());
      ++start[g + 1];
    }
    for (size_t g = 0; g < ng; ++g) start[g + 1] += start[g];
    for (int64_t i = 0; i < it.m; ++i) {
      const size_t g = static_cast<size_t>(std::lower_bound(experts.begin(), experts.end(), it.e[i]) - experts.begin());
      order[static_cast<size_t>(start[g] + fill[g]++)] = i;
    }
  }
  const int64_t ng = static_cast<int64_t>(experts.size());
  const int64_t extra = alongside ? 1 : 0;  // task 0: `alongside`
#pragma omp parallel for schedule(dynamic, 1) if(ng + extra > 1)
  for (int64_t t = 0; t < ng + extra; ++t) {
    if (t < extra) {
      alongside();
      continue;
    }
    const int64_t g = t - extra;
    const int64_t* rows = order.data() + start[static_cast<size_t>(g)];
    const int64_t m = start[static_cast<size_t>(g) + 1] - start[static_cast<size_t>(g)];
    std::vector<float>& xin = tl_local.xin;
    std::vector<float>& rw = tl_local.rw;
    std::vector<float>& o = tl_local.o;
    // Every element is written below (xin, rw) or by fn (o): sized, not zeroed.
    xin.resize(static_cast<size_t>(m * dim));
    rw.resize(static_cast<size_t>(m));
    o.resize(static_cast<size_t>(m * dim));
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(xin.data() + i * dim, it.X(rows[i], dim), dim * sizeof(float));
      rw[i] = it.w[rows[i]];
    }
    fn(experts[static_cast<size_t>(g)], xin.data(), m, rw.data(), o.data());
    for (int64_t i = 0; i < m; ++i) std::memcpy(out + rows[i] * dim, o.data() + i * dim, dim * sizeof(float));
  }
}

void AddItem(Items* it, const float* x, int64_t dim, float w, int32_t e) {
  it->x.insert(it->x.end(), x, x + dim);
  it->w.push_back(w);
  it->e.push_back(e);
  ++it->m;
}

// y[r] = Σ_t slot[r, t] in increasing idx[r, t], from 0 (MoE.forward's order).
// Rows over the team (each row's sums on one thread, in that order): serial,
// with the items' copies it was ~10 ms of each 1 024-row prefill layer of the
// `large` preset on one thread while the other waited.
void Combine(const float* slot, const int32_t* idx, int64_t n, int k, int64_t dim, float* y) {
  ParallelFor(n, n * k * dim >= (int64_t{1} << 16), [&](int64_t r) {
    int order[64];
    for (int t = 0; t < k; ++t) order[t] = t;
    std::sort(order, order + k, [&](int a, int b) { return idx[r * k + a] < idx[r * k + b]; });
    float* yr = y + r * dim;
    for (int64_t c = 0; c < dim; ++c) yr[c] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float* s = slot + (r * k + order[j]) * dim;
      for (int64_t c = 0; c < dim; ++c) yr[c] += s[c];
    }
  });
}

void Count(int64_t sent, int64_t recv) {
  g_sent += sent;
  g_recv += recv;
}

}  // namespace

void ReserveRoutedExpertScratch(int64_t m, int64_t dim) {
  LocalScratch& l = tl_local;
  if (l.xin.capacity() < static_cast<size_t>(m * dim)) l.xin.reserve(static_cast<size_t>(m * dim));
  if (l.rw.capacity() < static_cast<size_t>(m)) l.rw.reserve(static_cast<size_t>(m));
  if (l.o.capacity() < static_cast<size_t>(m * dim)) l.o.reserve(static_cast<size_t>(m * dim));
}

const char* EpExchangeName(EpExchange e) {
  switch (e) {
    case EpExchange::kReplicated: return "replicated";
    case EpExchange::kGeneral: return "general";
    case EpExchange::kStatic: return "static";
  }
  return "?";
}

EpTraffic GetEpTraffic() { return {g_sent.load(), g_recv.load(), g_calls.load()}; }

void RoutedExperts(Communicator* comm, EpExchange exchange, const ExpertShard& shard, const float* x, int64_t n,
                   int64_t dim, const int32_t* idx, const float* wts, int k, const ExpertFn& fn, float* y,
                   const std::function<void()>& alongside) {
  DI_CHECK(k >= 1 && k <= 64);
  const int N = comm ? comm->size() : 1;
  DI_CHECK(shard.size == N && shard.num_experts % N == 0);
  const int me = comm ? comm->rank() : 0;
  thread_local std::vector<float> slot;  // [n, k, dim]; the calling thread's, reused
  ++g_calls;

  if (N == 1) {
    // Every (row, slot) is an item of this rank: RunLocal writes all of
    // `slot`, and reads the activation rows in place.
    slot.resize(static_cast<size_t>(n * k * dim));
    thread_local Items it;
    it.x.clear();
    it.rows = x;
    it.per_row = k;
    it.w.assign(wts, wts + n * k);
    it.e.assign(idx, idx + n * k);
    it.m = n * k;
    RunLocal(fn, dim, it, slot.data(), alongside);
    Combine(slot.data(), idx, n, k, dim, y);
    return;
  }
  slot.assign(static_cast<size_t>(n * k * dim), 0.0f);
  // Several ranks: `alongside` first, on the calling thread.
  if (alongside) alongside();

  if (exchange == EpExchange::kReplicated) {
    // Every rank knows every row's routing: each computes its own (row, slot)
    // items in canonical (row, slot) order and one AllGatherV shares them.
    Items mine;
    std::vector<int64_t> counts(N, 0);
    for (int64_t r = 0; r < n; ++r)
      for (int t = 0; t < k; ++t) {
        const int q = shard.owner(idx[r * k + t]);
        counts[q] += dim * static_cast<int64_t>(sizeof(float));
        if (q == me) AddItem(&mine, x + r * dim, dim, wts[r * k + t], idx[r * k + t]);
      }
    std::vector<float> out(static_cast<size_t>(mine.m * dim));
    RunLocal(fn, dim, mine, out.data());
    std::vector<float> all(static_cast<size_t>(n * k * dim));
    {
      RegionScope region(Region::kCollective);
      comm->AllGatherV(out.data(), counts, all.data());
    }
    Count(counts[me], n * k * dim * static_cast<int64_t>(sizeof(float)) - counts[me]);
    // Unpack: rank q's block holds its items in canonical order.
    std::vector<int64_t> at(N, 0);
    int64_t base = 0;
    for (int q = 0; q < N; ++q) {
      at[q] = base;
      base += counts[q] / static_cast<int64_t>(sizeof(float));
    }
    for (int64_t r = 0; r < n; ++r)
      for (int t = 0; t < k; ++t) {
        const int q = shard.owner(idx[r * k + t]);
        std::memcpy(slot.data() + (r * k + t) * dim, all.data() + at[q], dim * sizeof(float));
        at[q] += dim;
      }
    Combine(slot.data(), idx, n, k, dim, y);
    return;
  }

  if (exchange == EpExchange::kGeneral) {
    // Dispatch: items to each owner (x row, weight, expert id), sizes first.
    const int64_t item_floats = dim + 2;  // x | weight | expert id (int32 bits)
    std::vector<std::vector<float>> send(N);
    std::vector<int64_t> send_items(N, 0);
    for (int64_t r = 0; r < n; ++r)
      for (int t = 0; t < k; ++t) {
        const int32_t e = idx[r * k + t];
        const int q = shard.owner(e);
        std::vector<float>& b = send[q];
        b.insert(b.end(), x + r * dim, x + (r + 1) * dim);
        b.push_back(wts[r * k + t]);
        float eb;
        std::memcpy(&eb, &e, sizeof(eb));
        b.push_back(eb);
        ++send_items[q];
      }
    std::vector<int64_t> recv_items(N, 0);
    std::vector<int64_t> send_bytes(N), recv_bytes(N);
    std::vector<float> sbuf, rbuf;
    {
      RegionScope region(Region::kCollective);
      comm->AllToAll(send_items.data(), sizeof(int64_t), recv_items.data());
    }
    int64_t total_recv = 0;
    for (int q = 0; q < N; ++q) {
      send_bytes[q] = send_items[q] * item_floats * static_cast<int64_t>(sizeof(float));
      recv_bytes[q] = recv_items[q] * item_floats * static_cast<int64_t>(sizeof(float));
      total_recv += recv_items[q];
      sbuf.insert(sbuf.end(), send[q].begin(), send[q].end());
    }
    rbuf.resize(static_cast<size_t>(total_recv * item_floats));
    {
      RegionScope region(Region::kCollective);
      comm->AllToAllV(sbuf.data(), send_bytes, rbuf.data(), recv_bytes);
    }
    Items it;
    it.m = total_recv;
    it.x.resize(static_cast<size_t>(total_recv * dim));
    it.w.resize(static_cast<size_t>(total_recv));
    it.e.resize(static_cast<size_t>(total_recv));
    for (int64_t i = 0; i < total_recv; ++i) {
      const float* p = rbuf.data() + i * item_floats;
      std::memcpy(it.x.data() + i * dim, p, dim * sizeof(float));
      it.w[i] = p[dim];
      std::memcpy(&it.e[i], p + dim + 1, sizeof(int32_t));
      DI_CHECK(shard.owns(it.e[i]));
    }
    std::vector<float> out(static_cast<size_t>(total_recv * dim));
    RunLocal(fn, dim, it, out.data());
    // Combine: outputs back to the rows' owners, in the order they came.
    std::vector<int64_t> back_send(N), back_recv(N);
    for (int q = 0; q < N; ++q) {
      back_send[q] = recv_items[q] * dim * static_cast<int64_t>(sizeof(float));
      back_recv[q] = send_items[q] * dim * static_cast<int64_t>(sizeof(float));
    }
    std::vector<float> back(static_cast<size_t>(n * k * dim));
    {
      RegionScope region(Region::kCollective);
      comm->AllToAllV(out.data(), back_send, back.data(), back_recv);
    }
    int64_t s = 0, r_ = 0;
    for (int q = 0; q < N; ++q) {
      s += send_bytes[q] + back_send[q];
      r_ += recv_bytes[q] + back_recv[q];
    }
    Count(s, r_);
    std::vector<int64_t> at(N, 0);
    int64_t base = 0;
    for (int q = 0; q < N; ++q) {
      at[q] = base;
      base += send_items[q] * dim;
    }
    for (int64_t r = 0; r < n; ++r)
      for (int t = 0; t < k; ++t) {
        const int q = shard.owner(idx[r * k + t]);
        std::memcpy(slot.data() + (r * k + t) * dim, back.data() + at[q], dim * sizeof(float));
        at[q] += dim;
      }
    Combine(slot.data(), idx, n, k, dim, y);
    return;
  }

  // kStatic: fixed shapes. Every rank's rows with their routing, gathered.
  const int64_t B = n;
  const int64_t row_floats = dim + 2 * k;  // x | idx (int32 bits) | weights
  std::vector<float> mine(static_cast<size_t>(B * row_floats));
  for (int64_t r = 0; r < B; ++r) {
    float* p = mine.data() + r * row_floats;
    std::memcpy(p, x + r * dim, dim * sizeof(float));
    std::memcpy(p + dim, idx + r * k, k * sizeof(int32_t));
    std::memcpy(p + dim + k, wts + r * k, k * sizeof(float));
  }
  std::vector<float> all(static_cast<size_t>(N * B * row_floats));
  {
    RegionScope region(Region::kCollective);
    comm->AllGather(mine.data(), B * row_floats * static_cast<int64_t>(sizeof(float)), all.data());
  }
  Items it;
  std::vector<int64_t> where;  // item → (rank·B + row)·k + slot
  for (int p = 0; p < N; ++p)
    for (int64_t r = 0; r < B; ++r) {
      const float* row = all.data() + (p * B + r) * row_floats;
      for (int t = 0; t < k; ++t) {
        int32_t e;
        std::memcpy(&e, row + dim + t, sizeof(e));
        if (!shard.owns(e)) continue;
        AddItem(&it, row, dim, row[dim + k + t], e);
        where.push_back((p * B + r) * k + t);
      }
    }
  std::vector<float> out(static_cast<size_t>(it.m * dim));
  RunLocal(fn, dim, it, out.data());
  std::vector<float> sendbuf(static_cast<size_t>(N * B * k * dim), 0.0f);  // [N][B][k][dim]
  for (int64_t i = 0; i < it.m; ++i)
    std::memcpy(sendbuf.data() + where[i] * dim, out.data() + i * dim, dim * sizeof(float));
  std::vector<float> recvbuf(sendbuf.size());
  const int64_t block = B * k * dim * static_cast<int64_t>(sizeof(float));
  {
    RegionScope region(Region::kCollective);
    comm->AllToAll(sendbuf.data(), block, recvbuf.data());
  }
  Count(mine.size() * sizeof(float) + N * block, all.size() * sizeof(float) + N * block);
  for (int64_t r = 0; r < B; ++r)
    for (int t = 0; t < k; ++t) {
      const int q = shard.owner(idx[r * k + t]);
      std::memcpy(slot.data() + (r * k + t) * dim, recvbuf.data() + ((q * B + r) * k + t) * dim, dim * sizeof(float));
    }
  Combine(slot.data(), idx, n, k, dim, y);
}

}  // namespace deepinfer
