// The split-K decode-linear kernel (sm_90): decode_linear_kernel's products with the roles of the operands
// swapped and K split over a thread-block cluster, for the 1-64 rows of a decode step.
//
// Why: decode_linear_kernel's CTA owns 8 output columns and all of K, so every CTA reads all of x: at 32 rows
// that is 4 activation loads per weight load, and x (128 KB at K = 2048) is read through L2 once per 8 columns.
// cuBLAS's nvjet kernels reach 45-73% of the copy bandwidth at 32 rows (H100: o 6.2 us for 8 MB, gate and up
// 10.6 us each for 23 MB). Here weight rows are the mma's M side (16 per warp, 64 per
// CTA) and x's rows its N side (8 per mma, XM mmas), so one x fragment serves 16 weight rows, and a CTA takes
// a slice of K: x's slice sits in shared memory, loaded once (cp.async) while the first weight loads are in
// flight. The S CTAs of a cluster take the S slices of K of one 64-column tile and add their fp32 partial tiles
// through distributed shared memory, each CTA summing 1/S of the tile in rank order (deterministic) and writing
// it with the epilogue (silu-mul, bias). No workspace, no counters, no second launch: CUDA-graph safe.
//
// Weight loads as in decode_linear_kernel: lane (g, t) reads 8 consecutive k of weight rows g and g+8 straight
// into registers (16-byte streaming loads, U chunks of 32 k in flight per warp), x's 8 k of its row g from
// shared memory, and both operands take the same permutation of k (mma_chunk's), so no ldmatrix is needed.
//
// On an H100: faster than cuBLAS and than decode_linear_kernel for q+k+v at 33-64 rows only (Llama-style
// 1.29-1.37x cuBLAS); at 1-32 rows no faster than decode_linear_kernel, and on the plain o/down projections
// slower than cuBLAS at every K split. So launch_decode_linear runs it for decode_qkv at 33-64 rows where the
// TMA kernel does not run.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cp_async.cuh"
#include "debug_overrides.h"  // FUSEKIT_DECODE_GEMM
#include "decode_linear.cuh"
#include "decode_linear_tma.cuh"
#include "launch.cuh"  // sm_count, opt_in_smem, binary_version, launch_ex
#include "mma.cuh"
#include "pdl.cuh"

namespace fusekit {
namespace decode_gemm {

constexpr int kSkWarps = 4;
constexpr int kSkCols = kTileCols;  // output columns (weight rows) per CTA and weight: 16 per warp
static_assert(kSkCols == 16 * kSkWarps);
constexpr int kSkMaxSplits = kMaxClusterSplits;

// Elements per row of x's slice in shared memory: the slice rounded up to 64, plus 32, so rows g and g+1 of one
// 16-byte-per-lane load are 64 bytes apart modulo 128 (no bank conflict within a quarter warp).
__host__ __device__ constexpr int x_stride(int chunks_per_split) { return (chunks_per_split * kChunk + 63) / 64 * 64 + 32; }

// Grid (column tiles of all parts, S); cluster (1, S, 1): blockIdx.y is the split and the rank in the cluster.
// XM: x row tiles of 8 (rows 8*XM >= m); NW as decode_linear_kernel's (2: gate and up, silu-mul epilogue).
template <typename T, int XM, int NW>
__global__ void __launch_bounds__(kSkWarps * 32) decode_linear_splitk_kernel(const Params p, int chunks_per_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // no clusters: never launched (splitk_built is false for such a build)
#else
  constexpr int U = NW == 2 ? 4 : 8;  // chunks of 32 k in flight per warp
  constexpr int R = 8 * XM;           // x rows held (rows >= m are zeros)
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);  // [R][x_stride]; after the products, the partial tile (red)
  const int stride = x_stride(chunks_per_split);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int split = blockIdx.y;
  int n0;
  const int j = tile_part<NW>(p, blockIdx.x, kSkCols, n0);  // the part this CTA's columns belong to
  const int n = part_of(p.n, j);
  const int chunks = (p.k + kChunk - 1) / kChunk;
  const int c_beg = split * chunks_per_split, c_end = min(chunks, c_beg + chunks_per_split);
  const T* x = static_cast<const T*>(p.x);
  pdl_wait();  // x, and the output: the kernels before (PDL)

  // x's slice: rows [0, R) (zeros past m), k [c_beg * 32, c_end * 32) (zeros past K)
  const int per_row = (c_end - c_beg) * (kChunk / 8);
  for (int e = threadIdx.x; e < R * per_row; e += kSkWarps * 32) {
    const int r = e / per_row, c8 = e % per_row, kk = c_beg * kChunk + c8 * 8;
    const bool ok = r < p.m && kk < p.k;
    cp_async16(xs + r * stride + c8 * 8, ok ? x + static_cast<int64_t>(r) * p.k + kk : x, ok);
  }
  cp_async_commit();

