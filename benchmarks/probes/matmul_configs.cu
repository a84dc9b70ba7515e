// A torch-free probe of CUTLASS sm90 GEMM + epilogue configurations (tile, cluster, schedule, epilogue step)
// for csrc/batched_matmul/matmul_epilogue.cu's dispatch: each set builds one shared library on a machine with no GPU, and
// matmul_configs.py times it on the GPU through ctypes, next to cuBLAS and Inductor, with no build there.
//   CU=<cutlass>/include; for s in 0 1 2 3 4 5 6 7 8 9 10 11 12; do nvcc -shared -o mm$s.so matmul_configs.cu -DFK_PROBE_SET=$s \
//     -I$CU -I../../csrc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC; done
//   python matmul_configs.py mm0.so mm1.so mm2.so mm3.so   # result: benchmarks/results/h200_matmul_configs.txt
// The epilogue is the kernel's (csrc/batched_matmul/matmul_gemm.cuh: LinCombPerColBiasEltAct, runtime activation, SFU forms).
#define NDEBUG 1
#include <cassert>

#include "batched_matmul/matmul_gemm.cuh"  // csrc/: the kernel's RuntimeAct (SFU GELU/SiLU), GemmConfig, gemm_arguments

using namespace cute;
template <class Element, class LayoutB, class Tile, class Cluster, class MainSched, class EpiSched,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
using Gemm = fusekit::GemmConfig<Element, LayoutB, Tile, Cluster, MainSched, EpiSched, EpiTile>;
// no C operand (as the kernel without a residual) and a fixed pipeline depth (0: as many as fit)
template <class Tile, class MainSched, class EpiSched, class EpiTile, int kStages>
using GemmV = fusekit::GemmConfig<cutlass::half_t, cutlass::layout::RowMajor, Tile, Shape<_1, _1, _1>, MainSched,
                                  EpiSched, EpiTile, void, kStages>;

using PP = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using WS = cutlass::gemm::KernelTmaWarpSpecialized;  // not persistent: one CTA per tile, several per SM
using EA = cutlass::epilogue::collective::EpilogueTileAuto;
using CO = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EPP = cutlass::epilogue::TmaWarpSpecialized;
using ECO = cutlass::epilogue::TmaWarpSpecializedCooperative;
using H = cutlass::half_t;
using B = cutlass::bfloat16_t;
using RM = cutlass::layout::RowMajor;
using CM = cutlass::layout::ColumnMajor;
using C1 = Shape<_1, _1, _1>;
using C21 = Shape<_2, _1, _1>;
using C41 = Shape<_4, _1, _1>;
using C12 = Shape<_1, _2, _1>;
using SK = cutlass::gemm::StreamKScheduler;

template <class G>
int run(int L, int M, int N, int K, const void* a, const void* b, const void* bias, void* d, float alpha, int act,
        void* ws, size_t ws_bytes, void* stream, int sm_count) {
  using Device = typename G::Device;
  if constexpr (G::kPlain) {
    if (bias || act) return -5;  // the plain epilogue has neither
  }
  fusekit::GemmProblem p{};  // contiguous a [L, M, K], b [L, K, N]; d [L, M, N] doubles as the unread C
  p.L = L, p.M = M, p.N = N, p.K = K;
  p.a = a, p.b = b, p.bias = bias, p.c = d, p.d = d;
  p.lda = K, p.sa = int64_t(M) * K, p.ldb = N, p.sb = int64_t(K) * N, p.ldc = N, p.sc = int64_t(M) * N;
  using StrideB = typename G::Kernel::StrideB;
  // StrideB is in (N, K, L) order: (ldb, 1, batch) is a K-major b ([L, N, K], ldb = K); (1, ldb, batch) an N-major one
  if constexpr (std::is_same_v<StrideB, Stride<int64_t, Int<1>, int64_t>>) p.ldb = K;
  p.alpha = alpha, p.beta = 0.f, p.act = act;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sm_count;
  const typename Device::Arguments args = fusekit::gemm_arguments<G>(p, hw);
  Device gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
  if (Device::get_workspace_size(args) > ws_bytes) return -2;
  if (gemm.initialize(args, ws, (cudaStream_t)stream) != cutlass::Status::kSuccess) return -3;
  if (gemm.run((cudaStream_t)stream) != cutlass::Status::kSuccess) return -4;
  return 0;
}

