// The TMA decode-linear kernel (sm_90a): decode_linear's products with the weight streamed through a deep
// shared-memory ring by the Tensor Memory Accelerator and multiplied on wgmma, for the 9-64 rows of a decode step.
//
// Why: at 32 rows cuBLAS's nvjet kernels stream the weights at 45-73% of the copy bandwidth (H100, Llama-style
// b32: o 6.2 us for 8 MB, gate and up 10.9 us each for 23 MB, down 10.5 + 2.0 us), and fusekit's register-batch
// kernels (decode_linear.cuh, decode_linear_splitk.cuh) no better: each warp's loads are a chain of round trips
// held in registers. Here one producer warp keeps up to kTmaMaxStages 64 x 64 weight tiles (8 KB each, and x's
// matching 64-wide slice) in flight per CTA with cp.async.bulk.tensor (mbarrier complete_tx), and one consumer
// warpgroup multiplies each stage as it lands: wgmma m64nXk16 with the 64 weight rows as M and x's rows as N
// (X = 8/16/32/64 >= rows), both operands K-major in 128-byte-swizzled shared memory, float32 sums. Weights do
// not depend on the kernel before, so the first stages' weight tiles are issued before pdl_wait (PDL); x's
// after it. K is split over a thread-block cluster of S <= 8 CTAs as in the split-K kernel: each CTA's float32
// partial tile goes to its shared memory and every CTA sums 1/S of the tile over the ranks in rank order through
// distributed shared memory (deterministic; no workspace, CUDA-graph safe), then the epilogue (silu-mul, bias).
//
// Tensor maps (the TMA descriptors) are built on the host per call for x, and once per weight (cached by
// address, shape and dtype: a map is a function of those alone); the driver's encoder comes through the
// runtime's entry-point query (no libcuda link). Built only where the extension is compiled for sm_90a
// (FUSEKIT_SM90A); elsewhere tma_built() is false and the other kernels run.
//
// F8: the float8 per-row form (decode_linear_fp8.cuh): x's e4m3 copy and the e4m3 weights in the same 128-byte
// rows (128 k per box, not 64), wgmma m64nXk32 e4m3 (native on sm_90a, K-major as here), and each partial sum
// times x's row scale and the weight's column scale before the cluster's sum.
//
// W8: the 8-bit weight-only form (decode_linear_w8.cuh; 1: int8, 2: e4m3 with float32 row scales). A stage is one
// 8-bit box of the weights (128 k) and x's two 64-wide boxes (KB = 2). Each consumer thread reads its wgmma A
// fragments' weights (two rows, 4 of each 16 k) out of the 8-bit box, widens them in registers (widen8.cuh: int8
// exactly, e4m3 times its row's scale rounded once) and wgmma takes A from registers (wgmma_rs.cuh), x from shared
// memory; the next stage is widened while the tensor cores multiply this one (two fragment sets, wait_group 1). The
// 8-bit weight is read from HBM once (half the 16-bit bytes), never widened in shared memory, and x is staged once
// per CTA, where the mma.sync kernel re-reads x for every 16 columns. int8's column scale multiplies the sums before
// the cluster's sum.
#pragma once
#include <c10/cuda/CUDAFunctions.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "decode_linear.cuh"
#include "launch.cuh"  // sm_count, opt_in_smem, launch_ex
#include "mbarrier.cuh"  // mbar_*, smem_u32
#include "pdl.cuh"
#include "wgmma_rs.cuh"  // W8: wgmma_rs_k16
#include "widen8.cuh"  // W8: widen_rows2

