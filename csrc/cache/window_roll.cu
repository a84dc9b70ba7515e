// fusekit::window_roll -- a full sliding-window KV cache moved one slot to the left in place, the new token's
// row written into the last slot: one read and one write of the window.
//
//   def window_roll_ref(cache, new):    # cache [B, H, W, D], new [B, H, 1, D]; cache changes in place
//       cache.copy_(torch.cat([cache[:, :, 1:], new], dim=2))
//
// transformers' StaticSlidingWindowLayer does this (roll(-1), index_put of the last slot, copy_ back) for every
// decode step of a full window; Inductor runs it as a gather into a new buffer, the index_put, and a copy back:
// two reads and two writes of the window per layer (Mistral-style, batch 32, window 1024: 256 MB a layer).
//
// Contract: cache [B, H, W, D] on a CUDA device, unit last-dim stride, each row's bytes (D x element size) and
// the other strides multiples of 16 bytes, 16-byte aligned; new [B, H, 1, D] of the same dtype and device, any
// strides. Any dtype of 1, 2 or 4 bytes (the rows are copied as bits).
//
// One CTA owns one (sequence, head) and a column piece of its rows (whole 16-byte chunks), so no other CTA
// touches what it reads or writes. It walks the window from slot 0 up in tiles of kTile rows per thread: a tile's
// loads (slots s + 1) all land before any thread stores the tile (slots s), and the next tile's loads (slots
// above the tile) are in flight while it stores; a CTA whose piece holds the whole window in one tile (8 rows a
// thread) has every load in flight at once. Runs on the current stream, no workspace (CUDA-graph safe).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cache/window_roll.h"
#include "checks.h"  // describe
#include "debug_overrides.h"
#include "launch.cuh"
#include "pdl.cuh"

namespace fusekit {
namespace {

constexpr int kRoll = 256;  // threads per CTA at most
constexpr int kTile = 8;    // rows per thread per tile: 8 x 16 bytes in flight per thread

struct Params {
  char* cache;
  const char* fresh;
  int64_t cs0, cs1, cs2;            // cache strides in bytes (batch, head, slot)
  int64_t ns0, ns1, ns3;            // new's strides in elements (batch, head, dim)
  int heads, slots, chunks;         // chunks: 16-byte chunks per row
  int piece;                        // chunks per CTA's column piece
  int rows;                         // rows per pass of the CTA's threads (threads / piece)
};

template <typename E>  // E: the element's bits
__device__ __forceinline__ uint4 new_chunk(const Params& p, int b, int h, int chunk) {
  constexpr int kPer = 16 / sizeof(E);
  const E* src = reinterpret_cast<const E*>(p.fresh) + b * p.ns0 + h * p.ns1;
  uint4 out;
  E* e = reinterpret_cast<E*>(&out);
#pragma unroll
  for (int i = 0; i < kPer; ++i) e[i] = src[(chunk * kPer + i) * p.ns3];
  return out;
}

// kOne: the whole window is one tile (no second register set for the next tile's loads: more CTAs per SM).
template <typename E, bool kOne>
__global__ void __launch_bounds__(kRoll) window_roll_kernel(const Params p) {
  // CTAs of one (sequence, head) are adjacent (they stream neighbouring bytes of the same rows at the same time)
  const int pieces = p.chunks / p.piece, bh = blockIdx.x / pieces, b = bh / p.heads, h = bh % p.heads;
  const int rl = threadIdx.x / p.piece, chunk = blockIdx.x % pieces * p.piece + threadIdx.x % p.piece;
  char* base = p.cache + b * p.cs0 + h * p.cs1 + chunk * 16;
  const int tile = kTile * p.rows;
  const auto load = [&](int t, uint4 (&v)[kTile]) {
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const int dst = t * tile + j * p.rows + rl, src = dst + 1;
      if (dst < p.slots) {
        v[j] = src < p.slots ? *reinterpret_cast<const uint4*>(base + src * p.cs2) : new_chunk<E>(p, b, h, chunk);
      }
    }
  };
  const auto store = [&](int t, const uint4 (&v)[kTile]) {
#pragma unroll
    for (int j = 0; j < kTile; ++j) {  // this thread's loads of tile t have landed (a use of each register) ...
      asm volatile("" ::"r"(v[j].x), "r"(v[j].y), "r"(v[j].z), "r"(v[j].w));
    }
    __syncthreads();  // ... and every other thread's: no store below overwrites a slot still to be read
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const int dst = t * tile + j * p.rows + rl;
      if (dst < p.slots) *reinterpret_cast<uint4*>(base + dst * p.cs2) = v[j];
    }
  };
  pdl_wait();  // the new row and the cache: written by the kernels before
  uint4 a[kTile];
  load(0, a);
  if constexpr (kOne) {
    store(0, a);
  } else {
    uint4 n[kTile];
    const int tiles = (p.slots + tile - 1) / tile;
    for (int t = 0; t < tiles; ++t) {
      // the next tile's loads go out before this tile's stores (slots above this tile's: nobody stored there yet)
      if (t + 1 < tiles) load(t + 1, n);
      store(t, a);
#pragma unroll
      for (int j = 0; j < kTile; ++j) a[j] = n[j];
    }
  }
  pdl_trigger();
}

}  // namespace

