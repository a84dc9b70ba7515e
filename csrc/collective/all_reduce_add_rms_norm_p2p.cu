// fusekit::all_reduce_add_rms_norm_p2p -- a tensor-parallel all-reduce, the residual add after it and the RMSNorm
// of the sum, in one kernel over symmetric memory (the kernel of fusekit::all_reduce_add_rms_norm).
//
//   def all_reduce_add_rms_norm_ref(x, residual, weight, eps, group_name):        # fusion_backend/collectives.py
//       h = all_reduce(x, "sum", group_name)            # rounded to x's dtype
//       if residual is not None:
//           h = residual + h
//       h32 = h.to(torch.float32)
//       y = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
//       return weight * y, h
//
// Contract: x [..., H] bfloat16 or float32, contiguous, H * element size a multiple of 16 bytes; residual (optional)
// like x; weight [H] of x's dtype; buffer: this rank's symmetric buffer [2, world_size, *x.shape] (a slot per
// rank, in two halves the calls alternate), every element -0.0 before the first call (the "empty" mark);
// epochs: max_blocks int32, zero at first, one count of calls per block (the half it uses); buffer_ptrs: the
// device array of the group's world_size buffer pointers (torch's symmetric memory handle: buffer_ptrs_dev) and
// buffer_offset, the buffer's byte offset in each; max_blocks: at most the blocks the GPU holds at once (a block
// waits for the same block of every peer).
// Every rank calls it with the same shapes in the same order (it is a collective). Returns (normed, h).
//
// One block per row (grid-stride over rows): the block stores its rows into this rank's slot of every peer's buffer
// (NVLink stores, in flight together, -0.0 written as +0.0), then sums the slots of its own buffer in rank order,
// reading each 16 bytes again until no element is -0.0: the data is its own flag (a Lamport-style exchange), so
// there is no signal and no fence between the peers, only the stores' one-way trip. The block puts -0.0 back in what
// it read, adds the residual, writes h, reduces the row's sum of squares and writes the normed row. Every rank sums
// the same floats in the same order, so the residual stream stays identical across ranks (+0.0 for -0.0 changes no
// sum that starts at +0.0). Consecutive calls use alternate halves of the buffer: a peer can be one call ahead of
// this rank (it needs this rank's rows of a call to finish it), never two. No host sync, no allocation besides
// the outputs: CUDA-graph safe once the buffer exists (the epochs live on the device and advance with every replay).
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "convert.cuh"
#include "launch.cuh"
#include "vec.cuh"

