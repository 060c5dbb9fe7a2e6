// Load-time repacking of FP8 / FP4 / BF16 weights into the 64-row interleaved
// layouts the kernels stream (cpu_ops.h). A pure data transform: no value is
// converted except the FP8 block scales (E8M0 → FP32 with E8M0ToFloat, the
// reference's own conversion) and, for a BF16 weight that is dequantised FP8,
// its exact E4M3 codes and power-of-two factors (PackedBf16::w8, checked
// weight by weight).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

#include <sys/mman.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/linear_common.h"
#include "format/numerics.h"

namespace deepinfer::cpu {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
// The arrays AllocateAligned maps itself (2 MiB or more), by start address,
// with their mapped length: AlignedFree unmaps them.
std::mutex g_mapped_mu;
std::unordered_map<void*, size_t>& MappedArrays() {
  static auto* m = new std::unordered_map<void*, size_t>;  // never destroyed: frees may run at exit
  return *m;
}
}  // namespace

void AlignedFree::operator()(void* p) const {
  if (p == nullptr) return;
  if (reinterpret_cast<uintptr_t>(p) % kHugePage == 0) {  // only such starts can be mapped arrays
    size_t len = 0;
    {
      std::lock_guard<std::mutex> lock(g_mapped_mu);
      auto it = MappedArrays().find(p);
      if (it != MappedArrays().end()) {
        len = it->second;
        MappedArrays().erase(it);
      }
    }
    if (len != 0) {
      ::munmap(p, len);
      return;
    }
  }
  std::free(p);
}

void SetMinParallelMacs(int64_t macs) { g_min_parallel_macs = macs; }

// Arrays of 2 MiB or more (the packed weights a decode step streams, the
// large scratch buffers) start on a 2 MiB boundary and their whole 4 KiB
// pages are marked MADV_HUGEPAGE, so that with transparent huge pages in
// `madvise` mode (Debian's default) they are backed by 2 MiB pages: one TLB
// entry per 2 MiB instead of 512, and no 4 KiB page boundaries in a GEMV's
// stream for the hardware prefetchers to stop at. Each such array is its own
// anonymous mapping: 2 MiB more is mapped and the unaligned head and the tail
// past the array's last 4 KiB page are unmapped at once. A huge page never
// extends past the end of a mapping, so the last partial 2 MiB stays in 4 KiB
// pages (no physical memory past the array's end), and the alignment costs no
// address space either (posix_memalign kept the skipped head mapped: up to
// 2 MiB of address space per array, ~94 GB over the real checkpoint's ~47 k
// such arrays, counted against the commit limit under
// vm.overcommit_memory = 2). AlignedFree unmaps them.
// Measured (Zen 5 VM, FP8 GEMV 2304 × 5120 from DRAM, 12 copies of each
// form in one process, alternated 15 times): 1.60× (AVX-512) / 1.14× (AVX2)
// on one thread, 1.23× / 1.10× on two (docs/kernels-log.md, "Huge pages for
// the packed weights"). Where THP is off (`never`) the hint does nothing.
template <typename T>
AlignedArray<T> AllocateAligned(size_t n) {
  if (n > (SIZE_MAX - 63) / sizeof(T)) throw std::bad_alloc();  // n·sizeof(T) rounded up would wrap
  const size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
  if (bytes >= kHugePage) {
    constexpr size_t kPage = 4096;
    if (bytes > SIZE_MAX - 2 * kHugePage) throw std::bad_alloc();
    const size_t len = (bytes + kPage - 1) / kPage * kPage;
    void* base = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    const uintptr_t a = (b + kHugePage - 1) / kHugePage * kHugePage;
    if (a > b) ::munmap(base, a - b);                                      // the head
    ::munmap(reinterpret_cast<void*>(a + len), b + len + kHugePage - (a + len));  // the tail (never empty)
    void* p = reinterpret_cast<void*>(a);
    ::madvise(p, len, MADV_HUGEPAGE);  // a hint: on failure the pages stay 4 KiB
    try {
      std::lock_guard<std::mutex> lock(g_mapped_mu);
      MappedArrays()[p] = len;  // a new mapping at p: any entry there would be stale
    } catch (...) {
      ::munmap(p, len);
      throw;
    }
    return AlignedArray<T>(static_cast<T*>(p));
  }
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedArray<T>(static_cast<T*>(p));
}
template AlignedArray<uint8_t> AllocateAligned<uint8_t>(size_t);
template AlignedArray<uint16_t> AllocateAligned<uint16_t>(size_t);
template AlignedArray<uint32_t> AllocateAligned<uint32_t>(size_t);
template AlignedArray<float> AllocateAligned<float>(size_t);

