// A torch-free-at-runtime probe of launch shapes for the 1-byte-output kernels at HBM sizes (20M and 50M
// elements, rows of 4096): static INT8 / FP8 (csrc/fusekit.h's elementwise engine) and per-row / per-column
// INT8 (csrc/quantize/quant_i8_channel.cu), the kernels of csrc/ themselves next to variants (threads per block,
// vectors or rows per thread, a grid-stride loop), a pure 16-byte copy kernel and cudaMemcpy, all timed the
// same way in one process: L2 flushed by a 256 MB memset, events around each launch, the median of `reps`
// launches, `rounds` interleaved rounds (the figure is their median), and one-call CUDA-graph replays of
// some. Every variant's output is compared byte for byte with its csrc kernel's ("MISMATCH" lines).
// The csrc kernel files are included whole (their op registration is compiled out below); only c10/ATen
// headers and libraries are needed, no GPU to build:
//   PY=python3 CSRC=csrc; TI=$($PY -c "from torch.utils.cpp_extension import include_paths; \
//     print(' '.join('-I'+p for p in include_paths('cuda')))"); TL=$($PY -c "import torch, os; \
//     print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
//   nvcc -O3 -std=c++20 hbm_launch_shapes.cu -o hbm_probe $TI -I$CSRC --expt-relaxed-constexpr \
//     -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
//     -D__CUDA_NO_HALF2_OPERATORS__ -gencode=arch=compute_90a,code=sm_90a -D_GLIBCXX_USE_CXX11_ABI=1 \
//     -L$TL -lc10 -lc10_cuda -ltorch_cpu -ltorch_cuda -ltorch -Xlinker -rpath=$TL
//   ./hbm_probe [rounds=5] [reps=60] [name prefixes, e.g. dq8,dqf8]   # result: results/h200_hbm_probe.txt
// The per-channel and exact-row dynamic quantizer variants are launch parameters of the csrc kernels
// themselves ('dq8'/'dqf8': INT8/e4m3; 'bracket' and 'quot': the exact-row kernel with kQuotient off or on,
// whichever the op does not launch for that dtype; 'general': the kernel for any row length). Section A of the result file (256- vs 128-thread blocks) came from this probe as of bae548f
// built once against that commit's csrc and once against 96013a6's (its -DFK_PROBE_256 build).
#include "fusekit.h"
#undef TORCH_LIBRARY_IMPL
#define TORCH_LIBRARY_IMPL(ns, k, m) [[maybe_unused]] static void C10_CONCATENATE(fkp_unused_, C10_UID)(torch::Library & m)
#include "quantize/quant_fp8.cu"
#include "quantize/quant_i8.cu"
#include "quantize/quant_i8_channel.cu"
#include "quantize/dyn_quant_fp8.cu"
#include "quantize/dyn_quant_i8.cu"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e = (x);                                                                           \
    if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } \
  } while (0)

namespace fusekit {

// The engine's vector path for one input (N = 1, ROW = 0), VPT vectors per thread, TH threads; GS: a
// grid-stride loop over a grid of SMs x (2048 / TH) blocks instead of one-shot blocks. n % V == 0 here.
template <int VPT, int TH, bool GS, typename T, typename Out, int V, typename Op>
__global__ void __launch_bounds__(TH) ew(Op op, Out* __restrict__ out, const T* __restrict__ a, int64_t n) {
  const int64_t nvec = n / V;
  const int64_t step = GS ? int64_t(gridDim.x) * VPT * TH : 0;
  for (int64_t base = int64_t(blockIdx.x) * VPT * TH + threadIdx.x; base < nvec; base += step) {
    Held<T, V> x[VPT];
#pragma unroll
    for (int u = 0; u < VPT; ++u)
      if (base + u * TH < nvec) x[u].load(a, base + u * TH);
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
      const int64_t i = base + u * TH;
      if (i >= nvec) continue;
      if constexpr (has_pair<Op>::value) {
        Vec<uint16_t, V / 2> w;
#pragma unroll
        for (int j = 0; j < V; j += 2) {
          float2 f[1] = {x[u].pair(j)};
          w.v[j / 2] = op.pair(f);
        }
        reinterpret_cast<Vec<uint16_t, V / 2>*>(out)[i] = w;
      } else {
        Vec<Out, V> o;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          T vals[1] = {x[u].elem(j)};
          o.v[j] = apply1<T, Out>(op, vals);
        }
        reinterpret_cast<Vec<Out, V>*>(out)[i] = o;
      }
    }
    if (!GS) break;
  }
}

