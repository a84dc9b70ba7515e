// The float8 dynamic per-row decode GEMM (torchao's Float8DynamicActivationFloat8WeightConfig with PerRow) that
// fusekit::decode_linear_fp8 (one weight), decode_qkv_fp8 (q, k and v of one x) and decode_gate_up_fp8 (gate and
// up with SiLU / tanh-GELU times up) launch. Each linear of x computes
//
//   s = (x.abs().amax(-1, keepdim=True) / 448.0).float()              # the division rounded to x's dtype
//   xq = (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
//   y = torch._scaled_mm(xq.reshape(-1, K), w.t(), s.reshape(-1, 1), w_scale.t(), out_dtype=x.dtype)
//
// x quantized exactly so (the quotient correctly rounded, e4m3 round-to-nearest-even with +-448 saturation, NaN
// kept: clamp + cast), the fp8 products summed in float32 (tensor cores), times both scales, rounded once; the
// gated epilogue as eager's act(gate) * up on the rounded products.
//
// The CTA is decode_linear_w8's: 8 warps, 8 NB columns of one part (NW = 2: of both weights), all of K, 16 MT rows.
// Up to 8 rows it first finds the max |x| of its rows (warp per row), then each lane quantizes the 16 k of x it
// multiplies: one launch, no fp8 copy of x. Above 8 rows quantize_rows writes x's e4m3 copy and the rows' scales
// first (a CTA per row; buffers from the caching allocator) and the GEMM (PREQ) widens those: the weights of one x
// share one quantization either way. fp8 values are exact in float16, so x and w are widened to float16 and
// m16n8k16 takes them whatever x's dtype (cvt e4m3x2 -> f16x2: sm_89+ hardware). On sm_90+ launched with PDL.
//
// I8: the same launches for torchao's int8 dynamic per-row linears (Int8DynamicActivationInt8WeightConfig;
// fusekit::decode_linear_int8dyn, decode_qkv_int8dyn, decode_gate_up_int8dyn), each linear of x computing
//
//   s = (max(-min(x.amin(-1), 0), max(x.amax(-1), 0)) / 127.5).float().clamp_min(2**-23).to(x.dtype).float()
//   xq = (x.float() * (1 / s)).round().clamp(-128, 127).to(torch.int8)     # 1 / s and the product rounded
//   y = ((torch._int_mm(xq, w.t()) * s).to(x.dtype) * w_scale.flatten()).to(x.dtype)
//
// with int8 x int8 m16n8k32 products into exact int32 sums and both of torchao's roundings in the epilogue: the
// quantized x and the output are eager's to the bit (the gated product: act(gate) * up rounded as eager, act by
// fast_silu / fast_gelu_tanh). A lane's 16 int8 of x and of each weight row feed two m16n8k32 (words 0-1, then
// 2-3): the same k permutation for both operands. No TMA kernel: the mma.sync one on every build.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_fp8.h>

#include <string>
#include <tuple>

#include "convert.cuh"                       // to_float2
#include "debug_overrides.h"                 // FUSEKIT_DECODE_FP8_BLOCKS, FUSEKIT_DECODE_FP8
#include "decode_gemm/decode_linear.cuh"      // Params, part_of, tile_part, set_tile_ends, epilogue, loads, mma_chunk
#include "decode_gemm/decode_linear_tma.cuh"  // launch_tma_fp8
#include "dtype_dispatch.cuh"
#include "quantize/torchao_rows.cuh"  // kFp8Max, div_rn, quantize2, amax2, row_scale