size_t PackedFp8::bytes() const {
  return static_cast<size_t>(tiles * kTileRows * src.in) + static_cast<size_t>(tiles * (src.in / 32) * 4 * 4);
}
size_t PackedFp4::bytes() const {
  return static_cast<size_t>(tiles * kTileRows * (src.in / 2)) + static_cast<size_t>(tiles * kTileRows * (src.in / 32));
}
size_t PackedBf16::bytes() const {
  const size_t bf16 = static_cast<size_t>(tiles * kTileRows * src.in * 2);
  return w8 ? bf16 + decode_bytes() : bf16;
}
size_t PackedBf16::decode_bytes() const {
  if (!w8) return static_cast<size_t>(tiles * kTileRows * src.in * 2);
  return static_cast<size_t>(tiles * kTileRows * src.in) + static_cast<size_t>(tiles * (src.in / 32) * 2 * 4);
}
size_t PackedF32::bytes() const { return static_cast<size_t>(tiles * rows * in * 4); }

namespace {

// dst[t][k][r] = src[(R·t + r)·K + k] for elements of type T (rows >= N: 0),
// R = rows per tile (kTileRows; PackF32 of a small N: fewer).
template <typename T>
void Interleave(const T* src, int64_t N, int64_t K, int64_t tiles, T* dst, int64_t R = kTileRows) {
  constexpr int64_t kKB = 64;  // k-block: a 64×64 transpose stays in L1
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    T* d = dst + t * K * R;
    for (int64_t k0 = 0; k0 < K; k0 += kKB) {
      const int64_t k1 = std::min(K, k0 + kKB);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t n = t * R + r;
        if (n < N) {
          const T* s = src + n * K;
          for (int64_t k = k0; k < k1; ++k) d[k * R + r] = s[k];
        } else {
          for (int64_t k = k0; k < k1; ++k) d[k * R + r] = T(0);
        }
      }
    }
  }
}

// The E4M3FN code of the BF16 value h · 2^-t, or -1 where that is not an
// E4M3FN value (too many significant bits, out of range, NaN/Inf, or h an
// FP32 subnormal). Exact bit arithmetic: no rounding anywhere.
int Bf16ToE4M3Exact(uint16_t h, int t) {
  const int sign = (h >> 15) & 1, ef = (h >> 7) & 0xFF, m7 = h & 0x7F;
  if (ef == 0) return m7 == 0 ? (sign << 7) : -1;  // ±0; an FP32 subnormal is refused
  if (ef == 0xFF) return -1;
  const int e = ef - 127 - t;  // binary exponent of the scaled value
  if (e >= -6) {
    if ((m7 & 0x0F) != 0 || e > 8 || (e == 8 && (m7 >> 4) == 7)) return -1;  // 0x7F / 0xFF are NaN
    return (sign << 7) | ((e + 7) << 3) | (m7 >> 4);
  }
  if (e < -9) return -1;
  // Subnormal: (128 + m7)·2^(e-7) in units of 2^-9 must be an integer < 8.
  const int shift = -2 - e;  // 5, 6, 7 for e = -7, -8, -9
  const int sig = 128 + m7;
  if ((sig & ((1 << shift) - 1)) != 0) return -1;
  return (sign << 7) | (sig >> shift);
}

