// The CUTLASS 3 (sm90) pieces of fusekit::matmul_epilogue that need no torch: the runtime activation
// functor and the GEMM configuration template, so that a torch-free program can build and time the same
// configurations. It includes the CUTLASS headers, which want NDEBUG defined (matmul_dispatch.cuh does so).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include <type_traits>

#include "fast_math.cuh"

namespace fusekit {

enum Act : int { kNone = 0, kGelu = 1, kGeluTanh = 2, kRelu = 3, kSilu = 4 };

// Epilogue activations: fast_math.cuh's SFU forms (fast_gelu_erf, ...). The GEMM epilogue is instruction-
// bound when the GEMM is short (K = 64: 25M outputs per 0.02 ms of MMA).
// The activation is a runtime argument (a uniform branch per fragment): one kernel serves all five,
// instead of five times the instantiations and compile time.
template <class T>
struct RuntimeAct {
  struct Arguments {
    int act = kNone;
  };
  CUTLASS_HOST_DEVICE T operator()(T const& x, Arguments const& args) const {
#ifdef __CUDA_ARCH__
    switch (args.act) {
      case kGelu: return fast_gelu_erf(x);
      case kGeluTanh: return fast_gelu_tanh(x);
      case kRelu: return relu(x);
      case kSilu: return fast_silu(x);
      default: return x;
    }
#else
    return x;
#endif
  }
};

template <class T, int N>
struct RuntimeAct<cutlass::Array<T, N>> {
  using Arguments = typename RuntimeAct<T>::Arguments;
  // one branch per fragment, outside the element loop
  template <class F>
  CUTLASS_DEVICE static cutlass::Array<T, N> map(cutlass::Array<T, N> const& v, F f) {
    cutlass::Array<T, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = f(v[i]);
    return out;
  }
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& v, Arguments const& args) const {
#ifdef __CUDA_ARCH__
    switch (args.act) {
      case kGelu: return map(v, [](T x) { return fast_gelu_erf(x); });
      case kGeluTanh: return map(v, [](T x) { return fast_gelu_tanh(x); });
      case kRelu: return map(v, [](T x) { return relu(x); });
      case kSilu: return map(v, [](T x) { return fast_silu(x); });
      default: return v;
    }
#else
    return v;
#endif
  }
};

// One GEMM configuration: element type, B's layout (RowMajor: b is [K, N] with unit N stride;
// ColumnMajor: unit K stride, e.g. k.transpose(-1, -2) or a linear weight), CTA tile, cluster, mainloop and
// epilogue schedules, and the epilogue's sub-tile (EpilogueTileAuto: CUTLASS's choice). fp32 accumulation;
// the epilogue is act(alpha acc + beta C + per-column bias), 16-byte aligned operands.
// ElementC = void: no C operand (beta must be 0): no C buffers in shared memory, and CUTLASS then delays each
// TMA store to overlap it with the next sub-tile's math (DelayTmaStore). kStages: the mainloop's pipeline
// depth; 0: as many as fit beside the epilogue's shared memory. ElementD: the output's type (float: the
// output cast to fp32 is the epilogue's store; the bias stays Element). Element float: A and B are fp32 in
// memory and the wgmma runs on their TF32 part (the builder maps float to tfloat32_t). kPlainEpilogue: no
// bias and no activation (void C only): CUTLASS's LinearCombination (alpha acc) instead of the bias +
// activation EVT, whose per-element work bounds a short-K GEMM ([96,512,64,512]: 0.0265 -> 0.0221 ms on an
// H200, cuBLAS 0.0228). Scheduler: GemmUniversal's tile
// scheduler (void: the persistent data-parallel one).
template <class Element, class LayoutB, class Tile, class Cluster, class MainSchedule, class EpiSchedule,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto, class ElementC = Element, int kStages = 0,
          class ElementD = Element, bool kPlainEpilogue = false, class Scheduler = void>
struct GemmConfig {
  static constexpr bool kPlain = kPlainEpilogue;
  static_assert(!kPlain || std::is_void_v<ElementC>, "the plain epilogue has no C operand");
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16 bytes
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr int kAlignC =  // void C: D's (unused)
      128 / cutlass::sizeof_bits<std::conditional_t<std::is_void_v<ElementC>, ElementD, ElementC>>::value;
  using Fusion = std::conditional_t<
      kPlain, cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>,
      cutlass::epilogue::fusion::LinCombPerColBiasEltAct<RuntimeAct, ElementD, float, Element, Element, float>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpiTile, float, float, ElementC, LayoutC,
      kAlignC, ElementD, LayoutC, kAlignD, EpiSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign, float,
      Tile, Cluster,
      std::conditional_t<kStages == 0,
                         cutlass::gemm::collective::StageCountAutoCarveout<
                             static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
                         cutlass::gemm::collective::StageCount<kStages>>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// One (batched) GEMM + epilogue call: D = act(alpha A B + beta C + bias), L batches of [M, K] x [K, N].
struct GemmProblem {
  int64_t L, M, N, K;
  const void *a, *b, *bias, *c;
  void* d;                            // written contiguous [L, M, N] (of G's ElementD)
  int64_t lda, sa, ldb, sb, ldc, sc;  // leading and batch strides, in elements
  bool b_kmajor;                      // b has a unit K stride (picks G's LayoutB)
  float alpha;
  const float* alpha_ptr;             // a device alpha, read by the kernel; null: alpha
  float beta;                         // 0: C is never read
  int act;                            // Act
};

// G's arguments for p (the strides in CuTe's (M|N, K, L) order).
template <class G>
typename G::Device::Arguments gemm_arguments(const GemmProblem& p, const cutlass::KernelHardwareInfo& hw) {
  using namespace cute;
  using Element = typename G::Kernel::ElementA;
  using StrideB = typename G::Kernel::StrideB;
  const auto sA = make_stride(p.lda, Int<1>{}, p.sa);
  StrideB sB;
  if constexpr (std::is_same_v<StrideB, Stride<int64_t, Int<1>, int64_t>>) sB = make_stride(p.ldb, Int<1>{}, p.sb);
  else sB = make_stride(Int<1>{}, p.ldb, p.sb);
  const typename G::Kernel::StrideC sC = make_stride(p.ldc, Int<1>{}, p.sc);
  const typename G::Kernel::StrideD sD = make_stride(p.N, Int<1>{}, p.M * p.N);
  typename G::Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {int(p.M), int(p.N), int(p.K), int(p.L)},
      {static_cast<const Element*>(p.a), sA, static_cast<const Element*>(p.b), sB},
      {{}, static_cast<typename G::Kernel::ElementC const*>(p.c), sC, static_cast<typename G::Kernel::ElementD*>(p.d),
       sD},
      hw};
  auto& f = args.epilogue.thread;
  f.alpha = p.alpha;
  f.alpha_ptr = p.alpha_ptr;
  f.beta = p.beta;
  if constexpr (!G::kPlain) {
    f.bias_ptr = static_cast<const Element*>(p.bias);
    f.activation.act = p.act;
  }
  return args;
}

}  // namespace fusekit
