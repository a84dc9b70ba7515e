// Shared pieces of fusekit's CUDA kernels: input checks, a 16-byte-vector elementwise engine sized to
// the GPU, and the float-or-0-dim-tensor scalar arguments (see fusion_backend/ops.py).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>

#define FK_CHECK_CUDA(t) TORCH_CHECK((t).is_cuda(), "fusekit: " #t " must be a CUDA tensor, got ", fusekit::describe(t))
#define FK_CHECK_CONTIGUOUS(t) TORCH_CHECK((t).is_contiguous(), "fusekit: " #t " must be contiguous")
#define FK_CHECK_FLOATING(t)                                                                          \
  TORCH_CHECK((t).scalar_type() == at::kFloat || (t).scalar_type() == at::kHalf ||                     \
                  (t).scalar_type() == at::kBFloat16,                                                 \
              "fusekit: " #t " must be float32, float16 or bfloat16, got ", c10::toString((t).scalar_type()))
// NOTE: messages are built as plain strings: streaming IntArrayRef/Device into TORCH_CHECK from nvcc-
// compiled code crashed the process on torch 2.11 (seen on an H200), instead of raising.
#define FK_CHECK_SAME(a, b)                                                                           \
  TORCH_CHECK((a).sizes() == (b).sizes() && (a).scalar_type() == (b).scalar_type() &&                 \
                  (a).device() == (b).device(),                                                       \
              "fusekit: " #a " and " #b " must have one shape, dtype and device; got ",               \
              fusekit::describe(a), " and ", fusekit::describe(b))

namespace fusekit {

inline std::string describe(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] " + c10::toString(t.scalar_type()) + " " + t.device().str();
}

constexpr int kThreads = 256;

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// Blocks for `units` independent work items: enough to fill every SM (8 x 256 threads each), no more;
// the kernels are grid-stride loops.
inline int blocks_for(int64_t units) {
  static int sms[64] = {0};
  int dev = c10::cuda::current_device();
  if (sms[dev] == 0) C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev));
  int64_t want = (units + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(sms[dev]) * 8)));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// out[i] = op({in[0][i], ..., in[N-1][i]}) over n elements. 16-byte vector loads when every pointer is
// aligned, then a scalar tail; any n (0, 1, odd) is correct.
template <int N, typename T, typename Out, int V, typename Op>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(Op op, Out* __restrict__ out,
                                                               const T* const* __restrict__ unused,
                                                               const T* __restrict__ a, const T* __restrict__ b,
                                                               const T* __restrict__ c, int64_t n) {
  const T* in[3] = {a, b, c};
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Vec<T, V> x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = reinterpret_cast<const Vec<T, V>*>(in[k])[i];
    Vec<Out, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      T vals[N];
#pragma unroll
      for (int k = 0; k < N; ++k) vals[k] = x[k].v[j];
      o.v[j] = op(vals);
    }
    reinterpret_cast<Vec<Out, V>*>(out)[i] = o;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) {
    T vals[N];
#pragma unroll
    for (int k = 0; k < N; ++k) vals[k] = in[k][i];
    out[i] = op(vals);
  }
}

// Launch `op` on the current stream over contiguous inputs of one dtype T.
template <int N, typename T, typename Out, typename Op>
void launch_elementwise(Op op, Out* out, const T* a, const T* b, const T* c, int64_t n) {
  if (n == 0) return;
  constexpr int V = 16 / sizeof(T);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  bool vec = aligned16(out) && aligned16(a) && (N < 2 || aligned16(b)) && (N < 3 || aligned16(c));
  if (vec) {
    elementwise_kernel<N, T, Out, V><<<blocks_for(n / V + 1), kThreads, 0, stream>>>(op, out, nullptr, a, b, c, n);
  } else {
    elementwise_kernel<N, T, Out, 1><<<blocks_for(n), kThreads, 0, stream>>>(op, out, nullptr, a, b, c, n);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A float argument that may arrive as a Python number or as a 0-dim tensor (`<name>_t`). A host value
// is used directly; a device tensor is read inside the kernel (no host sync, CUDA-graph safe).
struct ScalarArg {
  float value = 0.f;
  const float* ptr = nullptr;  // device pointer to a float32 copy, when the scalar lives on the GPU
  bool on_host = true;
  at::Tensor keep;             // keeps the float32 copy alive until the launch is enqueued
  __host__ __device__ float get() const {
#ifdef __CUDA_ARCH__
    return ptr ? *ptr : value;
#else
    return value;
#endif
  }
};

inline ScalarArg scalar_arg(const char* name, double v, const std::optional<at::Tensor>& t,
                            const at::Device& device) {
  ScalarArg s;
  if (!t.has_value()) {
    s.value = static_cast<float>(v);
    return s;
  }
  TORCH_CHECK(t->dim() == 0 && t->is_floating_point(), "fusekit: ", name,
              "_t must be a 0-dim floating tensor, got ", describe(*t));
  if (t->is_cpu()) {
    s.value = static_cast<float>(t->item<double>());
    return s;
  }
  TORCH_CHECK(t->device() == device, "fusekit: ", name, "_t is on ", t->device().str(), ", inputs on ",
              device.str());
  s.keep = t->scalar_type() == at::kFloat ? *t : t->to(at::kFloat);
  s.ptr = s.keep.data_ptr<float>();
  s.on_host = false;
  return s;
}

}  // namespace fusekit
