// fusekit::silu_mul_fp8_rows -- SwiGLU's product quantized per row to float8 e4m3 as torchao quantizes the down
// projection's input (Float8DynamicActivationFloat8WeightConfig(PerRow)), in one pass: the product stays on chip.
//
//   def silu_mul_fp8_rows_ref(gate, up):                     # patterns/quantize.py
//       h = F.silu(gate) * up                                # silu rounded to gate's dtype, then the product
//       s = (h.abs().amax(-1, keepdim=True) / 448.0).float()  # the division rounded to gate's dtype
//       return (h.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s
//
// Inductor fuses that chain into one looped Triton reduction over rows of 5632-14336, which reads gate and up twice
// (the max, then the quotients) and recomputes the product; here a CTA keeps its row's product in registers and
// reads gate and up once. Exactly eager's values: silu in float32 as eager's CUDA kernel (x / (1 + expf(-x)), no
// fast math), both 16-bit roundings, the scale and the correctly rounded quotients of quantize/torchao_rows.cuh.
//
// Contract: gate, up [..., N] CUDA, one shape, one dtype (float16 or bfloat16), contiguous, 16-byte aligned, N a
// positive multiple of 8; returns xq float8_e4m3fn [..., N] and s float32 [..., 1] (new, contiguous). Rows up to
// kHeld * 8 * 1024 = 32768 wide stay in registers; wider ones recompute the product from gate and up (from L2).
// Runs on the current stream, no host sync, CUDA-graph safe.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "checks.h"                     // FK_CHECK_*, aligned16, describe
#include "elementwise/activations.cuh"  // silu (eager's float32 formula)
#include "quantize/torchao_rows.cuh"    // row_scale, div_rn, amax2

namespace fusekit {
namespace {

constexpr int kHeld = 4;            // 8-value vectors a thread keeps between the max and the quotients
constexpr int kMaxThreads = 1024;

// 8 values of silu(gate) * up as eager rounds them: silu to T, then the product to T
template <typename T>
__device__ __forceinline__ uint4 silu_mul8(const uint4& g, const uint4& u) {
  const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
  uint32_t h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 gf = to_float2<T>(gw[i]), uf = to_float2<T>(uw[i]);
    const float a = to_float(from_float<T>(silu(gf.x))), b = to_float(from_float<T>(silu(gf.y)));
    const T lo = from_float<T>(a * uf.x), hi = from_float<T>(b * uf.y);
    h[i] = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&lo)) |
           (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// max(a, |each of 8 values|), NaN kept (torch's amax)
template <typename T>
__device__ __forceinline__ float absmax8(const uint4& v, float a) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = to_float2<T>(w[i]);
    a = amax2<true>(a, amax2<true>(fabsf(f.x), fabsf(f.y)));
  }
  return a;
}

// 2 values (one word of T) -> two e4m3 as torchao_rows.cuh's quantize2, with a zero quotient keeping x's sign:
// div_rn's correcting FMAs turn -0 into +0, and SwiGLU's product holds -0 (silu of a very negative gate, or a zero
// times a negative up) where eager writes e4m3 -0 (0x80)
template <typename T>
__device__ __forceinline__ uint32_t quantize2_signed(uint32_t v, float s, float r) {
  const float2 f = to_float2<T>(v);
  const auto q = [&](float x) {
    const float t = div_rn(x, s, r);
    return t == 0.f ? copysignf(t, x) : t;
  };
  return __nv_cvt_float2_to_fp8x2(make_float2(q(f.x), q(f.y)), __NV_SATFINITE, __NV_E4M3);
}

// 8 values -> 8 e4m3 in memory order
template <typename T>
__device__ __forceinline__ uint2 quantize8_e4m3(const uint4& v, float s, float r) {
  const auto four = [&](uint32_t lo, uint32_t hi) {
    return quantize2_signed<T>(lo, s, r) | (quantize2_signed<T>(hi, s, r) << 16);
  };
  return make_uint2(four(v.x, v.y), four(v.z, v.w));
}