namespace fusekit {
namespace decode_fp8 {

using decode_gemm::kMaxParts;
using decode_gemm::kWarps;
using decode_gemm::load_cached;
using decode_gemm::load_stream;
using decode_gemm::mma_chunk;
using decode_gemm::part_of;

constexpr int kChunk8 = 64;  // k per chunk: 4 lanes x 16 values

// decode_linear's parameters (x, the parts' w / out / n / tile ends, m, k, act; bias unused) and the scales.
// NW = 1: `parts` e4m3 weights of x (q, k, v), out[i] = x w[i]^T. NW = 2: w[0] gate, w[1] up of one N, out[0] =
// act(gate) * up. PREQ: x is x's e4m3 copy and x_scale the rows' scales.
struct Fp8Params : decode_gemm::Params {
  const float* x_scale;
  const float* w_scale[kMaxParts];
};

// two e4m3 (low byte first) -> a float16 pair, exact
__device__ __forceinline__ uint32_t widen2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// 16 e4m3 -> k [0, 8) and [8, 16) as two fragments of 8 float16
__device__ __forceinline__ void widen16(const uint4& q, uint4& a, uint4& b) {
  const uint32_t v[4] = {q.x, q.y, q.z, q.w};
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[2 * i] = widen2(static_cast<uint16_t>(v[i] & 0xFFFFu));
    h[2 * i + 1] = widen2(static_cast<uint16_t>(v[i] >> 16));
  }
  a = make_uint4(h[0], h[1], h[2], h[3]);
  b = make_uint4(h[4], h[5], h[6], h[7]);
}

// 8 values of x (one uint4) quantized -> 8 float16 holding e4m3 values
template <typename T>
__device__ __forceinline__ uint4 quantize8(const uint4& v, float s, float r) {
  return make_uint4(widen2(quantize2<T>(v.x, s, r)), widen2(quantize2<T>(v.y, s, r)), widen2(quantize2<T>(v.z, s, r)),
                    widen2(quantize2<T>(v.w, s, r)));
}

// max |x| over x[first], x[first + stride], ... (8 values per load) of a row of k, reduced over the warp; as a float
// (exact: the max of 16-bit values)
template <typename T, bool NANP = false>
__device__ __forceinline__ float warp_amax(const T* x, int k, int first, int stride) {
  float a = 0.f;
  for (int kk = first; kk < k; kk += stride) {
    const uint4 v = load_cached(x + kk);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = to_float2<T>(w[i]);
      a = amax2<NANP>(a, amax2<NANP>(fabsf(f.x), fabsf(f.y)));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) a = amax2<NANP>(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  return a;
}

// one value of x -> int8 as torchao: x * (1 / s) in float32 (r = 1 / s correctly rounded), rounded half to even,
// clamped (an infinite product saturates like the clamp; NaN gives 0)
__device__ __forceinline__ uint32_t quantize1_i8(float f, float r) {
  const int q = max(-128, min(127, __float2int_rn(__fmul_rn(f, r))));
  return static_cast<uint32_t>(q) & 0xFFu;
}

// 4 values of x (two words of T) -> 4 int8 in memory order, the first in the low byte
template <typename T>
__device__ __forceinline__ uint32_t quantize4_i8(uint32_t lo, uint32_t hi, float r) {
  const float2 a = to_float2<T>(lo), b = to_float2<T>(hi);
  return quantize1_i8(a.x, r) | (quantize1_i8(a.y, r) << 8) | (quantize1_i8(b.x, r) << 16) |
         (quantize1_i8(b.y, r) << 24);
}

// 16 values of x (k 0-7 in a, 8-15 in b) -> 16 int8 in memory order
template <typename T>
__device__ __forceinline__ uint4 quantize16_i8(const uint4& a, const uint4& b, float r) {
  return make_uint4(quantize4_i8<T>(a.x, a.y, r), quantize4_i8<T>(a.z, a.w, r), quantize4_i8<T>(b.x, b.y, r),
                    quantize4_i8<T>(b.z, b.w, r));
}

// Above 8 rows every CTA quantizing its rows again costs more than the pass over its weight columns (H100: 32 rows
// 0.55x Inductor at 2048 -> 5632): one CTA per row first writes the row's e4m3 copy and scale (quantize_rows),
// and the GEMM (PREQ) widens those.
template <typename T, bool I8>
__global__ void __launch_bounds__(256) quantize_rows_kernel(const T* __restrict__ x, uint8_t* __restrict__ xq,
                                                            float* __restrict__ xs, int k) {
  __shared__ float warp_max[8];
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_wait();
  pdl_trigger();  // the GEMM after may start (its weights' loads): its pdl_wait still waits for this grid's end
  float a = warp_amax<T, I8>(x + row * k, k, threadIdx.x * 8, 256 * 8);
  if (lane == 0) warp_max[warp] = a;
  __syncthreads();
  a = warp_max[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) a = amax2<I8>(a, warp_max[i]);
  const float s = row_scale<T, I8>(a), r = __frcp_rn(s);
  if (threadIdx.x == 0) xs[row] = s;
  for (int kk = threadIdx.x * 8; kk < k; kk += 256 * 8) {
    const uint4 v = load_cached(x + row * k + kk);
    if constexpr (I8) {
      *reinterpret_cast<uint2*>(xq + row * k + kk) =
          make_uint2(quantize4_i8<T>(v.x, v.y, r), quantize4_i8<T>(v.z, v.w, r));
    } else {
      const auto pair = [&](uint32_t lo, uint32_t hi) {  // 4 e4m3 in memory order
        return static_cast<uint32_t>(quantize2<T>(lo, s, r)) | (static_cast<uint32_t>(quantize2<T>(hi, s, r)) << 16);
      };
      *reinterpret_cast<uint2*>(xq + row * k + kk) = make_uint2(pair(v.x, v.y), pair(v.z, v.w));
    }
  }
}

template <typename T, int MT, int NW, int NB, bool HI, bool PREQ, bool I8>
__global__ void __launch_bounds__(kWarps * 32) decode_linear_fp8_kernel(const Fp8Params p) {
  using Acc = std::conditional_t<I8, int, float>;  // I8: exact int32 sums
  constexpr int H = HI ? 2 : 1;
  constexpr int U = MT == 1 ? 4 : MT == 2 ? 2 : 1;  // chunks in flight per lane
  constexpr int F = NB * MT * 4;                    // accumulators per lane and weight
  constexpr int R = 16 * MT;                        // rows per CTA
  static_assert(NW * NB <= 2, "a lane loads at most 2 weight rows per chunk");
  __shared__ Acc red[kWarps][NW * F][32];
  __shared__ float row_s[R], row_r[R];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int n0;
  const int j = decode_gemm::tile_part<NW>(p, blockIdx.x, 8 * NB, n0);  // the part this CTA's columns belong to
  const int m0 = blockIdx.y * R, n = part_of(p.n, j);
  const uint8_t* wts[NW];
  const float* wsc[NW];
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    wts[w] = static_cast<const uint8_t*>(NW == 1 ? part_of(p.w, j) : p.w[w]);
    wsc[w] = NW == 1 ? part_of(p.w_scale, j) : p.w_scale[w];
  }
  const int chunks = (p.k + kChunk8 - 1) / kChunk8;
  const T* x = static_cast<const T*>(p.x);
  pdl_wait();  // x, and the output: the kernels before (PDL)

  // the rows' scales: s = float(T(amax / 448)), as eager rounds the division to x's dtype. fmaxf drops a NaN that
  // amax keeps; the row's output is NaN either way (the NaN, quantized, enters every column's sum). A row of zeros:
  // s = 0, every quotient NaN, as eager's 0 / 0.
  if constexpr (PREQ) {
    for (int r = threadIdx.x; r < R; r += kWarps * 32) row_s[r] = m0 + r < p.m ? p.x_scale[m0 + r] : 1.f;
  } else {
    for (int r = warp; r < R; r += kWarps) {
      if (m0 + r >= p.m) break;
      const float s =
          row_scale<T, I8>(warp_amax<T, I8>(x + static_cast<int64_t>(m0 + r) * p.k, p.k, lane * 8, 32 * 8));
      if (lane == 0) {
        row_s[r] = s;
        row_r[r] = __frcp_rn(s);
      }
    }
  }
  __syncthreads();
  float sq[MT][H], rq[MT][H];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const int r = i * 16 + h * 8 + g;
      sq[i][h] = !PREQ && m0 + r < p.m ? row_s[r] : 1.f;
      rq[i][h] = !PREQ && m0 + r < p.m ? row_r[r] : 1.f;
    }

