// One-pass dynamic per-row (per-token) quantization: each block owns one row, keeps it in registers,
// reduces |x| to the row's absmax, writes the fp32 scale and the quantized row. x is read from HBM once.
#pragma once
#include "fusekit.h"

namespace fusekit {

constexpr int kRowThreads = 256;
constexpr int kRowVecs = 4;  // vectors per thread kept in registers; longer rows re-read x (from L2)

__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[kRowThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? warp_max[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Q(x, s, r) -> OutT quantizes x / s (r = 1 / s, for the fast path); Q::kMax is the format's largest
// magnitude (127, 448). Block per row: any row length.
template <typename T, typename OutT, int V, typename Q>
__global__ void __launch_bounds__(kRowThreads) rowquant_kernel(const T* __restrict__ x, OutT* __restrict__ q,
                                                               float* __restrict__ scales, int64_t cols, Q op,
                                                               float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  OutT* qr = q + row * cols;
  const int64_t nvec = cols / V;
  Vec<T, V> held[kRowVecs];
  float amax = 0.f;
  bool has_nan = false;
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < nvec) {
      held[k] = reinterpret_cast<const Vec<T, V>*>(xr)[i];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float a = fabsf(static_cast<float>(held[k].v[j]));
        has_nan |= isnan(a);
        amax = fmaxf(amax, a);
      }
    }
  }
  for (int64_t i = threadIdx.x + int64_t(kRowVecs) * blockDim.x; i < nvec; i += blockDim.x) {
    Vec<T, V> v = reinterpret_cast<const Vec<T, V>*>(xr)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float a = fabsf(static_cast<float>(v.v[j]));
      has_nan |= isnan(a);
      amax = fmaxf(amax, a);
    }
  }
  for (int64_t i = nvec * V + threadIdx.x; i < cols; i += blockDim.x) {
    float a = fabsf(static_cast<float>(xr[i]));
    has_nan |= isnan(a);
    amax = fmaxf(amax, a);
  }
  const bool any_nan = __syncthreads_or(has_nan);
  amax = block_max(amax);
  if (any_nan) amax = __int_as_float(0x7fffffff);  // eager's amax propagates NaN; fmaxf drops it
  // s = clamp(amax, min=eps) / kMax, as eager computes it: a host-scalar divide is x * (1/kMax)
  const float s = (isnan(amax) ? amax : fmaxf(amax, eps)) * (1.0f / Q::kMax);
  const float r = 1.0f / s;
  if (threadIdx.x == 0) scales[row] = s;
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < nvec) {
      Vec<OutT, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = op(static_cast<float>(held[k].v[j]), s, r);
      reinterpret_cast<Vec<OutT, V>*>(qr)[i] = o;
    }
  }
  for (int64_t i = threadIdx.x + int64_t(kRowVecs) * blockDim.x; i < nvec; i += blockDim.x) {
    Vec<T, V> v = reinterpret_cast<const Vec<T, V>*>(xr)[i];
    Vec<OutT, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = op(static_cast<float>(v.v[j]), s, r);
    reinterpret_cast<Vec<OutT, V>*>(qr)[i] = o;
  }
  for (int64_t i = nvec * V + threadIdx.x; i < cols; i += blockDim.x) qr[i] = op(static_cast<float>(xr[i]), s, r);
}

// Persistent blocks, one row at a time, with a 3-stage cp.async pipeline: while a block reduces and
// quantizes row r from shared memory, rows r+G and r+2G are already on their way from HBM. Every block
// always has loads in flight, which the simple load-reduce-store kernel above does not (it reached only
// about half the copy bandwidth). Rows of up to 16 KB (8192 half / 4096 float elements).
constexpr int kStages = 3;

inline int device_major() {
  static int major[64] = {0};
  const int dev = c10::cuda::current_device();
  if (major[dev] == 0) C10_CUDA_CHECK(cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev));
  return major[dev];
}
constexpr int kPipeVecs = 4;  // vectors per thread: 256 threads x 4 x 16 B = 16 KB rows

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

