// The decode-linear kernel shared by fusekit::decode_linear (one weight, or SwiGLU's gate and up) and
// fusekit::decode_qkv (the q, k and v projections of one input in one launch): a few rows of activations
// against weight matrices that are read once, straight from HBM, by as many thread blocks as fill the GPU.
//
// Why: at M <= 8 a linear is a pass over its weight, and cuBLAS's small-M kernels leave HBM bandwidth unused
// (H100: 2 MB k/v projections at 13% of the copy bandwidth); SwiGLU's gate and up then take two such passes
// plus an elementwise kernel, and q, k and v three launches. Here a CTA of 8 warps owns 8 output columns of
// one part (q, k or v: the grid's x covers the parts' column tiles in turn) or of both gated weights, 16*MT
// rows (gridDim.y covers more rows), and all of K: its warps take the 32-wide chunks in turn (neighbouring
// warps, neighbouring chunks) and issue every load of U chunks before any product, so a lane's weight and
// activation loads are in flight together; the warps' partial sums are added in shared memory. Tensor cores
// (mma.sync m16n8k16) do the products: each lane loads 8 consecutive k of one weight row and of its
// activation rows, and both operands take the same permutation of k inside a chunk (see mma_chunk), so no
// shuffle or shared-memory staging is needed. Weights are streamed past L1 (no_allocate); x, read by every
// column tile, stays in L1/L2. Runs on the current stream, no workspace; on sm_90+ launched with programmatic
// dependent launch (pdl.cuh).
//
// On an H100: faster than cuBLAS + Inductor's silu-mul for gate/up at 1-8 rows (1.04-1.13x); slower than
// cuBLAS for every plain linear (0.43-0.98x), so that rule is off by default. More columns per CTA (16-64)
// and K split over a thread-block cluster inside this kernel (2-8 CTAs, DSMEM reduction) are slower at the
// decode shapes (the cluster split wins only k/v at 1-8 rows, by up to 1.09x); 16 columns per CTA pay off
// only for decode_qkv at 17-32 rows (launch_rows' wide), where the activations that every column tile reads
// cost more than at a few rows.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "checks.h"       // FK_CHECK_CUDA, describe, aligned16
#include "convert.cuh"    // to_float, from_float
#include "fast_math.cuh"  // fast_silu, fast_gelu_tanh, fast_gelu_erf
#include "launch.cuh"     // binary_version, launch_ex
#include "mma.cuh"
#include "pdl.cuh"