  Acc acc[NW * NB][MT][4];  // [weight * NB + column block][tile][fragment]
#pragma unroll
  for (int b = 0; b < NW * NB; ++b)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[b][i][c] = 0;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  for (int c0 = warp; c0 < chunks; c0 += kWarps * U) {
    uint4 a[U][MT][H][2], q[U][NW * NB];  // x (16-bit, then quantized): [chunk][tile][row g | g + 8][k 0-7 | 8-15]
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of U chunks first, then their products
      const int kk = (c0 + u * kWarps) * kChunk8 + t * 16;
      const bool kin = kk < p.k;  // K % 16 == 0: a lane's 16 values all in or all out
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < H; ++h) {
          const int row = m0 + i * 16 + h * 8 + g;
          const bool ok = kin && row < p.m;
          if constexpr (PREQ) {  // 16 e4m3 (I8: int8) of xq: loaded now, widened with the products
            const uint8_t* xp = static_cast<const uint8_t*>(p.x) + (ok ? static_cast<int64_t>(row) * p.k + kk : 0);
            a[u][i][h][0] = ok ? load_cached(xp) : zero;
          } else {
            const T* xp = ok ? x + static_cast<int64_t>(row) * p.k + kk : x;
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              a[u][i][h][s] = load_cached(xp + (ok ? 8 * s : 0));
              if (!ok) a[u][i][h][s] = zero;
            }
          }
        }