template <typename T, typename OutT, int V, typename Q>
__global__ void __launch_bounds__(kRowThreads) rowquant_pipelined_kernel(const T* __restrict__ x, OutT* __restrict__ q,
                                                                         float* __restrict__ scales, int64_t rows,
                                                                         int64_t cols, Q op, float eps) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int nvec = static_cast<int>(cols / V);
  auto stage = [&](int st) { return reinterpret_cast<Vec<T, V>*>(smem) + st * nvec; };
  auto issue = [&](int64_t row, int st) {
    if (row < rows) {
      const Vec<T, V>* src = reinterpret_cast<const Vec<T, V>*>(x + row * cols);
      Vec<T, V>* dst = stage(st);
      for (int i = threadIdx.x; i < nvec; i += kRowThreads) cp_async16(dst + i, src + i);
    }
    cp_async_commit();  // an empty group keeps the wait counts uniform
  };
  const int64_t G = gridDim.x;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue(blockIdx.x + st * G, st);
  int it = 0;
  for (int64_t row = blockIdx.x; row < rows; row += G, ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // this row has landed for every thread; the stage read last iteration is free
    const Vec<T, V>* cur = stage(it % kStages);
    Vec<T, V> held[kPipeVecs];
    float amax = 0.f;
    bool has_nan = false;
#pragma unroll
    for (int k = 0; k < kPipeVecs; ++k) {
      const int i = threadIdx.x + k * kRowThreads;
      if (i < nvec) {
        held[k] = cur[i];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float a = fabsf(static_cast<float>(held[k].v[j]));
          has_nan |= isnan(a);
          amax = fmaxf(amax, a);
        }
      }
    }
    issue(row + (kStages - 1) * G, (it + kStages - 1) % kStages);
    const bool any_nan = __syncthreads_or(has_nan);
    amax = block_max(amax);
    if (any_nan) amax = __int_as_float(0x7fffffff);
    const float s = (isnan(amax) ? amax : fmaxf(amax, eps)) * (1.0f / Q::kMax);
    const float r = 1.0f / s;
    if (threadIdx.x == 0) scales[row] = s;
    Vec<OutT, V>* qr = reinterpret_cast<Vec<OutT, V>*>(q + row * cols);
#pragma unroll
    for (int k = 0; k < kPipeVecs; ++k) {
      const int i = threadIdx.x + k * kRowThreads;
      if (i < nvec) {
        Vec<OutT, V> o;
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = op(static_cast<float>(held[k].v[j]), s, r);
        qr[i] = o;
      }
    }
  }
  cp_async_wait<0>();
}

// x: [..., cols] contiguous; q: same shape (OutT storage); scales: [rows] fp32.
template <typename T, typename OutT, typename Q>
void launch_rowquant(const T* x, OutT* q, float* scales, int64_t rows, int64_t cols, Q op, float eps) {
  if (rows == 0) return;
  constexpr int V = 16 / sizeof(T);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // fewer threads for short rows: every thread should hold at least one vector
  int threads = 32;
  while (threads < kRowThreads && int64_t(threads) * V < cols) threads *= 2;
  TORCH_CHECK(rows <= INT32_MAX, "fusekit: too many rows");
  const size_t smem = size_t(kStages) * cols * sizeof(T);
  if (cols % V == 0 && aligned16(x) && cols / V <= kRowThreads * kPipeVecs && smem <= 48 * 1024 &&
      device_major() >= 8) {  // cp.async is sm_80+
    static int sms[64] = {0};
    const int dev = c10::cuda::current_device();
    if (sms[dev] == 0) C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev));
    const int per_sm = std::max<int>(1, std::min<int>(8, int((160 * 1024) / smem)));
    const int64_t grid = std::min<int64_t>(rows, int64_t(sms[dev]) * per_sm);
    rowquant_pipelined_kernel<T, OutT, V><<<grid, kRowThreads, smem, stream>>>(x, q, scales, rows, cols, op, eps);
  } else if (cols % V == 0 && aligned16(x)) {
    rowquant_kernel<T, OutT, V><<<rows, threads, 0, stream>>>(x, q, scales, cols, op, eps);
  } else {
    rowquant_kernel<T, OutT, 1><<<rows, threads, 0, stream>>>(x, q, scales, cols, op, eps);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace fusekit