// A pure copy with the engine's one-shot structure: VPT 16-byte vectors per thread.
template <int VPT, int TH>
__global__ void __launch_bounds__(TH) copy16(uint4* __restrict__ dst, const uint4* __restrict__ src, int64_t nvec) {
  const int64_t base = int64_t(blockIdx.x) * VPT * TH + threadIdx.x;
  uint4 x[VPT];
#pragma unroll
  for (int u = 0; u < VPT; ++u)
    if (base + u * TH < nvec) x[u] = src[base + u * TH];
#pragma unroll
  for (int u = 0; u < VPT; ++u)
    if (base + u * TH < nvec) dst[base + u * TH] = x[u];
}

}  // namespace fusekit

using namespace fusekit;

static cudaStream_t g_st;  // every launch, the flush and the events

struct Timer {
  cudaEvent_t a, b;
  void* flush;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMalloc(&flush, 256 << 20));
  }
  float median(const std::function<void()>& fn, int reps) {
    std::vector<float> t;
    for (int i = 0; i < reps + 3; ++i) {
      CK(cudaMemsetAsync(flush, i & 0xff, 256 << 20, g_st));
      CK(cudaEventRecord(a, g_st));
      fn();
      CK(cudaEventRecord(b, g_st));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 3) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

static int g_sms = 0;

template <int VPT, int TH, bool GS, typename T, typename Out, typename Op>
std::function<void()> ew_launch(Op op, Out* out, const T* x, int64_t n) {
  constexpr int V = vec_width<T, Out>();
  const int64_t nvec = n / V;
  const unsigned blocks = GS ? unsigned(g_sms * (2048 / TH)) : unsigned((nvec + VPT * TH - 1) / (VPT * TH));
  return [=] { ew<VPT, TH, GS, T, Out, V><<<blocks, TH, 0, g_st>>>(op, out, x, n); };
}

template <typename T, typename Out, typename Op>
std::function<void()> real_launch(Op op, Out* out, const T* x, int64_t n) {
  // launch_elementwise's choice at these sizes (vector path, full-size blocks), on g_st
  constexpr int V = vec_width<T, Out>();
  constexpr int th = block_threads<Out>();
  const unsigned blocks = one_shot_blocks(n / V, false, th);
  const at::cuda::detail::IntDivider<unsigned> one(1u);
  return [=] {
    elementwise_kernel<1, 0, T, Out, V, false><<<blocks, th, 0, g_st>>>(op, out, x, nullptr, nullptr, n, 1, one, false);
  };
}

// quant_channel_kernel with TH threads and R rows per thread; the defaults are the op's launch
template <typename T, bool PER_ROW, int TH = kChannelThreads, int R = kChannelRows>
std::function<void()> chan_launch(const T* x, const float* s, const float* z, int8_t* q, int64_t rows, int64_t cols) {
  constexpr int V = 16 / sizeof(T);
  const int64_t vcols = cols / V;
  const int64_t threads = vcols * ((rows + R - 1) / R);
  const unsigned blocks = unsigned((threads + TH - 1) / TH);
  const at::cuda::detail::IntDivider<unsigned> vdiv(static_cast<unsigned>(vcols));
  return [=] {
    quant_channel_kernel<T, V, PER_ROW, TH, R><<<blocks, TH, 0, g_st>>>(x, s, z, q, rows, vcols, vdiv, -128.f, 127.f);
  };
}

// dynamic per-row quantization: the csrc kernels as launch_rowquant launches them (rows of 4096 16-bit
// elements: rowquant_exact_kernel), the general kernel alone, and the exact kernel with other caps
template <typename T, typename Q, bool kGeneral = false>
std::function<void()> rowq_real(const T* x, typename Q::Out* q, float* sc, int64_t rows, int64_t cols) {
  constexpr int V = 16 / sizeof(T);
  int threads = 32;
  while (threads < kRowThreads && int64_t(threads) * kRowVecs < cols / V) threads *= 2;
  constexpr int kTH = ExactRow<T>::kThreads, kMinBlocks = ExactRow<T>::kMinBlocks;
  if (!kGeneral && cols / V == kTH * kRowVecs)
    return [=] {
      rowquant_exact_kernel<T, V, Q, kTH, kMinBlocks, ExactRow<T>::kQuotient><<<unsigned(rows), kTH, 0, g_st>>>(
          x, q, sc, 1e-5f);
    };
  return [=] { rowquant_kernel<T, V, Q><<<unsigned(rows), threads, 0, g_st>>>(x, q, sc, cols, 1e-5f); };
}
template <typename T, typename Q, int MINB, int TH = 128, bool QUOT = false>  // rows of TH * kRowVecs vectors
std::function<void()> rowq_launch(const T* x, typename Q::Out* q, float* sc, int64_t rows, int64_t cols) {
  constexpr int V = 16 / sizeof(T);
  return [=] { rowquant_exact_kernel<T, V, Q, TH, MINB, QUOT><<<unsigned(rows), TH, 0, g_st>>>(x, q, sc, 1e-5f); };
}

// fn captured once into a CUDA graph on g_st; the returned function replays it
std::function<void()> graphed(const std::function<void()>& fn) {
  cudaGraph_t gr;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeRelaxed));
  fn();
  CK(cudaStreamEndCapture(g_st, &gr));
  CK(cudaGraphInstantiate(&ge, gr, 0));
  return [=] { CK(cudaGraphLaunch(ge, g_st)); };
}