#pragma unroll
      for (int b = 0; b < NW * NB; ++b) {
        const int col = n0 + (b % NB) * 8 + g;
        const bool ok = kin && col < n;
        q[u][b] = load_stream(ok ? wts[b / NB] + static_cast<int64_t>(col) * p.k + kk : wts[0]);
        if (!ok) q[u][b] = zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < H; ++h) {
          if constexpr (I8) {  // 16 int8 in a[..][0] (PREQ: as loaded)
            if constexpr (!PREQ) a[u][i][h][0] = quantize16_i8<T>(a[u][i][h][0], a[u][i][h][1], rq[i][h]);
          } else if constexpr (PREQ) {
            const uint4 v = a[u][i][h][0];
            widen16(v, a[u][i][h][0], a[u][i][h][1]);
          } else {
#pragma unroll
            for (int s = 0; s < 2; ++s) a[u][i][h][s] = quantize8<T>(a[u][i][h][s], sq[i][h], rq[i][h]);
          }
        }
#pragma unroll
      for (int b = 0; b < NW * NB; ++b) {
        if constexpr (I8) {
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            const uint4& lo = a[u][i][0][0];
            const uint4& hi = HI ? a[u][i][H - 1][0] : zero;
            mma16832_s8(acc[b][i], lo.x, hi.x, lo.y, hi.y, q[u][b].x, q[u][b].y);
            mma16832_s8(acc[b][i], lo.z, hi.z, lo.w, hi.w, q[u][b].z, q[u][b].w);
          }
        } else {
          uint4 w0, w1;
          widen16(q[u][b], w0, w1);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma_chunk<__half>(acc[b][i], a[u][i][0][0], HI ? a[u][i][H - 1][0] : zero, w0);
            mma_chunk<__half>(acc[b][i], a[u][i][0][1], HI ? a[u][i][H - 1][1] : zero, w1);
          }
        }
      }
    }
  }
  pdl_trigger();

  // the warps' sums in warp order (deterministic), then both scales and the epilogue; C fragment: c0, c1 row g,
  // c2, c3 row g + 8, columns 2t, 2t + 1
