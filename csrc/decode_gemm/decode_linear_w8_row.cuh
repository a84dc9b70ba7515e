// The one-row form of the 8-bit weight-only decode linear (decode_linear_w8.cuh: fusekit::decode_linear_w8 and
// fusekit::decode_linear_fp8_weight at a batch-1 step): a GEMV without tensor cores. At one row an MMA tile wastes
// 15 of its 16 rows and the mma.sync kernel's CTA sums 8 warps' partials through shared memory; what matters is
// only how many weight bytes are in flight. Inductor, under the coordinate-descent tuning torchao's quantize_ turns
// on, writes these linears at one row as a float32 mul + sum reduction reading the 8-bit weight once.
//
// A warp owns R output columns and all of K: each lane reads 16 weights (16 bytes) of each of its R weight rows at
// k [16 lane + 512 j, + 16), U x S of them in flight, and the same 16 elements of x (staged once per CTA). The
// weights are widened as the mma.sync kernel widens them (widen16: int8 exactly, e4m3 times the row's scale
// rounded to x's dtype), the products summed in float32 over U x R independent chains, then over the warp's
// lanes (shuffles), and scaled once (int8: the scale after the sum). Rows of x (grid.y) each re-read the weights:
// the default takes this kernel at one row only, and for e4m3 weights only (launch_rows in decode_linear_w8.cuh).
#pragma once
#include "convert.cuh"  // to_float2
#include "cp_async.cuh"
#include "decode_gemm/widen8.cuh"  // widen16
#include "launch.cuh"
#include "pdl.cuh"

namespace fusekit {
namespace decode_w8 {

constexpr int kRowWarps = 4;

// acc + the dot product of 8 elements of x and 8 of w (4 words each)
template <typename T>
__device__ __forceinline__ float dot8(const uint4& x, const uint4& w, float acc) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = to_float2<T>(xs[i]), b = to_float2<T>(wv[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

constexpr int kRowThreads = kRowWarps * 32;
constexpr int kStepK = 32 * 16;  // k of one step of a warp: 16 bytes of a weight row per lane

// P: W8Params (decode_linear_w8.cuh). R output columns per warp; a stage is U steps (U x 16 bytes of each of the
// R weight rows per lane), S stages in flight.
//
// The weights go through cp.async into a ring of per-thread slots (a thread reads back only what it copied: no
// barrier), x's row into shared memory once. Loads into registers would not stay in flight: ptxas moves each
// 16-byte weight load down to its products (the mma.sync kernel's SASS shows the same at one row), so a lane
// waited on one load at a time.
template <typename T, int R, int U, int S, bool FP8, typename P>
__global__ void __launch_bounds__(kRowThreads) decode_linear_w8_row_kernel(const P p) {
  extern __shared__ uint4 smem[];
  uint4* ring = smem;                          // [S][U][R][kRowThreads]
  uint4* xs = smem + S * U * R * kRowThreads;  // x's row: K / 8 words of 8 elements
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = (blockIdx.x * kRowWarps + warp) * R, row = blockIdx.y;
  const int8_t* wq = static_cast<const int8_t*>(p.w);
  const int steps = (p.k + kStepK * U - 1) / (kStepK * U);
  float ws[R];  // fp8: each column's scale (not written by the kernels before: read ahead of the wait)
#pragma unroll
  for (int r = 0; r < R; ++r) ws[r] = FP8 && n0 + r < p.n ? static_cast<const float*>(p.scales)[n0 + r] : 0.f;
  const auto issue = [&](int j) {  // stage j's weights into ring slot j % S; past K or N: zeros
    uint4* st = ring + (j % S) * U * R * kRowThreads;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = (j * U + u) * kStepK + lane * 16;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool ok = kk < p.k && n0 + r < p.n;
        cp_async16(st + (u * R + r) * kRowThreads + tid, ok ? wq + static_cast<int64_t>(n0 + r) * p.k + kk : wq, ok);
      }
    }
  };
  pdl_wait();  // x, and the output: the kernels before (PDL)

  const T* x = static_cast<const T*>(p.x) + static_cast<int64_t>(row) * p.k;
  for (int c = tid; c < p.k / 8; c += kRowThreads) cp_async16(xs + c, x + 8 * c, true);
  for (int j = 0; j < S - 1; ++j) {  // x with the first stage's group
    if (j < steps) issue(j);
    cp_async_commit();
  }
  float acc[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[u][r] = 0.f;
  for (int j = 0; j < steps; ++j) {
    if (j + S - 1 < steps) issue(j + S - 1);  // into the slot this thread read at j - 1
    cp_async_commit();                        // empty past the end: the count stays S - 1 groups ahead
    cp_async_wait<S - 1>();
    if (j == 0) __syncthreads();  // x: copied by every thread
    const uint4* st = ring + (j % S) * U * R * kRowThreads;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = (j * U + u) * kStepK + lane * 16;
      if (kk >= p.k) break;  // K % 16 == 0: a lane's 16 elements all in or all out
      const uint4 a0 = xs[kk / 8], a1 = xs[kk / 8 + 1];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        uint4 w0, w1;
        widen16<T, FP8>(st[(u * R + r) * kRowThreads + tid], ws[r], w0, w1);
        acc[u][r] = dot8<T>(a1, w1, dot8<T>(a0, w0, acc[u][r]));
      }
    }
  }
  pdl_trigger();

  T* out = static_cast<T*>(p.out) + static_cast<int64_t>(row) * p.n;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u) s += acc[u][r];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (lane == 0 && n0 + r < p.n) {
      out[n0 + r] = from_float<T>(FP8 ? s : s * to_float(static_cast<const T*>(p.scales)[n0 + r]));
    }
  }
}

// The row GEMV where x's row fits its shared memory (K <= kRowMaxK) and rows fit grid.y; false: not launched.
constexpr int kRowMaxK = 32768;

template <typename T, bool FP8, typename P>
bool launch_row(const P& p, cudaStream_t stream) {
  constexpr int R = 2, U = 4, S = 2;
  constexpr int ring = S * U * R * kRowThreads * 16;
  if (p.k > kRowMaxK || p.m > 65535) return false;
  const auto kernel = decode_linear_w8_row_kernel<T, R, U, S, FP8, P>;
  static const int version = [&] {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        ring + kRowMaxK * static_cast<int>(sizeof(T))));
    return binary_version(kernel);
  }();
  const dim3 grid((p.n + kRowWarps * R - 1) / (kRowWarps * R), p.m);
  launch_ex(kernel, grid, dim3(kRowThreads), ring + p.k * sizeof(T), stream, pdl_allowed(version, 'g'), 0, p);
  return true;
}

}  // namespace decode_w8
}  // namespace fusekit
