// deepinfer/base/region_timer.h — wall-time split of a forward pass by model
// region (attention, indexer, compressor, mHC, MoE, head, ...), for
// `deepinfer bench e2e`. Off by default: a disabled scope costs one relaxed
// atomic load.
//
// Use: `RegionScope scope(Region::kMoe);` around a region on the thread that
// runs Forward (OpenMP work inside the region is included in its wall time).
// Scopes nest; time is charged exclusively to the innermost open region, so
// the regions add up to the instrumented wall time.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer {

enum class Region : int {
  kEmbed = 0,   // token embedding, Engram
  kMhc,         // mHC mixes / Sinkhorn / collapse / expand
  kNorm,        // RMSNorms outside other regions
  kAttention,   // attention projections (wq_a, wq_b, wkv, wo_a, wo_b) and norms
  kAttnCore,    // RoPE, KV QAT, window ring, sparse attention (the non-GEMM part)
  kCompressor,  // KV compressor
  kIndexer,     // indexer scores and top-k
  kRouter,      // MoE gate and top-k
  kMoe,         // routed + shared experts and the combine
  kHead,        // final collapse, norm and LM head
  kCollective,  // waiting in a collective of the parallel runtime (parallel/communicator.h)
  kCount
};
const char* RegionName(Region r);

// Enables/disables collection (global). Not for use while a Forward runs.
void EnableRegionTimer(bool on);
bool RegionTimerEnabled();
// Zeroes the accumulated times.
void ResetRegionTimes();
// Seconds accumulated per region since the last reset.
std::array<double, static_cast<int>(Region::kCount)> RegionSeconds();

class RegionScope {
 public:
  explicit RegionScope(Region r);
  ~RegionScope();
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  int region_ = -1;  // -1: disabled
  int parent_ = -1;
};

}  // namespace deepinfer
