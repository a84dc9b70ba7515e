// Brute-force check of rowquant.cuh's div_by_recip(x, s, 1/s) against div.rn.f32 (__fdiv_rn), the division
// eager's dynamic quantizers run: bit for bit on the quotient wherever |x / s| >= 2^-11, and on the int8 and
// e4m3 values everywhere. Scales s = 2^e * m for e in [-60, 100], random mantissas, plus scales as the
// kernels make them (amax * (1/127), amax * (1/448)); x = s * t for random t in [-kMax, kMax] and in
// [-kMax, kMax] * 2^-47.., and x placed on and 1-2 ulps beside the rounding boundaries (where ties are).
// Build: as hbm_launch_shapes.cu (torch's headers and libraries, -Icsrc); run: ./div_check [batches=64].
// Exit status 1 on any mismatch.
#include "quantize/rowquant.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

using fusekit::div_by_recip;

__device__ __forceinline__ uint32_t hash(uint64_t v) {
  v ^= v >> 33; v *= 0xff51afd7ed558ccdull; v ^= v >> 33; v *= 0xc4ceb9fe1a85ec53ull; v ^= v >> 33;
  return uint32_t(v);
}
__device__ __forceinline__ int8_t i8(float t) { return int8_t(fminf(fmaxf(rintf(t), -128.f), 127.f)); }
__device__ __forceinline__ uint8_t e4m3(float t) {
  return uint8_t(__nv_cvt_float_to_fp8(fminf(fmaxf(t, -448.f), 448.f), __NV_SATFINITE, __NV_E4M3));
}

// counts: [0] pairs checked, [1] quotient mismatches (|q| >= 2^-11), [2] int8 mismatches, [3] e4m3 mismatches
__global__ void check(uint64_t seed, unsigned long long* counts) {
  const uint64_t id = seed * (uint64_t(gridDim.x) * blockDim.x) + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  unsigned long long n = 0, bq = 0, bi = 0, bf = 0;
  for (int it = 0; it < 64; ++it) {
    const uint32_t h0 = hash(id * 131 + it), h1 = hash(id * 131 + it + 0x9e3779b97f4a7c15ull);
    const bool fp8 = h0 & 1;
    const float kmax = fp8 ? 448.f : 127.f;
    float s;
    if (h0 & 2) {  // as the kernels: amax * (1/kMax), amax with a random mantissa
      const float amax = __uint_as_float((((h0 >> 8) % 150 + 20) << 23) | (h1 >> 9));
      s = amax * (1.0f / kmax);
    } else {
      s = __uint_as_float((((h0 >> 8) % 161 + 67) << 23) | (h1 >> 9));  // 2^-60 .. 2^100
    }
    if (!(s >= 0x1p-60f) || !isfinite(s)) continue;
    const float r = 1.0f / s;
    for (int k = 0; k < 16; ++k) {
      const uint32_t h = hash(h1 * 977ull + k + id);
      float x;
      if (k < 8) {  // random quotient in [-kMax, kMax], and from k = 6 on scaled by 2^-(0..47): tiny ones too
        x = s * (__uint_as_float(0x3f800000u | (h >> 9)) - 1.5f) * 2.f * kmax;
        if (k >= 6) x *= __uint_as_float(uint32_t(127 - (h >> 3) % 48) << 23);
      } else {  // on or beside a boundary: int8 k + 0.5, or an e4m3 midpoint
        float b;
        if (!fp8) {
          b = float(int(h % 255) - 127) + 0.5f;
        } else {
          const uint8_t c = uint8_t(h % 126);
          const float lo = __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
          const float hi = __half2float(__half(__nv_cvt_fp8_to_halfraw(c + 1, __NV_E4M3)));
          b = ((h >> 8) & 1 ? -1.f : 1.f) * 0.5f * (lo + hi);
        }
        x = __uint_as_float(__float_as_uint(b * s) + int((h >> 12) % 5) - 2);
      }
      const float q = __fdiv_rn(x, s), d = div_by_recip(x, s, r);
      ++n;
      bq += fabsf(q) >= 0x1p-11f && __float_as_uint(q) != __float_as_uint(d);
      bi += i8(q) != i8(d);
      bf += e4m3(q) != e4m3(d);
    }
  }
  atomicAdd(counts + 0, n);
  atomicAdd(counts + 1, bq);
  atomicAdd(counts + 2, bi);
  atomicAdd(counts + 3, bf);
}

int main(int argc, char** argv) {
  const int batches = argc > 1 ? atoi(argv[1]) : 64;
  unsigned long long* c;
  cudaMalloc(&c, 32);
  cudaMemset(c, 0, 32);
  for (int b = 0; b < batches; ++b) check<<<4096, 256>>>(b, c);
  unsigned long long h[4];
  if (cudaMemcpy(h, c, 32, cudaMemcpyDeviceToHost) != cudaSuccess) { printf("CUDA error\n"); return 2; }
  printf("div_by_recip vs div.rn.f32: %llu pairs, quotient mismatches (|q| >= 2^-11) %llu, int8 %llu, e4m3 %llu\n",
         h[0], h[1], h[2], h[3]);
  return (h[1] | h[2] | h[3]) ? 1 : 0;
}
