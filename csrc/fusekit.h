// Shared pieces of fusekit's CUDA kernels: input checks, a 16-byte-vector elementwise engine sized to
// the GPU, and the float-or-0-dim-tensor scalar arguments (see fusion_backend/ops.py).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fast_math.cuh"  // SFU activations, division by a reused divisor (torch-free)

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#define FK_CHECK_CUDA(t) TORCH_CHECK((t).is_cuda(), "fusekit: " #t " must be a CUDA tensor, got ", fusekit::describe(t))
#define FK_CHECK_CONTIGUOUS(t) TORCH_CHECK((t).is_contiguous(), "fusekit: " #t " must be contiguous")
#define FK_CHECK_FLOATING(t)                                                                          \
  TORCH_CHECK((t).scalar_type() == at::kFloat || (t).scalar_type() == at::kHalf ||                     \
                  (t).scalar_type() == at::kBFloat16,                                                 \
              "fusekit: " #t " must be float32, float16 or bfloat16, got ", c10::toString((t).scalar_type()))
// NOTE: messages are built as plain strings: streaming IntArrayRef/Device into TORCH_CHECK from nvcc-
// compiled code crashed the process on torch 2.11 (seen on an H200), instead of raising.
#define FK_CHECK_SAME(a, b)                                                                           \
  TORCH_CHECK((a).sizes() == (b).sizes() && (a).scalar_type() == (b).scalar_type() &&                 \
                  (a).device() == (b).device(),                                                       \
              "fusekit: " #a " and " #b " must have one shape, dtype and device; got ",               \
              fusekit::describe(a), " and ", fusekit::describe(b))

namespace fusekit {

inline std::string describe(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] " + c10::toString(t.scalar_type()) + " " + t.device().str();
}

// Whether `m` broadcasts to the 4-D shape `full` (at most 4 dims, each 1 or equal to full's, right-aligned).
inline bool broadcasts_to(const at::Tensor& m, const std::array<int64_t, 4>& full) {
  if (m.dim() > 4) return false;
  for (int64_t i = 1; i <= m.dim(); ++i) {
    if (m.size(-i) != 1 && m.size(-i) != full[4 - i]) return false;
  }
  return true;
}

// Attention against a KV cache (decode_attention, gqa_attention): q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with
// Hq % Hkv == 0, float16 or bfloat16 on one CUDA device, unit last-dim strides.
inline void check_cache_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op) {
  TORCH_CHECK(q.is_cuda(), "fusekit: q must be a CUDA tensor, got ", describe(q));
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "fusekit: ", op,
              " takes float16 or bfloat16, got q ", describe(q));
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "fusekit: ", op, ": q, k, v must be 4-D; got ",
              describe(q), ", ", describe(k), ", ", describe(v));
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  k.device() == q.device() && v.device() == q.device(),
              "fusekit: ", op, ": q, k, v must share dtype and device; got ", describe(q), ", ", describe(k), ", ",
              describe(v));
  TORCH_CHECK(k.size(0) == q.size(0) && v.sizes() == k.sizes() && k.size(3) == q.size(3) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0,
              "fusekit: ", op, ": want q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with Hq % Hkv == 0; got ", describe(q),
              ", ", describe(k), ", ", describe(v));
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "fusekit: ", op,
              ": q, k, v need a unit last-dim stride");
}

// An attention mask: on q's device, bool or q's dtype (or float32 where `float32_ok`), broadcastable to
// `full` (named `shape` in the message).
inline void check_attention_mask(const at::Tensor& m, const at::Tensor& q, const std::array<int64_t, 4>& full,
                                 const char* op, const char* shape, bool float32_ok) {
  TORCH_CHECK(m.device() == q.device(), "fusekit: ", op, ": mask on another device: ", describe(m));
  TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == q.scalar_type() ||
                  (float32_ok && m.scalar_type() == at::kFloat),
              "fusekit: ", op, ": mask must be ", float32_ok ? "bool, float32" : "bool", " or q's dtype; got ",
              describe(m));
  TORCH_CHECK(broadcasts_to(m, full), "fusekit: ", op, ": mask ", describe(m), " does not broadcast to ", shape);
}