  // this lane's weight rows: n0 + 16 warp + g and + 8, of each weight
  const T* wrow[NW][2];
  bool rok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int col = n0 + warp * 16 + h * 8 + g;
    rok[h] = col < n;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const T* base = static_cast<const T*>(NW == 1 ? part_of(p.w, j) : p.w[w]);
      wrow[w][h] = rok[h] ? base + static_cast<int64_t>(col) * p.k : base;
    }
  }

  float acc[NW][XM][4];
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < XM; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[w][i][c] = 0.f;

  bool x_ready = false;
  for (int c0 = c_beg; c0 < c_end; c0 += U) {
    uint4 b[U][NW][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every weight load of U chunks, then the products
      const int kk = (c0 + u) * kChunk + t * 8;
      const bool kin = c0 + u < c_end && kk < p.k;  // K % 8 == 0: a lane's 8 elements all in or all out
#pragma unroll
      for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool ok = kin && rok[h];
          b[u][w][h] = load_stream(ok ? wrow[w][h] + kk : wrow[w][h]);
          if (!ok) b[u][w][h] = make_uint4(0, 0, 0, 0);
        }
    }
    if (!x_ready) {  // once, with the first weight loads in flight (every warp runs the same trips)
      cp_async_wait<0>();
      __syncthreads();
      x_ready = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u >= c_end) break;
      const T* xp = xs + g * stride + (c0 + u - c_beg) * kChunk + t * 8;
#pragma unroll
      for (int i = 0; i < XM; ++i) {
        const uint4 xf = *reinterpret_cast<const uint4*>(xp + i * 8 * stride);
#pragma unroll
        for (int w = 0; w < NW; ++w) {  // A: weight rows g, g+8 (16 x 16); B: x rows (16 x 8), k permuted alike
          mma16816<T>(acc[w][i], b[u][w][0].x, b[u][w][1].x, b[u][w][0].y, b[u][w][1].y, xf.x, xf.y);
          mma16816<T>(acc[w][i], b[u][w][0].z, b[u][w][1].z, b[u][w][0].w, b[u][w][1].w, xf.z, xf.w);
        }
      }
    }
  }
  pdl_trigger();
  if (!x_ready) cp_async_wait<0>();  // an empty split still waits for its copies
  __syncthreads();  // every warp is done with xs

  // the partial tile, red[w][row][col] (row: x's row, col: the tile's column); C fragment: c0, c1 weight row g,
  // x rows 2t, 2t+1; c2, c3 weight row g + 8
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < XM; ++i) {
      float* r0 = red + (w * R + i * 8 + 2 * t) * kRedStride + warp * 16 + g;
      r0[0] = acc[w][i][0];
      r0[kRedStride] = acc[w][i][1];
      r0[8] = acc[w][i][2];
      r0[kRedStride + 8] = acc[w][i][3];
    }

  cluster_sum_store<T, NW, R, kSkWarps * 32>(p, j, n0, red);
#endif
}

constexpr size_t kSkSmemBudget = 112 * 1024;  // x's slice per CTA: two CTAs per SM at the least

template <typename T>
constexpr size_t slice_bytes(int rows, int chunks_per_split) { return size_t(rows) * x_stride(chunks_per_split) * sizeof(T); }