namespace fusekit {
namespace decode_gemm {

constexpr int kTmaCols = kTileCols;    // weight rows (output columns) per CTA: the wgmma's M
constexpr int kTmaBK = 64;             // k per box: one 128-byte swizzled row of bf16/fp16 (F8: 128 k)
constexpr int kTmaThreads = 160;       // one consumer warpgroup, one producer warp
constexpr int kTmaMaxStages = 8;
constexpr int kTmaMaxSplits = kMaxClusterSplits;
constexpr size_t kTmaSmemBudget = 110 * 1024;  // two CTAs per SM
constexpr size_t kTmaSmemMax = 227 * 1024;     // an SM's all: two stages of four boxes

struct TmaParams {
  CUtensorMap wmap[kMaxParts];  // NW = 2: the gate's and the up weight's; NW = 1: each part's
  CUtensorMap xmap;
  Params p;
  int kb_per_split;  // 64-wide k blocks per split
  int stages;
  int early;         // 1: the first stages' weight tiles are issued before pdl_wait
  const float* x_scale;               // F8: x's row scales
  const float* w_scale[kMaxParts];    // F8: the weights' column scales (NW = 2: gate's, up's)
  const void* w8_scale;               // W8: the weight rows' scales (int8: [N] of T; e4m3: [N] float32)
};

// k per 128-byte box row: 64 of a 16-bit type, 128 of e4m3
template <bool F8>
__host__ __device__ constexpr int tma_box_k() { return F8 ? 2 * kTmaBK : kTmaBK; }

// A stage: KB (1 or 2) 64-wide k boxes of each weight's 64 rows and of x's MX rows (each box 128-byte rows,
// 1024-aligned); W8: the 8-bit weights' one box of 64 rows, then x's KB boxes.
__host__ __device__ constexpr int tma_stage_bytes(int nw, int mx, int kb, bool w8 = false) {
  return w8 ? (kTmaCols + mx * kb) * kTmaBK * 2 : (nw * kTmaCols + mx) * kTmaBK * 2 * kb;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A box of the tensor map at (c0 = k, c1 = row) into shared memory; `bar` counts its bytes.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
               ::"r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar)) : "memory");
}
// K-major operand in 128-byte-swizzled rows (8-row groups 1024 bytes apart); a k16 step adds 32 bytes.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  return (static_cast<uint64_t>((smem_u32(p) & 0x3FFFF) >> 4)) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
// 16 bits of shared memory (volatile: not moved above the mbarrier wait that makes them valid)
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {  // keep the accumulators out of the async window
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <bool Bf16>
__device__ __forceinline__ void wgmma_k16(float (&d)[4], uint64_t a, uint64_t b) {  // m64n8k16
  if constexpr (Bf16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(a), "l"(b), "r"(1));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(a), "l"(b), "r"(1));
  }
}

template <bool Bf16>
__device__ __forceinline__ void wgmma_k16(float (&d)[8], uint64_t a, uint64_t b) {  // m64n16k16
  if constexpr (Bf16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b), "r"(1));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b), "r"(1));
  }
}

template <bool Bf16>
__device__ __forceinline__ void wgmma_k16(float (&d)[16], uint64_t a, uint64_t b) {  // m64n32k16
  if constexpr (Bf16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(a), "l"(b), "r"(1));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(a), "l"(b), "r"(1));
  }
}

template <bool Bf16>
__device__ __forceinline__ void wgmma_k16(float (&d)[32], uint64_t a, uint64_t b) {  // m64n64k16
  if constexpr (Bf16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(1));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(1));
  }
}

