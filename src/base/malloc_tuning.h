// deepinfer/base/malloc_tuning.h — glibc malloc settings for the engine's
// programs (the `deepinfer` CLI calls RetainFreedMemory first thing).
//
// With glibc's defaults a free() of a large heap chunk at the top of the heap
// gives the memory back to the kernel (brk down, from 128 KiB), and blocks
// from 128 KiB up (raised dynamically) are mmap-ed and munmap-ed one by one;
// the next step's buffers of the same sizes then fault every page in again,
// zeroed by the kernel on the faulting thread. A 1 024-token prefill of the
// `large` preset made ~6 500 brk calls that way (strace -c).
#pragma once

namespace deepinfer {

// Process-wide: blocks below 32 MiB come from the heap (M_MMAP_THRESHOLD,
// glibc's largest), the heap is trimmed only when 1 GiB is free at its top
// (M_TRIM_THRESHOLD) and grows in steps of at least 16 MiB (M_TOP_PAD); freed
// memory then stays with the process for the next step's buffers (its
// resident size stays at its peak, as the workspace's own buffers do; a
// long-running server whose step shapes vary can hold more than that peak
// through fragmentation, and per-thread arenas are never shrunk).
// Returns true when all three were applied; false when one failed (the
// others may be in effect), and false changing nothing when the user set
// any of malloc's parameters (GLIBC_TUNABLES naming glibc.malloc.*, or one
// of MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_TOP_PAD_), in a
// sanitizer build (its allocator ignores them), or off glibc. Another
// allocator preloaded (LD_PRELOAD) still sees mallopt succeed and ignores
// it. Call before threads start. Never throws.
bool RetainFreedMemory();

}  // namespace deepinfer