namespace fusekit {
namespace decode_gemm {

constexpr int kWarps = 8;
constexpr int kChunk = 32;  // k per lane group per step: 4 lanes x 8 elements

// Both loads are volatile asm, as the products are, and unconditional (a lane past the edge reads the tensor's
// first 16 bytes and drops them): straight-line code keeps them in program order, all issued before the first
// product. (As __ldg behind branches, ptxas held fewer registers than one round of loads needs.)
__device__ __forceinline__ uint4 load_stream(const void* p) {  // a weight: read once, keep it out of L1
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ uint4 load_cached(const void* p) {  // an activation: every column tile reads it
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// One 32-wide k chunk of a 16x8 tile. Lane (g = lane/4, t = lane%4) holds k [8t, 8t+8) of activation rows g and
// g+8 (lo, hi) and of weight row g (w), as 4 words of 2 elements. m16n8k16 wants, per lane, k {2t, 2t+1, 2t+8,
// 2t+9} of a 16-wide slice; giving the first mma words 0-1 and the second words 2-3 maps each of the 32 k
// to one slot of one mma, identically for both operands, so the dot products are the chunk's.
template <typename T>
__device__ __forceinline__ void mma_chunk(float (&c)[4], const uint4& lo, const uint4& hi, const uint4& w) {
  mma16816<T>(c, lo.x, hi.x, lo.y, hi.y, w.x, w.y);
  mma16816<T>(c, lo.z, hi.z, lo.w, hi.w, w.z, w.w);
}

template <typename T>
__device__ __forceinline__ float round_to(float x) { return to_float(from_float<T>(x)); }

constexpr int kMaxParts = 3;

// NW = 2 (gated): one part, w[0] the gate and w[1] the up weight, out[0] = act(x w[0]^T) * (x w[1]^T), act SiLU
// (SwiGLU) or tanh-GELU (GeGLU) by `act`.
// NW = 1: `parts` weights of one K, each N a multiple of 8, out[i] = act(x w[i]^T (+ bias[i] where not null)), act
// none, GELU or tanh-GELU (a GPT-NeoX / Falcon / Phi-2 MLP's up projection); part i owns the column tiles (8 NB
// columns each) [tile_end[i-1], tile_end[i]) of the grid's x (set by launch).
struct Params {
  const void* x;
  const void* w[kMaxParts];
  void* out[kMaxParts];
  const void* bias[kMaxParts];
  int n[kMaxParts];
  int tile_end[kMaxParts];
  int parts;
  int m, k;
  int act;  // NW = 2: kSiluMul or kGeluTanhMul; NW = 1: kNoAct, kGelu or kGeluTanh
  const void* residual;  // null, or [m, n] of T added to the (one part's) output, rounded as eager's add
  const void* norm_w;    // the NORM kernels: x is h, and the products are RMSNorm(h) * norm_w's (below)
  float eps;
};

enum Act : int { kNoAct = 0, kSiluMul = 1, kGeluTanhMul = 2, kGelu = 3, kGeluTanh = 4 };

// Its part's index, selected with constant indices (a run-time index into the parameters would go through
// local memory).
template <typename V>
__device__ __forceinline__ V part_of(const V (&a)[kMaxParts], int j) { return j == 0 ? a[0] : j == 1 ? a[1] : a[2]; }

// The part (q, k or v) of column tile `tile` (blockIdx.x), and the tile's first column in it; `cols` per tile.
template <int NW>
__device__ __forceinline__ int tile_part(const Params& p, int tile, int cols, int& n0) {
  int j = 0;
  if constexpr (NW == 1) j = int(p.parts > 1 && tile >= p.tile_end[0]) + int(p.parts > 2 && tile >= p.tile_end[1]);
  n0 = (tile - (j == 0 ? 0 : part_of(p.tile_end, j - 1))) * cols;
  return j;
}

// Sets p.tile_end for tiles of `cols` columns; returns the tiles of all parts (the grid's x).
inline int set_tile_ends(Params& p, int cols) {
  int tiles = 0;
  for (int i = 0; i < p.parts; ++i) p.tile_end[i] = tiles += (p.n[i] + cols - 1) / cols;
  return tiles;
}

// The epilogue of one output element from its float32 sums (s1: the up weight's, gated only), rounded as eager.
// Gated (SwiGLU, GeGLU): act(gate) * up with both products, and act's result, in T. One weight: + bias in float32
// (one rounding, as cuBLAS's addmm), then GELU of that rounded value (F.gelu(F.linear(x, w, b))).
template <typename T, int NW>
__device__ __forceinline__ float epilogue(int act, float s0, float s1, const T* bias, int col) {
  if constexpr (NW == 2) {
    const float g = round_to<T>(s0);
    return round_to<T>(act == kGeluTanhMul ? fast_gelu_tanh(g) : fast_silu(g)) * round_to<T>(s1);
  } else {
    const float y = bias != nullptr ? s0 + to_float(bias[col]) : s0;
    return act == kGelu ? fast_gelu_erf(round_to<T>(y)) : act == kGeluTanh ? fast_gelu_tanh(round_to<T>(y)) : y;
  }
}

// The stored value of an output element: y rounded to T, plus the residual's element (when given) rounded again,
// as eager's `residual + linear(...)` of two T tensors.
// r: the residual's element, loaded beforehand (ignored without a residual).
template <typename T>
__device__ __forceinline__ T store_value(float y, const Params& p, float r) {
  return p.residual == nullptr ? from_float<T>(y) : from_float<T>(round_to<T>(y) + r);
}
// The same, the residual's element loaded here (idx: the element's index in out and residual).
template <typename T>
__device__ __forceinline__ T store_value(float y, const Params& p, int64_t idx) {
  return store_value<T>(y, p, p.residual == nullptr ? 0.f : to_float(static_cast<const T*>(p.residual)[idx]));
}

// ---- RMSNorm inside the GEMM (the NORM kernels) ----
// transformers' RMSNorm before a linear, `linear(w_norm * T(h * rsqrt(mean(h^2) + eps)), W)`, is computed as
// rsqrt(mean(h^2) + eps) * linear(T(h * w_norm), W): each CTA reads all of K of its rows anyway, so it adds up h^2
// from the values it loads and scales its float32 sums by the row's factor before the epilogue. One rounding of
// the normalized row (T(h * w_norm)) where eager has two; at a decode step's few rows this saves the RMSNorm's
// kernel (and, with the residual epilogue of the linear before, the residual add's).
// Two elements of h (a word) -> T(h * g) of both; their squares added to ss.
template <typename T>
__device__ __forceinline__ uint32_t norm_pair(uint32_t h, uint32_t g, float& ss) {
  float2 hf, gf;
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    hf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h));
    gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g));
    const __nv_bfloat162 y = __float22bfloat162_rn(make_float2(hf.x * gf.x, hf.y * gf.y));
    r = *reinterpret_cast<const uint32_t*>(&y);
  } else {
    hf = __half22float2(*reinterpret_cast<const __half2*>(&h));
    gf = __half22float2(*reinterpret_cast<const __half2*>(&g));
    const __half2 y = __float22half2_rn(make_float2(hf.x * gf.x, hf.y * gf.y));
    r = *reinterpret_cast<const uint32_t*>(&y);
  }
  ss = fmaf(hf.x, hf.x, fmaf(hf.y, hf.y, ss));
  return r;
}
// 8 elements of h (16 bytes) and of w_norm at the same k
template <typename T>
__device__ __forceinline__ uint4 norm_chunk(const uint4& h, const uint4& g, float& ss) {
  return make_uint4(norm_pair<T>(h.x, g.x, ss), norm_pair<T>(h.y, g.y, ss), norm_pair<T>(h.z, g.z, ss),
                    norm_pair<T>(h.w, g.w, ss));
}
// A row's RMSNorm factor from its sum of squares over K
__device__ __forceinline__ float rms_factor(float ss, const Params& p) { return rsqrtf(ss / p.k + p.eps); }