// e4m3 x e4m3 -> float32 sums, m64nXk32: no transpose operands (8-bit wgmma takes K-major operands only);
// accumulate 0: d = a b (the first step of a box)
__device__ __forceinline__ void wgmma_e4m3_k32(float (&d)[4], uint64_t a, uint64_t b, int accumulate) {  // m64n8k32
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_e4m3_k32(float (&d)[8], uint64_t a, uint64_t b, int accumulate) {  // m64n16k32
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_e4m3_k32(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {  // m64n32k32
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_e4m3_k32(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {  // m64n64k32
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(a), "l"(b), "r"(accumulate));
}
#endif  // sm_90a helpers

// Grid (column tiles of all parts, S); cluster (1, S, 1): blockIdx.y is the split and the rank in the cluster.
// MX: x rows held (>= m; the rows past m are TMA's zero fill); NW as decode_linear_kernel's; F8: x and the weights
// e4m3 (T: the output's type). NORM (KB = 1, 16-bit): x is h; the consumers turn each stage's x box into
// T(h * w_norm) in place (adding up h^2 of their rows) before its products, and the epilogue scales by the rows'
// RMSNorm factors (decode_linear.cuh's RMSNorm section).
template <typename T, int MX, int NW, int KB, bool F8 = false, bool NORM = false, int W8 = 0>
__global__ void __launch_bounds__(kTmaThreads) decode_linear_tma_kernel(const __grid_constant__ TmaParams tp) {
  static_assert(!NORM || (KB == 1 && !F8), "the RMSNorm form reads one 16-bit x box per stage");
  static_assert(W8 == 0 || (NW == 1 && KB == 2 && !F8 && !NORM), "one 8-bit weight box of 128 k, two 16-bit x boxes");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BK = tma_box_k<F8>();  // k per box
  constexpr int WB = kTmaCols * kTmaBK * 2, XB = MX * kTmaBK * 2, SK = KB * BK;
  constexpr int SB = tma_stage_bytes(NW, MX, KB, W8 != 0);
  constexpr int XO = W8 ? WB : NW * KB * WB;  // x's boxes in a stage (W8: after the 8-bit box, 64 rows x 128 bytes)
  constexpr int R = MX / 2;  // accumulators per thread and weight
  const Params& p = tp.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int ns = tp.stages;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + ns * SB);
  uint64_t* empty = full + ns;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int n0;
  const int j = tile_part<NW>(p, blockIdx.x, kTmaCols, n0);
  const int split = blockIdx.y;
  const int kblocks = (p.k + SK - 1) / SK;  // stages of the whole K
  const int kb0 = split * tp.kb_per_split, nk = max(0, min(kblocks, kb0 + tp.kb_per_split) - kb0);
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; ++s) mbar_init(full + s, 1), mbar_init(empty + s, 4);
    mbar_init_fence();
  }
  __syncthreads();

  float acc[NW][R];
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < R; ++i) acc[w][i] = 0.f;
  // F8: each stage's products summed by the tensor cores alone, then added to acc by the CUDA cores (fp8 wgmma's
  // own accumulation keeps fewer bits than float32: the sums over a long K are promoted every 128 k, as cuBLAS and
  // DeepSeek-V3's kernels do)
  float part[F8 ? NW : 1][F8 ? R : 1];
  float ss[NORM ? (MX * 8 + 127) / 128 : 1] = {};  // NORM: h^2 of this consumer's x rows threadIdx / 8 + 16 q

  if (warp == 4) {  // producer: one lane issues every copy
    if (lane == 0) {
      const CUtensorMap* wm[NW];
#pragma unroll
      for (int w = 0; w < NW; ++w) wm[w] = NW == 2 ? &tp.wmap[w] : (j == 0 ? &tp.wmap[0] : j == 1 ? &tp.wmap[1] : &tp.wmap[2]);
      const int pre = min(ns, nk);
      const auto weights = [&](int i) {
        unsigned char* st = smem + (i % ns) * SB;
        if constexpr (W8 != 0) {
          tma_load(st, wm[0], (kb0 + i) * SK, n0, full + i % ns);  // 128 k of 8-bit weights
        } else {
#pragma unroll
          for (int w = 0; w < NW; ++w)
#pragma unroll
            for (int b = 0; b < KB; ++b) {
              tma_load(st + (w * KB + b) * WB, wm[w], (kb0 + i) * SK + b * BK, n0, full + i % ns);
            }
        }
      };
      const auto xs = [&](int i) {
#pragma unroll
        for (int b = 0; b < KB; ++b) {
          tma_load(smem + (i % ns) * SB + XO + b * XB, &tp.xmap, (kb0 + i) * SK + b * BK, 0, full + i % ns);
        }
      };
      if (tp.early) {  // the weights of the first stages: no kernel before writes them
        for (int i = 0; i < pre; ++i) mbar_expect_tx(full + i, SB), weights(i);
        pdl_wait();
        for (int i = 0; i < pre; ++i) xs(i);
      } else {
        pdl_wait();
        for (int i = 0; i < pre; ++i) mbar_expect_tx(full + i, SB), weights(i), xs(i);
      }
      for (int i = pre; i < nk; ++i) {
        mbar_wait(empty + i % ns, (i / ns - 1) & 1);  // the stage's last use is consumed
        mbar_expect_tx(full + i % ns, SB);
        weights(i);
        xs(i);
      }
    }
    __syncwarp();
  } else if constexpr (W8 != 0) {  // consumers, the 8-bit weight-only form
    const int g = lane / 4, t = lane % 4, r0 = 16 * warp + g;  // this thread's A rows: r0, r0 + 8 of the tile
    float s0 = 1.f, s8 = 1.f;  // e4m3: their scales (not written by the kernels before: read ahead of the wait)
    if constexpr (W8 == 2) {
      const float* sc = static_cast<const float*>(tp.w8_scale);
      s0 = n0 + r0 < p.n[0] ? sc[n0 + r0] : 0.f;
      s8 = n0 + r0 + 8 < p.n[0] ? sc[n0 + r0 + 8] : 0.f;
    }
    pdl_wait();  // (the epilogue's stores)
    // A of the 8 k16 steps of a stage: rows r0 and r0 + 8 of the 8-bit box (both r % 8 == g: the 128-byte swizzle
    // puts k chunk kk at chunk kk ^ g), k 2t, 2t + 1 and 2t + 8, 2t + 9 of each chunk (no bank conflicts: the eight
    // g read eight different chunks)
    const auto widen_stage = [&](const unsigned char* st, uint32_t (&a)[8][4]) {
      const uint32_t w0 = smem_u32(st) + r0 * 128 + 2 * t, w8 = w0 + 8 * 128;  // (shared addresses: ld.shared)
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint32_t c = (kk ^ g) * 16;
        const uint32_t lo = lds_u16(w0 + c) | lds_u16(w8 + c) << 16;          // k 2t, 2t + 1 of rows r0, r0 + 8
        const uint32_t hi = lds_u16(w0 + c + 8) | lds_u16(w8 + c + 8) << 16;  // k 2t + 8, 2t + 9
        decode_w8::widen_rows2<T, W8 == 2>(lo, s0, s8, a[kk][0], a[kk][1]);
        decode_w8::widen_rows2<T, W8 == 2>(hi, s0, s8, a[kk][2], a[kk][3]);
      }
    };
    const auto multiply = [&](const unsigned char* st, const uint32_t (&a)[8][4]) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint64_t xd = smem_desc(st + XO + (kk / 4) * XB) + 2 * (kk % 4);  // x box kk / 4, its k16 step kk % 4
        wgmma_rs_k16<std::is_same_v<T, __nv_bfloat16>>(acc[0], a[kk], xd);
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
    uint32_t af[2][8][4];  // two stages' fragments: stage i widened while stage i - 1 multiplies
    fence_regs(acc[0]);
    for (int i0 = 0; i0 < nk; i0 += 2) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = i0 + h;
        if (i < nk) {
          mbar_wait(full + i % ns, (i / ns) & 1);
          unsigned char* st = smem + (i % ns) * SB;
          widen_stage(st, af[h]);
          multiply(st, af[h]);
          asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // stage i - 1's products are done
          if (i > 0 && lane == 0) mbar_arrive(empty + (i - 1) % ns);       // its x box is free
        }
      }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_regs(acc[0]);
    pdl_trigger();
  } else {  // consumers: the warpgroup multiplies each stage as it lands
    pdl_wait();  // (the epilogue's stores)
    if (p.residual != nullptr && threadIdx.x < min(MX, p.m)) {
      // the residual's 128-byte line of this tile's row threadIdx, into L2 while the ring streams: it was written
      // kernels before and the weights streamed since may have evicted it (the epilogue's load then missed)
      const T* line = static_cast<const T*>(p.residual) + static_cast<int64_t>(threadIdx.x) * part_of(p.n, j) + n0;
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(line));
    }
    for (int i = 0; i < nk; ++i) {
      const int s = i % ns;
      uint4 g = make_uint4(0, 0, 0, 0);
      if constexpr (NORM) {  // this thread's 8 k of w_norm, loaded before the stage lands: the 16-byte chunk
        // threadIdx % 8 of rows threadIdx / 8 (+ 16 q) holds k chunk (threadIdx % 8) ^ (row % 8) (128-byte swizzle)
        const int k = (kb0 + i) * SK + ((threadIdx.x % 8) ^ ((threadIdx.x / 8) % 8)) * 8;
        if (k < p.k) g = load_cached(static_cast<const T*>(p.norm_w) + k);
      }
      mbar_wait(full + s, (i / ns) & 1);
      unsigned char* st = smem + s * SB;
      if constexpr (NORM) {
#pragma unroll
        for (int q = 0; q < (MX * 8 + 127) / 128; ++q) {
          const int e = threadIdx.x + 128 * q;  // 16-byte chunk e of the MX x 128-byte box
          if (e < MX * 8) {
            uint4* c = reinterpret_cast<uint4*>(st + XO + e * 16);
            *c = norm_chunk<T>(*c, g, ss[q]);
          }
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the writes, before wgmma reads them
        asm volatile("bar.sync 1, 128;\n" ::: "memory");                 // every consumer's
      }
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        if constexpr (F8) {
          fence_regs(part[w]);
        } else {
          fence_regs(acc[w]);
        }
      }
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int b = 0; b < KB; ++b) {
        const uint64_t xd = smem_desc(st + XO + b * XB);
#pragma unroll
        for (int kk = 0; kk < kTmaBK / 16; ++kk) {
#pragma unroll
          for (int w = 0; w < NW; ++w) {  // a k16 (16-bit) or k32 (e4m3) step: 32 bytes of each row
            if constexpr (F8) {
              wgmma_e4m3_k32(part[w], smem_desc(st + (w * KB + b) * WB) + 2 * kk, xd + 2 * kk, b + kk > 0);
            } else {
              wgmma_k16<std::is_same_v<T, __nv_bfloat16>>(acc[w], smem_desc(st + (w * KB + b) * WB) + 2 * kk, xd + 2 * kk);
            }
          }
        }
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        if constexpr (F8) {
          fence_regs(part[w]);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[w][r] += part[w][r];
        } else {
          fence_regs(acc[w]);
        }
      }
      if (lane == 0) mbar_arrive(empty + s);  // one arrival per warp
    }
    pdl_trigger();
  }
  __syncthreads();  // every stage consumed: the ring's memory holds the partial tile now

  // red[w][x row][column]; accumulator d[4c + e] of warp wq, lane l: weight row 16 wq + l/4 (+8 for e >= 2),
  // x row 8c + 2 (l%4) (+1 for odd e). F8: each sum times its x row's and weight column's scales (0 past m and n).
  float* red = reinterpret_cast<float*>(smem);
  if (warp < 4) {
    const int col = 16 * warp + lane / 4, xr = 2 * (lane % 4);
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      float ws0 = 1.f, ws8 = 1.f;
      if constexpr (F8) {
        const float* wsc = NW == 2 ? tp.w_scale[w] : part_of(tp.w_scale, j);
        const int n = part_of(p.n, j);
        ws0 = n0 + col < n ? wsc[n0 + col] : 0.f;
        ws8 = n0 + col + 8 < n ? wsc[n0 + col + 8] : 0.f;
      }
      if constexpr (W8 == 1) {  // int8: the column's scale after the sums
        const T* wsc = static_cast<const T*>(tp.w8_scale);
        ws0 = n0 + col < p.n[0] ? to_float(wsc[n0 + col]) : 0.f;
        ws8 = n0 + col + 8 < p.n[0] ? to_float(wsc[n0 + col + 8]) : 0.f;
      }
#pragma unroll
      for (int c = 0; c < MX / 8; ++c) {
        float xs0 = 1.f, xs1 = 1.f;
        if constexpr (F8) {
          xs0 = 8 * c + xr < p.m ? tp.x_scale[8 * c + xr] : 0.f;
          xs1 = 8 * c + xr + 1 < p.m ? tp.x_scale[8 * c + xr + 1] : 0.f;
        }
        float* r0 = red + (w * MX + 8 * c + xr) * kRedStride + col;
        constexpr bool COLS = F8 || W8 == 1;  // the sums times the column scales (F8: and x's row scales)
        r0[0] = COLS ? acc[w][4 * c] * xs0 * ws0 : acc[w][4 * c];
        r0[kRedStride] = COLS ? acc[w][4 * c + 1] * xs1 * ws0 : acc[w][4 * c + 1];
        r0[8] = COLS ? acc[w][4 * c + 2] * xs0 * ws8 : acc[w][4 * c + 2];
        r0[kRedStride + 8] = COLS ? acc[w][4 * c + 3] * xs1 * ws8 : acc[w][4 * c + 3];
      }
    }
  }
  float* ssq = red + NW * MX * kRedStride;  // NORM: this CTA's sums of squares of each x row
  if constexpr (NORM) {
    if (warp < 4) {
#pragma unroll
      for (int q = 0; q < (MX * 8 + 127) / 128; ++q) {
        float v = ss[q];  // the 8 lanes of a row summed
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        if (threadIdx.x % 8 == 0 && threadIdx.x + 128 * q < MX * 8) ssq[threadIdx.x / 8 + 16 * q] = v;
      }
    }
  }
  cluster_sum_store<T, NW, MX, kTmaThreads>(p, j, n0, red, NORM ? ssq : nullptr);