// Set 4 (session 13): the plain GEMM (no bias, no activation, alpha only) through CUTLASS's LinearCombination
// epilogue (GemmConfig's kPlainEpilogue, void C) instead of the kernel's EVT (LinCombPerColBiasEltAct with a
// null bias and act none): the EVT's cost where K is short and the output store bounds the kernel
// ([96,512,64,512]: plain 0.85-0.89x of cuBLAS before).
// void C, any element type (names starting with "bf16" run bf16), B layout (names starting with or containing
// "kmaj" take a K-major b, [L, N, K]), cluster, epilogue and tile scheduler (sets 6-12)
template <class E, class LayoutB, class Tile, class Cluster, class MainSched, class EpiSched, class EpiTile, bool kPlain,
          class Sched = void>
using GemmP = fusekit::GemmConfig<E, LayoutB, Tile, Cluster, MainSched, EpiSched, EpiTile, void, 0, E, kPlain, Sched>;
template <class Tile, class MainSched, class EpiSched, class EpiTile>
using GemmLC = fusekit::GemmConfig<H, RM, Tile, C1, MainSched, EpiSched, EpiTile, void, 0, H, true>;

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
#elif FK_PROBE_SET == 3  // session 10: void C, not-persistent kernels with a fixed depth vs the kernel's choices
    {"prod co128x64x64_void", &run<GemmV<Shape<_128, _64, _64>, CO, ECO, EA, 0>>},
    {"prod co128x128x64_et128x64_void", &run<GemmV<Shape<_128, _128, _64>, CO, ECO, Shape<_128, _64>, 0>>},
    {"prod pp128x128x64_et64x128_void", &run<GemmV<Shape<_128, _128, _64>, PP, EPP, Shape<_64, _128>, 0>>},
    {"ws128x128x64_s2", &run<GemmV<Shape<_128, _128, _64>, WS, EPP, EA, 2>>},
    {"ws128x128x64_s3", &run<GemmV<Shape<_128, _128, _64>, WS, EPP, EA, 3>>},
    {"ws128x64x64_s4", &run<GemmV<Shape<_128, _64, _64>, WS, EPP, EA, 4>>},
    {"ws128x64x128_s2", &run<GemmV<Shape<_128, _64, _128>, WS, EPP, EA, 2>>},
    {"ws64x128x64_s3", &run<GemmV<Shape<_64, _128, _64>, WS, EPP, EA, 3>>},
    {"co128x64x64_void_s4", &run<GemmV<Shape<_128, _64, _64>, CO, ECO, EA, 4>>},
#elif FK_PROBE_SET == 4  // session 13: plain GEMM, LinearCombination epilogue vs the kernel's EVT (void C)
    {"prod pp128x128x64_et64x128_void", &run<GemmV<Shape<_128, _128, _64>, PP, EPP, Shape<_64, _128>, 0>>},
    {"lc pp128x128x64_et64x128", &run<GemmLC<Shape<_128, _128, _64>, PP, EPP, Shape<_64, _128>>>},
    {"lc pp128x128x64_auto", &run<GemmLC<Shape<_128, _128, _64>, PP, EPP, EA>>},
    {"lc co128x128x64_et128x64", &run<GemmLC<Shape<_128, _128, _64>, CO, ECO, Shape<_128, _64>>>},
    {"lc co128x256x64_auto", &run<GemmLC<Shape<_128, _256, _64>, CO, ECO, EA>>},
    {"lc co256x128x64_auto", &run<GemmLC<Shape<_256, _128, _64>, CO, ECO, EA>>},
#elif FK_PROBE_SET == 5  // session 14: N = 64, K = 512 with GELU ([96,512,512,64]): K extent, M extent, ping-pong
    {"prod co128x64x64_void", &run<GemmV<Shape<_128, _64, _64>, CO, ECO, EA, 0>>},
    {"co128x64x128_void", &run<GemmV<Shape<_128, _64, _128>, CO, ECO, EA, 0>>},
    {"pp128x64x64_void", &run<GemmV<Shape<_128, _64, _64>, PP, EPP, EA, 0>>},
    {"pp64x64x128_void", &run<GemmV<Shape<_64, _64, _128>, PP, EPP, EA, 0>>},
    {"pp64x64x64_void", &run<GemmV<Shape<_64, _64, _64>, PP, EPP, EA, 0>>},
    {"co256x64x64_void", &run<GemmV<Shape<_256, _64, _64>, CO, ECO, EA, 0>>},