// PackedBf16::w8 / s8 (see cpu_ops.h): per 32 rows (half a tile) and 32
// columns a power of two 2^t, t = emax - 8 or, failing that, emax - 7
// (emax: the block's largest binary exponent), such that every weight is an
// E4M3FN value times 2^t (a block of zeros: factor 1, outside s8_exp_lo/hi);
// each is then checked against the kernel's own reconstruction (the
// E4M3Scaled bit pattern times 2^(t+120), an FP32 multiply). False (and
// nothing kept) as soon as one weight fails.
bool BuildBf16Codes(const ref::Bf16Weight& w, int64_t tiles, PackedBf16& p) {
  const int64_t N = w.out, K = w.in, kc = K / 32;
  if (K <= 0 || K % 32 != 0 || N <= 0) return false;
  AlignedArray<uint8_t> codes = AllocateAligned<uint8_t>(static_cast<size_t>(tiles * K * kTileRows));
  AlignedArray<float> scales = AllocateAligned<float>(static_cast<size_t>(tiles * kc * 2));
  bool ok = true;
  int lo = 1000, hi = -1000;
#pragma omp parallel for schedule(dynamic, 1) reduction(min : lo) reduction(max : hi)
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t b = 0; b < kc * 2; ++b) {
      bool mine;
#pragma omp atomic read
      mine = ok;
      if (!mine) break;
      const int64_t c = b / 2, r0 = (b % 2) * 32;  // columns 32c.., rows 64t + r0 ..
      int emax = -1000;
      for (int64_t r = r0; r < r0 + 32 && t * kTileRows + r < N; ++r)
        for (int64_t k = 32 * c; k < 32 * c + 32; ++k) {
          const uint16_t h = w.w[(t * kTileRows + r) * K + k];
          if ((h & 0x7FFF) != 0) emax = std::max(emax, ((h >> 7) & 0xFF) - 127);
        }
      if (emax == -1000) {
        // All zero (or padding rows): factor 1, which multiplies any finite x
        // exactly, so it stays out of the range the calls check (s8_exp_lo/hi).
        for (int64_t r = r0; r < r0 + 32; ++r) {
          const int64_t n = t * kTileRows + r;
          for (int64_t k = 32 * c; k < 32 * c + 32; ++k)
            codes[(t * K + k) * kTileRows + r] = n < N ? static_cast<uint8_t>(w.w[n * K + k] >> 8) : 0;  // ±0
        }
        scales[(t * kc + c) * 2 + b % 2] = 1.0f;
        continue;
      }
      bool block_ok = false;
      for (int tt = emax - 8; tt <= emax - 7 && !block_ok; ++tt) {
        if (tt + 120 < -126 || tt + 120 > 127) continue;
        const float sc = std::ldexp(1.0f, tt + 120);
        block_ok = true;
        for (int64_t r = r0; r < r0 + 32 && block_ok; ++r) {
          const int64_t n = t * kTileRows + r;
          for (int64_t k = 32 * c; k < 32 * c + 32; ++k) {
            int code = 0;
            if (n < N) {
              const uint16_t h = w.w[n * K + k];
              code = Bf16ToE4M3Exact(h, tt);
              // The kernel's value: sign-extended code << 20, masked, as FP32, times sc.
              const uint32_t bits =
                  static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(code)) << 20) & 0x87F00000u;
              if (code < 0 || FloatBits(BitsFloat(bits) * sc) != FloatBits(Bf16ToFloat(h))) {
                block_ok = false;
                break;
              }
            }
            codes[(t * K + k) * kTileRows + r] = static_cast<uint8_t>(code);
          }
        }
        if (block_ok) {
          scales[(t * kc + c) * 2 + b % 2] = sc;
          lo = std::min(lo, tt + 120);
          hi = std::max(hi, tt + 120);
        }
      }
      if (!block_ok) {
#pragma omp atomic write
        ok = false;
        break;
      }
    }
  }
  if (!ok) return false;
  p.w8 = std::move(codes);
  p.s8 = std::move(scales);
  p.s8_exp_lo = lo;
  p.s8_exp_hi = hi;
  return true;
}

}  // namespace

