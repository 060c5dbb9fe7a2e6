// Communicator: the single-process implementation, the MPI one (when built
// with DEEPINFER_WITH_MPI), and the process world. See communicator.h.
#include "parallel/communicator.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#ifdef DEEPINFER_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (no deprecated C++ bindings)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace deepinfer {

namespace {
std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}
}  // namespace

// ------------------------------------------------------------------ local

LocalCommunicator::LocalCommunicator() : hosts_{HostName()} {}

void LocalCommunicator::Broadcast(void*, int64_t, int root) {
  if (root != 0) Fail(ErrorKind::kInvalidArgument, "Broadcast: root {} outside a 1-rank communicator", root);
}
void LocalCommunicator::AllGather(const void* in, int64_t bytes, void* out) {
  if (bytes > 0 && in != out) std::memmove(out, in, static_cast<size_t>(bytes));
}
void LocalCommunicator::AllGatherV(const void* in, const std::vector<int64_t>& counts, void* out) {
  DI_CHECK(counts.size() == 1);
  AllGather(in, counts[0], out);
}
void LocalCommunicator::GatherV(const void* in, const std::vector<int64_t>& counts, void* out, int root) {
  DI_CHECK(counts.size() == 1 && root == 0);
  AllGather(in, counts[0], out);
}
void LocalCommunicator::AllToAll(const void* in, int64_t bytes_per_rank, void* out) {
  AllGather(in, bytes_per_rank, out);
}
void LocalCommunicator::AllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                  const std::vector<int64_t>& recv_counts) {
  DI_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0]);
  AllGather(in, send_counts[0], out);
}

// ------------------------------------------------------------------ MPI

#ifdef DEEPINFER_WITH_MPI
namespace {

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    // MPI_COMM_WORLD itself (MPI_Comm_dup would block, unpolled, if a rank died at start-up).
    comm_ = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Who is where: pid and host of every rank, for the liveness checks.
    struct Peer {
      int64_t pid;
      char host[120];
    } me{};
    me.pid = getpid();
    const std::string h = HostName();
    std::strncpy(me.host, h.c_str(), sizeof(me.host) - 1);
    std::vector<Peer> all(static_cast<size_t>(size_));
    // Polled like every collective; nobody's pid is known yet, so only the
    // start-up timeout bounds the wait for a rank that died while starting.
    MPI_Request r;
    Check(MPI_Iallgather(&me, sizeof(Peer), MPI_BYTE, all.data(), sizeof(Peer), MPI_BYTE, comm_, &r), "MPI_Iallgather");
    timeout_s_ = 120;
    Wait(&r, "start-up (exchange of rank pids)");
    timeout_s_ = 0;
    for (const Peer& p : all) {
      pids_.push_back(p.pid);
      hosts_.emplace_back(p.host);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }
  bool broken() const override { return broken_; }
  void CheckPeers() override {
    Enter("CheckPeers");
    const int dead = DeadLocalPeer();
    if (dead >= 0)
      Break(dead, fmt::format("rank {} (pid {} on {}) is gone", dead, pids_[dead], hosts_[dead]));
  }

