// fusekit::decode_linear_w8a8 -- an int8 x int8 linear at a decode step's few rows, both scales in its epilogue:
// torchao's Int8DynamicActivationInt8WeightConfig after x's per-row quantization.
//
//   def decode_linear_w8a8_ref(xq, xs, w, ws, dtype, out_dtype=None):
//       rows = xq.reshape(-1, xq.shape[-1])
//       y = (torch._int_mm(rows, w.t()) * xs.reshape(-1, 1).expand(rows.shape[0], w.shape[0])).to(dtype)
//       y = (y * ws.flatten()).reshape(xq.shape[:-1] + w.shape[:1])
//       return y.to(out_dtype or dtype)
//
// Inductor runs that as aten._int_mm (cuBLAS, which refuses 16 rows or fewer) and a kernel for the scales, which
// reads the int32 products back. Here the weight is read once, the products summed exactly in int32 on tensor
// cores, and both roundings of torchao's epilogue are done in registers: the output equals eager's to the bit.
//
// Contract: xq [..., K] (M rows) int8, contiguous, 16-byte aligned, K a multiple of 16; xs M float32 row scales,
// contiguous (any shape: [..., 1]); w [N, K] int8, contiguous, 16-byte aligned; ws N float32 scales, contiguous
// ([N, 1] or [N]); dtype float16 or bfloat16; out_dtype None or float32 (the product times ws unrounded: the
// graph torch 2.11's pointless_convert leaves where an upcast consumer, SiLU, follows). Returns [..., N] of
// out_dtype or dtype. Runs on the current stream, no workspace; on sm_90+ launched with programmatic dependent
// launch.
//
// The CTA is decode_linear_w8's: 8 warps, 8 NB output columns, all of K, 16 MT rows. A lane loads 16 int8 of each
// of its NB weight rows (k [16t, 16t + 16) of a 64-wide chunk) and the same 16 k of its x rows; two m16n8k32 s8
// products take them, words 0-1 then words 2-3, the same k permutation for both operands (mma_chunk's argument).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "decode_gemm/decode_linear.cuh"
#include "decode_gemm/w8a8_args.h"
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace {

using decode_gemm::kWarps;
using decode_gemm::load_cached;
using decode_gemm::load_stream;

constexpr int kChunk8 = 64;  // k per chunk: 4 lanes x 16 int8

struct W8A8Params {
  const int8_t* xq;
  const float* xs;
  const int8_t* w;
  const float* ws;
  void* out;
  int m, n, k;
};

// HI: rows g + 8 of each 16-row tile exist (more than 8 rows), else only rows g are loaded. F32: the output is
// float32 (the last rounding to T skipped).
template <typename T, int MT, int NB, bool HI, bool F32>
__global__ void __launch_bounds__(kWarps * 32) decode_linear_w8a8_kernel(const W8A8Params p) {
  constexpr int H = HI ? 2 : 1;
  constexpr int U = MT == 1 ? 4 : 2;  // chunks in flight per lane
  constexpr int F = NB * MT * 4;      // accumulators per lane
  __shared__ int red[kWarps][F][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * 8 * NB, m0 = blockIdx.y * 16 * MT;
  const int chunks = (p.k + kChunk8 - 1) / kChunk8;
  pdl_wait();  // xq and xs, and the output: the kernels before (PDL)

  int acc[NB][MT][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[nb][i][c] = 0;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  for (int c0 = warp; c0 < chunks; c0 += kWarps * U) {
    uint4 a[U][MT][H], q[U][NB];  // x: [chunk][tile][row g | g + 8]; w: 16 int8 per column tile
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of U chunks first, then their products
      const int kk = (c0 + u * kWarps) * kChunk8 + t * 16;
      const bool kin = kk < p.k;  // K % 16 == 0: a lane's 16 elements all in or all out
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < H; ++h) {
          const int row = m0 + i * 16 + h * 8 + g;
          const bool ok = kin && row < p.m;
          a[u][i][h] = load_cached(ok ? p.xq + static_cast<int64_t>(row) * p.k + kk : p.xq);
          if (!ok) a[u][i][h] = zero;
        }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        const int col = n0 + nb * 8 + g;
        const bool ok = kin && col < p.n;
        q[u][nb] = load_stream(ok ? p.w + static_cast<int64_t>(col) * p.k + kk : p.w);
        if (!ok) q[u][nb] = zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const uint4& lo = a[u][i][0];
          const uint4& hi = HI ? a[u][i][H - 1] : zero;
          mma16832_s8(acc[nb][i], lo.x, hi.x, lo.y, hi.y, q[u][nb].x, q[u][nb].y);
          mma16832_s8(acc[nb][i], lo.z, hi.z, lo.w, hi.w, q[u][nb].z, q[u][nb].w);
        }
  }
  pdl_trigger();

  // the warps' int32 sums (exact in any order), then torchao's epilogue: * xs, round to T, * ws, round to T.
  // C fragment: c0, c1 row g, c2, c3 row g + 8, columns 2t, 2t + 1
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp][(nb * MT + i) * 4 + c][lane] = acc[nb][i][c];
  __syncthreads();
  for (int e = threadIdx.x; e < F * 32; e += kWarps * 32) {
    const int l = e % 32, f = e / 32, c = f % 4, i = f / 4 % MT, nb = f / (4 * MT);
    const int row = m0 + i * 16 + (l / 4) + (c / 2) * 8, col = n0 + nb * 8 + (l % 4) * 2 + c % 2;
    int s = 0;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) s += red[v][f][l];
    if (row < p.m && col < p.n) {
      const float y = __fmul_rn(to_float(from_float<T>(__fmul_rn(__int2float_rn(s), p.xs[row]))), p.ws[col]);
      const int64_t at = static_cast<int64_t>(row) * p.n + col;
      if constexpr (F32) {
        static_cast<float*>(p.out)[at] = y;
      } else {
        static_cast<T*>(p.out)[at] = from_float<T>(y);
      }
    }
  }
}