// ---- the end of a K split over a thread-block cluster (the split-K and TMA kernels) ----
constexpr int kTileCols = 64;              // output columns (weight rows) per CTA of both
constexpr int kRedStride = kTileCols + 4;  // floats per row of a partial tile: the fragment stores hit 32 banks
constexpr int kMaxClusterSplits = 8;       // the portable cluster size

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Cluster (1, S, 1), S = gridDim.y, rank = blockIdx.y; each CTA's float32 partial tile of its 64 columns is in its
// shared memory, weight w's [x row][column] at red + w * R * kRedStride. This CTA sums its share (column pairs
// rank, rank + S, ... of each row) over the ranks in rank order (deterministic), applies the epilogue (the gated
// activation of the two weights, or bias and activation), rounds once and stores; then no CTA leaves while another still reads its memory.
// ssq (the NORM kernels): each CTA's sums of squares of its x rows over its split of K, summed here in rank order.
template <typename T, int NW, int R, int kThreads>
__device__ __forceinline__ void cluster_sum_store(const Params& p, int j, int n0, const float* red,
                                                  const float* ssq = nullptr) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int split = blockIdx.y, splits = gridDim.y, n = part_of(p.n, j);
  const int rows = min(R, p.m), first = split * kThreads + threadIdx.x, step = splits * kThreads;
  // The residual's pairs of this thread's first kPre elements, loaded before the cluster's barrier so that their
  // latency hides behind it (after it, each store waited for its load).
  constexpr int kPre = 2;  // (the loop below picks pre[0] or pre[1])
  float2 pre[kPre];
  const T* res = static_cast<const T*>(p.residual);
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int e = first + i * step, row = e / (kTileCols / 2), col = 2 * (e % (kTileCols / 2));
    pre[i] = make_float2(0.f, 0.f);
    if (res != nullptr && e < rows * (kTileCols / 2) && n0 + col < n) {
      const int64_t idx = static_cast<int64_t>(row) * n + n0 + col;
      pre[i] = make_float2(to_float(res[idx]), to_float(res[idx + 1]));
    }
  }
  cluster.sync();  // every split's partial tile written (release/acquire across the cluster)
  T* out = static_cast<T*>(part_of(p.out, j));
  const T* bias = static_cast<const T*>(NW == 1 ? part_of(p.bias, j) : nullptr);
  int it = 0;
  for (int e = first; e < rows * (kTileCols / 2); e += step, ++it) {
    const int row = e / (kTileCols / 2), col = 2 * (e % (kTileCols / 2));
    if (n0 + col >= n) continue;  // n is a multiple of 8: both columns in or both out
    float2 v[NW][kMaxClusterSplits];  // every split's pair loaded first (one round trip), then summed in rank order
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float* mine = red + (w * R + row) * kRedStride + col;
#pragma unroll
      for (int q = 0; q < kMaxClusterSplits; ++q) {
        if (q >= splits) break;
        v[w][q] = *reinterpret_cast<const float2*>(cluster.map_shared_rank(mine, q));
      }
    }
    float2 s[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      s[w] = v[w][0];
#pragma unroll
      for (int q = 1; q < kMaxClusterSplits; ++q) {
        if (q >= splits) break;
        s[w].x += v[w][q].x, s[w].y += v[w][q].y;
      }
    }
    if (ssq != nullptr) {
      float ss = 0.f;
      for (int q = 0; q < splits; ++q) ss += *cluster.map_shared_rank(ssq + row, q);
      const float f = rms_factor(ss, p);
#pragma unroll
      for (int w = 0; w < NW; ++w) s[w].x *= f, s[w].y *= f;
    }
    const float y0 = epilogue<T, NW>(p.act, s[0].x, s[NW - 1].x, bias, n0 + col);
    const float y1 = epilogue<T, NW>(p.act, s[0].y, s[NW - 1].y, bias, n0 + col + 1);
    const int64_t idx = static_cast<int64_t>(row) * n + n0 + col;
    if (it < kPre) {
      const float2 r = it == 0 ? pre[0] : pre[1];  // (constant indices: pre stays in registers)
      out[idx] = store_value<T>(y0, p, r.x);
      out[idx + 1] = store_value<T>(y1, p, r.y);
    } else {
      out[idx] = store_value<T>(y0, p, idx);
      out[idx + 1] = store_value<T>(y1, p, idx + 1);
    }
  }
  // the reads of other CTAs' memory are done: a relaxed barrier, no release needed
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
#endif