#elif FK_PROBE_SET == 6  // session 14: N = 64, K = 512: clusters along M (B multicast) and stream-K, void C
    {"co128x64x128_void", &run<GemmV<Shape<_128, _64, _128>, CO, ECO, EA, 0>>},
    {"co128x64x128_void_c21", &run<GemmP<H, RM, Shape<_128, _64, _128>, C21, CO, ECO, EA, false>>},
    {"co128x64x128_void_c41", &run<GemmP<H, RM, Shape<_128, _64, _128>, C41, CO, ECO, EA, false>>},
    {"co128x64x64_void_c21", &run<GemmP<H, RM, Shape<_128, _64, _64>, C21, CO, ECO, EA, false>>},
    {"co128x64x64_void_c41", &run<GemmP<H, RM, Shape<_128, _64, _64>, C41, CO, ECO, EA, false>>},
    {"pp64x64x128_void_c21", &run<GemmP<H, RM, Shape<_64, _64, _128>, C21, PP, EPP, EA, false>>},
    {"co128x64x128_void_sk", &run<GemmP<H, RM, Shape<_128, _64, _128>, C1, CO, ECO, EA, false, SK>>},
    {"co128x64x64_void_sk", &run<GemmP<H, RM, Shape<_128, _64, _64>, C1, CO, ECO, EA, false, SK>>},
#elif FK_PROBE_SET == 7  // session 14: the plain GEMM at K >= 512 (MLP linears: K-major weight), LinearCombination
    {"prod pp128x128x64_et64x64_void", &run<GemmP<H, RM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _64>, false>>},
    {"kmaj prod pp128x128x64_et64x64_void", &run<GemmP<H, CM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _64>, false>>},
    {"kmaj lc pp128x128x64_auto", &run<GemmP<H, CM, Shape<_128, _128, _64>, C1, PP, EPP, EA, true>>},
    {"kmaj lc pp128x128x64_c21", &run<GemmP<H, CM, Shape<_128, _128, _64>, C21, PP, EPP, EA, true>>},
    {"kmaj lc co128x256x64_auto", &run<GemmP<H, CM, Shape<_128, _256, _64>, C1, CO, ECO, EA, true>>},
    {"kmaj lc co128x256x64_c21", &run<GemmP<H, CM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true>>},
    {"kmaj void co128x256x64_c21", &run<GemmP<H, CM, Shape<_128, _256, _64>, C21, CO, ECO, EA, false>>},
    {"lc co128x256x64_c21", &run<GemmP<H, RM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true>>},
    {"lc pp128x128x64_c21", &run<GemmP<H, RM, Shape<_128, _128, _64>, C21, PP, EPP, EA, true>>},
#elif FK_PROBE_SET == 8  // session 15: N = 64 with bias + GELU: one 128x64 epilogue step; fp16, bf16. At 58f90ed this set
    // also had the bias loaded into shared memory once per CTA instead of once per tile (a FusionCallbacks
    // whose Sm90RowBroadcast skips the reload): no faster, not kept (benchmarks/TRIED.md).
    {"prod co128x64x64_void", &run<GemmP<H, RM, Shape<_128, _64, _64>, C1, CO, ECO, EA, false>>},
    {"co128x64x64_void_et128x64", &run<GemmP<H, RM, Shape<_128, _64, _64>, C1, CO, ECO, Shape<_128, _64>, false>>},
    {"bf16 prod co128x64x64_void", &run<GemmP<B, RM, Shape<_128, _64, _64>, C1, CO, ECO, EA, false>>},
    {"bf16 co128x64x64_void_et128x64", &run<GemmP<B, RM, Shape<_128, _64, _64>, C1, CO, ECO, Shape<_128, _64>, false>>},
#elif FK_PROBE_SET == 9  // session 15: the plain GEMM at K >= 512 in fp16 and bf16, LinearCombination 128x256 / 2x1
    {"prod pp128x128x64_et64x64_void", &run<GemmP<H, RM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _64>, false>>},
    {"lc co128x256x64_c21", &run<GemmP<H, RM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true>>},
    {"lc pp128x128x64_c21", &run<GemmP<H, RM, Shape<_128, _128, _64>, C21, PP, EPP, EA, true>>},
    {"kmaj prod pp128x128x64_et64x64_void", &run<GemmP<H, CM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _64>, false>>},
    {"kmaj lc co128x256x64_c21", &run<GemmP<H, CM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true>>},
    {"kmaj lc pp128x128x64_c21", &run<GemmP<H, CM, Shape<_128, _128, _64>, C21, PP, EPP, EA, true>>},
    {"bf16 prod pp128x128x64_et64x64_void", &run<GemmP<B, RM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _64>, false>>},
    {"bf16 lc co128x256x64_c21", &run<GemmP<B, RM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true>>},
    {"bf16 kmaj prod pp128x128x64_et64x64_void", &run<GemmP<B, CM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _64>, false>>},
    {"bf16 kmaj lc co128x256x64_c21", &run<GemmP<B, CM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true>>},
    {"bf16 kmaj lc pp128x128x64_c21", &run<GemmP<B, CM, Shape<_128, _128, _64>, C21, PP, EPP, EA, true>>},