// x [..., N] and a bias [N] of x's dtype and device, both contiguous (the bias-epilogue ops).
inline void check_bias(const at::Tensor& x, const at::Tensor& bias) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  FK_CHECK_CONTIGUOUS(bias);
  TORCH_CHECK(x.dim() >= 1 && bias.dim() == 1 && bias.size(0) == x.size(-1) &&
                  bias.scalar_type() == x.scalar_type() && bias.device() == x.device(),
              "fusekit: bias must be [x.shape[-1]] with x's dtype and device; got x ", describe(x),
              ", bias ", describe(bias));
}

constexpr int kThreads = 256;
constexpr int kSmallThreads = 128;  // launch_elementwise's blocks when a launch is small (small_launch)

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// The SM count of device `dev` (default: the current one), queried once per device.
inline int sm_count(int dev = -1) {
  static int sms[64] = {0};
  if (dev < 0) dev = c10::cuda::current_device();
  if (sms[dev] == 0) C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev));
  return sms[dev];
}

// Dynamic shared memory above 48 KB must be asked for, per kernel and per device: `bytes` for Kernel on the current
// device, once (every launch of it may then use up to `bytes`).
template <auto Kernel>
void opt_in_smem(size_t bytes) {
  static bool done[64] = {};
  const int dev = c10::cuda::current_device();
  if (done[dev]) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done[dev] = true;
}

// Blocks for `units` independent work items: enough to fill every SM (8 x 256 threads each), no more;
// the kernels are grid-stride loops.
inline int blocks_for(int64_t units) {
  int64_t want = (units + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(sm_count()) * 8)));
}

// explicit conversions: torch's extension flags disable the implicit half/bfloat16 <-> float ones
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// 16 bytes global -> shared without registers (sm_80+); pred false: zeros (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Programmatic dependent launch (PDL, sm_90+). A kernel launched by launch_ex with pdl set may start while
// the kernel before it on the stream is still running (its launch, and what it does before pdl_wait, overlap
// that kernel's tail; Inductor's Triton kernels do the same under triton.enable_pdl). So it calls pdl_wait()
// before any global access an earlier kernel could conflict with (a load of an input, any store: even an
// output buffer may be memory the kernel before still reads), and pdl_trigger() where the next kernel may
// start early (that kernel's own pdl_wait still waits for this one to finish). No-ops where compiled for an
// older arch, and such a kernel is launched without PDL (pdl_allowed checks its binary). Measured on an H100
// (benchmarks/NOTES.md, Llama-style decode step in a CUDA graph, Inductor's PDL on): attention and decode GEMMs
// with PDL b1 0.611 -> 0.598 ms, b32 0.898 -> 0.896; prefetching the GEMMs' weights into L2 before the wait
// was slower (b1 0.637 ms) and is not done.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether a kernel whose binary is `binary_version` (cudaFuncAttributes) may be launched with PDL now: built for
// sm_90+ (its pdl_wait is real), and FUSEKIT_PDL allows it (read at each launch: a CUDA graph keeps what its
// capture saw): unset or "1": every part; "0": none; else the parts whose letter it holds (A/B runs): 'a' the
// attention kernels, 'g' the decode GEMMs.
inline bool pdl_allowed(int binary_version, char part) {
  if (binary_version < 90) return false;
  const char* e = std::getenv("FUSEKIT_PDL");
  if (e == nullptr || std::strcmp(e, "1") == 0) return true;
  return std::strchr(e, part) != nullptr;
}