  void Broadcast(void* data, int64_t bytes, int root) override {
    Enter("Broadcast");
    MPI_Request r;
    Check(MPI_Ibcast(data, Int(bytes), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
    Wait(&r, "Broadcast");
  }
  void AllGather(const void* in, int64_t bytes, void* out) override {
    Enter("AllGather");
    MPI_Request r;
    Check(MPI_Iallgather(in, Int(bytes), MPI_BYTE, out, Int(bytes), MPI_BYTE, comm_, &r), "MPI_Iallgather");
    Wait(&r, "AllGather");
  }
  void AllGatherV(const void* in, const std::vector<int64_t>& counts, void* out) override {
    Enter("AllGatherV");
    std::vector<int> c, displ;
    Displacements(counts, &c, &displ);
    MPI_Request r;
    Check(MPI_Iallgatherv(in, c[rank_], MPI_BYTE, out, c.data(), displ.data(), MPI_BYTE, comm_, &r),
          "MPI_Iallgatherv");
    Wait(&r, "AllGatherV");
  }
  void GatherV(const void* in, const std::vector<int64_t>& counts, void* out, int root) override {
    Enter("GatherV");
    std::vector<int> c, displ;
    Displacements(counts, &c, &displ);
    MPI_Request r;
    Check(MPI_Igatherv(in, c[rank_], MPI_BYTE, out, c.data(), displ.data(), MPI_BYTE, root, comm_, &r),
          "MPI_Igatherv");
    Wait(&r, "GatherV");
  }
  void AllToAll(const void* in, int64_t bytes_per_rank, void* out) override {
    Enter("AllToAll");
    MPI_Request r;
    Check(MPI_Ialltoall(in, Int(bytes_per_rank), MPI_BYTE, out, Int(bytes_per_rank), MPI_BYTE, comm_, &r),
          "MPI_Ialltoall");
    Wait(&r, "AllToAll");
  }
  void AllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts) override {
    Enter("AllToAllV");
    std::vector<int> sc, sd, rc, rd;
    Displacements(send_counts, &sc, &sd);
    Displacements(recv_counts, &rc, &rd);
    MPI_Request r;
    Check(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE, comm_, &r),
          "MPI_Ialltoallv");
    Wait(&r, "AllToAllV");
  }
  void AllReduce(int64_t* data, int64_t count, ReduceOp op) override {
    Enter("AllReduce");
    const MPI_Op o = op == ReduceOp::kSum ? MPI_SUM : op == ReduceOp::kMin ? MPI_MIN : MPI_MAX;
    MPI_Request r;
    Check(MPI_Iallreduce(MPI_IN_PLACE, data, Int(count), MPI_INT64_T, o, comm_, &r), "MPI_Iallreduce");
    Wait(&r, "AllReduce");
  }
  void Barrier() override {
    Enter("Barrier");
    MPI_Request r;
    Check(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    Wait(&r, "Barrier");
  }

 private:
  void Enter(const char* what) {
    if (broken_) throw RankLostError(lost_rank_, fmt::format("{}: the parallel job is broken ({})", what, lost_why_));
  }
  static int Int(int64_t n) {
    if (n < 0 || n > INT_MAX) Fail(ErrorKind::kOutOfRange, "MPI message of {} bytes exceeds the 2 GiB limit", n);
    return static_cast<int>(n);
  }
  void Displacements(const std::vector<int64_t>& counts, std::vector<int>* c, std::vector<int>* d) const {
    if (static_cast<int>(counts.size()) != size_)
      Fail(ErrorKind::kInternal, "collective counts for {} ranks in a communicator of {}", counts.size(), size_);
    int64_t at = 0;
    for (int64_t n : counts) {
      c->push_back(Int(n));
      d->push_back(Int(at));
      at += n;
    }
    Int(at);
  }
  void Check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    Break(-1, fmt::format("{} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
  }
  [[noreturn]] void Break(int rank, const std::string& why) {
    broken_ = true;
    lost_rank_ = rank;
    lost_why_ = why;
    throw RankLostError(rank, why);
  }
  // A peer on this host whose process is gone, or -1.
  int DeadLocalPeer() const {
    if (static_cast<int>(pids_.size()) != size_) return -1;  // still starting: pids not exchanged yet
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || hosts_[q] != hosts_[rank_]) continue;
      if (kill(static_cast<pid_t>(pids_[q]), 0) != 0 && errno == ESRCH) return q;
    }
    return -1;
  }
  void Wait(MPI_Request* req, const char* what) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto last_check = start;
    int done = 0;
    for (int64_t polls = 0;; ++polls) {
      Check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      // Spin briefly (steps follow each other closely), then back off.
      if (polls > 20000) std::this_thread::sleep_for(std::chrono::microseconds(polls > 200000 ? 1000 : 50));
      if ((polls & 255) != 0 && polls <= 20000) continue;
      const auto now = Clock::now();
      if (now - last_check > std::chrono::milliseconds(250)) {
        last_check = now;
        const int dead = DeadLocalPeer();
        if (dead >= 0)
          Break(dead, fmt::format("rank {} (pid {} on {}) is gone: {} on rank {} cannot complete", dead, pids_[dead],
                                  hosts_[dead], what, rank_));
      }
      const double waited = std::chrono::duration<double>(now - start).count();
      if (timeout_s_ > 0 && waited > timeout_s_)
        Break(-1, fmt::format("{} on rank {} waited {:.0f} s for its peers (--distributed-timeout): a rank is stuck "
                              "(stopped, or much slower), or a rank on another host is gone; ranks on this host are "
                              "alive",
                              what, rank_, waited));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int64_t> pids_;
  std::vector<std::string> hosts_;
  double timeout_s_ = 0;
  bool broken_ = false;
  int lost_rank_ = -1;
  std::string lost_why_;
};

}  // namespace
#endif  // DEEPINFER_WITH_MPI

// ------------------------------------------------------------------ world

namespace {
std::mutex g_world_mu;
std::unique_ptr<Communicator> g_world;
bool g_world_mpi = false;
bool g_finalized = false;

int LaunchedSize() {
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  return s ? std::atoi(s) : 1;
}
}  // namespace

Communicator& World() {
  std::lock_guard<std::mutex> lock(g_world_mu);
  if (g_world) return *g_world;
  const int launched = LaunchedSize();
#ifdef DEEPINFER_WITH_MPI
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED)
      spdlog::warn("MPI provides thread level {} < MPI_THREAD_SERIALIZED; collectives stay on one thread", provided);
    g_world = std::make_unique<MpiCommunicator>();
    g_world_mpi = true;
    return *g_world;
  }
#endif
  if (launched > 1)
    Fail(ErrorKind::kUnavailable,
         "started by mpirun with {} ranks, but this deepinfer was built without MPI (install libopenmpi-dev and "
         "rebuild with -DDEEPINFER_WITH_MPI=ON)",
         launched);
  g_world = std::make_unique<LocalCommunicator>();
  return *g_world;
}

bool WorldIsMpi() {
  std::lock_guard<std::mutex> lock(g_world_mu);
  return g_world_mpi;
}

bool WorldIsBroken() {
  std::lock_guard<std::mutex> lock(g_world_mu);
#ifdef DEEPINFER_WITH_MPI
  if (g_world_mpi) return static_cast<MpiCommunicator*>(g_world.get())->broken();
#endif
  return false;
}

void ShutdownWorld() {
  std::lock_guard<std::mutex> lock(g_world_mu);
#ifdef DEEPINFER_WITH_MPI
  if (g_world_mpi && !g_finalized) {
    g_finalized = true;
    auto* mpi = static_cast<MpiCommunicator*>(g_world.get());
    if (mpi->broken()) return;  // a dead peer: MPI_Finalize would wait for it
    MPI_Finalize();
  }
#endif
}

void AbortWorld(int code) {
#ifdef DEEPINFER_WITH_MPI
  if (g_world_mpi && !g_finalized) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

}  // namespace deepinfer
