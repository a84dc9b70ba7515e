// The 8-bit-weight decode linear shared by fusekit::decode_linear_w8 (int8 weight-only, torchao's
// Int8WeightOnlyConfig: the scale after the products) and fusekit::decode_linear_fp8_weight (float8 e4m3
// weight-only, Float8WeightOnlyConfig: each weight scaled and rounded to x's dtype before them). The 8-bit weight is
// read once and widened on chip, never written back to HBM as a 16-bit copy.
//
// At one row the e4m3 op runs the GEMV of decode_linear_w8_row.cuh. On sm_90a builds, at 9-64 rows and at 1-8 rows
// (int8: 1-8, e4m3: 2-8) with K >= 4096, the TMA kernel's W8 form runs (decode_linear_tma.cuh: x staged once per CTA,
// the weights widened into wgmma's A registers; launch_rows below says why not at fewer rows and a smaller K). This
// file's mma.sync kernel runs elsewhere.
// Its CTA is decode_linear_kernel's (decode_linear.cuh): 8 warps, 8 NB output columns, all of K, 16 MT rows. A lane
// loads 16 weights of each of its NB weight rows at once (k [16t, 16t + 16) of a 64-wide chunk) and the same 16 k of
// its x rows; widen16 (widen8.cuh) turns the weights into 16-bit operands; two m16n8k16 pairs take them (mma_chunk: x
// and w in the same k order).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "debug_overrides.h"  // FUSEKIT_DECODE_GEMM
#include "decode_gemm/decode_linear.cuh"
#include "decode_gemm/decode_linear_tma.cuh"  // launch_tma_w8
#include "decode_gemm/decode_linear_w8_row.cuh"  // launch_row
#include "decode_gemm/widen8.cuh"  // widen16
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace decode_w8 {

using decode_gemm::kWarps;
using decode_gemm::load_cached;
using decode_gemm::load_stream;
using decode_gemm::mma_chunk;

constexpr int kChunk8 = 64;  // k per chunk: 4 lanes x 16 int8

struct W8Params {
  const void* x;
  const void* w;       // int8 or float8_e4m3fn [N, K]
  const void* scales;  // int8: [N] of x's dtype, applied to the sums; fp8: [N] float32, applied to each weight
  void* out;
  int m, n, k;
};

// NB column tiles of 8 per CTA (a lane reads NB weight rows: more bytes in flight per CTA, x read once for them);
// HI: rows g + 8 of each 16-row tile exist (more than 8 rows), else only rows g are loaded. FP8: e4m3 weights, each
// scaled and rounded before the products (no scale after them).
template <typename T, int MT, int NB, bool HI, bool FP8>
__global__ void __launch_bounds__(kWarps * 32) decode_linear_w8_kernel(const W8Params p) {
  constexpr int H = HI ? 2 : 1;
  constexpr int U = MT == 1 ? 4 : MT == 2 ? 2 : 1;  // chunks in flight per lane (registers: x takes 4 H MT words each)
  constexpr int F = NB * MT * 4;                    // accumulators per lane
  __shared__ float red[kWarps][F][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * 8 * NB, m0 = blockIdx.y * 16 * MT;
  const int chunks = (p.k + kChunk8 - 1) / kChunk8;
  const T* x = static_cast<const T*>(p.x);
  const int8_t* wq = static_cast<const int8_t*>(p.w);
  float ws[NB];  // fp8: the scale of this lane's weight row in each column tile (the scales are not written by the
                 // kernels before: read ahead of the wait)
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    const int col = n0 + nb * 8 + g;
    ws[nb] = FP8 && col < p.n ? static_cast<const float*>(p.scales)[col] : 0.f;
  }
  pdl_wait();  // x, and the output: the kernels before (PDL)

  float acc[NB][MT][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[nb][i][c] = 0.f;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  for (int c0 = warp; c0 < chunks; c0 += kWarps * U) {
    uint4 a[U][MT][H][2], q[U][NB];  // x: [chunk][tile][row g | g + 8][k 0-7 | 8-15]; w: 16 int8 per column tile
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
          const T* xp = ok ? x + static_cast<int64_t>(row) * p.k + kk : x;
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            a[u][i][h][s] = load_cached(xp + (ok ? 8 * s : 0));
            if (!ok) a[u][i][h][s] = zero;
          }
        }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        const int col = n0 + nb * 8 + g;
        const bool ok = kin && col < p.n;
        q[u][nb] = load_stream(ok ? wq + static_cast<int64_t>(col) * p.k + kk : wq);
        if (!ok) q[u][nb] = zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        uint4 w0, w1;
        widen16<T, FP8>(q[u][nb], ws[nb], w0, w1);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          mma_chunk<T>(acc[nb][i], a[u][i][0][0], HI ? a[u][i][H - 1][0] : zero, w0);
          mma_chunk<T>(acc[nb][i], a[u][i][0][1], HI ? a[u][i][H - 1][1] : zero, w1);
        }
      }
  }
  pdl_trigger();

  // the warps' sums in warp order (deterministic), then the scale; C fragment: c0, c1 row g, c2, c3 row g + 8,
  // columns 2t, 2t + 1
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp][(nb * MT + i) * 4 + c][lane] = acc[nb][i][c];
  __syncthreads();
  T* out = static_cast<T*>(p.out);
  const T* scales = static_cast<const T*>(p.scales);
  for (int e = threadIdx.x; e < F * 32; e += kWarps * 32) {
    const int l = e % 32, f = e / 32, c = f % 4, i = f / 4 % MT, nb = f / (4 * MT);
    const int row = m0 + i * 16 + (l / 4) + (c / 2) * 8, col = n0 + nb * 8 + (l % 4) * 2 + c % 2;
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) s += red[v][f][l];
    if (row < p.m && col < p.n) {
      out[static_cast<int64_t>(row) * p.n + col] = from_float<T>(FP8 ? s : s * to_float(scales[col]));
    }
  }
}

