// Programmatic dependent launch (PDL, sm_90+). A kernel launched by launch_ex (launch.cuh) with pdl set may
// start while the kernel before it on the stream is still running (its launch, and what it does before
// pdl_wait, overlap that kernel's tail; Inductor's Triton kernels do the same under triton.enable_pdl). So it
// calls pdl_wait() before any global access a kernel before it could conflict with (a load of an input, any
// store: even an output buffer may be memory the kernel before still reads), and pdl_trigger() where the next
// kernel may start early (that kernel's own pdl_wait still waits for this one to finish). No-ops where compiled
// for an older arch, and such a kernel is launched without PDL (pdl_allowed checks its binary). On an H100, a
// Llama-style decode step in a CUDA graph with Inductor's PDL on takes b1 0.611 -> 0.598 ms and b32 0.898 ->
// 0.896 ms with attention and decode GEMMs launched so; prefetching the GEMMs' weights into L2 before the wait
// is slower (b1 0.637 ms) and is not done.
#pragma once

#include "debug_overrides.h"

namespace fusekit {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether a kernel whose binary is `binary_version` (launch.cuh) may be launched with PDL now: built for sm_90+
// (its pdl_wait is real), and not turned off for its part ('a' attention, 'g' decode GEMMs) by the FUSEKIT_PDL
// test override (debug_overrides.h).
inline bool pdl_allowed(int binary_version, char part) {
  if (binary_version < 90) return false;
  return debug::pdl_enabled(part);
}

}  // namespace fusekit