// K split per column tile: S in [1, 8], at least 4 chunks (128 k) per split and x's slice within the budget,
// minimizing the CTAs an SM runs in turn times each one's chunks plus a fixed cost of ~4 chunks (x's slice, the
// cluster's two barriers, the reduction). 0: no split fits (K too long for 8 splits of this many rows).
template <typename T>
int splitk_splits(int tiles, int chunks, int rows) {
  const int sms = sm_count();
  int best = 0;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= kSkMaxSplits; ++s) {
    const int per = (chunks + s - 1) / s;
    if (s > 1 && per < 4) break;
    if ((chunks + per - 1) / per < s || slice_bytes<T>(rows, per) > kSkSmemBudget) continue;  // empty split, too big
    const int64_t cost = (int64_t(tiles) * s + sms - 1) / sms * (per + 4);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

// Whether this build's kernel has clusters (sm_90+); without them it runs one split only, so it is not used.
template <typename T, int XM, int NW>
bool splitk_built() {
  static const bool yes = binary_version(decode_linear_splitk_kernel<T, XM, NW>) >= 90;
  return yes;
}

// Launches with S splits (0: splitk_splits's choice); false, launching nothing, where no split fits or the build
// has no clusters.
template <typename T, int XM, int NW>
bool launch_splitk(Params p, cudaStream_t stream, int splits = 0) {
  if (!splitk_built<T, XM, NW>()) return false;
  const int tiles = set_tile_ends(p, kSkCols);
  const int chunks = (p.k + kChunk - 1) / kChunk;
  int s = splits > 0 ? std::min(splits, kSkMaxSplits) : splitk_splits<T>(tiles, chunks, 8 * XM);
  if (s == 0) return false;
  const int per = (chunks + s - 1) / s;
  s = (chunks + per - 1) / per;  // no empty split
  const size_t smem = std::max(slice_bytes<T>(8 * XM, per), size_t(NW) * 8 * XM * kRedStride * sizeof(float));
  if (smem > kSkSmemBudget) return false;
  if (smem > 48 * 1024) opt_in_smem<decode_linear_splitk_kernel<T, XM, NW>>(kSkSmemBudget);
  launch_ex(decode_linear_splitk_kernel<T, XM, NW>, dim3(tiles, s), dim3(kSkWarps * 32), smem, stream,
            pdl_allowed(90, 'g'), s, p, per);  // (splitk_built: an sm_90 binary)
  return true;
}

// Whether the measured selection takes the TMA kernel (sm_90a builds): every plain linear of 1-64 rows, gate/up
// at 9-64 and q/k/v at 17-64 (below those decode_linear_kernel is as fast). H100, Llama-style, op alone, cold
// weights, us, cuBLAS -> TMA at 32 rows: o 6.5 -> 6.7, down 13.4 -> 11.5, lm_head 52.0 -> 50.0; gate/up with
// silu (cuBLAS + Inductor 25.6) 22.5 -> ~21; q+k+v decode_linear_kernel 10.1 -> 8.0; at 1 and 8 rows o 6.3 ->
// 5.7-5.9, down 12.6 -> 10.8.
inline bool tma_selected(int m, int nw, bool qkv) {
  if (!tma_built() || m > 64) return false;
  return qkv ? m > 16 : nw == 2 ? m > 8 : true;
}

// Every launch of decode_linear and decode_qkv. Measured selection (H100, cold weights, op alone): the TMA kernel
// where tma_selected says; else the split-K kernel for q/k/v at 33-64 rows (Llama-style 17.7 -> 13.0-13.7 us,
// decode_linear_kernel 20.8-23.0), decode_linear_kernel elsewhere. The FUSEKIT_DECODE_GEMM test override
// (debug_overrides.h) forces one kernel instead.
// NORM (x is h, RMSNorm inside): the TMA kernel wherever it is built (the override "old": decode_linear_kernel).
// There each CTA normalizes its x boxes once per stage; decode_linear_kernel's 8-column CTAs each normalize the rows
// they read, 8 times the work: H200, Llama-style b1 step, gate/up with the norm 24.6 us there against 17.0 on the
// TMA kernel (and 16.4 + 2.3 for the plain kernel and Inductor's add + RMSNorm).
template <typename T, int NW, bool NORM = false>
void launch_decode_linear(const Params& p, cudaStream_t stream, bool qkv = false) {
  const debug::DecodeGemmOverride o = debug::decode_gemm_override();
  if constexpr (NORM) {
    const bool tma = o.kernel != 0;
    if (!(tma && launch_tma_norm<T, NW>(p, stream, p.m > 8, p.m > 8 ? 4 : kTmaMaxSplits))) {
      launch_rows<T, NW, true>(p, stream, /*wide=*/qkv);
    }
    return;
  }
  const int forced = o.kernel, splits = o.splits, stages = o.stages, boxes = o.boxes;
  const bool early = o.early;
  if (forced == 2 && launch_tma<T, NW>(p, stream, splits, early, stages, boxes)) return;
  // In a decode step (H100, Llama-style @1024, CUDA graphs): above 8 rows the first weight tiles issued before
  // pdl_wait and at most 4 splits (b32 0.867 -> 0.844 ms, b64 1.173 -> 1.163); at 1-8 rows neither (b1 0.573
  // against 0.578-0.589, b8 0.647 against 0.644-0.660).
  if (forced == -1 && tma_selected(p.m, NW, qkv) && launch_tma<T, NW>(p, stream, 0, p.m > 8, 0, 1, p.m > 8 ? 4 : kTmaMaxSplits)) {
    return;
  }
  const bool splitk = forced == 1 ? p.m <= 64 : forced == -1 && qkv && p.m > 32 && p.m <= 64;
  bool done = false;
  if (splitk) {
    if (p.m <= 8) done = launch_splitk<T, 1, NW>(p, stream, splits);
    else if (p.m <= 16) done = launch_splitk<T, 2, NW>(p, stream, splits);
    else if (p.m <= 32) done = launch_splitk<T, 4, NW>(p, stream, splits);
    else done = launch_splitk<T, 8, NW>(p, stream, splits);
  }
  if (!done) launch_rows<T, NW>(p, stream, /*wide=*/qkv);
}

}  // namespace decode_gemm
}  // namespace fusekit