PackedFp8 PackFp8(const ref::Fp8Weight& w) {
  PackedFp8 p;
  p.src = w;
  const int64_t N = w.out, K = w.in, B = w.block;
  p.tiles = (N + kTileRows - 1) / kTileRows;
  // The repacked kernel needs one scale per 16 rows × 32 columns.
  if (B <= 0 || B % 32 != 0 || K % 32 != 0) {
    p.use_ref = true;
    return p;
  }
  for (int64_t i = 0; i < N * K && !p.use_ref; ++i) p.use_ref = E4M3IsNaN(w.w[i]);
  if (p.use_ref) return p;
  p.w = AllocateAligned<uint8_t>(static_cast<size_t>(p.tiles * K * kTileRows));
  Interleave(w.w, N, K, p.tiles, p.w.get());
  const int64_t kc = K / 32, scale_cols = (K + B - 1) / B;
  p.ws = AllocateAligned<float>(static_cast<size_t>(p.tiles * kc * 4));
  for (int64_t t = 0; t < p.tiles; ++t)
    for (int64_t c = 0; c < kc; ++c)
      for (int64_t g = 0; g < 4; ++g) {
        const int64_t n = t * kTileRows + g * 16;
        p.ws[(t * kc + c) * 4 + g] = n < N ? E8M0ToFloat(w.scale[(n / B) * scale_cols + (c * 32) / B]) : 1.0f;
      }
  {
    // E8M0 byte b is 2^(b-127); 0xFF (NaN) leaves the range failing the guard.
    int lo = 255, hi = -1;
    const int64_t nscales = ((N + B - 1) / B) * scale_cols;
    for (int64_t i = 0; i < nscales; ++i) lo = std::min<int>(lo, w.scale[i]), hi = std::max<int>(hi, w.scale[i]);
    if (nscales > 0 && hi != 0xFF) p.scale_exp_lo = lo - 127, p.scale_exp_hi = hi - 127;
  }
  return p;
}

PackedFp4 PackFp4(const ref::Fp4Weight& w) {
  PackedFp4 p;
  p.src = w;
  const int64_t N = w.out, K = w.in;
  p.tiles = (N + kTileRows - 1) / kTileRows;
  if (K % 32 != 0) {
    p.use_ref = true;
    return p;
  }
  const int64_t groups = K / 32;
  // The kernel turns a scale byte b into 2^(b-127) by a shift: valid for 1..254.
  for (int64_t i = 0; i < N * groups && !p.use_ref; ++i) p.use_ref = w.scale[i] == 0 || w.scale[i] == 0xFF;
  if (p.use_ref) return p;
  // w[t][j][r] = the 4 checkpoint bytes of row 64t+r at columns 8j..8j+7 (one
  // little-endian dword; nibble i = column 8j+i), 0 for padding rows.
  p.w = AllocateAligned<uint8_t>(static_cast<size_t>(p.tiles * (K / 2) * kTileRows));
  {
    const int64_t J = K / 8;
    uint8_t* dst = p.w.get();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < p.tiles; ++t)
      for (int64_t j = 0; j < J; ++j)
        for (int64_t r = 0; r < kTileRows; ++r) {
          const int64_t n = t * kTileRows + r;
          uint8_t* o = dst + ((t * J + j) * kTileRows + r) * 4;
          if (n < N) std::memcpy(o, w.w + n * (K / 2) + j * 4, 4);
          else std::memset(o, 0, 4);
        }
  }
  p.s = AllocateAligned<uint8_t>(static_cast<size_t>(p.tiles * groups * kTileRows));
  Interleave(w.scale, N, groups, p.tiles, p.s.get());
  // Padding rows: scale byte 127 (1.0) so their (discarded) results stay finite.
  for (int64_t t = 0; t < p.tiles; ++t)
    for (int64_t r = 0; r < kTileRows; ++r)
      if (t * kTileRows + r >= N)
        for (int64_t g = 0; g < groups; ++g) p.s[(t * groups + g) * kTileRows + r] = 127;
  if (N * groups > 0) {
    const auto [lo, hi] = std::minmax_element(w.scale, w.scale + N * groups);
    p.scale_exp_lo = *lo - 127, p.scale_exp_hi = *hi - 127;
  }
  return p;
}

