// deepinfer/kernels/cpu/membw.h — STREAM-style memory-bandwidth kernels, the
// "machine limit" every kernel benchmark is reported against (bench
// `deepinfer bench kernels`, docs in README "Benchmarks").
//
// Definitions follow McCalpin's STREAM: copy c[i] = a[i] (2 arrays counted,
// 8 bytes per float element moved), triad a[i] = b[i] + s·c[i] (3 arrays, 12
// bytes per element; separate multiply and add). Write-allocate traffic is not
// counted, as in STREAM. Vectorised with Highway (runtime dispatch), split over
// the OpenMP team in contiguous static ranges.
#pragma once

#include <cstdint>

namespace deepinfer::cpu {

// One parallel pass each. Arrays of n floats; no alignment requirement.
void StreamCopy(float* c, const float* a, int64_t n);
void StreamTriad(float* a, const float* b, const float* c, float s, int64_t n);

// Reads n bytes (sum of 64-bit words, returned so the work is not removed):
// the read-only bandwidth that a GEMV's weight stream can at best reach.
uint64_t StreamRead(const uint8_t* p, int64_t n);

}  // namespace deepinfer::cpu