template <typename K>
int binary_version(K* kernel) {
  cudaFuncAttributes a{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  return a.binaryVersion;
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where `pdl`, as a cluster of (1, cluster_y, 1) CTAs
// where cluster_y > 0.
template <typename... P, typename... A>
void launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
               unsigned cluster_y, A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_y > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1, attr[n].val.clusterDim.y = cluster_y, attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr, cfg.numAttrs = n;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}

// c += a (16x16, row-major) * b (16x8, col-major) on tensor cores (sm_80+), float32 accumulation; T is
// __nv_bfloat16 or __half. a0..a3, b0, b1: the PTX fragment registers (two elements each).
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// f(__half{}) for float16, f(__nv_bfloat16{}) otherwise: the ops whose kernels take only these two (callers check).
template <typename F>
void dispatch_half_bf16(at::ScalarType t, F&& f) {
  if (t == at::kHalf) {
    f(__half{});
  } else {
    f(__nv_bfloat16{});
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Vector width for a kernel reading T and writing Out: 16-byte accesses on the wider side.
template <typename T, typename Out>
constexpr int vec_width() { return 16 / (sizeof(T) > sizeof(Out) ? sizeof(T) : sizeof(Out)); }

constexpr int kVecsPerThread = 2;  // independent 16-byte loads per thread and input, all issued first

// float -> T, round to nearest even, and the float value that rounding gives. bfloat16 rounds one value
// with integer ops: a lone F2F conversion made bf16 kernels slower (measured on an H200: bias + ReLU in
// bf16 at 50M elements, 0.070 ms this way, 0.081 ms with __float2bfloat16_rn). rnd2 rounds two values
// with one packed conversion, which is faster than both (static INT8 in bf16: 0.066 -> 0.058 ms).
__device__ __forceinline__ float bf16_round(float f) {
  if (isnan(f)) return f;
  const unsigned u = __float_as_uint(f);
  return __uint_as_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
template <typename T>
__device__ __forceinline__ T to(float f) { return static_cast<T>(f); }
template <>
__device__ __forceinline__ c10::BFloat16 to<c10::BFloat16>(float f) {
  return c10::BFloat16(static_cast<unsigned short>(__float_as_uint(bf16_round(f)) >> 16), c10::BFloat16::from_bits());
}
template <typename T>
__device__ __forceinline__ float rnd(float f) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return bf16_round(f);
  else return static_cast<float>(static_cast<T>(f));
}
template <typename T>
__device__ __forceinline__ void rnd2(float& a, float& b) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    // unpacked with a shift and a mask: __bfloat1622float2 spends a PRMT and a shift on the high half
    const __nv_bfloat162 h = __float22bfloat162_rn(make_float2(a, b));
    const uint32_t w = *reinterpret_cast<const uint32_t*>(&h);
    a = __uint_as_float(w << 16), b = __uint_as_float(w & 0xffff0000u);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    const float2 f = __half22float2(__float22half2_rn(make_float2(a, b)));
    a = f.x, b = f.y;
  }
}
template <typename T>
__device__ __forceinline__ float2 rnd2(float2 v) {
  rnd2<T>(v.x, v.y);
  return v;
}

// f applied lane by lane: map2(f, a, b) = {f(a.x, b.x), f(a.y, b.y)} (the float2 ops' arithmetic).
template <typename F, typename... A>
__device__ __forceinline__ float2 map2(F f, A... a) {
  return make_float2(f(a.x...), f(a.y...));
}

// An op with a 1-byte output and `static constexpr bool kPairs = true` also defines
// `uint16_t pair(const float2 (&v)[N])`: two neighbouring elements in (converted by the engine from the held
// words, see Held::pair), their two output bytes out, low byte first. Kernels that round to a 16-bit type
// between steps (eager's semantics) then round two values per conversion instruction (see rnd2), and the
// bytes are packed as words rather than assembled byte by byte.
template <typename Op, typename = void>
struct has_pair : std::false_type {};
template <typename Op>
struct has_pair<Op, std::enable_if_t<Op::kPairs>> : std::true_type {};

// An op with `static constexpr bool kFloat2 = true` computes in float on two neighbouring elements:
// `float2 operator()(const float2 (&v)[N])`, inputs converted by the engine and the two results rounded
// to T with one packed conversion (ops whose output dtype is their input dtype; see benchmarks/NOTES.md).
template <typename Op, typename = void>
struct is_float2_op : std::false_type {};
template <typename Op>
struct is_float2_op<Op, std::enable_if_t<Op::kFloat2>> : std::true_type {};

template <typename T>
__device__ __forceinline__ float2 load2(const T* p) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  else if constexpr (std::is_same_v<T, c10::Half>) return __half22float2(*reinterpret_cast<const __half2*>(p));
  else return make_float2(static_cast<float>(p[0]), static_cast<float>(p[1]));
}
template <typename T>
__device__ __forceinline__ void store2(T* p, float2 r) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) *reinterpret_cast<__nv_bfloat162*>(p) = __float22bfloat162_rn(r);
  else if constexpr (std::is_same_v<T, c10::Half>) *reinterpret_cast<__half2*>(p) = __float22half2_rn(r);
  else p[0] = static_cast<T>(r.x), p[1] = static_cast<T>(r.y);
}

