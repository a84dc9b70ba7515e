// One-pass dynamic per-row (per-token) quantization: each block owns one row, keeps it in registers,
// reduces |x| to the row's absmax, writes the fp32 scale and the quantized row. x is read from HBM once.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <tuple>

#include "checks.h"  // FK_CHECK_*, aligned16
#include "vec.cuh"   // Vec, Held, to_floats

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

// Running |x| maximum of one vector. Half and bfloat16 use packed abs/max (two elements an instruction,
// exact: the maximum is one of the inputs); NaN is tracked separately because fmaxf drops it.
template <typename T, int V>
__device__ __forceinline__ void absmax_update(const Vec<T, V>& v, float& amax, bool& has_nan) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float a = fabsf(static_cast<float>(v.v[j]));
    has_nan |= isnan(a);
    amax = fmaxf(amax, a);
  }
}
template <typename P, typename T, int V>
__device__ __forceinline__ void absmax_packed(const Vec<T, V>& v, float& amax, bool& has_nan) {
  const P* h = reinterpret_cast<const P*>(v.v);
  P m = __habs2(h[0]);
#pragma unroll
  for (int j = 1; j < V / 2; ++j) m = __hmax2_nan(m, __habs2(h[j]));
  const float lo = __low2float(m), hi = __high2float(m);
  has_nan |= isnan(lo) || isnan(hi);
  amax = fmaxf(amax, fmaxf(lo, hi));
}
template <int V>
__device__ __forceinline__ void absmax_update(const Vec<c10::Half, V>& v, float& amax, bool& has_nan) {
  if constexpr (V % 2 == 0) absmax_packed<__half2>(v, amax, has_nan);
  else absmax_update<c10::Half, V>(v, amax, has_nan);
}
template <int V>
__device__ __forceinline__ void absmax_update(const Vec<c10::BFloat16, V>& v, float& amax, bool& has_nan) {
  if constexpr (V % 2 == 0) absmax_packed<__nv_bfloat162>(v, amax, has_nan);
  else absmax_update<c10::BFloat16, V>(v, amax, has_nan);
}
// What a thread holds (vec.cuh's Held): bf16 as 32-bit words, as in the elementwise engine, where holding
// 16-bit elements makes each load wait to be unpacked (PRMT). Here the two are within noise (dyn_quant_i8
// bf16: 87 / 86% of copy bandwidth held as elements, 89 / 86% as words, at 20M / 50M elements).
template <typename T, int V>
__device__ __forceinline__ void absmax_update(const Held<T, V>& h, float& amax, bool& has_nan) {
  absmax_update(h.x, amax, has_nan);
}
template <int V>
__device__ __forceinline__ void absmax_update(const Held<c10::BFloat16, V>& h, float& amax, bool& has_nan) {
  if constexpr (V % 2 == 0) {
    __nv_bfloat162 m, w;
    memcpy(&m, &h.w.v[0], 4);
    m = __habs2(m);
#pragma unroll
    for (int j = 1; j < V / 2; ++j) {
      memcpy(&w, &h.w.v[j], 4);
      m = __hmax2_nan(m, __habs2(w));
    }
    uint32_t u;
    memcpy(&u, &m, 4);
    const float lo = __uint_as_float(u << 16), hi = __uint_as_float(u & 0xffff0000u);
    has_nan |= isnan(lo) || isnan(hi);
    amax = fmaxf(amax, fmaxf(lo, hi));
  } else {
    absmax_update(h.x, amax, has_nan);
  }
}

// Q quantizes x / s into Q::Out (Q::kMax: the format's largest magnitude, 127 or 448):
//   Q::quotient(t)                  eager's value from its quotient t = x / s (clamp, round, convert);
//   Q::one(t)                       the value of t = x * r for |t| <= kMax * (1 + 2^-19) (no clamp needed);
//   Q::bracket(x[V], rlo, rhi, w)   V % 4 == 0: the V values of x * rlo and of x * rhi, packed four to a
//                                   32-bit word w (from x * rhi); false when the two ends differ anywhere;
//   Q::pack(t[V], w)                V % 4 == 0: the V values of eager quotients t, four to a word.
// NOTE (exact and fast): x / s lies between x * rlo and x * rhi (rlo, rhi = 1/s -+ 2^-20 relative, wider
// than every rounding error in play), and rounding is monotone, so where both ends give one value, eager's
// rounded x / s gives it too. That costs two FMAs per element instead of a division, on which the fp16
// kernel is issue-bound (0.072 ms with the division, 0.054 ms bracketed, at [16384, 4096] on an H200; copy
// floor 0.049 ms).
// The exact-row kernel's 16-bit rows skip the bracket: div_by_recip below gives eager's quotient itself
// in five FP instructions, with no vectors left undecided (ExactRow::kQuotient).

