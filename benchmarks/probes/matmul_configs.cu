// A torch-free probe of CUTLASS sm90 GEMM + epilogue configurations (tile, cluster, schedule, epilogue step)
// for csrc/matmul_epilogue.cu's dispatch: each set builds one shared library on a machine with no GPU, and
// matmul_configs.py times it on the GPU through ctypes, next to cuBLAS and Inductor, with no build there.
//   CU=<cutlass>/include; for s in 0 1 2; do nvcc -shared -o mm$s.so matmul_configs.cu -DFK_PROBE_SET=$s \
//     -I$CU -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC; done
//   python matmul_configs.py mm0.so mm1.so mm2.so      # result: benchmarks/results/h200_matmul_configs.txt
// The epilogue is the kernel's (LinCombPerColBiasEltAct with the runtime activation and the SFU forms).
#define NDEBUG 1
#include <cassert>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>
#include <cstdio>

using namespace cute;

// Copies of fusekit.h's SFU forms (fusekit.h includes torch, which this probe must not need).
__device__ __forceinline__ float ex2_approx(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float rcp_approx(float x) { float y; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float fast_gelu_erf(float x) {
  const float t = rcp_approx(fmaf(0.3275911f * 0.70710678118654752f, fabsf(x), 1.0f));
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f), 0.254829592f);
  const float erf = copysignf(1.0f - poly * ex2_approx((-0.5f * kLog2e * x) * x), x);
  const float h = 0.5f * x;
  return fmaf(h, erf, h);
}
__device__ __forceinline__ float fast_gelu_tanh(float x) {
  constexpr float k0 = 2.0f * kLog2e * 0.79788456080286536f, k1 = k0 * 0.044715f;
  const float e = ex2_approx(x * fmaf(k1, x * x, k0));
  return x * (1.0f - rcp_approx(1.0f + e));
}
__device__ __forceinline__ float fast_silu(float x) { return x * rcp_approx(1.0f + ex2_approx(-kLog2e * x)); }
__device__ __forceinline__ float relu(float x) { return isnan(x) ? x : fmaxf(x, 0.0f); }

template <class T>
struct RuntimeAct {
  struct Arguments { int act = 0; };
  CUTLASS_HOST_DEVICE T operator()(T const& x, Arguments const& args) const {
#ifdef __CUDA_ARCH__
    switch (args.act) {
      case 1: return fast_gelu_erf(x);
      case 2: return fast_gelu_tanh(x);
      case 3: return relu(x);
      case 4: return fast_silu(x);
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
      case 1: return map(v, [](T x) { return fast_gelu_erf(x); });
      case 2: return map(v, [](T x) { return fast_gelu_tanh(x); });
      case 3: return map(v, [](T x) { return relu(x); });
      case 4: return map(v, [](T x) { return fast_silu(x); });
      default: return v;
    }
#else
    return v;
#endif
  }
};