// CTA: 8 warps, 8 NB columns (blockIdx.x) of one part (or of both gated weights), 16*MT rows (blockIdx.y), all
// of K. NB = 2 halves the column tiles, so x (read by every tile) is read half as often (launch_rows' wide).
// NORM: x is h, normalized as it is loaded (the RMSNorm section above).
template <typename T, int MT, int NW, int NB, bool NORM = false>
__global__ void __launch_bounds__(kWarps * 32) decode_linear_kernel(const Params p) {
  constexpr int U = MT * NW * NB <= 2 ? 4 : 2;  // chunks in flight per lane: fewer loads per chunk, more chunks
  constexpr int F = NB * MT * 4;                // accumulators per lane and weight
  extern __shared__ float red[];                // [kWarps][NW][F][32]: the warps' partial sums; NORM: then
                                                // [kWarps][16 MT] the warps' sums of squares of each row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int n0;
  const int j = tile_part<NW>(p, blockIdx.x, 8 * NB, n0);  // the part this CTA's columns belong to
  const int m0 = blockIdx.y * 16 * MT, n = part_of(p.n, j);
  const T* wts[NW];
#pragma unroll
  for (int w = 0; w < NW; ++w) wts[w] = static_cast<const T*>(NW == 1 ? part_of(p.w, j) : p.w[w]);
  const int chunks = (p.k + kChunk - 1) / kChunk;
  const T* x = static_cast<const T*>(p.x);
  pdl_wait();  // x, and the output: the kernels before (PDL)

  float acc[NW][NB * MT][4];  // [w][nb * MT + i]
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < NB * MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[w][i][c] = 0.f;
  float ss[MT][2] = {};  // NORM: this lane's sums of squares of rows g and g + 8 of each 16-row tile
  const T* gw = static_cast<const T*>(p.norm_w);

  for (int c0 = warp; c0 < chunks; c0 += kWarps * U) {
    uint4 a[U][MT][2], b[U][NW][NB], nw[NORM ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of U chunks first, then their products
      const int kk = (c0 + u * kWarps) * kChunk + t * 8;
      const bool kin = kk < p.k;  // K % 8 == 0: a lane's 8 elements all in or all out
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + i * 16 + h * 8 + g;
          const bool ok = kin && row < p.m;
          a[u][i][h] = load_cached(ok ? x + static_cast<int64_t>(row) * p.k + kk : x);
          if (!ok) a[u][i][h] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
      for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          const int col = n0 + nb * 8 + g;
          const bool ok = kin && col < n;
          const T* wp = wts[w];
          b[u][w][nb] = load_stream(ok ? wp + static_cast<int64_t>(col) * p.k + kk : wp);
          if (!ok) b[u][w][nb] = make_uint4(0, 0, 0, 0);
        }
      if constexpr (NORM) {
        nw[u] = load_cached(kin ? gw + kk : gw);
        if (!kin) nw[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if constexpr (NORM) {  // (8-row groups past m hold zeros: skipped, a warp-uniform branch)
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (m0 + i * 16 + h * 8 < p.m) a[u][i][h] = norm_chunk<T>(a[u][i][h], nw[u], ss[i][h]);
          }
      }
#pragma unroll
      for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int i = 0; i < MT; ++i) mma_chunk<T>(acc[w][nb * MT + i], a[u][i][0], a[u][i][1], b[u][w][nb]);
    }
  }
  pdl_trigger();
  float* sq = red + kWarps * NW * F * 32;
  if constexpr (NORM) {  // the four lanes of a row (t) summed, then one per warp and row to shared memory
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = ss[i][h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (t == 0) sq[warp * 16 * MT + i * 16 + h * 8 + g] = v;
      }
  }

  // the warps' sums, in warp order (deterministic), then the epilogue; C fragment: c0,c1 row g, c2,c3 row g+8,
  // columns 2t, 2t+1
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < NB * MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[((warp * NW + w) * F + i * 4 + c) * 32 + lane] = acc[w][i][c];
  __syncthreads();
  T* out = static_cast<T*>(part_of(p.out, j));
  const T* bias = static_cast<const T*>(NW == 1 ? part_of(p.bias, j) : nullptr);
  for (int e = threadIdx.x; e < F * 32; e += kWarps * 32) {
    const int l = e % 32, f = e / 32, c = f % 4, i = f / 4 % MT, nb = f / (4 * MT);
    const int row = m0 + i * 16 + (l / 4) + (c / 2) * 8, col = n0 + nb * 8 + (l % 4) * 2 + c % 2;
    float s[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      s[w] = 0.f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) s[w] += red[((v * NW + w) * F + f) * 32 + l];
    }
    if constexpr (NORM) {
      float q = 0.f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) q += sq[v * 16 * MT + row - m0];
      const float fct = rms_factor(q, p);