#else
  __trap();  // not an sm_90a build: tma_built() is false, never launched
#endif
}

// Whether this build has the kernel (the extension compiled for sm_90a: build.py defines FUSEKIT_SM90A).
inline bool tma_built() {
#ifdef FUSEKIT_SM90A
  return true;
#else
  return false;
#endif
}

// The driver's tensor-map encoder, through the runtime (no libcuda link); null where the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A row-major [rows, k] matrix of T (16-bit, or e4m3 as __nv_fp8_e4m3) as boxes of `box_rows` x one 128-byte row,
// 128-byte swizzled, zeros past its edges.
template <typename T>
bool encode_map(CUtensorMap* map, const void* ptr, int64_t rows, int64_t k, int box_rows) {
  const auto enc = tensor_map_encoder();
  if (enc == nullptr) return false;
  constexpr bool f8 = std::is_same_v<T, __nv_fp8_e4m3>;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * sizeof(T)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(tma_box_k<f8>()), static_cast<cuuint32_t>(box_rows)}, estr[2] = {1, 1};
  const auto dt = f8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                  : std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                     : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return enc(map, dt, 2, const_cast<void*>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A weight's map, encoded once: a map depends only on (address, shape, dtype), so the cache (one per T) cannot go
// stale.
template <typename T>
bool weight_map(CUtensorMap* map, const void* ptr, int n, int k) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int>, CUtensorMap> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(ptr, n, k);
  const auto it = cache.find(key);
  if (it != cache.end()) {
    *map = it->second;
    return true;
  }
  if (!encode_map<T>(map, ptr, n, k, kTmaCols)) return false;
  if (cache.size() < 4096) cache.emplace(key, *map);
  return true;
}