namespace fusekit {
namespace {

constexpr int kMaxWorld = 72;  // torch's largest peer-to-peer domain

// 16 bytes of this rank's buffer as a peer wrote them, past the L1 (it holds the same address from a call before).
__device__ __forceinline__ uint4 load_peer(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_volatile(void* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// The empty mark is -0.0 in every element: a sign bit alone, in each 16 bits (bfloat16) or 32 bits (float32).
template <typename T>
constexpr uint32_t kEmpty = sizeof(T) == 2 ? 0x80008000u : 0x80000000u;

template <typename T>
__device__ __forceinline__ bool is_empty_word(uint32_t w) {
  if constexpr (sizeof(T) == 2) return (w & 0xffffu) == 0x8000u || (w >> 16) == 0x8000u;
  else return w == 0x80000000u;
}
// Still (partly) empty: any element of the 16 bytes is the mark (a peer's 16-byte store may land in parts).
template <typename T>
__device__ __forceinline__ bool any_empty(uint4 v) {
  return is_empty_word<T>(v.x) || is_empty_word<T>(v.y) || is_empty_word<T>(v.z) || is_empty_word<T>(v.w);
}
// -0.0 as +0.0, so that data is never the mark.
template <typename T>
__device__ __forceinline__ uint32_t unmark_word(uint32_t w) {
  if constexpr (sizeof(T) == 2) {
    if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
    if ((w >> 16) == 0x8000u) w &= 0x0000ffffu;
    return w;
  } else {
    return w == 0x80000000u ? 0u : w;
  }
}
template <typename T>
__device__ __forceinline__ uint4 unmark(uint4 v) {
  return make_uint4(unmark_word<T>(v.x), unmark_word<T>(v.y), unmark_word<T>(v.z), unmark_word<T>(v.w));
}

template <typename T>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // scratch is reused by the next row
  return v;
}

constexpr int kMaxThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    all_reduce_add_rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                                   const T* __restrict__ weight, T* __restrict__ out, T* __restrict__ h_out,
                                   T* local, T* const* bufs, int64_t offset, uint32_t* epochs, int rank, int world,
                                   int64_t rows, int H, float eps) {
  constexpr int N = 16 / sizeof(T);
  constexpr int kBatch = 8;  // loads in flight at once
  using V = Vec<T, N>;
  __shared__ float scratch[32];
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = epochs[blockIdx.x];
  __syncthreads();
  const int64_t slot = rows * H;                          // one rank's rows in a buffer
  const int64_t half = (epoch & 1u) * world * slot;       // this call's half: the other one a peer may still read
  const int nvec = H / N;
  const uint4 empty = make_uint4(kEmpty<T>, kEmpty<T>, kEmpty<T>, kEmpty<T>);
  // push: this rank's rows into its slot of every peer's buffer (stores in flight together; its own sum term is
  // read from x)
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      const uint4 val = unmark<T>(*reinterpret_cast<const uint4*>(x + r * H + v * N));
      const int64_t at = offset + (half + rank * slot + r * H + v * N) * static_cast<int64_t>(sizeof(T));
      for (int p = 0; p < world; ++p)
        if (p != rank) store_volatile(reinterpret_cast<char*>(bufs[p]) + at, val);
    }
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float ss = 0.f;
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      float acc[N] = {};
      for (int p0 = 0; p0 < world; p0 += kBatch) {  // rank order on every rank
        uint4 raw[kBatch];
#pragma unroll
        for (int q = 0; q < kBatch; ++q) {
          const int p = p0 + q;
          if (p == rank) raw[q] = *reinterpret_cast<const uint4*>(x + r * H + v * N);
          else if (p < world) raw[q] = load_peer(local + half + p * slot + r * H + v * N);
        }
#pragma unroll
        for (int q = 0; q < kBatch; ++q) {
          const int p = p0 + q;
          if (p >= world) break;
          if (p != rank) {
            T* at = local + half + p * slot + r * H + v * N;
            while (any_empty<T>(raw[q])) raw[q] = load_peer(at);  // the peer's rows not (all) here yet
            store_volatile(at, empty);  // emptied for the call after next (read: this thread holds it)
          }
          const V& pv = *reinterpret_cast<const V*>(&raw[q]);
#pragma unroll
          for (int j = 0; j < N; ++j) acc[j] += static_cast<float>(pv.v[j]);
        }
      }
      V h;
      V res;
      if (residual != nullptr) res = reinterpret_cast<const V*>(residual + r * H)[v];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const T s = to<T>(acc[j]);  // the all-reduce's result in x's dtype, as the graph had it
        h.v[j] = residual != nullptr ? to<T>(static_cast<float>(res.v[j]) + static_cast<float>(s)) : s;
        const float f = static_cast<float>(h.v[j]);
        ss += f * f;
      }
      reinterpret_cast<V*>(h_out + r * H)[v] = h;
    }
    const float inv = rsqrtf(block_sum<T>(ss, scratch) / H + eps);
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {  // the elements this thread wrote above
      const V h = reinterpret_cast<const V*>(h_out + r * H)[v];
      const V w = reinterpret_cast<const V*>(weight)[v];
      V o;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const T y = to<T>(static_cast<float>(h.v[j]) * inv);
        o.v[j] = to<T>(static_cast<float>(w.v[j]) * static_cast<float>(y));
      }
      reinterpret_cast<V*>(out + r * H)[v] = o;
    }
  }
  // The next call's rows go to the other half. A peer writes this half again in the call after next, which it
  // reaches only with this rank's rows of the next call, which this rank sends once this call (its reads and the
  // marks put back) has finished.
  if (threadIdx.x == 0) epochs[blockIdx.x] = epoch + 1;
}

