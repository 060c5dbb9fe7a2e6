// deepinfer/kernels/cpu/hwy_targets.h — the Highway targets the CPU kernels are
// compiled for. Include FIRST in every kernels/cpu foreach_target translation
// unit (before any hwy header).
//
// Compiled: HWY_AVX3 (AVX-512 F/BW/DQ/VL), HWY_AVX2 (AVX2 + FMA + F16C), and
// the baseline fallback (HWY_EMU128, or HWY_SCALAR with g++ < 12.3). SSSE3 and
// SSE4 are skipped: they would only add build time, the fallback covers such
// machines correctly. Each translation unit's dispatch table only ever picks
// targets compiled into it (hwy::ChosenTarget::GetIndex). A tree configured
// with DEEPINFER_SIMD=avx2-up|avx2 (CMakeLists.txt; the sanitizer builds) has
// AVX2 as its baseline and no fallback (DEEPINFER_NO_FALLBACK_TARGET).
#pragma once

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