// Stages of the ring: 3 unless asked (the FUSEKIT_DECODE_GEMM test override), at least 2, at most one per k block
// of a split. Three is the fastest on an H100: more CTAs per SM (three of gate/up, six of a plain linear at 32
// rows) rather than more bytes in flight per CTA.
inline int tma_stages(int asked, int per, int stage_bytes) {
  const int fit = static_cast<int>((kTmaSmemBudget - 1024 - 16 * kTmaMaxStages) / stage_bytes);
  return std::max(2, std::min({asked > 0 ? asked : 3, fit, kTmaMaxStages, std::max(per, 2)}));
}

inline size_t tma_smem(int stages, int stage_bytes) { return 1024 + size_t(stages) * stage_bytes + 16 * stages; }

// How many clusters of S CTAs with this shared memory the GPU holds at once (the occupancy API knows how the
// SMs group into GPCs, which a cluster cannot span); cached per (device, kernel instance, S, bytes).
template <typename K>
int tma_max_clusters(K* kernel, int s, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, size_t>, int> cache;
  const int dev = c10::cuda::current_device();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, s, smem);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1, s), cfg.blockDim = dim3(kTmaThreads), cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1, attr.val.clusterDim.y = s, attr.val.clusterDim.z = 1;
  cfg.attrs = &attr, cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    n = std::max(1, 2 * sm_count() / s);  // (two CTAs per SM, no GPC bound)
  }
  return cache.emplace(key, n).first->second;
}

