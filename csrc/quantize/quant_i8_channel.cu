// fusekit::quant_i8_channel -- per-channel INT8: one fp32 scale and zero point per column ([N]) or per
// row ([M, 1]), bit-exact with eager CUDA.
//
//   def quant_i8_channel_ref(x: Tensor, scale: Tensor, zp: Tensor, qmin: int = -128,
//                            qmax: int = 127) -> Tensor:
//       return torch.clamp(torch.round(x / scale + zp), qmin, qmax).to(torch.int8)
//
// Contract: x [M, N] CUDA, contiguous, float32/float16/bfloat16; scale and zp float32, contiguous, both
// [N] or both [M, 1]. x / scale promotes to float32 (a true division), then + zp, round half to even.
#include <ATen/Dispatch.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "quant_round.cuh"  // round_to_i8, round_bits, pack_low_bytes
#include "checks.h"
#include "fast_math.cuh"  // div_rn_recip, div_rn_by, div_rn_divisor_ok
#include "launch.cuh"     // kThreads, blocks_for
#include "vec.cuh"        // Vec, Held

namespace fusekit {
namespace {

// q = x / s (rounded as eager's true division) -> + z -> round half to even -> clamp -> int8. The rounding
// is quant_round.cuh's round_to_i8: rintf and a float -> int cast (FRND + F2I per element, both on the
// conversion pipe) hold the 16-bit kernels at ~70% of copy bandwidth.
__device__ __forceinline__ int8_t quant_one(float v, float s, float z, float qmin, float qmax) {
  return round_to_i8(__fadd_rn(__fdiv_rn(v, s), z), qmin, qmax);
}

// A vector whose fast path does not apply (x beyond 2^60, inf, NaN; a scale out of range; a NaN zero point):
// eager's division per element. Out of line, as in rowquant.cuh: joined with the fast path, its packed word
// is taken apart into bytes (an AND and a PRMT per byte) and qmin/qmax are reloaded per element.
template <int V, int NS>
__device__ __noinline__ void quant_vec_exact(Vec<float, V> xf, Vec<float, NS> s, Vec<float, NS> z, float qmin,
                                             float qmax, Vec<int8_t, V>* dst) {
  Vec<int8_t, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) o.v[j] = quant_one(xf.v[j], s.v[NS == 1 ? 0 : j], z.v[NS == 1 ? 0 : j], qmin, qmax);
  *dst = o;
}

// One vector of V inputs (already float) against NS = V (per column) or NS = 1 (per row) scales, stored to
// dst. Fast path: the divisor's work once per scale (div_rn_recip; s_ok: every |s| in [2^-60, 2^60] and no
// zero point NaN), and every |x| <= 2^60 (false for inf and NaN). Then q is eager's correctly rounded x / s,
// except where |x| < 2^-102 (the correction's residual is subnormal): there |q| < 2^-42 either way, and the
// int8 is round(z) or 0 for both (q is below half an ulp of any z >= 2^-18; else |q + z| < 2^-17). So no
// lower bound on |x| is needed. With x, s and z free of NaN, t = q + z is never NaN,
// and the rounding skips round_to_i8's NaN test; an infinite t clamps as eager's does.
template <int V, int NS>
__device__ __forceinline__ void quant_vec(const float (&xf)[V], const Vec<float, NS>& s, const float (&r)[NS],
                                          const Vec<float, NS>& z, bool s_ok, float qmin, float qmax,
                                          Vec<int8_t, V>* dst) {
  bool ok = s_ok;
#pragma unroll
  for (int j = 0; j < V; ++j) ok &= fabsf(xf[j]) <= 0x1p60f;
  if (ok) {
    uint32_t b[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int k = NS == 1 ? 0 : j;
      const float t = __fadd_rn(div_rn_by(xf[j], s.v[k], r[k]), z.v[k]);
      b[j] = round_bits(fminf(fmaxf(t, qmin), qmax));
    }
    if constexpr (V % 4 == 0) {
      uint32_t w[V / 4];
#pragma unroll
      for (int j = 0; j < V; j += 4) w[j / 4] = pack_low_bytes(b[j], b[j + 1], b[j + 2], b[j + 3]);
      *reinterpret_cast<Vec<uint32_t, V / 4>*>(dst) = *reinterpret_cast<const Vec<uint32_t, V / 4>*>(w);
    } else {
      Vec<int8_t, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = static_cast<int8_t>(b[j] & 0xffu);
      *dst = o;
    }
    return;
  }
  Vec<float, V> xv;
#pragma unroll
  for (int j = 0; j < V; ++j) xv.v[j] = xf[j];
  quant_vec_exact<V, NS>(xv, s, z, qmin, qmax, dst);
}

// Vector path (cols % V == 0, aligned): a thread owns one column vector (V columns) in R consecutive rows:
// the per-column scale and zp vectors are loaded once for R rows, the row/column split is one 32-bit
// multiply-shift per thread (IntDivider), and all R loads are issued before any math. One vector per thread,
// with a 64-bit division or modulo per vector and scale/zp reloaded per vector, runs at 67-89% of copy
// bandwidth. Blocks of 64 threads: at 20M elements on an H200 (7 interleaved rounds; copy of the same bytes
// 0.0190 ms), 256 -> 128 -> 64 threads: per column fp16 0.0205 -> 0.0204 -> 0.0202 ms, bf16 0.0208 -> 0.0206
// -> 0.0204; per row fp16 0.0202 -> 0.0202 -> 0.0197, bf16 0.0201 -> 0.0201 -> 0.0196; fp32 0.0297-0.0299 in
// all three. 6 or 8 rows per thread are slower (per column bf16 0.0205 and 0.0216 ms with 128 threads).
constexpr int kChannelRows = 4;
constexpr int kChannelThreads = 64;

// TH threads per block, R rows per thread: template parameters so that other launch shapes of this very
// kernel can be timed; the op launches the defaults.
template <typename T, int V, bool PER_ROW, int TH = kChannelThreads, int R = kChannelRows>
__global__ void __launch_bounds__(TH) quant_channel_kernel(const T* __restrict__ x, const float* __restrict__ scale,
                                                           const float* __restrict__ zp, int8_t* __restrict__ q,
                                                           int64_t rows, int64_t vcols,
                                                           at::cuda::detail::IntDivider<unsigned> vdiv,
                                                           float qmin, float qmax) {
  const auto dm = vdiv.divmod(blockIdx.x * TH + threadIdx.x);  // < 2^32 threads (host checks)
  const int64_t cv = dm.mod, r0 = int64_t(dm.div) * R;
  if (r0 >= rows) return;
  Held<T, V> h[R];
#pragma unroll
  for (int u = 0; u < R; ++u)
    if (r0 + u < rows) h[u].load(x, (r0 + u) * vcols + cv);
  // each row's vector through quant(u, xf, dst)
  auto store_rows = [&](auto&& quant) {
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (r0 + u < rows) {
        float xf[V];
#pragma unroll
        for (int j = 0; j < V; ++j) xf[j] = static_cast<float>(h[u].elem(j));
        quant(u, xf, reinterpret_cast<Vec<int8_t, V>*>(q) + (r0 + u) * vcols + cv);
      }
    }
  };
  if constexpr (PER_ROW) {
    Vec<float, 1> s[R], z[R];
    float r[R][1];
    bool s_ok[R];
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (r0 + u < rows) {
        s[u].v[0] = scale[r0 + u], z[u].v[0] = zp[r0 + u];
        r[u][0] = div_rn_recip(s[u].v[0]);
        s_ok[u] = div_rn_divisor_ok(s[u].v[0]) && !isnan(z[u].v[0]);
      }
    }
    store_rows([&](int u, const float (&xf)[V], Vec<int8_t, V>* dst) {
      quant_vec<V, 1>(xf, s[u], r[u], z[u], s_ok[u], qmin, qmax, dst);
    });
  } else {
    const Vec<float, V> sv = reinterpret_cast<const Vec<float, V>*>(scale)[cv];
    const Vec<float, V> zv = reinterpret_cast<const Vec<float, V>*>(zp)[cv];
    float r[V];
    bool s_ok = true;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      r[j] = div_rn_recip(sv.v[j]);
      s_ok &= div_rn_divisor_ok(sv.v[j]) && !isnan(zv.v[j]);
    }
    store_rows([&](int, const float (&xf)[V], Vec<int8_t, V>* dst) {
      quant_vec<V, V>(xf, sv, r, zv, s_ok, qmin, qmax, dst);
    });
  }
}