// eager's x / s (div.rn.f32) without a division, for a finite s >= 2^-60 and r = 1/s correctly rounded:
// x * r and two FMA corrections, the steps div.rn.f32 itself takes after its reciprocal (Markstein: with r
// within half an ulp of 1/s and q within an ulp of x / s, fma(r, x - s * q, q) is the rounded quotient;
// the first correction brings q within the ulp). The s bound keeps the residuals out of the subnormals
// wherever |x / s| >= 2^-11, the smallest quotient whose rounding can matter (e4m3's half-subnormal).
// The FMAs turn x = -0 into +0; eager keeps the sign (e4m3 0x80), hence the copysign.
__device__ __forceinline__ float div_by_recip(float x, float s, float r) {
  float q = x * r;
  q = fmaf(r, fmaf(-s, q, x), q);
  q = fmaf(r, fmaf(-s, q, x), q);
  return copysignf(q, x);
}
constexpr float kMinBracketScale = 0x1p-60f;

// The rare vector whose bracket does not decide: some x / s at or next to a rounding boundary (an exact tie
// in ~2% of the vectors of a randn bf16 row, 0.2% in fp16, whose 11-bit mantissas meet ties less often).
// Out of line: joined with the fast path, the fast path's packed words are taken apart into bytes to meet
// these byte stores (~10 extra integer ops and a local-memory spill per vector in the SASS).
template <typename Q, int V>
__device__ __noinline__ void quantize_near_tie(Vec<float, V> xf, typename Q::Out* dst, float s, float r) {
  Vec<typename Q::Out, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) o.v[j] = Q::quotient(div_by_recip(xf.v[j], s, r));
  *reinterpret_cast<Vec<typename Q::Out, V>*>(dst) = o;
}
// Rows with a NaN/inf scale or one below kMinBracketScale, and the general kernel's undecided vectors:
// eager's division per element.
template <typename Q, int V>
__device__ __noinline__ void quantize_exact(Vec<float, V> xf, typename Q::Out* dst, float s) {
  Vec<typename Q::Out, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) o.v[j] = Q::quotient(__fdiv_rn(xf.v[j], s));
  *reinterpret_cast<Vec<typename Q::Out, V>*>(dst) = o;
}

// kNearTie: undecided vectors take quantize_near_tie, else quantize_exact. Only the exact-row kernel takes
// the former: in the general kernel, a second out-of-line callee raises registers from 48 to 56-62 (4
// blocks per SM instead of 5; fp32 rows of 4096 at 20M elements on an H200: 0.0331 ms instead of 0.0306), and
// one callee doing either is no faster than the division alone in the exact-row kernel.
// kQuotient (V % 4 == 0): no bracket; every element's quotient by div_by_recip, packed by Q::pack (rows
// with a NaN/inf or tiny scale still take quantize_exact).
template <typename T, typename Q, bool kNearTie, int V, bool kQuotient = false>
__device__ __forceinline__ void quantize_vec(const Held<T, V>& v, typename Q::Out* dst, bool fast, float s,
                                             float r, float rlo, float rhi) {
  Vec<float, V> xf;
  to_floats(v, xf.v);
  if constexpr (kQuotient) {
    if (fast) {
      Vec<uint32_t, V / 4> w;
#pragma unroll
      for (int j = 0; j < V; ++j) xf.v[j] = div_by_recip(xf.v[j], s, r);
      Q::pack(xf.v, w.v);
      *reinterpret_cast<Vec<uint32_t, V / 4>*>(dst) = w;
      return;
    }
  } else if (fast) {
    if constexpr (V % 4 == 0) {
      Vec<uint32_t, V / 4> w;
      if (Q::bracket(xf.v, rlo, rhi, w.v)) {
        *reinterpret_cast<Vec<uint32_t, V / 4>*>(dst) = w;
        return;
      }
    } else {  // V = 1, 2 (odd rows, unaligned x, fp64)
      Vec<typename Q::Out, V> o;
      bool same = true;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        o.v[j] = Q::one(xf.v[j] * rhi);
        same &= o.v[j] == Q::one(xf.v[j] * rlo);
      }
      if (same) {
        *reinterpret_cast<Vec<typename Q::Out, V>*>(dst) = o;
        return;
      }
    }
    if constexpr (kNearTie) {
      quantize_near_tie<Q, V>(xf, dst, s, r);
      return;
    }
  }
  quantize_exact<Q, V>(xf, dst, s);
}