template <typename T, int MT, int NB, bool HI, bool FP8>
void launch(const W8Params& p, cudaStream_t stream) {
  const dim3 grid((p.n + 8 * NB - 1) / (8 * NB), (p.m + 16 * MT - 1) / (16 * MT));
  static const int version = binary_version(decode_linear_w8_kernel<T, MT, NB, HI, FP8>);
  launch_ex(decode_linear_w8_kernel<T, MT, NB, HI, FP8>, grid, dim3(kWarps * 32), 0, stream,
            pdl_allowed(version, 'g'), 0, p);
}

// e4m3 at one row: the GEMV (decode_linear_w8_row.cuh); FUSEKIT_DECODE_GEMM=row takes it at every row count, for
// both. int8 keeps the kernels below at one row: the GEMV was faster alone (H100, cold weights, o 4.0 against the
// mma.sync kernel's 4.5 us, down 6.6 against 10.8) but the int8 weight-only b1 step was slower with it (0.626 against
// 0.552 ms, H100, torch 2.11, 2026-12-07; TRIED.md).
// sm_90a builds, N a multiple of 8, 9-64 rows or 1-8 rows with K >= 4096: the TMA kernel's W8 form
// (decode_linear_tma.cuh); FUSEKIT_DECODE_GEMM=tma takes it at every 1-64 rows, =old never. H200, e4m3, Llama-style,
// op alone, cold weights, us, this kernel -> TMA (2026-12-03): 32 rows o 8.0 -> 5.6, gate 14.8 -> 8.7, down 19.1 ->
// 10.7; 1 row down (K 5632) 12.6 -> 8.7, but o 4.8 -> 5.1 and gate 6.7 -> 7.5 (K 2048: at one row a CTA's fixed
// cost, the ring's first fill and the cluster's sum, is more than x's re-reads). Else this file's kernel, its tiles
// by row count: M <= 8 one 8-row half tile, <= 16 one tile, <= 32 two, else four (two column tiles a CTA up to 32
// rows).
template <bool FP8>
void launch_rows(const W8Params& p, at::ScalarType dtype, cudaStream_t stream) {
  dispatch_half_bf16(dtype, [&](auto tag) {
    using T = decltype(tag);
    const int forced = debug::decode_gemm_override().kernel;
    if ((forced == 3 || (forced == -1 && FP8 && p.m == 1)) && launch_row<T, FP8>(p, stream)) return;
    if (forced == 2 || (forced == -1 && (p.m > 8 || p.k >= 4096))) {
      decode_gemm::Params q{};
      q.x = p.x, q.w[0] = p.w, q.out[0] = p.out, q.n[0] = p.n, q.parts = 1, q.m = p.m, q.k = p.k;
      q.act = decode_gemm::kNoAct;
      if (decode_gemm::launch_tma_w8<T, FP8 ? 2 : 1>(q, p.scales, stream)) return;
    }
    if (p.m <= 8) return launch<T, 1, 2, false, FP8>(p, stream);
    if (p.m <= 16) return launch<T, 1, 2, true, FP8>(p, stream);
    if (p.m <= 32) return launch<T, 2, 2, true, FP8>(p, stream);
    launch<T, 4, 1, true, FP8>(p, stream);
  });
}

// Both ops' host side: x as decode_gemm::check_x wants it with K a multiple of 16, w [N, K] of `wtype` (int8 or
// float8_e4m3fn) contiguous and 16-byte aligned, then `check_scales` (the two ops' scale contracts differ), then the
// launch on the current stream.
template <bool FP8, typename CheckScales>
at::Tensor run(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const char* op,
               CheckScales check_scales) {
  const at::ScalarType wtype = FP8 ? at::kFloat8_e4m3fn : at::kChar;
  decode_gemm::check_x(x, op);
  TORCH_CHECK(x.size(-1) % 16 == 0, "fusekit: ", op, ": K = x.shape[-1] must be a multiple of 16; got x ",
              describe(x));
  TORCH_CHECK(w.scalar_type() == wtype && w.dim() == 2 && w.size(1) == x.size(-1) && w.device() == x.device(),
              "fusekit: ", op, ": w must be ", FP8 ? "a float8_e4m3fn" : "an int8", " [N, K] on x's device with K = x.shape[-1]; got x ",
              describe(x), ", w ", describe(w));
  TORCH_CHECK(w.is_contiguous() && aligned16(w.data_ptr()) && w.size(0) < (int64_t{1} << 30),
              "fusekit: ", op, ": w must be contiguous and 16-byte aligned; got ", describe(w));
  check_scales();
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, w.size(0));
  if (out.numel() == 0) return out;
  const W8Params p{x.data_ptr(), w.data_ptr(), scales.data_ptr(), out.data_ptr(), static_cast<int>(m),
                   static_cast<int>(w.size(0)), static_cast<int>(x.size(-1))};
  launch_rows<FP8>(p, x.scalar_type(), c10::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace decode_w8
}  // namespace fusekit
