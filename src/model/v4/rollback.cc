// Speculative rollback of the DeepSeek-V4 compressor carries (model.h
// RollbackCarry, docs/speculative.md): the carry slot rows are put back to
// their pre-chunk bytes and Compressor.forward's per-token slot updates are
// replayed for the kept positions from the chunk's capture (model.cc
// Pass::Compressor writes it). Entries are not emitted again: the kept
// positions' compressed KV and index keys are already in their paged rows.
#include <cstring>
#include <limits>
#include <vector>

#include "base/error.h"
#include "model/v4/model.h"

namespace deepinfer::v4 {

namespace {
int Coff(int r) { return r == 4 ? 2 : 1; }
}  // namespace

int64_t V4Model::CarryCaptureFloats(const StateGeometry& g, int64_t len) const {
  int64_t n = 0;
  for (const StateRegionGeometry& reg : g.of(StateKind::kCompressorCarry).regions) {
    const int r = cfg_.compress_ratios.at(reg.layer);
    n += len * (reg.rows_per_block / (Coff(r) * r)) * (reg.row_bytes / 4);
  }
  return n;
}

void V4Model::RollbackCarry(const SequenceStateView& v, const std::vector<uint8_t>& snapshot_carry, int64_t start,
                            int64_t len, int64_t end, const float* capture) const {
  if (end <= start || end > start + len)
    Fail(ErrorKind::kInternal, "V4 RollbackCarry: end {} outside ({}, {}]", end, start, start + len);
  const StateKindGeometry& cg = v.geometry->of(StateKind::kCompressorCarry);
  if (static_cast<int64_t>(snapshot_carry.size()) != cg.bytes_per_block())
    Fail(ErrorKind::kInternal, "V4 RollbackCarry: snapshot of {} bytes, the carry slot has {}", snapshot_carry.size(),
         cg.bytes_per_block());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  int64_t snap_off = 0;
  const float* cap = capture;
  for (size_t ri = 0; ri < cg.regions.size(); ++ri) {
    const StateRegionGeometry& reg = cg.regions[ri];
    const int l = reg.layer, r = cfg_.compress_ratios.at(l), coff = Coff(r);
    const int64_t nslot = static_cast<int64_t>(coff) * r, rowf = reg.row_bytes / 4, rpp = reg.rows_per_block / nslot;
    const int region = static_cast<int>(ri);
    if (l < cfg_.n_layers) {  // the drafter's own layers are not part of the target's chunk
      std::memcpy(v.Row(StateKind::kCompressorCarry, region, 0), snapshot_carry.data() + snap_off,
                  static_cast<size_t>(reg.block_bytes()));
      if (!capture) Fail(ErrorKind::kInternal, "V4 RollbackCarry: no carry capture");
      for (int comp = 0; comp < (r == 4 ? 2 : 1); ++comp) {  // attention compressor, then the indexer's
        const bool indexer = comp == 1;
        const int64_t wdt = coff * (indexer ? cfg_.index_head_dim : cfg_.head_dim), base = indexer ? 2 * nslot : 0;
        // Per-thread scratch (capacity kept: no allocation per rollback), filled as the fresh vectors were.
        thread_local std::vector<float> kvs, scs;
        kvs.assign(static_cast<size_t>(nslot * wdt), 0.0f);
        scs.assign(static_cast<size_t>(nslot * wdt), 0.0f);
        if (start == 0) {  // a chunk at position 0 started from the fresh carry (model.cc Compressor)
          std::fill(kvs.begin(), kvs.end(), 0.0f);
          std::fill(scs.begin(), scs.end(), kNegInf);
        } else {
          for (int64_t t = 0; t < nslot; ++t) {
            std::memcpy(kvs.data() + t * wdt, v.Row(StateKind::kCompressorCarry, region, base + t), wdt * 4);
            std::memcpy(scs.data() + t * wdt, v.Row(StateKind::kCompressorCarry, region, base + nslot + t), wdt * 4);
          }
        }
        for (int64_t p = start; p < end; ++p) {
          const int64_t slot = (coff == 2 ? r : 0) + p % r;
          const float* src = cap + ((p - start) * rpp + (indexer ? 2 : 0)) * rowf;
          std::memcpy(kvs.data() + slot * wdt, src, wdt * 4);
          std::memcpy(scs.data() + slot * wdt, src + rowf, wdt * 4);
          if ((p + 1) % r != 0) continue;
          // The group is complete (its entry was emitted by the forward): shift and clear as Compressor does.
          if (coff == 2) {
            std::memcpy(kvs.data(), kvs.data() + r * wdt, r * wdt * 4);
            std::memcpy(scs.data(), scs.data() + r * wdt, r * wdt * 4);
          }
          std::fill(kvs.begin() + (nslot - r) * wdt, kvs.end(), 0.0f);
          std::fill(scs.begin() + (nslot - r) * wdt, scs.end(), kNegInf);
        }
        for (int64_t t = 0; t < nslot; ++t) {
          std::memcpy(v.Row(StateKind::kCompressorCarry, region, base + t), kvs.data() + t * wdt, wdt * 4);
          std::memcpy(v.Row(StateKind::kCompressorCarry, region, base + nslot + t), scs.data() + t * wdt, wdt * 4);
        }
      }
    }
    snap_off += reg.block_bytes();
    if (cap) cap += len * rpp * rowf;
  }
}

}  // namespace deepinfer::v4