// What a thread holds of one vector load, read back as elements or as float pairs. bf16 is held as 32-bit
// words (bf16 pairs) and split where used: held as 16-bit elements, each load was unpacked (PRMT, which
// waits for it) before the next load was issued, so the loads ran one after another (static INT8 and
// bias + ReLU in bf16; benchmarks/NOTES.md). fp16 needs no unpacking (HADD2.F32 reads either half).
template <typename T, int V, typename = void>
struct Held {
  Vec<T, V> x;
  __device__ __forceinline__ void load(const T* p, int64_t i) { x = reinterpret_cast<const Vec<T, V>*>(p)[i]; }
  __device__ __forceinline__ T elem(int j) const { return x.v[j]; }
  __device__ __forceinline__ float2 pair(int j) const { return load2(&x.v[j]); }
};
template <int V>
struct Held<c10::BFloat16, V, std::enable_if_t<V % 2 == 0>> {
  Vec<uint32_t, V / 2> w;
  __device__ __forceinline__ void load(const c10::BFloat16* p, int64_t i) {
    w = reinterpret_cast<const Vec<uint32_t, V / 2>*>(p)[i];
  }
  __device__ __forceinline__ c10::BFloat16 elem(int j) const {
    return c10::BFloat16(static_cast<unsigned short>(w.v[j / 2] >> (16 * (j % 2))), c10::BFloat16::from_bits());
  }
  __device__ __forceinline__ float2 pair(int j) const {  // j even
    return make_float2(__uint_as_float(w.v[j / 2] << 16), __uint_as_float(w.v[j / 2] & 0xffff0000u));
  }
};

// A held vector as V floats, converted pair by pair (bf16: a shift and a mask per pair of elements).
template <typename T, int V>
__device__ __forceinline__ void to_floats(const Held<T, V>& v, float (&xf)[V]) {
  if constexpr (V % 2 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 2) {
      const float2 f = v.pair(j);
      xf[j] = f.x, xf[j + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) xf[j] = static_cast<float>(v.elem(j));
  }
}

// One element through the engine's per-element call: a float2 op sees it twice (tails, unaligned views).
template <typename T, typename Out, int N, typename Op>
__device__ __forceinline__ Out apply1(const Op& op, const T (&vals)[N]) {
  if constexpr (is_float2_op<Op>::value) {
    float2 f[N];
#pragma unroll
    for (int k = 0; k < N; ++k) f[k] = make_float2(static_cast<float>(vals[k]), static_cast<float>(vals[k]));
    return to<Out>(op(f).x);
  } else {
    return op(vals);
  }
}