// A CTA per row; thread t holds vectors t, t + blockDim, ... (kHeld of them).
template <typename T>
__global__ void __launch_bounds__(kMaxThreads) silu_mul_fp8_rows_kernel(const T* __restrict__ gate,
                                                                         const T* __restrict__ up,
                                                                         uint8_t* __restrict__ xq,
                                                                         float* __restrict__ xs, int64_t n) {
  __shared__ float warp_max[kMaxThreads / 32];
  const int64_t row = blockIdx.x, nvec = n / 8;
  const uint4* g = reinterpret_cast<const uint4*>(gate + row * n);
  const uint4* u = reinterpret_cast<const uint4*>(up + row * n);
  uint2* q = reinterpret_cast<uint2*>(xq + row * n);
  uint4 h[kHeld];
  // every load first, then the math (interleaved, each load is waited for in turn)
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < nvec) h[k] = g[i];
  }
  uint4 uv[kHeld];
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < nvec) uv[k] = u[i];
  }
  float a = 0.f;
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    if (threadIdx.x + int64_t(k) * blockDim.x < nvec) {
      h[k] = silu_mul8<T>(h[k], uv[k]);
      a = absmax8<T>(h[k], a);
    }
  }
  for (int64_t i = threadIdx.x + int64_t(kHeld) * blockDim.x; i < nvec; i += blockDim.x)
    a = absmax8<T>(silu_mul8<T>(g[i], u[i]), a);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) a = amax2<true>(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_max[warp] = a;
  __syncthreads();
  a = warp_max[0];
  for (int w = 1; w < warps; ++w) a = amax2<true>(a, warp_max[w]);
  // a row of zeros: s = 0 and every quotient NaN, as eager's 0 / 0
  const float s = row_scale<T>(a), r = __frcp_rn(s);
  if (threadIdx.x == 0) xs[row] = s;
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < nvec) q[i] = quantize8_e4m3<T>(h[k], s, r);
  }
  for (int64_t i = threadIdx.x + int64_t(kHeld) * blockDim.x; i < nvec; i += blockDim.x)
    q[i] = quantize8_e4m3<T>(silu_mul8<T>(g[i], u[i]), s, r);
}

std::tuple<at::Tensor, at::Tensor> silu_mul_fp8_rows_cuda(const at::Tensor& gate, const at::Tensor& up) {
  FK_CHECK_CUDA(gate);
  FK_CHECK_SAME(gate, up);
  TORCH_CHECK(gate.scalar_type() == at::kHalf || gate.scalar_type() == at::kBFloat16,
              "fusekit: silu_mul_fp8_rows: gate and up must be float16 or bfloat16; got ", describe(gate));
  TORCH_CHECK(gate.dim() >= 1 && gate.is_contiguous() && up.is_contiguous() && aligned16(gate.data_ptr()) &&
                  aligned16(up.data_ptr()),
              "fusekit: silu_mul_fp8_rows: gate and up must be contiguous and 16-byte aligned; got gate ",
              describe(gate), ", up ", describe(up));
  const int64_t n = gate.size(-1);
  TORCH_CHECK(n > 0 && n % 8 == 0, "fusekit: silu_mul_fp8_rows: the last dimension must be a positive multiple of 8; got ",
              describe(gate));
  const int64_t rows = gate.numel() / n;
  TORCH_CHECK(rows <= INT32_MAX, "fusekit: silu_mul_fp8_rows: too many rows; got ", describe(gate));
  c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor xq = at::empty(gate.sizes(), gate.options().dtype(at::kFloat8_e4m3fn));
  std::vector<int64_t> ssize(gate.sizes().begin(), gate.sizes().end());
  ssize.back() = 1;
  at::Tensor s = at::empty(ssize, gate.options().dtype(at::kFloat));
  if (rows == 0) return {xq, s};
  // as few threads as hold the row in kHeld vectors each (a warp at least)
  const int64_t nvec = n / 8;
  const int threads = int(std::min<int64_t>(kMaxThreads, ((nvec + kHeld - 1) / kHeld + 31) / 32 * 32));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto* qp = reinterpret_cast<uint8_t*>(xq.data_ptr());
  if (gate.scalar_type() == at::kBFloat16) {
    silu_mul_fp8_rows_kernel<__nv_bfloat16><<<unsigned(rows), threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(gate.data_ptr()), static_cast<const __nv_bfloat16*>(up.data_ptr()), qp,
        s.data_ptr<float>(), n);
  } else {
    silu_mul_fp8_rows_kernel<__half><<<unsigned(rows), threads, 0, stream>>>(
        static_cast<const __half*>(gate.data_ptr()), static_cast<const __half*>(up.data_ptr()), qp,
        s.data_ptr<float>(), n);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {xq, s};
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("silu_mul_fp8_rows", &fusekit::silu_mul_fp8_rows_cuda); }