// Launches with S splits of K (0: the cheapest S in [1, max_splits]: the waves of clusters the GPU holds at once
// times each CTA's k blocks plus a fixed ~3 (the ring's first fill, the cluster's barriers and reduction)); false,
// launching nothing, where this build or driver has no TMA kernel or a map cannot be encoded.
// F8: p.x is x's e4m3 copy, p.w the e4m3 weights, and `scales` (x's rows', then each weight's columns') set.
template <typename T, int MX, int NW, int KB, bool F8 = false, bool NORM = false, int W8 = 0>
bool launch_tma_rows(const Params& p, cudaStream_t stream, int splits, bool early, int stages, int max_splits,
                     const TmaParams* scales = nullptr) {
  using E = std::conditional_t<F8, __nv_fp8_e4m3, T>;                 // x's element
  using EW = std::conditional_t<F8 || W8 != 0, __nv_fp8_e4m3, T>;    // the weights' (W8: int8 as 8 bits too)
  TmaParams tp{};
  tp.p = p;
  if (scales != nullptr) {
    tp.x_scale = scales->x_scale;
    for (int i = 0; i < kMaxParts; ++i) tp.w_scale[i] = scales->w_scale[i];
    tp.w8_scale = scales->w8_scale;
  }
  const int tiles = set_tile_ends(tp.p, kTmaCols);
  for (int i = 0; i < (NW == 2 ? 2 : p.parts); ++i) {
    if (!weight_map<EW>(&tp.wmap[i], p.w[i], p.n[NW == 2 ? 0 : i], p.k)) return false;
  }
  if (!encode_map<E>(&tp.xmap, p.x, p.m, p.k, MX)) return false;
  auto* kernel = decode_linear_tma_kernel<T, MX, NW, KB, F8, NORM, W8>;
  opt_in_smem<decode_linear_tma_kernel<T, MX, NW, KB, F8, NORM, W8>>(kTmaSmemMax);
  constexpr int SB = tma_stage_bytes(NW, MX, KB, W8 != 0);
  constexpr int SK = KB * tma_box_k<F8>();
  const int kblocks = (p.k + SK - 1) / SK;
  int s = std::min({splits, kTmaMaxSplits, kblocks});
  if (splits <= 0) {
    int64_t best_cost = INT64_MAX;
    for (int c = 1; c <= max_splits && c <= kblocks; ++c) {
      const int per = (kblocks + c - 1) / c;
      if ((kblocks + per - 1) / per < c) continue;  // an empty split
      const int held = tma_max_clusters(kernel, c, tma_smem(tma_stages(stages, per, SB), SB));
      const int64_t cost = int64_t(tiles + held - 1) / held * (per + 3);
      if (cost < best_cost) s = c, best_cost = cost;
    }
  }
  tp.kb_per_split = (kblocks + s - 1) / s;
  s = (kblocks + tp.kb_per_split - 1) / tp.kb_per_split;  // no empty split
  tp.stages = tma_stages(stages, tp.kb_per_split, SB);
  tp.early = early;
  launch_ex(kernel, dim3(tiles, s), dim3(kTmaThreads), tma_smem(tp.stages, SB), stream, pdl_allowed(90, 'g'), s, tp);
  return true;
}