// Threads per block of elementwise_kernel. Kernels that write one byte per element (static INT8 and FP8)
// take 128-thread blocks. Measured on an H200 against 256 (benchmarks/probes/hbm_launch_shapes.cu, both
// builds in one call, two runs each), at 20M elements: static INT8 fp16 0.0205 -> 0.0197 ms, bf16 0.0205 ->
// 0.0200 ms, FP8 0.0203 -> 0.0196 ms (a device-to-device copy of the same bytes: 0.0192 ms); at 50M, 1-2%.
// Small launches keep kSmallThreads.
template <typename Out, bool Small = false>
constexpr int block_threads() { return Small ? kSmallThreads : sizeof(Out) == 1 ? 128 : kThreads; }

// out[i] = op({in[0][i], ..., in[N-1][i]}) over n elements. Bit k of ROW marks input k as a [cols] vector
// broadcast along the last dimension (a bias). One-shot blocks (no grid-stride loop): the block scheduler
// keeps the SMs full and every thread's loads are in flight together. Vector loads when every pointer is
// aligned and cols is a multiple of the vector width; the < V leftover elements go to block 0.
// Small: one vector per thread in kSmallThreads-thread blocks (see small_launch).
template <int N, int ROW, typename T, typename Out, int V, bool Small, typename Op>
__global__ void __launch_bounds__(block_threads<Out, Small>()) elementwise_kernel(
    Op op, Out* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c,
    int64_t n, int64_t cols, at::cuda::detail::IntDivider<unsigned> vdiv, bool idx32) {
  constexpr int kVecsPerThread = Small ? 1 : ::fusekit::kVecsPerThread;
  constexpr int kThreads = block_threads<Out, Small>();
  const T* in[3] = {a, b, c};
  const int64_t nvec = n / V, vcols = cols / V;
  const int64_t base = int64_t(blockIdx.x) * kVecsPerThread * kThreads + threadIdx.x;
  // Index math first, then every load. The broadcast index is i % vcols: a multiply-shift (vdiv) where the
  // indices fit 32 bits; a 64-bit modulo is a call, which held registers (6 blocks/SM instead of 8) and,
  // placed between the loads, made them wait on each other (bias + GELU; benchmarks/NOTES.md).
  int64_t row[kVecsPerThread];
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    const int64_t i = base + u * kThreads;
    row[u] = !ROW ? 0 : idx32 ? int64_t(vdiv.divmod(static_cast<unsigned>(i)).mod) : i % vcols;
  }
  Held<T, V> x[kVecsPerThread][N];
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    const int64_t i = base + u * kThreads;
    if (i < nvec) {
#pragma unroll
      for (int k = 0; k < N; ++k) x[u][k].load(in[k], (ROW >> k) & 1 ? row[u] : i);
    }
  }
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    const int64_t i = base + u * kThreads;
    if (i < nvec) {
      if constexpr (has_pair<Op>::value && V % 2 == 0) {
        static_assert(sizeof(Out) == 1, "kPairs ops write one byte per element");
        Vec<uint16_t, V / 2> w;
#pragma unroll
        for (int j = 0; j < V; j += 2) {
          float2 f[N];
#pragma unroll
          for (int k = 0; k < N; ++k) f[k] = x[u][k].pair(j);
          w.v[j / 2] = op.pair(f);
        }
        reinterpret_cast<Vec<uint16_t, V / 2>*>(out)[i] = w;
        continue;
      }
      Vec<Out, V> o;
      if constexpr (is_float2_op<Op>::value && V % 2 == 0) {
#pragma unroll
        for (int j = 0; j < V; j += 2) {
          float2 f[N];
#pragma unroll
          for (int k = 0; k < N; ++k) f[k] = x[u][k].pair(j);
          store2(&o.v[j], op(f));
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          T vals[N];
#pragma unroll
          for (int k = 0; k < N; ++k) vals[k] = x[u][k].elem(j);
          o.v[j] = apply1<T, Out>(op, vals);
        }
      }
      reinterpret_cast<Vec<Out, V>*>(out)[i] = o;
    }
  }
  if (blockIdx.x == 0) {
    for (int64_t i = nvec * V + threadIdx.x; i < n; i += kThreads) {
      T vals[N];
#pragma unroll
      for (int k = 0; k < N; ++k) vals[k] = in[k][(ROW >> k) & 1 ? i % cols : i];
      out[i] = apply1<T, Out>(op, vals);
    }
  }
}