std::tuple<at::Tensor, at::Tensor> all_reduce_add_rms_norm_p2p_cuda(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight, double eps,
    const at::Tensor& buffer, const at::Tensor& epochs, int64_t buffer_ptrs, int64_t buffer_offset, int64_t rank,
    int64_t world_size, int64_t max_blocks) {
  FK_CHECK_CUDA(x);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "fusekit::all_reduce_add_rms_norm: x must be bfloat16 or float32, got ", describe(x));
  FK_CHECK_CONTIGUOUS(x);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0 && x.size(-1) * x.element_size() % 16 == 0,
              "fusekit::all_reduce_add_rms_norm: x's rows must be a multiple of 16 bytes, got ", describe(x));
  TORCH_CHECK(buffer.is_cuda() && buffer.is_contiguous() && buffer.scalar_type() == x.scalar_type() &&
                  buffer.device() == x.device() && buffer.numel() == 2 * world_size * x.numel(),
              "fusekit::all_reduce_add_rms_norm: buffer must be a contiguous [2, world_size, *x.shape] of x's dtype on "
              "x's device; "
              "got x ", describe(x), ", buffer ", describe(buffer));
  TORCH_CHECK(epochs.is_cuda() && epochs.scalar_type() == at::kInt && epochs.is_contiguous() &&
                  epochs.device() == x.device() && epochs.numel() >= max_blocks,
              "fusekit::all_reduce_add_rms_norm: epochs must be max_blocks int32 on x's device, got ",
              describe(epochs));
  if (residual) {
    FK_CHECK_SAME(x, (*residual));
    FK_CHECK_CONTIGUOUS((*residual));
  }
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1) && weight.scalar_type() == x.scalar_type() &&
                  weight.device() == x.device() && weight.is_contiguous(),
              "fusekit::all_reduce_add_rms_norm: weight must be [x.shape[-1]] with x's dtype and device, contiguous; "
              "got x ", describe(x), ", weight ", describe(weight));
  TORCH_CHECK(world_size > 1 && world_size <= kMaxWorld && rank >= 0 && rank < world_size,
              "fusekit::all_reduce_add_rms_norm: rank ", rank, " of world size ", world_size);
  TORCH_CHECK(buffer_ptrs != 0 && max_blocks >= 1 && buffer_offset >= 0 && buffer_offset % 16 == 0,
              "fusekit::all_reduce_add_rms_norm: no symmetric memory handle (buffer pointers)");
  TORCH_CHECK(aligned16(x.data_ptr()) && aligned16(buffer.data_ptr()) && aligned16(weight.data_ptr()) &&
                  (!residual || aligned16(residual->data_ptr())),
              "fusekit::all_reduce_add_rms_norm: x, residual, weight and buffer must be 16-byte aligned");
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  auto h = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int H = static_cast<int>(x.size(-1));
  const int64_t rows = x.numel() / H;
  if (rows == 0) return {out, h};
  const int per = 16 / static_cast<int>(x.element_size());
  const int threads = std::clamp((H / per + 31) / 32 * 32, 32, kMaxThreads);
  const int blocks = static_cast<int>(std::min<int64_t>(rows, max_blocks));
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    all_reduce_add_rms_norm_kernel<T><<<blocks, threads, 0, stream>>>(
        x.const_data_ptr<T>(), residual ? residual->const_data_ptr<T>() : nullptr, weight.const_data_ptr<T>(),
        out.data_ptr<T>(), h.data_ptr<T>(), buffer.data_ptr<T>(), reinterpret_cast<T* const*>(buffer_ptrs),
        buffer_offset, reinterpret_cast<uint32_t*>(epochs.data_ptr<int>()), static_cast<int>(rank),
        static_cast<int>(world_size), rows, H, static_cast<float>(eps));
  };
  if (x.scalar_type() == at::kBFloat16) launch(c10::BFloat16{});
  else launch(float{});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, h};
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("all_reduce_add_rms_norm_p2p", &fusekit::all_reduce_add_rms_norm_p2p_cuda);
}
