// deepinfer/parallel/communicator.h — the collectives DeepInfer's ranks use
// (docs/parallel.md): one interface, an MPI implementation (OpenMPI, started
// with `mpirun`) and a single-process one, so every code path runs with and
// without MPI.
//
// Buffers are bytes; typed helpers below wrap them for trivially copyable
// element types. Every collective is called by every rank of the
// communicator in the same order with matching sizes (the MPI rule); sizes
// that a rank cannot know are exchanged first by the caller (AllToAll of the
// counts, then AllToAllV).
//
// Failure: a rank that dies must never leave the others hanging. The MPI
// implementation waits for each collective by polling, and while it waits it
// checks that the other ranks' processes still exist (ranks on the same host:
// by pid; docs/parallel.md says what happens across hosts). When a peer is
// gone, or a wait exceeds `timeout_s` without progress, the call throws
// RankLostError naming the rank (and from then on every call throws at once:
// the communicator is broken and the process should stop). A broken
// communicator is never finalised (MPI_Finalize would wait for the dead rank).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"

namespace deepinfer {

// A peer rank is gone (its process died or stopped answering).
class RankLostError : public Error {
 public:
  RankLostError(int rank, const std::string& message) : Error(ErrorKind::kUnavailable, message), rank_(rank) {}
  int rank() const { return rank_; }  // the lost rank, -1 if unknown (timeout across hosts)

 private:
  int rank_;
};

enum class ReduceOp { kSum, kMin, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "local".
  virtual const char* backend() const = 0;
  // Host name of each rank (index = rank).
  virtual const std::vector<std::string>& hosts() const = 0;

  // `bytes` bytes from `root` to every rank (in place).
  virtual void Broadcast(void* data, int64_t bytes, int root) = 0;
  // Every rank contributes `bytes`; `out` receives size()·bytes, rank order.
  virtual void AllGather(const void* in, int64_t bytes, void* out) = 0;
  // Rank r contributes counts[r] bytes (every rank passes the same counts);
  // `out` receives Σ counts, rank order.
  virtual void AllGatherV(const void* in, const std::vector<int64_t>& counts, void* out) = 0;
  // Rank r contributes counts[r] bytes to `root`; only root's `out` is written
  // (Σ counts, rank order).
  virtual void GatherV(const void* in, const std::vector<int64_t>& counts, void* out, int root) = 0;
  // Each rank sends bytes_per_rank bytes to every rank: `in` and `out` are
  // size()·bytes_per_rank, block q of `in` goes to rank q, block p of `out`
  // came from rank p.
  virtual void AllToAll(const void* in, int64_t bytes_per_rank, void* out) = 0;
  // Uneven all-to-all: send_counts[q] bytes to rank q (blocks of `in` back to
  // back in rank order); recv_counts[p] bytes from rank p into `out`.
  virtual void AllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                         const std::vector<int64_t>& recv_counts) = 0;
  // Element-wise reduction of int64 values over all ranks, in place.
  virtual void AllReduce(int64_t* data, int64_t count, ReduceOp op) = 0;
  virtual void Barrier() = 0;

  // Seconds a collective may wait without its peers before it fails with
  // RankLostError (0 = forever). Local peers are also checked by pid.
  virtual void set_timeout(double seconds) = 0;
  // Throws RankLostError if a peer's process on this host is gone (cheap;
  // for an idle leader, which runs no collective that would notice).
  virtual void CheckPeers() = 0;
  // True once a peer was lost: every collective throws RankLostError.
  virtual bool broken() const = 0;

  // ---- typed helpers (T trivially copyable)
  template <class T>
  void BroadcastVector(std::vector<T>* v, int root) {
    static_assert(std::is_trivially_copyable_v<T>);
    int64_t n = static_cast<int64_t>(v->size());
    Broadcast(&n, sizeof(n), root);
    v->resize(static_cast<size_t>(n));
    if (n > 0) Broadcast(v->data(), n * static_cast<int64_t>(sizeof(T)), root);
  }
  int64_t AllReduceOne(int64_t value, ReduceOp op) {
    AllReduce(&value, 1, op);
    return value;
  }
};

// The process's world: an MPI communicator when the process was started by
// mpirun (OMPI_COMM_WORLD_SIZE in the environment) and the build has MPI,
// else a single-process one. Created on first use; MPI_Init happens then
// (with MPI_THREAD_SERIALIZED: any one thread at a time may call collectives).
// Throws Error(kUnavailable) when started by mpirun with more than one rank
// but built without MPI.
Communicator& World();
// True once World() has been created with MPI.
bool WorldIsMpi();
// True when the MPI world lost a peer (its collectives throw RankLostError).
bool WorldIsBroken();
// Finalises MPI if World() used it and the communicator is not broken. Safe
// to call more than once; called by the CLI before it returns.
void ShutdownWorld();
// Ends the whole job at once (MPI_Abort when under MPI, else std::_Exit).
[[noreturn]] void AbortWorld(int code);

// The single-process communicator (size 1): every collective is a copy.
class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator();
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  void Broadcast(void*, int64_t, int root) override;
  void AllGather(const void* in, int64_t bytes, void* out) override;
  void AllGatherV(const void* in, const std::vector<int64_t>& counts, void* out) override;
  void GatherV(const void* in, const std::vector<int64_t>& counts, void* out, int root) override;
  void AllToAll(const void* in, int64_t bytes_per_rank, void* out) override;
  void AllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts) override;
  void AllReduce(int64_t*, int64_t, ReduceOp) override {}
  void Barrier() override {}
  void set_timeout(double) override {}
  void CheckPeers() override {}
  bool broken() const override { return false; }

 private:
  std::vector<std::string> hosts_;
};

// ---- byte packing for messages (host metadata)
class ByteWriter {
 public:
  template <class T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = buf_.size();
    buf_.resize(at + sizeof(T));
    std::memcpy(buf_.data() + at, &v, sizeof(T));
  }
  template <class T>
  void PutSpan(std::span<const T> v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Put<int64_t>(static_cast<int64_t>(v.size()));
    const size_t at = buf_.size();
    buf_.resize(at + v.size_bytes());
    if (!v.empty()) std::memcpy(buf_.data() + at, v.data(), v.size_bytes());
  }
  std::vector<uint8_t>& bytes() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

// Reads what ByteWriter wrote; throws Error(kCorruptData) past the end.
class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> b) : b_(b) {}
  template <class T>
  T Get() {
    static_assert(std::is_trivially_copyable_v<T>);
    Need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> GetVector() {
    const int64_t n = Get<int64_t>();
    if (n < 0) Fail(ErrorKind::kCorruptData, "parallel step message: negative length {}", n);
    Need(static_cast<size_t>(n) * sizeof(T));
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), b_.data() + at_, v.size() * sizeof(T));
    at_ += v.size() * sizeof(T);
    return v;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  void Need(size_t n) const {
    if (at_ + n > b_.size())
      Fail(ErrorKind::kCorruptData, "parallel step message truncated: need {} bytes at {}, have {}", n, at_, b_.size());
  }
  std::span<const uint8_t> b_;
  size_t at_ = 0;
};

}  // namespace deepinfer