#elif FK_PROBE_SET == 10  // session 15: plain K >= 512: LinearCombination alone, the cluster alone, stream-K, 256x128, 1x2
    {"lc pp128x128x64_auto", &run<GemmP<H, RM, Shape<_128, _128, _64>, C1, PP, EPP, EA, true>>},
    {"pp128x128x64_et64x64_c21", &run<GemmP<H, RM, Shape<_128, _128, _64>, C21, PP, EPP, Shape<_64, _64>, false>>},
    {"lc co128x256x64_c21_sk", &run<GemmP<H, RM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true, SK>>},
    {"lc co256x128x64_c21", &run<GemmP<H, RM, Shape<_256, _128, _64>, C21, CO, ECO, EA, true>>},
    {"lc pp128x128x64_c12", &run<GemmP<H, RM, Shape<_128, _128, _64>, C12, PP, EPP, EA, true>>},
    {"kmaj lc pp128x128x64_auto", &run<GemmP<H, CM, Shape<_128, _128, _64>, C1, PP, EPP, EA, true>>},
    {"kmaj pp128x128x64_et64x64_c21", &run<GemmP<H, CM, Shape<_128, _128, _64>, C21, PP, EPP, Shape<_64, _64>, false>>},
    {"kmaj lc co128x256x64_c21_sk", &run<GemmP<H, CM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true, SK>>},
    {"kmaj lc co256x128x64_c21", &run<GemmP<H, CM, Shape<_256, _128, _64>, C21, CO, ECO, EA, true>>},
    {"kmaj lc pp128x128x64_c12", &run<GemmP<H, CM, Shape<_128, _128, _64>, C12, PP, EPP, EA, true>>},
#elif FK_PROBE_SET == 11  // session 15: set 10 in bf16, K-major b (the Llama linear's row)
    {"bf16 kmaj lc pp128x128x64_auto", &run<GemmP<B, CM, Shape<_128, _128, _64>, C1, PP, EPP, EA, true>>},
    {"bf16 kmaj pp128x128x64_et64x64_c21", &run<GemmP<B, CM, Shape<_128, _128, _64>, C21, PP, EPP, Shape<_64, _64>, false>>},
    {"bf16 kmaj lc co128x256x64_c21_sk", &run<GemmP<B, CM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true, SK>>},
    {"bf16 kmaj lc co256x128x64_c21", &run<GemmP<B, CM, Shape<_256, _128, _64>, C21, CO, ECO, EA, true>>},
    {"bf16 kmaj lc pp128x128x64_c12", &run<GemmP<B, CM, Shape<_128, _128, _64>, C12, PP, EPP, EA, true>>},
    {"bf16 lc co128x256x64_c21", &run<GemmP<B, RM, Shape<_128, _256, _64>, C21, CO, ECO, EA, true>>},
    {"bf16 lc pp128x128x64_c21", &run<GemmP<B, RM, Shape<_128, _128, _64>, C21, PP, EPP, EA, true>>},
#elif FK_PROBE_SET == 12  // session 15: bias + GELU/SiLU at long K: the kernel's ping-pong 64x128 steps vs 128x256 2x1
    {"prod pp128x128x64_et64x128_void", &run<GemmP<H, RM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _128>, false>>},
    {"co128x256x64_c21_void", &run<GemmP<H, RM, Shape<_128, _256, _64>, C21, CO, ECO, EA, false>>},
    {"bf16 prod pp128x128x64_et64x128_void", &run<GemmP<B, RM, Shape<_128, _128, _64>, C1, PP, EPP, Shape<_64, _128>, false>>},
    {"bf16 co128x256x64_c21_void", &run<GemmP<B, RM, Shape<_128, _256, _64>, C21, CO, ECO, EA, false>>},
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
