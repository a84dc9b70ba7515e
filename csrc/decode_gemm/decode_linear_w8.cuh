// The 8-bit-weight decode linear shared by fusekit::decode_linear_w8 (int8 weight-only, torchao's
// Int8WeightOnlyConfig: the scale after the products) and fusekit::decode_linear_fp8_weight (float8 e4m3
// weight-only, Float8WeightOnlyConfig: each weight scaled and rounded to x's dtype before them). The 8-bit weight is
// read once and widened in registers, never written back as a 16-bit copy.
//
// The CTA is decode_linear_kernel's (decode_linear.cuh): 8 warps, 8 NB output columns, all of K, 16 MT rows. A lane
// loads 16 weights of each of its NB weight rows at once (k [16t, 16t + 16) of a 64-wide chunk) and the same 16 k of
// its x rows; int8 values become 16-bit exactly (fp16: the 0x6400 exponent trick, no conversion instruction; bf16:
// through float32's 0x4B000000), e4m3 values through half (exact) times the row's scale, rounded once; two m16n8k16
// pairs take them (mma_chunk: x and w in the same k order).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_fp8.h>

#include "decode_gemm/decode_linear.cuh"
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

// Four int8 (one word) -> two words of two 16-bit values each, exact.
template <typename T>
__device__ __forceinline__ void widen4(uint32_t b, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = b ^ 0x80808080u;  // biased: byte + 128 in [0, 255]
  if constexpr (std::is_same_v<T, __half>) {
    // 0x64XX is the half 1024 + XX: subtract 1152 (1024 + the bias)
    const uint32_t h01 = __byte_perm(u, 0x64646464u, 0x4140), h23 = __byte_perm(u, 0x64646464u, 0x4342);
    const __half2 bias = __half2half2(__ushort_as_half(0x6480));
    const __half2 r01 = __hsub2(*reinterpret_cast<const __half2*>(&h01), bias);
    const __half2 r23 = __hsub2(*reinterpret_cast<const __half2*>(&h23), bias);
    lo = *reinterpret_cast<const uint32_t*>(&r01);
    hi = *reinterpret_cast<const uint32_t*>(&r23);
  } else {
    // 0x4B0000XX is the float 2^23 + XX: subtract 2^23 + 128; integers of 8 bits are exact in bfloat16
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440 + i)) - 8388736.f;
    const __nv_bfloat162 r01 = __floats2bfloat162_rn(f[0], f[1]), r23 = __floats2bfloat162_rn(f[2], f[3]);
    lo = *reinterpret_cast<const uint32_t*>(&r01);
    hi = *reinterpret_cast<const uint32_t*>(&r23);
  }
}

// Four e4m3 (one word) times the weight row's float32 scale, each rounded once to T: two words of two values.
// e4m3 -> half is exact (cvt), half -> float too: the product and its rounding are (w.float() * s).to(T)'s.
template <typename T>
__device__ __forceinline__ void dequant4(uint32_t b, float s, uint32_t& lo, uint32_t& hi) {
  uint32_t r[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(b >> (16 * i)), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    if constexpr (std::is_same_v<T, __half>) {
      const __half2 v = __floats2half2_rn(f.x * s, f.y * s);
      r[i] = *reinterpret_cast<const uint32_t*>(&v);
    } else {
      const __nv_bfloat162 v = __floats2bfloat162_rn(f.x * s, f.y * s);
      r[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  lo = r[0], hi = r[1];
}

// 16 8-bit weights -> k [0, 8) and [8, 16) as two fragments of 8 16-bit values: int8 widened exactly, e4m3
// dequantized with the row's scale s
template <typename T, bool FP8>
__device__ __forceinline__ void widen16(const uint4& q, float s, uint4& a, uint4& b) {
  if constexpr (FP8) {
    dequant4<T>(q.x, s, a.x, a.y);
    dequant4<T>(q.y, s, a.z, a.w);
    dequant4<T>(q.z, s, b.x, b.y);
    dequant4<T>(q.w, s, b.z, b.w);
  } else {
    widen4<T>(q.x, a.x, a.y);
    widen4<T>(q.y, a.z, a.w);
    widen4<T>(q.z, b.x, b.y);
    widen4<T>(q.w, b.z, b.w);
  }
}

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

// The tiles by row count: M <= 8 one 8-row half tile, <= 16 one tile, <= 32 two, else four (two column tiles a CTA
// up to 32 rows)
template <bool FP8>
void launch_rows(const W8Params& p, at::ScalarType dtype, cudaStream_t stream) {
  dispatch_half_bf16(dtype, [&](auto tag) {
    using T = decltype(tag);
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
