// fusekit::decode_linear_w8 -- an int8 weight-only linear (w8a16) at a decode step's few rows: the int8 weight
// is read once and widened in registers, never written back as a 16-bit copy.
//
//   def decode_linear_w8_ref(x, w, scales):      # aten._weight_int8pack_mm's contract
//       return ((x.float() @ w.float().T) * scales.float()).to(x.dtype)
//
// torchao's Int8WeightOnlyConfig computes F.linear(x, w.to(x.dtype)) * scales; Inductor rewrites that into
// aten._weight_int8pack_mm (its woq_int8 lowering, bf16), whose CUDA kernel measured 61.9 us against cuBLAS's
// 34.0 for the 16-bit weight at 1 row and 4,251 us against 39.9 at 32 rows (H200, 4096 -> 14336): the int8
// weight, half the bytes, ended slower than the 16-bit one.
//
// Contract: x [..., K] (M rows) float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; w [N, K] int8,
// contiguous, 16-byte aligned; scales [N] of x's dtype, contiguous. Returns [..., N] of x's dtype: the products
// summed in float32 (tensor cores), times the scale, rounded once. Runs on the current stream, no workspace;
// on sm_90+ launched with programmatic dependent launch.
//
// The CTA is decode_linear_kernel's (decode_linear.cuh): 8 warps, 8 NB output columns, all of K, 16 MT rows. A lane
// loads 16 int8 of each of its NB weight rows at once (k [16t, 16t + 16) of a 64-wide chunk) and the same 16 k of its x rows;
// the int8 values become 16-bit exactly (fp16: the 0x6400 exponent trick, no conversion instruction; bf16: through
// float32's 0x4B000000), and two m16n8k16 pairs take them (mma_chunk: x and w in the same k order).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "decode_gemm/decode_linear.cuh"
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace {

using decode_gemm::kWarps;
using decode_gemm::load_cached;
using decode_gemm::load_stream;
using decode_gemm::mma_chunk;

constexpr int kChunk8 = 64;  // k per chunk: 4 lanes x 16 int8

struct W8Params {
  const void* x;
  const int8_t* w;
  const void* scales;
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

// 16 int8 -> k [0, 8) and [8, 16) as two fragments of 8 16-bit values
template <typename T>
__device__ __forceinline__ void widen16(const uint4& q, uint4& a, uint4& b) {
  widen4<T>(q.x, a.x, a.y);
  widen4<T>(q.y, a.z, a.w);
  widen4<T>(q.z, b.x, b.y);
  widen4<T>(q.w, b.z, b.w);
}

// NB column tiles of 8 per CTA (a lane reads NB weight rows: more bytes in flight per CTA, x read once for them);
// HI: rows g + 8 of each 16-row tile exist (more than 8 rows), else only rows g are loaded.
template <typename T, int MT, int NB, bool HI>
__global__ void __launch_bounds__(kWarps * 32) decode_linear_w8_kernel(const W8Params p) {
  constexpr int H = HI ? 2 : 1;
  constexpr int U = MT == 1 ? 4 : MT == 2 ? 2 : 1;  // chunks in flight per lane (registers: x takes 4 H MT words each)
  constexpr int F = NB * MT * 4;                    // accumulators per lane
  __shared__ float red[kWarps][F][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * 8 * NB, m0 = blockIdx.y * 16 * MT;
  const int chunks = (p.k + kChunk8 - 1) / kChunk8;
  const T* x = static_cast<const T*>(p.x);
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
        q[u][nb] = load_stream(ok ? p.w + static_cast<int64_t>(col) * p.k + kk : p.w);
        if (!ok) q[u][nb] = zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        uint4 w0, w1;
        widen16<T>(q[u][nb], w0, w1);
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
    if (row < p.m && col < p.n) out[static_cast<int64_t>(row) * p.n + col] = from_float<T>(s * to_float(scales[col]));
  }
}

template <typename T, int MT, int NB, bool HI>
void launch(const W8Params& p, cudaStream_t stream) {
  const dim3 grid((p.n + 8 * NB - 1) / (8 * NB), (p.m + 16 * MT - 1) / (16 * MT));
  static const int version = binary_version(decode_linear_w8_kernel<T, MT, NB, HI>);
  launch_ex(decode_linear_w8_kernel<T, MT, NB, HI>, grid, dim3(kWarps * 32), 0, stream, pdl_allowed(version, 'g'),
            0, p);
}

at::Tensor decode_linear_w8_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  constexpr const char* op = "decode_linear_w8";
  decode_gemm::check_x(x, op);
  TORCH_CHECK(x.size(-1) % 16 == 0, "fusekit: decode_linear_w8: K = x.shape[-1] must be a multiple of 16; got x ",
              describe(x));
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && w.size(1) == x.size(-1) && w.device() == x.device(),
              "fusekit: decode_linear_w8: w must be an int8 [N, K] on x's device with K = x.shape[-1]; got x ",
              describe(x), ", w ", describe(w));
  TORCH_CHECK(w.is_contiguous() && aligned16(w.data_ptr()) && w.size(0) < (int64_t{1} << 30),
              "fusekit: decode_linear_w8: w must be contiguous and 16-byte aligned; got ", describe(w));
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == w.size(0) && scales.is_contiguous() &&
                  scales.scalar_type() == x.scalar_type() && scales.device() == x.device(),
              "fusekit: decode_linear_w8: scales must be a contiguous [N] vector of x's dtype and device; got x ",
              describe(x), ", w ", describe(w), ", scales ", describe(scales));
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, w.size(0));
  if (out.numel() == 0) return out;
  W8Params p{x.data_ptr(), w.data_ptr<int8_t>(), scales.data_ptr(), out.data_ptr(), static_cast<int>(m),
             static_cast<int>(w.size(0)), static_cast<int>(x.size(-1))};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_half_bf16(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    if (p.m <= 8) return launch<T, 1, 2, false>(p, stream);
    if (p.m <= 16) return launch<T, 1, 2, true>(p, stream);
    if (p.m <= 32) return launch<T, 2, 2, true>(p, stream);
    launch<T, 4, 1, true>(p, stream);
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_w8", &fusekit::decode_linear_w8_cuda); }