#pragma unroll
  for (int b = 0; b < NW * NB; ++b)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp][(b * MT + i) * 4 + c][lane] = acc[b][i][c];
  __syncthreads();
  T* out = static_cast<T*>(part_of(p.out, j));
  for (int e = threadIdx.x; e < F * 32; e += kWarps * 32) {
    const int l = e % 32, f = e / 32, c = f % 4, i = f / 4 % MT, nb = f / (4 * MT);
    const int r = i * 16 + (l / 4) + (c / 2) * 8, row = m0 + r, col = n0 + nb * 8 + (l % 4) * 2 + c % 2;
    if (row >= p.m || col >= n) continue;
    float s[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      Acc sum = 0;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) sum += red[v][w * F + f][l];
      if constexpr (I8) {  // torchao: float(int32) * s rounded to T, then * w_scale (rounded to T below)
        s[w] = __fmul_rn(to_float(from_float<T>(__fmul_rn(__int2float_rn(sum), row_s[r]))), wsc[w][col]);
      } else {
        s[w] = sum * row_s[r] * wsc[w][col];
      }
    }
    out[static_cast<int64_t>(row) * n + col] =
        from_float<T>(decode_gemm::epilogue<T, NW>(p.act, s[0], s[NW - 1], static_cast<const T*>(nullptr), col));
  }
}

template <typename T, int MT, int NW, int NB, bool HI, bool PREQ, bool I8>
void launch(const Fp8Params& p, int tiles, cudaStream_t stream) {
  const dim3 grid(tiles, (p.m + 16 * MT - 1) / (16 * MT));
  static const int version = binary_version(decode_linear_fp8_kernel<T, MT, NW, NB, HI, PREQ, I8>);
  launch_ex(decode_linear_fp8_kernel<T, MT, NW, NB, HI, PREQ, I8>, grid, dim3(kWarps * 32), 0, stream,
            pdl_allowed(version, 'g'), 0, p);
}

// quantize_rows into buffers of the caching allocator (graph-safe); p.x and p.x_scale then point at them. The
// returned tensors keep them alive until the GEMM is enqueued.
template <typename T, bool I8 = false>
std::pair<at::Tensor, at::Tensor> quantize_x(Fp8Params& p, const at::Tensor& x, cudaStream_t stream) {
  at::Tensor xq = at::empty({p.m, p.k}, x.options().dtype(at::kByte));
  at::Tensor xs = at::empty({p.m}, x.options().dtype(at::kFloat));
  static const int version = binary_version(quantize_rows_kernel<T, I8>);
  launch_ex(quantize_rows_kernel<T, I8>, dim3(p.m), dim3(256), 0, stream, pdl_allowed(version, 'g'), 0,
            static_cast<const T*>(p.x), xq.data_ptr<uint8_t>(), xs.data_ptr<float>(), p.k);
  p.x = xq.data_ptr();
  p.x_scale = xs.data_ptr<float>();
  return {xq, xs};
}

// The GEMM with NB column blocks per CTA (see launch_fp8); quantized: p.x is already x's e4m3 copy
template <typename T, int NW, int NB, bool I8 = false>
void launch_fp8_tiles(Fp8Params p, const at::Tensor& x, cudaStream_t stream, bool quantized = false) {
  if (p.m <= 8 && !quantized) {
    return launch<T, 1, NW, NB, false, false, I8>(p, decode_gemm::set_tile_ends(p, 8 * NB), stream);
  }
  std::pair<at::Tensor, at::Tensor> held;
  if (!quantized) held = quantize_x<T, I8>(p, x, stream);
  if (p.m <= 16) return launch<T, 1, NW, NB, true, true, I8>(p, decode_gemm::set_tile_ends(p, 8 * NB), stream);
  if (p.m <= 32) return launch<T, 2, NW, NB, true, true, I8>(p, decode_gemm::set_tile_ends(p, 8 * NB), stream);
  launch<T, 4, NW, 1, true, true, I8>(p, decode_gemm::set_tile_ends(p, 8), stream);
}