void window_roll_cuda(const at::Tensor& cache, const at::Tensor& fresh) {
  TORCH_CHECK(cache.is_cuda() && fresh.device() == cache.device(),
              "fusekit: window_roll: cache and new on one CUDA device: ", describe(cache), ", ", describe(fresh));
  TORCH_CHECK(cache.dim() == 4 && fresh.dim() == 4, "fusekit: window_roll: cache [B, H, W, D] and new [B, H, 1, D]: ",
              describe(cache), ", ", describe(fresh));
  const int64_t B = cache.size(0), H = cache.size(1), W = cache.size(2), D = cache.size(3), es = cache.element_size();
  TORCH_CHECK(fresh.size(0) == B && fresh.size(1) == H && fresh.size(2) == 1 && fresh.size(3) == D,
              "fusekit: window_roll: new must be [B, H, 1, D] of the cache's B, H, D: ", describe(cache), ", ",
              describe(fresh));
  TORCH_CHECK(fresh.scalar_type() == cache.scalar_type(), "fusekit: window_roll: new's dtype must be the cache's: ",
              describe(cache), ", ", describe(fresh));
  TORCH_CHECK(es == 1 || es == 2 || es == 4, "fusekit: window_roll: elements of 1, 2 or 4 bytes: ", describe(cache));
  TORCH_CHECK(cache.stride(3) == 1 && (D * es) % 16 == 0 && (cache.stride(0) * es) % 16 == 0 &&
                  (cache.stride(1) * es) % 16 == 0 && (cache.stride(2) * es) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(cache.data_ptr()) % 16 == 0,
              "fusekit: window_roll: the cache's rows must be 16-byte aligned with unit last-dim stride: ",
              describe(cache));
  TORCH_CHECK(W < (int64_t{1} << 30) && B * H < (int64_t{1} << 31), "fusekit: window_roll: cache too large: ",
              describe(cache));
  if (cache.numel() == 0) return;
  c10::cuda::CUDAGuard guard(cache.device());
  Params p{};
  p.cache = static_cast<char*>(cache.data_ptr());
  p.fresh = static_cast<const char*>(fresh.data_ptr());
  p.cs0 = cache.stride(0) * es, p.cs1 = cache.stride(1) * es, p.cs2 = cache.stride(2) * es;
  p.ns0 = fresh.stride(0), p.ns1 = fresh.stride(1), p.ns3 = fresh.stride(3);
  p.heads = static_cast<int>(H), p.slots = static_cast<int>(W), p.chunks = static_cast<int>(D * es / 16);
  // Column pieces (a divisor of the row's chunks, at least 32 bytes: a whole sector unless the row is one chunk): the
  // widest that still gives about one CTA per SM (15/16 of them), else the narrowest. H200, bf16, us for pieces of
  // 2 / 4 / 8 / 16 chunks: Mistral-style window (4 heads x 1024 x 128) batch 8 10.9 / 10.0 / 11.9 / 16.3, batch 32
  // 28.3 / 25.8 / 23.2 / 23.6; Gemma-2 (4 x 4096 x 256) batch 8 53.7 / 43.6 / 39.6 / 55.0
  // (benchmarks/bench_window_roll.py --sweep). A piece that holds the whole window in one tile takes the one-tile
  // kernel.
  const int64_t want = sm_count() - sm_count() / 16;
  p.piece = 0;
  for (int c = std::min(p.chunks, kRoll); c >= 1; --c) {
    if (p.chunks % c != 0 || (c < 2 && p.chunks > 1)) continue;
    p.piece = c;
    if (B * H * (p.chunks / c) >= want) break;
  }
  if (const int forced = debug::window_roll_piece(); forced > 0 && p.chunks % forced == 0) p.piece = forced;
  const bool one = static_cast<int64_t>(kTile) * (kRoll / std::max(p.piece, 1)) >= W;
  TORCH_CHECK(p.piece >= 1 && p.piece <= kRoll, "fusekit: window_roll: rows of ", D * es, " bytes: ", describe(cache));
  p.rows = kRoll / p.piece;
  const int64_t blocks = B * H * (p.chunks / p.piece);
  TORCH_CHECK(blocks < (int64_t{1} << 31), "fusekit: window_roll: cache too large: ", describe(cache));
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(static_cast<unsigned>(p.rows * p.piece));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto pick = [&](auto one_tile) -> void (*)(Params) {
    constexpr bool kOne = decltype(one_tile)::value;
    return es == 1 ? window_roll_kernel<uint8_t, kOne> : es == 2 ? window_roll_kernel<uint16_t, kOne>
                                                                  : window_roll_kernel<uint32_t, kOne>;
  };
  void (*kernel)(Params) = one ? pick(std::true_type{}) : pick(std::false_type{});
  static const int version = binary_version(window_roll_kernel<uint16_t, true>);  // (one build: one arch for all)
  launch_ex(kernel, grid, block, 0, stream, pdl_allowed(version, 'a'), 0, p);
}

}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("window_roll", &fusekit::window_roll_cuda); }
