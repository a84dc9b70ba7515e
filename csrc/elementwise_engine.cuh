// The elementwise engine of the elementwise and static quantize ops: out[i] = op(in[0][i], ..., in[N-1][i])
// over contiguous inputs of one dtype, in 16-byte vectors, one-shot blocks sized to the launch and the GPU.
// An op is a functor in one of three forms (see has_pair and is_float2_op): T (&)[N] -> Out per element, float2
// pairs in and out (kFloat2), or pairs in and two output bytes out (kPairs).
#pragma once

#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "convert.cuh"  // to
#include "launch.cuh"   // kThreads, sm_count
#include "vec.cuh"      // Vec, Held, store2

namespace fusekit {

constexpr int kSmallThreads = 128;  // launch_elementwise's blocks when a launch is small (small_launch)

// Vector width for a kernel reading T and writing Out: 16-byte accesses on the wider side.
template <typename T, typename Out>
constexpr int vec_width() { return 16 / (sizeof(T) > sizeof(Out) ? sizeof(T) : sizeof(Out)); }

constexpr int kVecsPerThread = 2;  // independent 16-byte loads per thread and input, all issued first

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
// to T with one packed conversion (ops whose output dtype is their input dtype). The packed conversion takes
// bf16 GELU from 67% to 96% of copy bandwidth, GeGLU/SwiGLU in bf16 from 80-94% to 98-99% (H200, 50M elements).
template <typename Op, typename = void>
struct is_float2_op : std::false_type {};
template <typename Op>
struct is_float2_op<Op, std::enable_if_t<Op::kFloat2>> : std::true_type {};

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
// take 128-thread blocks: against 256, on an H200 at 20M elements, static INT8 fp16 0.0205 -> 0.0197 ms, bf16
// 0.0205 -> 0.0200 ms, FP8 0.0203 -> 0.0196 ms (a device-to-device copy of the same bytes: 0.0192 ms); at 50M,
// 1-2%. Small launches keep kSmallThreads.
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
  // indices fit 32 bits; a 64-bit modulo is a call, which holds registers (6 blocks/SM instead of 8) and,
  // placed between the loads, makes them wait on each other (bias + GELU).
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

}  // namespace fusekit