template <typename T, int MT, int NB, bool HI, bool F32>
void launch(const W8A8Params& p, cudaStream_t stream) {
  const dim3 grid((p.n + 8 * NB - 1) / (8 * NB), (p.m + 16 * MT - 1) / (16 * MT));
  static const int version = binary_version(decode_linear_w8a8_kernel<T, MT, NB, HI, F32>);
  launch_ex(decode_linear_w8a8_kernel<T, MT, NB, HI, F32>, grid, dim3(kWarps * 32), 0, stream,
            pdl_allowed(version, 'g'), 0, p);
}

template <typename T, bool F32>
void launch_rows(const W8A8Params& p, cudaStream_t stream) {
  if (p.m <= 8) return launch<T, 1, 2, false, F32>(p, stream);
  if (p.m <= 16) return launch<T, 1, 2, true, F32>(p, stream);
  if (p.m <= 32) return launch<T, 2, 2, true, F32>(p, stream);
  launch<T, 4, 1, true, F32>(p, stream);
}

at::Tensor decode_linear_w8a8_cuda(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& w,
                                   const at::Tensor& ws, at::ScalarType dtype,
                                   std::optional<at::ScalarType> out_dtype) {
  // rows: the launch's grid.y of 16-row tiles (decode_gemm::rows' limit); N under 2^30: the 8-column CTAs' grid.x
  const W8A8Shape a = check_w8a8_args("decode_linear_w8a8", xq, xs, w, ws, dtype, out_dtype, 65535 * 16, 1,
                                      int64_t{1} << 30);
  const int64_t m = a.m, k = a.k;
  const bool f32 = a.f32;
  c10::cuda::CUDAGuard guard(xq.device());
  std::vector<int64_t> shape(xq.sizes().begin(), xq.sizes().end());
  shape.back() = w.size(0);
  at::Tensor out = at::empty(shape, xq.options().dtype(f32 ? at::kFloat : dtype));
  if (out.numel() == 0) return out;
  W8A8Params p{xq.data_ptr<int8_t>(), xs.data_ptr<float>(), w.data_ptr<int8_t>(), ws.data_ptr<float>(),
               out.data_ptr(), static_cast<int>(m), static_cast<int>(w.size(0)), static_cast<int>(k)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_half_bf16(dtype, [&](auto tag) {
    using T = decltype(tag);
    f32 ? launch_rows<T, true>(p, stream) : launch_rows<T, false>(p, stream);
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_w8a8", &fusekit::decode_linear_w8a8_cuda); }