#pragma unroll
      for (int w = 0; w < NW; ++w) s[w] *= fct;
    }
    if (row < p.m && col < n) {
      const int64_t idx = static_cast<int64_t>(row) * n + col;
      out[idx] = store_value<T>(epilogue<T, NW>(p.act, s[0], s[NW - 1], bias, col), p, idx);
    }
  }
}

template <typename T, int MT, int NW, int NB, bool NORM = false>
void launch(Params p, cudaStream_t stream) {
  const dim3 grid(set_tile_ends(p, 8 * NB), (p.m + 16 * MT - 1) / (16 * MT));
  const size_t smem = sizeof(float) * kWarps * (NW * NB * MT * 4 * 32 + (NORM ? 16 * MT : 0));  // <= 34 KB
  static const int version = binary_version(decode_linear_kernel<T, MT, NW, NB, NORM>);
  launch_ex(decode_linear_kernel<T, MT, NW, NB, NORM>, grid, dim3(kWarps * 32), smem, stream,
            pdl_allowed(version, 'g'), 0, p);
}

// p.n and p.parts set; the column tiles are counted here. wide (decode_qkv): 16 columns per CTA at 17-32 rows,
// where x, read by every column tile, outweighs the weights: Llama-style q+k+v 14.6 -> 10.3 us at 32 rows on an
// H100; plain linears and 1-16 rows are slower wide.
template <typename T, int NW, bool NORM = false>
void launch_rows(const Params& p, cudaStream_t stream, bool wide = false) {
  if (p.m <= 16) return launch<T, 1, NW, 1, NORM>(p, stream);
  if (p.m <= 32) {
    if constexpr (NW == 1) {
      if (wide) return launch<T, 2, NW, 2, NORM>(p, stream);
    }
    return launch<T, 2, NW, 1, NORM>(p, stream);
  }
  launch<T, 4, NW, 1, NORM>(p, stream);
}