template <class Element, class LayoutB, class Tile, class Cluster, class MainSched, class EpiSched,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
struct Gemm {
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlign = 8;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<RuntimeAct, Element, float, Element, Element, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpiTile, float, float, Element, LayoutC,
      kAlign, Element, LayoutC, kAlign, EpiSched, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign, float,
      Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSched>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

using PP = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CO = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EPP = cutlass::epilogue::TmaWarpSpecialized;
using ECO = cutlass::epilogue::TmaWarpSpecializedCooperative;
using H = cutlass::half_t;
using RM = cutlass::layout::RowMajor;
using C1 = Shape<_1, _1, _1>;
using C21 = Shape<_2, _1, _1>;

template <class G>
int run(int L, int M, int N, int K, const void* a, const void* b, const void* bias, void* d, float alpha, int act,
        void* ws, size_t ws_bytes, void* stream, int sm_count) {
  using Device = typename G::Device;
  using Element = typename G::Kernel::ElementA;
  using StrideA = typename G::Kernel::StrideA;
  using StrideB = typename G::Kernel::StrideB;
  using StrideC = typename G::Kernel::StrideC;
  using StrideD = typename G::Kernel::StrideD;
  StrideA sA = make_stride(int64_t(K), Int<1>{}, int64_t(M) * K);
  StrideB sB = make_stride(Int<1>{}, int64_t(N), int64_t(K) * N);  // RowMajor b [K, N]: (N, K, L) unit N
  StrideC sC = make_stride(int64_t(N), Int<1>{}, int64_t(M) * N);
  StrideD sD = make_stride(int64_t(N), Int<1>{}, int64_t(M) * N);
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sm_count;
  typename Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {M, N, K, L},
                                  {static_cast<const Element*>(a), sA, static_cast<const Element*>(b), sB},
                                  {{}, static_cast<const Element*>(d), sC, static_cast<Element*>(d), sD},
                                  hw};
  auto& f = args.epilogue.thread;
  f.alpha = alpha;
  f.beta = 0.f;
  f.bias_ptr = static_cast<const Element*>(bias);
  f.activation.act = act;
  Device gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
  if (Device::get_workspace_size(args) > ws_bytes) return -2;
  if (gemm.initialize(args, ws, (cudaStream_t)stream) != cutlass::Status::kSuccess) return -3;
  if (gemm.run((cudaStream_t)stream) != cutlass::Status::kSuccess) return -4;
  return 0;
}

using Fn = int (*)(int, int, int, int, const void*, const void*, const void*, void*, float, int, void*, size_t, void*, int);
struct Variant { const char* name; Fn fn; };

#ifndef FK_PROBE_SET
#define FK_PROBE_SET 0
#endif

static Variant kVariants[] = {
#if FK_PROBE_SET == 0
    {"pp128x128x64", &run<Gemm<H, RM, Shape<_128, _128, _64>, C1, PP, EPP>>},
    {"co128x128x64", &run<Gemm<H, RM, Shape<_128, _128, _64>, C1, CO, ECO>>},
    {"co256x128x64", &run<Gemm<H, RM, Shape<_256, _128, _64>, C1, CO, ECO>>},
    {"pp128x128x64_c21", &run<Gemm<H, RM, Shape<_128, _128, _64>, C21, PP, EPP>>},
    {"pp128x128x64_et64x64", &run<Gemm<H, RM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _64>>>},
#elif FK_PROBE_SET == 1
    {"co128x64x64", &run<Gemm<H, RM, Shape<_128, _64, _64>, C1, CO, ECO>>},
    {"pp128x64x64", &run<Gemm<H, RM, Shape<_128, _64, _64>, C1, PP, EPP>>},
    {"co128x64x128", &run<Gemm<H, RM, Shape<_128, _64, _128>, C1, CO, ECO>>},
    {"co256x64x64", &run<Gemm<H, RM, Shape<_256, _64, _64>, C1, CO, ECO>>},
    {"co128x64x64_c21", &run<Gemm<H, RM, Shape<_128, _64, _64>, C21, CO, ECO>>},
    {"pp64x64x128", &run<Gemm<H, RM, Shape<_64, _64, _128>, C1, PP, EPP>>},
#else
    {"co128x128x64_et128x64", &run<Gemm<H, RM, Shape<_128, _128, _64>, C1, CO, ECO, Shape<_128, _64>>>},
    {"co128x256x64", &run<Gemm<H, RM, Shape<_128, _256, _64>, C1, CO, ECO>>},
    {"pp64x256x64", &run<Gemm<H, RM, Shape<_64, _256, _64>, C1, PP, EPP>>},
#endif
};

extern "C" int fk_probe_count() { return sizeof(kVariants) / sizeof(kVariants[0]); }
extern "C" const char* fk_probe_name(int i) { return kVariants[i].name; }
extern "C" int fk_probe_run(int i, int L, int M, int N, int K, const void* a, const void* b, const void* bias, void* d,
                            float alpha, int act, void* ws, size_t ws_bytes, void* stream, int sm_count) {
  return kVariants[i].fn(L, M, N, K, a, b, bias, d, alpha, act, ws, ws_bytes, stream, sm_count);
}