// The TMA + wgmma kernel (sm_90a builds, 1-64 rows) after quantize_rows, with the first stages' weight tiles issued
// before pdl_wait; false where it cannot run (then nothing was launched).
template <typename T, int NW>
bool launch_fp8_tma(Fp8Params p, const at::Tensor& x, cudaStream_t stream, int splits) {
  if (!decode_gemm::tma_built() || p.m > 64 || decode_gemm::tensor_map_encoder() == nullptr) return false;
  const auto held = quantize_x<T>(p, x, stream);
  decode_gemm::TmaParams scales{};
  scales.x_scale = p.x_scale;
  for (int i = 0; i < kMaxParts; ++i) scales.w_scale[i] = p.w_scale[i];
  if (decode_gemm::launch_tma_fp8<T, NW>(p, scales, stream, splits, true)) return true;
  launch_fp8_tiles<T, NW, 1>(p, x, stream, true);  // a map the driver would not encode: x is quantized already
  return true;
}

// Where the TMA kernel runs by default: 1-64 rows of an sm_90a build. H200, Llama-style widths, op alone, cold
// weights, mma.sync -> TMA us: down (K 5632) 12.3 -> 7.2 at 1 row, 15.4 -> 9.4 at 32, 25.8 -> 12.5 at 64; gate
// (2048 x 5632) 12.0 -> 10.9 at 32, 20.1 -> 10.9 at 64; the 32000-wide LM head 35.7 -> 23.0 at 1 row; but q
// (2048 x 2048) 5.2 -> 5.5 at 1 row (x quantized in the mma kernel's own launch, after quantize_rows here). In a
// decode step (b1, CUDA graphs) the TMA kernel at every row count still won: 0.413 ms against 0.453 with the
// mma.sync kernel kept at 1-8 rows for K < 4096 (its weight tiles go out before pdl_wait; the mma kernel's after).
inline bool fp8_tma_selected(int m) { return decode_gemm::tma_built() && m <= 64; }

// Launches the GEMM for p (x, parts, n, m, k, act and the weights' scales set; m > 0, k > 0): the TMA kernel where
// fp8_tma_selected says (unless FUSEKIT_DECODE_FP8=mma); else above 8 rows after
// quantize_rows (x's e4m3 copy and scales from the caching allocator: graph-safe). NW = 2 takes 8 columns of both
// weights per CTA; NW = 1 16 of one part (x read by half as many CTAs), except at up to 8 rows where 16 would leave
// under two CTAs per SM: 8 there (H200, Llama-style N = 2048: q 5.8 -> 5.2 us at 1 row, 6.1 -> 5.5 at 8; down
// 14.6 -> 12.3, 15.0 -> 13.0; at 32 rows 8 columns measured slower, q 7.1 -> 7.3, down 14.1 -> 14.8).
//
// I8 (int8 dynamic): no TMA kernel; otherwise the same choice of launches.
template <typename T, int NW, bool I8 = false>
void launch_fp8(Fp8Params p, const at::Tensor& x, cudaStream_t stream) {
  if constexpr (!I8) {
    const debug::DecodeFp8Override o = debug::decode_fp8_override();  // FUSEKIT_DECODE_FP8 (tests, benchmarks)
    if ((o.kernel == 2 || (o.kernel == -1 && fp8_tma_selected(p.m))) && launch_fp8_tma<T, NW>(p, x, stream, o.splits)) {
      return;
    }
  }
  if constexpr (NW == 1) {
    const int forced = debug::decode_fp8_blocks();  // FUSEKIT_DECODE_FP8_BLOCKS (tests, benchmarks)
    if (p.m <= 8 && (forced == 1 || (forced == 0 && decode_gemm::set_tile_ends(p, 16) < 2 * sm_count())))
      return launch<T, 1, NW, 1, false, false, I8>(p, decode_gemm::set_tile_ends(p, 8), stream);
  }
  launch_fp8_tiles<T, NW, NW == 2 ? 1 : 2, I8>(p, x, stream);
}