// Block per row: any row length. The first kRowVecs vectors per thread stay in registers between the
// absmax and the quantization; longer rows read the rest again (from L2).
template <typename T, int V, typename Q>
__global__ void __launch_bounds__(kRowThreads) rowquant_kernel(const T* __restrict__ x, typename Q::Out* __restrict__ q,
                                                               float* __restrict__ scales, int64_t cols, float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  typename Q::Out* qr = q + row * cols;
  const int64_t nvec = cols / V;
  Held<T, V> held[kRowVecs];
  float amax = 0.f;
  bool has_nan = false;
  // all loads first, then the math: interleaved, the compiler waits for each load in turn (0.065 ms
  // instead of 0.054 at [16384, 4096] fp16 on an H200)
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < nvec) held[k].load(xr, i);
  }
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) {
    if (threadIdx.x + int64_t(k) * blockDim.x < nvec) absmax_update(held[k], amax, has_nan);
  }
  for (int64_t i = threadIdx.x + int64_t(kRowVecs) * blockDim.x; i < nvec; i += blockDim.x) {
    Held<T, V> h;
    h.load(xr, i);
    absmax_update(h, amax, has_nan);
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
  if (threadIdx.x == 0) scales[row] = s;
  // The bracket and div_by_recip need a finite s >= 2^-60 (then |x / s| <= kMax * (1 + 2^-22)); NaN/inf
  // rows and a tinier s (eps below ~1e-16 in a direct call) take eager's division for the whole row.
  const bool fast = isfinite(s) && s >= kMinBracketScale;
  const float r = 1.0f / s, rlo = r * (1.0f - 0x1p-20f), rhi = r * (1.0f + 0x1p-20f);
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < nvec) quantize_vec<T, Q, false>(held[k], qr + i * V, fast, s, r, rlo, rhi);
  }
  for (int64_t i = threadIdx.x + int64_t(kRowVecs) * blockDim.x; i < nvec; i += blockDim.x) {
    Held<T, V> h;
    h.load(xr, i);
    quantize_vec<T, Q, false>(h, qr + i * V, fast, s, r, rlo, rhi);
  }
  for (int64_t i = nvec * V + threadIdx.x; i < cols; i += blockDim.x) {
    Held<T, 1> h;
    h.load(xr, i);
    quantize_vec<T, Q, false>(h, qr + i, fast, s, r, rlo, rhi);
  }
}

// Rows of exactly kTH * kRowVecs vectors (4096 elements: 16-bit in 128 threads, fp32 in 256; ExactRow): the
// kernel above without bounds checks or remainder loops, with at least kMinBlocks blocks per SM. On an H200 at
// 20M elements, general kernel -> this one, both on the bracket (copy 0.0192 ms): INT8 fp16 0.0225 -> 0.0209
// ms, bf16 0.0228 -> 0.0215; e4m3 fp16 0.0212 -> 0.0212, bf16 0.0223 -> 0.0217; at 50M 0-7% faster; fp32 (256
// threads, >= 5 blocks) 0.0302-0.0303 -> 0.0300-0.0301 (copy 0.0283). A separate kernel: folded into one
// template with the general kernel, it changes the general kernel's SASS. kMinBlocks and kQuotient are
// template parameters so that other choices of this very kernel can be timed; the op launches ExactRow's.
template <typename T, int V, typename Q, int kTH, int kMinBlocks = 10, bool kQuotient = false>
__global__ void __launch_bounds__(kTH, kMinBlocks) rowquant_exact_kernel(const T* __restrict__ x,
                                                                         typename Q::Out* __restrict__ q,
                                                                         float* __restrict__ scales, float eps) {
  constexpr int64_t cols = int64_t(kTH) * kRowVecs * V;
  const T* xr = x + blockIdx.x * cols;
  typename Q::Out* qr = q + blockIdx.x * cols;
  Held<T, V> held[kRowVecs];
  float amax = 0.f;
  bool has_nan = false;
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) held[k].load(xr, threadIdx.x + k * kTH);
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) absmax_update(held[k], amax, has_nan);
  // The scale step repeats rowquant_kernel's on purpose: a shared helper slows the general kernel.
  const bool any_nan = __syncthreads_or(has_nan);
  amax = block_max(amax);
  if (any_nan) amax = __int_as_float(0x7fffffff);
  const float s = (isnan(amax) ? amax : fmaxf(amax, eps)) * (1.0f / Q::kMax);  // as rowquant_kernel
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
  const bool fast = isfinite(s) && s >= kMinBracketScale;
  const float r = 1.0f / s, rlo = r * (1.0f - 0x1p-20f), rhi = r * (1.0f + 0x1p-20f);
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) {
    const int i = threadIdx.x + k * kTH;
    quantize_vec<T, Q, true, V, kQuotient>(held[k], qr + int64_t(i) * V, fast, s, r, rlo, rhi);
  }
}