// Host side: the checks both ops make, and the rows of x.
inline void check_x(const at::Tensor& x, const char* op) {
  FK_CHECK_CUDA(x);
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, "fusekit: ", op,
              " takes float16 or bfloat16, got x ", describe(x));
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && aligned16(x.data_ptr()), "fusekit: ", op,
              ": x must be contiguous and 16-byte aligned; got ", describe(x));
  TORCH_CHECK(x.size(-1) % 8 == 0 && x.size(-1) < (int64_t{1} << 31), "fusekit: ", op,
              ": K = x.shape[-1] must be a multiple of 8 (below 2^31); got x ", describe(x));
}

inline void check_weight(const at::Tensor& x, const at::Tensor& w, const char* op, const char* name) {
  TORCH_CHECK(w.dim() == 2 && w.size(1) == x.size(-1), "fusekit: ", op, ": ", name, " must be [N, K] with K = ",
              "x.shape[-1]; got x ", describe(x), ", ", name, " ", describe(w));
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && w.device() == x.device(), "fusekit: ", op, ": ", name,
              " must have x's dtype and device; got x ", describe(x), ", ", name, " ", describe(w));
  TORCH_CHECK(w.is_contiguous() && aligned16(w.data_ptr()), "fusekit: ", op, ": ", name,
              " must be contiguous and 16-byte aligned; got ", describe(w));
  TORCH_CHECK(w.size(0) % 8 == 0 && w.size(0) < (int64_t{1} << 28), "fusekit: ", op, ": ", name,
              "'s N must be a multiple of 8 (below 2^28); got ", describe(w));
}

// A bias of weight w (none, or a contiguous [N] of x's dtype and device).
inline void check_bias(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, const char* op,
                       const char* name) {
  if (!b.has_value()) return;
  TORCH_CHECK(b->dim() == 1 && b->size(0) == w.size(0) && b->is_contiguous() &&
                  b->scalar_type() == x.scalar_type() && b->device() == x.device(),
              "fusekit: ", op, ": ", name, " must be a contiguous [N] vector of x's dtype and device, N its weight's;",
              " got x ", describe(x), ", weight ", describe(w), ", ", name, " ", describe(*b));
}

inline int64_t rows(const at::Tensor& x, const char* op) {
  int64_t m = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) m *= x.size(i);
  TORCH_CHECK(m <= 65535 * 16, "fusekit: ", op, ": too many rows (", m, ") in x ", describe(x));
  return m;
}

inline at::Tensor out_like(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return at::empty(shape, x.options());
}

}  // namespace decode_gemm
}  // namespace fusekit