// The one-weight GEMMs are built once (decode_linear_fp8.cu, decode_linear_int8dyn.cu); decode_qkv_fp8.cu and
// decode_qkv_int8dyn.cu link to them (build time).
extern template void launch_fp8<__half, 1, false>(Fp8Params, const at::Tensor&, cudaStream_t);
extern template void launch_fp8<__nv_bfloat16, 1, false>(Fp8Params, const at::Tensor&, cudaStream_t);
extern template void launch_fp8<__half, 1, true>(Fp8Params, const at::Tensor&, cudaStream_t);
extern template void launch_fp8<__nv_bfloat16, 1, true>(Fp8Params, const at::Tensor&, cudaStream_t);

// Host side: x (16-bit rows, K a multiple of 16) and an e4m3 (I8: int8) weight with its float32 [N] / [N, 1] scales.
inline void check_x(const at::Tensor& x, const char* op) {
  decode_gemm::check_x(x, op);
  TORCH_CHECK(x.size(-1) % 16 == 0, "fusekit: ", op, ": K = x.shape[-1] must be a multiple of 16; got x ",
              describe(x));
}

inline void check_weight(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale, const char* op,
                         const char* name, at::ScalarType wdtype = at::kFloat8_e4m3fn) {
  TORCH_CHECK(w.scalar_type() == wdtype && w.dim() == 2 && w.size(1) == x.size(-1) && w.device() == x.device(),
              "fusekit: ", op, ": ", name, " must be a ", wdtype == at::kChar ? "int8" : "float8_e4m3fn",
              " [N, K] on x's device with K = x.shape[-1]; got x ", describe(x), ", ", name, " ", describe(w));
  TORCH_CHECK(w.is_contiguous() && aligned16(w.data_ptr()) && w.size(0) < (int64_t{1} << 28), "fusekit: ", op, ": ",
              name, " must be contiguous and 16-byte aligned; got ", describe(w));
  TORCH_CHECK(w_scale.scalar_type() == at::kFloat && w_scale.numel() == w.size(0) && w_scale.is_contiguous() &&
                  w_scale.dim() >= 1 && w_scale.dim() <= 2 && w_scale.size(0) == w.size(0) &&
                  w_scale.device() == x.device(),
              "fusekit: ", op, ": ", name, "'s scales must be a contiguous float32 [N] or [N, 1] on x's device; got ",
              name, " ", describe(w), ", scales ", describe(w_scale));
}

// ---- the ops' host side: decode_linear_, decode_qkv_ and decode_gate_up_ fp8 / int8dyn (I8) ----
// x and each weight checked (check_x, check_weight); outputs of x's dtype; the GEMM on the current stream.

constexpr at::ScalarType weight_dtype(bool i8) { return i8 ? at::kChar : at::kFloat8_e4m3fn; }

template <bool I8>
at::Tensor linear_op(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale, const char* op) {
  constexpr at::ScalarType wdtype = weight_dtype(I8);
  check_x(x, op);
  check_weight(x, w, w_scale, op, "w", wdtype);
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, w.size(0));
  if (out.numel() == 0) return out;
  Fp8Params p{};
  p.x = x.data_ptr(), p.m = static_cast<int>(m), p.k = static_cast<int>(x.size(-1)), p.parts = 1;
  p.w[0] = w.data_ptr(), p.w_scale[0] = w_scale.data_ptr<float>(), p.out[0] = out.data_ptr();
  p.n[0] = static_cast<int>(w.size(0));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_half_bf16(x.scalar_type(), [&](auto tag) { launch_fp8<decltype(tag), 1, I8>(p, x, stream); });
  return out;
}