inline unsigned one_shot_blocks(int64_t units, bool small = false, int threads = kThreads) {
  const int64_t per_block = small ? kSmallThreads : int64_t(threads) * kVecsPerThread;
  return static_cast<unsigned>(std::max<int64_t>(1, (units + per_block - 1) / per_block));
}

// Whether `units` give fewer full-size blocks than the GPU has SMs: the work then sits on a few SMs, whose
// instruction issue bounds the kernel (98K elements of bias + GELU: 24 blocks, 1.7-1.8 us against Inductor's
// 1.4 us with 96). Such launches take one vector per thread in kSmallThreads-thread blocks (96 blocks there).
inline bool small_launch(int64_t units) { return one_shot_blocks(units) < unsigned(sm_count()); }

// Launch `op` on the current stream over contiguous inputs of one dtype T (`cols` is the length of the
// row-broadcast inputs selected by ROW; ignored when ROW == 0).
template <int N, int ROW = 0, typename T, typename Out, typename Op>
void launch_elementwise(Op op, Out* out, const T* a, const T* b, const T* c, int64_t n, int64_t cols = 1) {
  if (n == 0) return;
  constexpr int V = vec_width<T, Out>();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto ok = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  bool vec = ok(out, sizeof(Vec<Out, V>)) && ok(a, sizeof(Vec<T, V>)) && (N < 2 || ok(b, sizeof(Vec<T, V>))) &&
             (N < 3 || ok(c, sizeof(Vec<T, V>))) && (ROW == 0 || cols % V == 0);
  const int64_t units = vec ? n / V : n, vcols = vec ? cols / V : cols;
  const bool idx32 = ROW != 0 && units < (int64_t(1) << 31) && vcols >= 1;  // + the grid's overhang < 2^32
  const at::cuda::detail::IntDivider<unsigned> vdiv(idx32 ? static_cast<unsigned>(vcols) : 1u);
  constexpr int kFull = block_threads<Out>();
  const bool small = small_launch(units);  // decided on 256-thread blocks, whatever kFull is
  const unsigned blocks = one_shot_blocks(units, small, kFull);
  const int threads = small ? kSmallThreads : kFull;
  if (vec && small) {
    elementwise_kernel<N, ROW, T, Out, V, true><<<blocks, threads, 0, stream>>>(op, out, a, b, c, n, cols, vdiv, idx32);
  } else if (vec) {
    elementwise_kernel<N, ROW, T, Out, V, false><<<blocks, threads, 0, stream>>>(op, out, a, b, c, n, cols, vdiv, idx32);
  } else {  // unaligned views: rare, one configuration
    elementwise_kernel<N, ROW, T, Out, 1, false><<<one_shot_blocks(units, false, kFull), kFull, 0, stream>>>(op, out, a, b, c, n, cols, vdiv, idx32);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// 1.5 * 2^23: for |t| < 2^22, t + kRoundMagic (or fma(x, r, kRoundMagic)) rounds t half to even into the
// low mantissa bits, whose low byte is then the int8: no F2I or FRND, both on the conversion pipe.
constexpr float kRoundMagic = 12582912.0f;
__device__ __forceinline__ uint32_t round_bits(float t) { return __float_as_uint(t + kRoundMagic); }
// Four int8s from the low bytes of four round_bits words, byte k from b_k (PRMT).
__device__ __forceinline__ uint32_t pack_low_bytes(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

// torch.round then clamp to [qmin, qmax] (integers, so the two commute) then .to(int8), for |t| finite or
// not. NaN -> 0, as eager's float -> int8 conversion on CUDA.
__device__ __forceinline__ int8_t round_to_i8(float t, float qmin, float qmax) {
  if (isnan(t)) return 0;
  return static_cast<int8_t>(round_bits(fminf(fmaxf(t, qmin), qmax)) & 0xffu);
}
// The same as a word whose low byte is the int8, for packing (pack2_low_bytes). A select rather than an
// early return: in static INT8's bf16 pairs, the branch made ptxas predicate the clamp and reload qmin/qmax
// per element (SASS). (The per-row kernels keep round_to_i8 in their rare exact path: with i8_bits there,
// ptxas scheduled their main loop differently and bf16 dyn_quant_i8 measured ~5% slower at 50M.)
__device__ __forceinline__ uint32_t i8_bits(float t, float qmin, float qmax) {
  const uint32_t b = round_bits(fminf(fmaxf(t, qmin), qmax));
  return isnan(t) ? 0u : b;
}
// Two int8s (the low bytes of i8_bits words a, b) as one 16-bit value, a in the low byte.
__device__ __forceinline__ uint16_t pack2_low_bytes(uint32_t a, uint32_t b) {
  return static_cast<uint16_t>(__byte_perm(a, b, 0x0040));
}

// Float math shared by the activation kernels (eager's formulas, evaluated in float32).
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// The activation for a result of dtype T: eager's libdevice math for float32, the SFU forms (fast_math.cuh)
// for 16 bits.
template <typename T>
constexpr bool is_16bit = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;
template <typename T>
__device__ __forceinline__ float gelu_for(float x, bool tanh) {
  if constexpr (is_16bit<T>) return tanh ? fast_gelu_tanh(x) : fast_gelu_erf(x);
  else return tanh ? gelu_tanh(x) : gelu_erf(x);
}
template <typename T>
__device__ __forceinline__ float silu_for(float x) {
  if constexpr (is_16bit<T>) return fast_silu(x);
  else return silu(x);
}

// float -> float8_e4m3fn with round-to-nearest-even, as c10::Float8_e4m3fn does for |v| <= 448 (callers
// clamp first, as the patterns do); NaN stays NaN.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// "none" / "tanh", as F.gelu's approximate argument
inline bool tanh_gelu(const std::string& approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh",
              "fusekit: approximate must be 'none' or 'tanh', got '", approximate, "'");
  return approximate == "tanh";
}

// A float argument that may arrive as a Python number or as a 0-dim tensor (`<name>_t`). A host value
// is used directly; a device tensor is read inside the kernel (no host sync, CUDA-graph safe).
struct ScalarArg {
  float value = 0.f;
  const float* ptr = nullptr;  // device pointer to a float32 copy, when the scalar lives on the GPU
  bool on_host = true;
  at::Tensor keep;             // keeps the float32 copy alive until the launch is enqueued
  __host__ __device__ float get() const {
#ifdef __CUDA_ARCH__
    return ptr ? *ptr : value;
#else
    return value;
#endif
  }
};

inline ScalarArg scalar_arg(const char* name, double v, const std::optional<at::Tensor>& t,
                            const at::Device& device) {
  ScalarArg s;
  if (!t.has_value()) {
    s.value = static_cast<float>(v);
    return s;
  }
  TORCH_CHECK(t->dim() == 0 && t->is_floating_point(), "fusekit: ", name,
              "_t must be a 0-dim floating tensor, got ", describe(*t));
  if (t->is_cpu()) {
    s.value = static_cast<float>(t->item<double>());
    return s;
  }
  TORCH_CHECK(t->device() == device, "fusekit: ", name, "_t is on ", t->device().str(), ", inputs on ",
              device.str());
  s.keep = t->scalar_type() == at::kFloat ? *t : t->to(at::kFloat);
  s.ptr = s.keep.data_ptr<float>();
  s.on_host = false;
  return s;
}

}  // namespace fusekit