namespace {
// Whether [a; b] can be concatenated in the packed domain (ConcatPackedRows).
template <typename P>
bool Concatenable(const P& a, const P& b) {
  return !a.use_ref && !b.use_ref && a.w && b.w && a.src.in == b.src.in && a.src.out % kTileRows == 0 &&
         a.tiles == a.src.out / kTileRows;
}
// dst = a's first `na` elements, then b's `nb`.
template <typename T>
AlignedArray<T> Concat(const T* a, size_t na, const T* b, size_t nb) {
  AlignedArray<T> dst = AllocateAligned<T>(na + nb);
  std::memcpy(dst.get(), a, na * sizeof(T));
  std::memcpy(dst.get() + na, b, nb * sizeof(T));
  return dst;
}
}  // namespace

std::unique_ptr<PackedFp8> ConcatPackedRows(const PackedFp8& a, const PackedFp8& b) {
  if (!Concatenable(a, b) || a.src.block != b.src.block) return nullptr;
  const int64_t K = a.src.in;
  auto p = std::make_unique<PackedFp8>();
  p->src = {nullptr, nullptr, a.src.out + b.src.out, K, a.src.block};
  p->tiles = a.tiles + b.tiles;
  // w[t][k][r] and ws[t][k/32][r/16]: the tiles of b follow those of a.
  p->w = Concat(a.w.get(), static_cast<size_t>(a.tiles * K * kTileRows), b.w.get(),
                static_cast<size_t>(b.tiles * K * kTileRows));
  p->ws = Concat(a.ws.get(), static_cast<size_t>(a.tiles * (K / 32) * 4), b.ws.get(),
                 static_cast<size_t>(b.tiles * (K / 32) * 4));
  p->scale_exp_lo = std::min(a.scale_exp_lo, b.scale_exp_lo);
  p->scale_exp_hi = std::max(a.scale_exp_hi, b.scale_exp_hi);
  return p;
}

std::unique_ptr<PackedFp4> ConcatPackedRows(const PackedFp4& a, const PackedFp4& b) {
  if (!Concatenable(a, b)) return nullptr;
  const int64_t K = a.src.in;
  auto p = std::make_unique<PackedFp4>();
  p->src = {nullptr, nullptr, a.src.out + b.src.out, K};
  p->tiles = a.tiles + b.tiles;
  // w[t][j][r] (dwords) and s[t][g][r]: the tiles of b follow those of a.
  p->w = Concat(a.w.get(), static_cast<size_t>(a.tiles * (K / 2) * kTileRows), b.w.get(),
                static_cast<size_t>(b.tiles * (K / 2) * kTileRows));
  p->s = Concat(a.s.get(), static_cast<size_t>(a.tiles * (K / 32) * kTileRows), b.s.get(),
                static_cast<size_t>(b.tiles * (K / 32) * kTileRows));
  p->scale_exp_lo = std::min(a.scale_exp_lo, b.scale_exp_lo);
  p->scale_exp_hi = std::max(a.scale_exp_hi, b.scale_exp_hi);
  return p;
}

PackedBf16 PackBf16(const ref::Bf16Weight& w) {
  PackedBf16 p;
  p.src = w;
  p.tiles = (w.out + kTileRows - 1) / kTileRows;
  p.w = AllocateAligned<uint16_t>(static_cast<size_t>(p.tiles * w.in * kTileRows));
  Interleave(w.w, w.out, w.in, p.tiles, p.w.get());
  const ExpRange r = Bf16CodesExpRange(w.w, w.out * w.in);
  p.exp_lo = r.lo;
  p.exp_hi = r.hi;
  p.finite = r.finite;
  p.any_nonzero = r.any_nonzero;
  BuildBf16Codes(w, p.tiles, p);
  return p;
}

}  // namespace deepinfer::cpu

namespace deepinfer::cpu {
PackedF32 PackF32(const float* w, int64_t out, int64_t in) {
  PackedF32 p;
  p.out = out;
  p.in = in;
  p.tiles = (out + kTileRows - 1) / kTileRows;
  p.rows = out <= 16 ? 16 : (out <= 32 ? 32 : kTileRows);
  p.w = AllocateAligned<float>(static_cast<size_t>(p.tiles * in * p.rows));
  Interleave(w, out, in, p.tiles, p.w.get(), p.rows);
  return p;
}
}  // namespace deepinfer::cpu
