// The dispatch of fusekit::matmul_epilogue (csrc/batched_matmul/matmul_epilogue.cu): CUTLASS configurations chosen by
// shape, and their launch. Shared by the translation units that instantiate them (split by input and output
// type, so that they compile in parallel): matmul_epilogue.cu (fp16/bf16 -> same dtype),
// matmul_epilogue_f32out.cu (fp16/bf16 -> fp32: the output cast), matmul_epilogue_tf32.cu (fp32 -> fp32 on
// TF32 tensor cores). sm_90a only. A unit includes every other header it needs before this one (see NDEBUG
// below).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <type_traits>

#include "launch.cuh"  // sm_count

// CUTLASS/CuTe assert() calls become function calls inside the kernel, which makes ptxas serialize every
// wgmma ("crossing function boundary", warning C7510). NDEBUG is set for the CUTLASS headers only, after
// every torch header of the unit: defined before one, it changes c10's inline code in this object only, and
// an error thrown from here then crashes the process (torch 2.11).
#ifndef NDEBUG
#define NDEBUG 1
#endif
#include <cassert>

#include "matmul_gemm.cuh"  // RuntimeAct, GemmConfig, GemmProblem, gemm_arguments

namespace fusekit {

// Defined in the other translation units; `out` is the [L, M, N] output (fp32), p.beta == 0.
void matmul_fp16_f32out(const GemmProblem& p, const at::Tensor& out);
void matmul_bf16_f32out(const GemmProblem& p, const at::Tensor& out);
void matmul_tf32(const GemmProblem& p, const at::Tensor& out);  // p.b_kmajor (wgmma reads TF32 K-major only)

namespace matmul_detail {

using namespace cute;

// Cooperative: both consumer warpgroups share a tile, so the epilogue runs at full width (short K, where
// the epilogue is most of the work). Ping-pong: the warpgroups alternate tiles, so one's epilogue hides
// under the other's MMAs (long K). EpiTile: the sub-tile the epilogue converts and stores per step; wider
// than CUTLASS's automatic choice, fewer steps (faster on an H200).
// kC: the kernel reads a C operand (the residual, beta = 1); without one, C is void (see GemmConfig).
template <class Element, class LayoutB, class Tile, class Cluster, bool kPingpong, class EpiTile, bool kC,
          class ElementD, bool kPlain = false>
using Gemm = GemmConfig<Element, LayoutB, Tile, Cluster,
                        std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                           cutlass::gemm::KernelTmaWarpSpecializedCooperative>,
                        std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                           cutlass::epilogue::TmaWarpSpecializedCooperative>,
                        EpiTile, std::conditional_t<kC, Element, void>, 0, ElementD, kPlain>;

template <class G>
void run(const GemmProblem& p, const at::Tensor& like) {
  using Device = typename G::Device;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = like.device().index();
  hw.sm_count = sm_count(hw.device_id);

  const typename Device::Arguments args = gemm_arguments<G>(p, hw);

  Device gemm;
  TORCH_CHECK(gemm.can_implement(args) == cutlass::Status::kSuccess,
              "fusekit: matmul_epilogue: CUTLASS cannot run this problem (alignment or strides)");
  const size_t ws_bytes = Device::get_workspace_size(args);
  at::Tensor ws = at::empty({int64_t(ws_bytes)}, like.options().dtype(at::kByte));  // caching allocator
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto st = gemm.initialize(args, ws_bytes ? ws.data_ptr() : nullptr, stream);
  TORCH_CHECK(st == cutlass::Status::kSuccess, "fusekit: matmul_epilogue: initialize failed: ",
              cutlassGetStatusString(st));
  st = gemm.run(stream);
  TORCH_CHECK(st == cutlass::Status::kSuccess, "fusekit: matmul_epilogue: launch failed: ", cutlassGetStatusString(st));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// K extent of a CTA tile: 128-byte rows (64 16-bit or 32 fp32 elements), the widest TMA swizzle
template <class Element>
using TileK = Int<128 / sizeof(Element)>;
template <class Element>
using Tile128x128 = Shape<_128, _128, TileK<Element>>;
template <class Element>
using Tile128x64 = Shape<_128, _64, TileK<Element>>;
template <class Element>
using Tile128x256 = Shape<_128, _256, TileK<Element>>;
using Cluster1 = Shape<_1, _1, _1>;
using Cluster2x1 = Shape<_2, _1, _1>;  // two CTAs along M share (multicast) their B tile
using EpiAuto = cutlass::epilogue::collective::EpilogueTileAuto;

// Tile and schedule by shape, each choice the fastest CUTLASS configuration measured on an H200:
// - N <= 64 (p @ v, narrow outputs): cooperative 128x64 tiles (memory-bound; no other tile, cluster or
//   stream-K is faster);
// - the plain GEMM (no bias, no activation, 16 bits): CUTLASS's LinearCombination kernels (below);
// - long K (>= 512, >= 1024 for GELU/SiLU, which one warpgroup hides only under longer MMAs): ping-pong
//   128x128, as is a short K without activation or residual; the rest cooperative 128x128, 128x64 epilogue steps;
// - no residual: no C operand (void C lets CUTLASS overlap each TMA store with the next step's math); ping-pong
//   then takes 64x128 epilogue steps for GELU/SiLU and for no activation at short K, 64x64 otherwise.
template <class Element, class LayoutB, bool kC, class ElementD = Element>
void dispatch_c(const GemmProblem& p, const at::Tensor& like) {
  const bool light_epilogue = p.act == kNone || p.act == kRelu;  // GELU/SiLU need longer MMAs to hide under
  if (p.N <= 64) return run<Gemm<Element, LayoutB, Tile128x64<Element>, Cluster1, false, EpiAuto, kC, ElementD>>(p, like);
  if constexpr (!kC) {
    // The plain 16-bit GEMM: ping-pong with CUTLASS's epilogue steps; from K = 4096 on, cooperative 128x256 tiles
    // in 2x1 clusters, whose epilogue a long K amortizes (both faster than cuBLAS at every shape timed).
    // No activation at short K: ping-pong with 64x128 steps, whose stores overlap the other warpgroup's tile.
    if constexpr (std::is_same_v<ElementD, Element> && sizeof(Element) == 2) {
      if (p.act == kNone && p.bias == nullptr) {
        if (p.K >= 4096)
          return run<Gemm<Element, LayoutB, Tile128x256<Element>, Cluster2x1, false, EpiAuto, kC, ElementD, true>>(p, like);
        return run<Gemm<Element, LayoutB, Tile128x128<Element>, Cluster1, true, EpiAuto, kC, ElementD, true>>(p, like);
      }
    }
    if (p.act == kNone && p.K < 512)
      return run<Gemm<Element, LayoutB, Tile128x128<Element>, Cluster1, true, Shape<_64, _128>, kC, ElementD>>(p, like);
  }
  if (p.K >= (light_epilogue ? 512 : 1024)) {
    if constexpr (!kC) {
      if (!light_epilogue) return run<Gemm<Element, LayoutB, Tile128x128<Element>, Cluster1, true, Shape<_64, _128>, kC, ElementD>>(p, like);
    }
    run<Gemm<Element, LayoutB, Tile128x128<Element>, Cluster1, true, Shape<_64, _64>, kC, ElementD>>(p, like);
  } else {
    run<Gemm<Element, LayoutB, Tile128x128<Element>, Cluster1, false, Shape<_128, _64>, kC, ElementD>>(p, like);
  }
}
template <class Element, class LayoutB>
void dispatch(const GemmProblem& p, const at::Tensor& like) {
  if (p.beta != 0.f) dispatch_c<Element, LayoutB, true>(p, like);
  else dispatch_c<Element, LayoutB, false>(p, like);
}

// The output-cast and TF32 units: no C operand (a residual is added after the kernel), both B layouts
// (TF32: K-major only).
template <class Element, class ElementD>
void dispatch_no_c(const GemmProblem& p, const at::Tensor& like) {
  if (p.b_kmajor) dispatch_c<Element, cutlass::layout::ColumnMajor, false, ElementD>(p, like);
  else dispatch_c<Element, cutlass::layout::RowMajor, false, ElementD>(p, like);
}

}  // namespace matmul_detail
}  // namespace fusekit
