// Launch helpers for the host code: the GPU's SM count, the opt-in to more than 48 KB of dynamic shared
// memory, grid sizes for grid-stride kernels, a kernel's binary arch, and launch_ex (PDL and clusters).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace fusekit {

constexpr int kThreads = 256;  // threads per block of the grid-stride kernels (blocks_for)

// The SM count of device `dev` (default: the current one), queried once per device.
inline int sm_count(int dev = -1) {
  static int sms[64] = {0};
  if (dev < 0) dev = c10::cuda::current_device();
  if (sms[dev] == 0) C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev));
  return sms[dev];
}

// The shared memory of one SM, queried once (each CTA on it also takes the 1 KB the runtime reserves per CTA).
inline int smem_per_sm(int dev = -1) {
  static int bytes[64] = {0};
  if (dev < 0) dev = c10::cuda::current_device();
  if (bytes[dev] == 0) C10_CUDA_CHECK(cudaDeviceGetAttribute(&bytes[dev], cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  return bytes[dev];
}

// Dynamic shared memory above 48 KB must be asked for, per kernel and per device: `bytes` for Kernel on the current
// device, once (every launch of it may then use up to `bytes`).
template <auto Kernel>
void opt_in_smem(size_t bytes) {
  static bool done[64] = {};
  const int dev = c10::cuda::current_device();
  if (done[dev]) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done[dev] = true;
}

// Blocks for `units` independent work items: enough to fill every SM (8 x 256 threads each), no more;
// the kernels are grid-stride loops.
inline int blocks_for(int64_t units) {
  int64_t want = (units + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(sm_count()) * 8)));
}

// The arch of `kernel`'s binary (cudaFuncAttributes::binaryVersion: 90 for sm_90).
template <typename K>
int binary_version(K* kernel) {
  cudaFuncAttributes a{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  return a.binaryVersion;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch where `pdl` (pdl.cuh),
// as a cluster of (1, cluster_y, 1) CTAs where cluster_y > 0.
template <typename... P, typename... A>
void launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
               unsigned cluster_y, A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_y > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1, attr[n].val.clusterDim.y = cluster_y, attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr, cfg.numAttrs = n;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}

}  // namespace fusekit