template <typename T>
void run_dtype(const char* dname, int64_t rows, int64_t cols, Timer& tm, int rounds, int reps,
               std::map<std::string, std::vector<float>>& res, const std::string& only) {
  const int64_t n = rows * cols;
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<T> xh(n);
  for (int64_t i = 0; i < n; ++i) xh[i] = static_cast<T>(nd(g));
  const int64_t ns = std::max(rows, cols);  // per column [cols], per row [rows]
  std::vector<float> sh(ns), zh(ns);
  std::uniform_real_distribution<float> us(0.01f, 0.05f);
  for (int64_t c = 0; c < ns; ++c) sh[c] = us(g), zh[c] = float(int(c % 7) - 3);
  T* x;
  float *s, *z;
  int8_t *q0, *q1;
  float* sc;
  void *c1, *c2;
  CK(cudaMalloc(&x, n * sizeof(T)));
  CK(cudaMalloc(&s, ns * 4));
  CK(cudaMalloc(&z, ns * 4));
  CK(cudaMalloc(&q0, n));
  CK(cudaMalloc(&q1, n));
  CK(cudaMalloc(&sc, rows * 4));
  const int64_t moved = n * (sizeof(T) + 1), half = moved / 2;
  CK(cudaMalloc(&c1, half));
  CK(cudaMalloc(&c2, half));
  CK(cudaMemcpy(x, xh.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(s, sh.data(), ns * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(z, zh.data(), ns * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(c1, 1, half));

  ScalarArg sa, za;
  sa.value = 0.05f, za.value = 3.f;
  QuantI8<T, false> qi8{sa, za, -128.f, 127.f, 1.0f / 0.05f};
  QuantFp8<T> qf8{sa};
  auto* q1u = reinterpret_cast<uint8_t*>(q1);
  auto* q0u = reinterpret_cast<uint8_t*>(q0);
  const int64_t nv16 = half / 16;
  std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"memcpy", [=] { CK(cudaMemcpyAsync(c2, c1, half, cudaMemcpyDeviceToDevice, g_st)); }},
      {"copy16 vpt2 th256", [=] { copy16<2, 256><<<unsigned((nv16 + 511) / 512), 256, 0, g_st>>>((uint4*)c2, (const uint4*)c1, nv16); }},
      {"copy16 vpt4 th256", [=] { copy16<4, 256><<<unsigned((nv16 + 1023) / 1024), 256, 0, g_st>>>((uint4*)c2, (const uint4*)c1, nv16); }},
      {"i8 real", real_launch(qi8, q0, x, n)},
      {"i8 vpt2 th256", ew_launch<2, 256, false>(qi8, q1, x, n)},
      {"i8 vpt4 th256", ew_launch<4, 256, false>(qi8, q1, x, n)},
      {"i8 vpt2 th128", ew_launch<2, 128, false>(qi8, q1, x, n)},
      {"i8 vpt1 th256", ew_launch<1, 256, false>(qi8, q1, x, n)},
      {"i8 gs vpt2 th256", ew_launch<2, 256, true>(qi8, q1, x, n)},
      {"fp8 real", real_launch(qf8, q0u, x, n)},
      {"fp8 vpt2 th256", ew_launch<2, 256, false>(qf8, q1u, x, n)},
      {"fp8 vpt2 th128", ew_launch<2, 128, false>(qf8, q1u, x, n)},
      {"col real", chan_launch<T, false>(x, s, z, q0, rows, cols)},
      {"col r4 th256", chan_launch<T, false, 256, 4>(x, s, z, q1, rows, cols)},
      {"col r2 th128", chan_launch<T, false, 128, 2>(x, s, z, q1, rows, cols)},
      {"col r4 th128", chan_launch<T, false, 128, 4>(x, s, z, q1, rows, cols)},
      {"col r8 th128", chan_launch<T, false, 128, 8>(x, s, z, q1, rows, cols)},
      {"col r6 th128", chan_launch<T, false, 128, 6>(x, s, z, q1, rows, cols)},
      {"dq8 real", rowq_real<T, ToI8>(x, q0, sc, rows, cols)},
      {"dq8 general", rowq_real<T, ToI8, true>(x, q1, sc, rows, cols)},

      {"dqf8 real", rowq_real<T, ToE4M3>(x, q0u, sc, rows, cols)},
      {"dqf8 general", rowq_real<T, ToE4M3, true>(x, q1u, sc, rows, cols)},

      {"row real", chan_launch<T, true>(x, s, z, q0, rows, cols)},
      {"row r4 th256", chan_launch<T, true, 256, 4>(x, s, z, q1, rows, cols)},
      {"row r4 th128", chan_launch<T, true, 128, 4>(x, s, z, q1, rows, cols)},
  };
  if constexpr (sizeof(T) == 2) {  // the exact-row kernel with other caps
    // the exact-row kernel on the bracket (kQuotient = false: csrc before session 11's change)
    cases.push_back({"dq8 bracket", rowq_launch<T, ToI8, 10, 128, false>(x, q1, sc, rows, cols)});
    cases.push_back({"dqf8 bracket", rowq_launch<T, ToE4M3, 10, 128, false>(x, q1u, sc, rows, cols)});
    cases.push_back({"dq8 minb12", rowq_launch<T, ToI8, 12>(x, q1, sc, rows, cols)});
    cases.push_back({"dq8 minb16", rowq_launch<T, ToI8, 16>(x, q1, sc, rows, cols)});
    cases.push_back({"dqf8 minb12", rowq_launch<T, ToE4M3, 12>(x, q1u, sc, rows, cols)});
    cases.push_back({"dqf8 minb16", rowq_launch<T, ToE4M3, 16>(x, q1u, sc, rows, cols)});
  } else {
    cases.push_back({"dq8 exact256 minb4", rowq_launch<T, ToI8, 4, 256>(x, q1, sc, rows, cols)});
    cases.push_back({"dqf8 exact256 minb4", rowq_launch<T, ToE4M3, 4, 256>(x, q1u, sc, rows, cols)});
    cases.push_back({"dq8 quot", rowq_launch<T, ToI8, 5, 256, true>(x, q1, sc, rows, cols)});  // kQuotient
    cases.push_back({"dqf8 quot", rowq_launch<T, ToE4M3, 5, 256, true>(x, q1u, sc, rows, cols)});
  }
  if (!only.empty())  // the cases whose name starts with one of `only`'s comma-separated prefixes, and memcpy
    cases.erase(std::remove_if(cases.begin() + 1, cases.end(), [&](auto& c) {
      for (size_t b = 0, e; b <= only.size(); b = e + 1) {
        e = std::min(only.find(',', b), only.size());
        if (c.first.rfind(only.substr(b, e - b), 0) == 0) return false;
      }
      return true;
    }), cases.end());
  cases.push_back({"memcpy graph", graphed(cases[0].second)});
  for (size_t i = 0, m = cases.size(); i < m; ++i)
    if (cases[i].first == "col real" || cases[i].first == "i8 real" || cases[i].first == "copy16 vpt2 th256")
      cases.push_back({cases[i].first + " graph", graphed(cases[i].second)});
  // exactness of each variant against its family's real kernel (the name's first word)
  std::map<std::string, std::vector<int8_t>> refs;
  std::vector<int8_t> got(n);
  for (auto& [name, fn] : cases) {
    if (name.find(' ') == std::string::npos || name.rfind("copy", 0) == 0 || name.find("graph") != std::string::npos) continue;
    const std::string f = name.substr(0, name.find(' '));
    CK(cudaMemset(q1, 0x55, n));
    fn();
    CK(cudaStreamSynchronize(g_st));
    if (name.find("real") != std::string::npos) {
      refs[f].resize(n);
      CK(cudaMemcpy(refs[f].data(), q0, n, cudaMemcpyDeviceToHost));
      continue;
    }
    CK(cudaMemcpy(got.data(), q1, n, cudaMemcpyDeviceToHost));
    const std::vector<int8_t>& ref = refs.at(f);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += got[i] != ref[i];
    if (bad) printf("MISMATCH %s %s %lld: %lld\n", dname, name.c_str(), (long long)n, (long long)bad);
  }
  for (int r = 0; r < rounds; ++r)
    for (auto& [name, fn] : cases) res[std::string(dname) + " " + std::to_string(n) + " | " + name].push_back(tm.median(fn, reps));
  CK(cudaFree(x)); CK(cudaFree(s)); CK(cudaFree(z)); CK(cudaFree(q0)); CK(cudaFree(q1)); CK(cudaFree(c1)); CK(cudaFree(c2)); CK(cudaFree(sc));
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 5, reps = argc > 2 ? atoi(argv[2]) : 60;
  const std::string only = argc > 3 ? argv[3] : "";
  CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  Timer tm;
  std::map<std::string, std::vector<float>> res;
  std::vector<std::string> order;
  for (int64_t rows : {4882, 12207}) {
    run_dtype<c10::Half>("fp16", rows, 4096, tm, rounds, reps, res, only);
    run_dtype<c10::BFloat16>("bf16", rows, 4096, tm, rounds, reps, res, only);
    run_dtype<float>("fp32", rows, 4096, tm, rounds, reps, res, only);
    printf("rows %lld done\n", (long long)rows);
    fflush(stdout);
  }
  // print: per (dtype, n) block, each case's median over rounds, % of memcpy, and the round spread
  std::string block;
  float memcpy_ms = 0;
  std::vector<std::pair<std::string, std::vector<float>>> rows(res.begin(), res.end());
  std::stable_sort(rows.begin(), rows.end(), [](auto& a, auto& b) {
    return a.first.substr(0, a.first.find('|')) < b.first.substr(0, b.first.find('|'));
  });
  for (auto& [key, v] : rows) {
    const std::string b = key.substr(0, key.find('|'));
    std::vector<float> s = v;
    std::sort(s.begin(), s.end());
    const float med = s[s.size() / 2];
    if (b != block) {
      block = b;
      memcpy_ms = 0;
      for (auto& [k2, v2] : rows)
        if (k2 == b + "| memcpy") {
          std::vector<float> t = v2;
          std::sort(t.begin(), t.end());
          memcpy_ms = t[t.size() / 2];
        }
      printf("\n== %s (memcpy of the same bytes %.4f ms)\n", b.c_str(), memcpy_ms);
    }
    printf("  %-24s %.4f ms  %6.1f%% of memcpy   rounds %.4f..%.4f\n", key.substr(key.find('|') + 2).c_str(), med,
           100.f * memcpy_ms / med, s.front(), s.back());
  }
  return 0;
}