// q, k and v of one x: the three weights' column tiles side by side in one grid (decode_qkv's layout)
template <bool I8>
std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_op(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& sq,
                                                      const at::Tensor& wk, const at::Tensor& sk, const at::Tensor& wv,
                                                      const at::Tensor& sv, const char* op) {
  constexpr at::ScalarType wdtype = weight_dtype(I8);
  check_x(x, op);
  check_weight(x, wq, sq, op, "wq", wdtype);
  check_weight(x, wk, sk, op, "wk", wdtype);
  check_weight(x, wv, sv, op, "wv", wdtype);
  const int64_t m = decode_gemm::rows(x, op);
  const at::Tensor* ws[3] = {&wq, &wk, &wv};
  const at::Tensor* ss[3] = {&sq, &sk, &sv};
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor outs[3] = {decode_gemm::out_like(x, wq.size(0)), decode_gemm::out_like(x, wk.size(0)),
                        decode_gemm::out_like(x, wv.size(0))};
  if (m == 0) return {outs[0], outs[1], outs[2]};
  Fp8Params p{};
  p.x = x.data_ptr(), p.m = static_cast<int>(m), p.k = static_cast<int>(x.size(-1));
  for (int i = 0; i < 3; ++i) {  // parts with no columns are left out (the grid counts the column tiles)
    if (ws[i]->size(0) == 0) continue;
    p.w[p.parts] = ws[i]->data_ptr(), p.w_scale[p.parts] = ss[i]->data_ptr<float>();
    p.out[p.parts] = outs[i].data_ptr(), p.n[p.parts] = static_cast<int>(ws[i]->size(0));
    ++p.parts;
  }
  if (p.parts > 0) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    dispatch_half_bf16(x.scalar_type(), [&](auto tag) { launch_fp8<decltype(tag), 1, I8>(p, x, stream); });
  }
  return {outs[0], outs[1], outs[2]};
}

// gate and up of one x (one N) with act(gate) * up: each CTA holds the same columns of both weights
template <bool I8>
at::Tensor gate_up_op(const at::Tensor& x, const at::Tensor& wg, const at::Tensor& sg, const at::Tensor& wu,
                      const at::Tensor& su, const std::string& act, const char* op) {
  constexpr at::ScalarType wdtype = weight_dtype(I8);
  TORCH_CHECK(act == "silu_mul" || act == "gelu_tanh_mul", "fusekit: ", op,
              ": act must be \"silu_mul\" or \"gelu_tanh_mul\"; got \"", act, "\"");
  check_x(x, op);
  check_weight(x, wg, sg, op, "wg", wdtype);
  check_weight(x, wu, su, op, "wu", wdtype);
  TORCH_CHECK(wg.size(0) == wu.size(0), "fusekit: ", op, ": wg and wu must have one N; got wg ", describe(wg),
              ", wu ", describe(wu));
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, wg.size(0));
  if (out.numel() == 0) return out;
  Fp8Params p{};
  p.x = x.data_ptr(), p.m = static_cast<int>(m), p.k = static_cast<int>(x.size(-1)), p.parts = 1;
  p.w[0] = wg.data_ptr(), p.w[1] = wu.data_ptr();
  p.w_scale[0] = sg.data_ptr<float>(), p.w_scale[1] = su.data_ptr<float>();
  p.out[0] = out.data_ptr(), p.n[0] = static_cast<int>(wg.size(0));
  p.act = act == "silu_mul" ? decode_gemm::kSiluMul : decode_gemm::kGeluTanhMul;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_half_bf16(x.scalar_type(), [&](auto tag) { launch_fp8<decltype(tag), 2, I8>(p, x, stream); });
  return out;
}

}  // namespace decode_fp8
}  // namespace fusekit