// launch(std::integral_constant<int, MX>{}) for the x rows tile MX (8, 16, 32, 64) that holds p.m rows: the
// launchers below; false, launching nothing, where this build has no TMA kernel or p.m is not in 1-64.
template <typename Launch>
bool with_rows_tile(const Params& p, Launch&& launch) {
  if (!tma_built() || p.m > 64 || p.m < 1) return false;
  if (p.m <= 8) return launch(std::integral_constant<int, 8>{});
  if (p.m <= 16) return launch(std::integral_constant<int, 16>{});
  if (p.m <= 32) return launch(std::integral_constant<int, 32>{});
  return launch(std::integral_constant<int, 64>{});
}

// The F8 kernel at 1-64 rows (one k box per stage: 128 k); false, launching nothing, as launch_tma_rows.
template <typename T, int NW>
bool launch_tma_fp8(const Params& p, const TmaParams& scales, cudaStream_t stream, int splits, bool early,
                    int max_splits = kTmaMaxSplits) {
  return with_rows_tile(p, [&](auto mx) {
    return launch_tma_rows<T, decltype(mx)::value, NW, 1, true>(p, stream, splits, early, 0, max_splits, &scales);
  });
}

// The W8 kernel (8-bit weight-only; W8 1: int8 with [N] scales of T, 2: e4m3 with [N] float32 scales) at 1-64 rows,
// N a multiple of 8 (the epilogue's column pairs); early weight tiles and at most 4 splits above 8 rows, as the
// 16-bit kernel in a decode step. False, launching nothing, as launch_tma_rows.
template <typename T, int W8>
bool launch_tma_w8(const Params& p, const void* w_scale, cudaStream_t stream) {
  if (p.n[0] % 8 != 0) return false;
  TmaParams s{};
  s.w8_scale = w_scale;
  const bool early = p.m > 8;
  const int ms = p.m > 8 ? 4 : kTmaMaxSplits;
  return with_rows_tile(p, [&](auto mx) {
    return launch_tma_rows<T, decltype(mx)::value, 1, 2, false, false, W8>(p, stream, 0, early, 0, ms, &s);
  });
}

// The NORM kernel at 1-64 rows (one 64-wide k box per stage); false, launching nothing, as launch_tma_rows.
template <typename T, int NW>
bool launch_tma_norm(const Params& p, cudaStream_t stream, bool early, int max_splits) {
  return with_rows_tile(p, [&](auto mx) {
    return launch_tma_rows<T, decltype(mx)::value, NW, 1, false, true>(p, stream, 0, early, 0, max_splits);
  });
}

template <typename T, int NW>
bool launch_tma(const Params& p, cudaStream_t stream, int splits, bool early, int stages, int boxes,
                int max_splits = kTmaMaxSplits) {
  return with_rows_tile(p, [&](auto mx) {
    constexpr int MX = decltype(mx)::value;
    if (boxes == 2) return launch_tma_rows<T, MX, NW, 2>(p, stream, splits, early, stages, max_splits);
    return launch_tma_rows<T, MX, NW, 1>(p, stream, splits, early, stages, max_splits);
  });
}

}  // namespace decode_gemm
}  // namespace fusekit