// Any shape and alignment: one element per step.
template <typename T, bool PER_ROW>
__global__ void __launch_bounds__(kThreads) quant_channel_scalar_kernel(const T* __restrict__ x, const float* __restrict__ scale,
                                                                        const float* __restrict__ zp, int8_t* __restrict__ q,
                                                                        int64_t n, int64_t cols, float qmin, float qmax) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t c = PER_ROW ? e / cols : e % cols;
    q[e] = quant_one(static_cast<float>(x[e]), scale[c], zp[c], qmin, qmax);
  }
}

at::Tensor quant_i8_channel_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zp,
                                 int64_t qmin, int64_t qmax) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  TORCH_CHECK(x.dim() == 2, "fusekit: quant_i8_channel needs x [M, N], got ", describe(x));
  TORCH_CHECK(scale.scalar_type() == at::kFloat && zp.scalar_type() == at::kFloat && scale.device() == x.device() &&
                  zp.device() == x.device() && scale.is_contiguous() && zp.is_contiguous(),
              "fusekit: scale and zp must be contiguous float32 on x's device; got ", describe(scale), ", ",
              describe(zp));
  const bool per_row = scale.dim() == 2;
  const bool ok = per_row ? (scale.size(0) == x.size(0) && scale.size(1) == 1)
                          : (scale.dim() == 1 && scale.size(0) == x.size(1));
  TORCH_CHECK(ok && scale.sizes() == zp.sizes(), "fusekit: scale/zp must both be [N] or [M, 1] for x ",
              describe(x), "; got ", describe(scale), ", ", describe(zp));
  TORCH_CHECK(-128 <= qmin && qmin <= qmax && qmax <= 127, "fusekit: need -128 <= qmin <= qmax <= 127");
  c10::cuda::CUDAGuard guard(x.device());
  auto q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  const int64_t n = x.numel();
  if (n == 0) return q;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "quant_i8_channel", [&] {
    constexpr int V = 16 / sizeof(scalar_t);
    const int64_t cols = x.size(1);
    auto* xp = x.data_ptr<scalar_t>();
    auto *sp = scale.data_ptr<float>(), *zpp = zp.data_ptr<float>();
    auto* qp = q.data_ptr<int8_t>();
    const int64_t rows = x.size(0), vcols = cols / V;
    const int64_t threads = vcols * ((rows + kChannelRows - 1) / kChannelRows);
    const int64_t blocks = (threads + kChannelThreads - 1) / kChannelThreads;
    const bool vec = cols % V == 0 && aligned16(xp) && reinterpret_cast<uintptr_t>(sp) % (4 * V) == 0 &&
                     reinterpret_cast<uintptr_t>(zpp) % (4 * V) == 0 && blocks * kChannelThreads <= UINT32_MAX;
    const float lo = float(qmin), hi = float(qmax);
    const at::cuda::detail::IntDivider<unsigned> vdiv(vec ? static_cast<unsigned>(vcols) : 1u);
    if (vec && per_row)
      quant_channel_kernel<scalar_t, V, true><<<static_cast<unsigned>(blocks), kChannelThreads, 0, stream>>>(xp, sp, zpp, qp, rows, vcols, vdiv, lo, hi);
    else if (vec)
      quant_channel_kernel<scalar_t, V, false><<<static_cast<unsigned>(blocks), kChannelThreads, 0, stream>>>(xp, sp, zpp, qp, rows, vcols, vdiv, lo, hi);
    else if (per_row)
      quant_channel_scalar_kernel<scalar_t, true><<<blocks_for(n), kThreads, 0, stream>>>(xp, sp, zpp, qp, n, cols, lo, hi);
    else
      quant_channel_scalar_kernel<scalar_t, false><<<blocks_for(n), kThreads, 0, stream>>>(xp, sp, zpp, qp, n, cols, lo, hi);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return q;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("quant_i8_channel", &fusekit::quant_i8_channel_cuda); }