// The exact-row launch by element size: threads per block and the launch bound's minimum blocks per SM.
// kQuotient: 16-bit rows quantize every element from div_by_recip's quotient, no bracket. On an H200 at 20M
// elements (copy 0.0190 ms), bracket -> quotient: INT8 fp16 0.0203 -> 0.0201 ms, bf16 0.0206 -> 0.0200; e4m3
// fp16 0.0205 -> 0.0199, bf16 0.0212 -> 0.0200 (the bracket's near-tie calls: 2-3% of bf16 vectors); fp32
// 0.0300-0.0301 -> 0.0302, so fp32 stays on the bracket.
template <typename T>
struct ExactRow {
  static constexpr int kThreads = sizeof(T) == 2 ? 128 : 256;
  static constexpr int kMinBlocks = sizeof(T) == 2 ? 10 : 5;  // a 48-register cap either way (42-46 used)
  static constexpr bool kQuotient = sizeof(T) == 2;
};

// x: [..., cols] contiguous; q: same shape; scales: [rows] fp32.
// NOTE (measured on an H200): a row per block with as few threads as hold the row in kRowVecs vectors
// each (128 threads for 4096 halfs) is faster than 64 x 8 and 512 x 1, two rows per block, a warp-per-row
// kernel (registers cap it at 2 blocks per SM) and a persistent 3-stage cp.async pipeline (per-row latency
// chain).
template <typename T, typename Q>
void launch_rowquant(const T* x, typename Q::Out* q, float* scales, int64_t rows, int64_t cols, float eps) {
  if (rows == 0) return;
  constexpr int V = 16 / sizeof(T);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK(rows <= INT32_MAX, "fusekit: too many rows");
  const bool vec = cols % V == 0 && aligned16(x);
  const int64_t units = vec ? cols / V : cols;
  int threads = 32;
  while (threads < kRowThreads && int64_t(threads) * kRowVecs < units) threads *= 2;
  if constexpr (sizeof(T) <= 4) {  // rows of 4096: 16-bit in 128 threads, fp32 in 256 (ExactRow)
    constexpr int kTH = ExactRow<T>::kThreads;
    if (vec && units == kTH * kRowVecs) {
      rowquant_exact_kernel<T, V, Q, kTH, ExactRow<T>::kMinBlocks, ExactRow<T>::kQuotient>
          <<<rows, kTH, 0, stream>>>(x, q, scales, eps);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  if (vec) {
    rowquant_kernel<T, V, Q><<<rows, threads, 0, stream>>>(x, q, scales, cols, eps);
  } else {
    rowquant_kernel<T, 1, Q><<<rows, threads, 0, stream>>>(x, q, scales, cols, eps);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The host side of a dynamic per-row quantizer: checks, outputs (q in `qdtype`, fp32 scales [..., 1]).
template <typename Q>
std::tuple<at::Tensor, at::Tensor> dyn_quant(const at::Tensor& x, double eps, at::ScalarType qdtype) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  TORCH_CHECK(x.dim() >= 1, "fusekit: dynamic quantization needs x with at least one dimension");
  c10::cuda::CUDAGuard guard(x.device());
  auto q = at::empty(x.sizes(), x.options().dtype(qdtype));
  auto sizes = x.sizes().vec();
  sizes.back() = 1;
  auto s = at::empty(sizes, x.options().dtype(at::kFloat));
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dyn_quant", [&] {
    launch_rowquant<scalar_t, Q>(x.data_ptr<scalar_t>(), reinterpret_cast<typename Q::Out*>(q.data_ptr()),
                                 s.data_ptr<float>(), rows, cols, static_cast<float>(eps));
  });
  return {q, s};
}

}  // namespace fusekit
