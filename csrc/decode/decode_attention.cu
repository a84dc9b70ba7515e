// fusekit::decode_attention -- a few query rows per sequence against a KV cache, grouped query heads read
// from their shared KV head (no repeat_kv copy), KV blocks the mask hides skipped, the cache split across
// thread blocks (flash-decoding) and the partial softmaxes combined.
//
//   def decode_attention_ref(q, k, v, mask=None, scale=0.125):
//       n = q.shape[1] // k.shape[1]                 # query heads per KV head (1: MHA)
//       return F.scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), attn_mask=mask, scale=scale)
//
// decode_attention_softcap.cu binds the same kernels with Gemma-2's soft-capped scores (decode_attention_run).
//
// Contract: q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with Hq % Hkv == 0 (or one KV head broadcast to Hq with stride
// 0, read as one group), on one CUDA device, one dtype in
// {float16, bfloat16}, D in {64, 80, 96, 112, 128, 160, 192, 256}, unit last-dim stride; k and v 16-byte aligned (every other
// stride and the offset a multiple of 8 elements). mask: none, bool (True = attend), q's dtype or float32
// (additive), broadcastable to [B,Hq,Lq,S]. Returns [B,Hq,Lq,D] in q's layout (empty_like(q)). A row the
// mask hides entirely (-inf or False everywhere) gives 0, as PyTorch's SDPA kernels do. Accumulates in float32.
//
// Hidden keys: False, or an additive value <= -60000 (-inf, and the finite "minus infinity" masks use:
// float16's min, or finfo.min; transformers builds bf16 masks of -65536). Such a key's weight
// exp(score + mask - row max) underflows to exactly 0 in float32 once the row has a key above -60000, unless
// scores differ by more than ~59000; a row with no such key is computed again over every key, exactly as the
// additive mask says (recompute_row below: in the combine, or a third kernel when there is one split).
//
// One CTA (4 warps) per (sequence, KV head, split of the cache, up to 16 rows of its query group). It reads
// its split's mask first (each distinct mask row once, all loads in flight), and skips the K and V of
// every 64-key block in which every row's mask hides every key (a split with nothing visible writes (-inf, 0)
// and ends; q is read only by CTAs with work, while their first K block is in flight). The visible K and V
// blocks go through a ring of two shared-memory stages (cp.async) and meet the
// query rows on tensor cores (mma.sync m16n8k16, float32 sums; the probabilities are rounded to q's dtype
// for P @ V, as PyTorch's fused SDPA kernels do): each visible key row is read once for all the rows of the
// group. With more than one split, partial (max, sum, output) go to a float32 workspace and a second kernel
// combines them. Splits hold at most 4 blocks (8 for a group of 4 rows of head dim <= 128): a short visible
// prefix of a long cache still spreads over many CTAs. One query row per KV head (MHA decode, head dim <= 128)
// runs a tile of its own. On sm_90 builds, where the cache's rows are contiguous, the streaming tile
// (decode_attention_stream_kernel: whole K/V blocks by bulk copy, CUDA cores, splits that fill whole waves; H200,
// GPT-NeoX widths, batch 32 at position 1024 of 4096: 103.2 -> 93.2 us against the tensor-core one-row tile);
// elsewhere the tensor-core one-row tile: a ring of three stages in the shared memory the other rows' scores would
// take, and about one wave of CTAs of up to 16 blocks each (H100, GPT-NeoX widths, 4000 of 4096 keys visible:
// batch 1 33.8 -> 28.2 us, batch 32 406 -> 383 us against the group tile). Runs on the current stream; the workspace comes from the caching allocator (CUDA-graph safe). On
// sm_90+ each kernel launches with programmatic dependent launch (pdl.cuh) and waits before its first access.
// A head dim between the tiles' sizes (80, 96, 112; 160, 192) runs the kernel of the next one up (128; 256) with
// the columns past D never copied, multiplied or written: the bytes read are D's, the tensor-core steps D / 16.
// Why so: on CUDA cores the kernel issues ~2,900 instructions per warp at batch 32 (Nsight Compute: 64%
// issue-active, 46% of DRAM bandwidth); on tensor cores it is 1.0-1.4x faster, and q read late, copies with
// fixed per-thread offsets, and scale and mask applied in the softmax pass instead of per block (SASS of the
// score step: ~510 -> ~215 instructions) make it 1.05-1.5x faster again. A ring of four stages (3 CTAs per
// SM) is slower at batch 32.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "attention_checks.h"  // check_cache_qkv, check_attention_mask
#include "decode/decode_attention.h"
#include "checks.h"            // describe
#include "convert.cuh"         // to_float, from_float
#include "cp_async.cuh"
#include "debug_overrides.h"
#include "dtype_dispatch.cuh"
#include "launch.cuh"          // sm_count, opt_in_smem, binary_version, launch_ex
#include "mbarrier.cuh"        // mbar_*, bulk_load (the streaming one-row tile)
#include "mma.cuh"
#include "pdl.cuh"

namespace fusekit {
namespace {

constexpr int kWarps = 4;
constexpr int kBlockN = 64;     // keys per mask-skip block
// Keys per split at most (the scores live in shared memory): 8 blocks for 4 rows of D <= 128, else 4. Batch 32
// and 64 of a 4-row group then take 8 splits instead of 16 (fewer CTAs that only read their mask; on an H100
// the op alone is 1-2% faster at b32/b64, the b64 decode step 2.4%, the b32 step within 0.2%).
constexpr int max_chunk(int d, int rt) { return rt == 1 ? 1024 : rt == 4 && d <= 128 ? 512 : 256; }
// The tile a head dim runs in: 64, 128 or 256 columns of shared memory (chunks of 8 a power of two, for the swizzle)
constexpr int padded(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kHiddenLog2 = -60000.f * kLog2e;  // a mask value at or below -60000 (in log2 units) hides

enum MaskKind { kNoMask = 0, kBoolMask = 1, kSameMask = 2, kFloatMask = 3 };

struct Params {
  const void* q;
  const void* k;
  const void* v;
  const void* mask;
  void* out;
  float* part_o;    // [splits, rows_total, D]
  float2* part_ml;  // [splits, rows_total] (max, sum) in log2 units
  int* hidden;      // [rows_total] 1: no key above kHiddenLog2 (finite masks, one split only; else null)
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, ms0, ms1, ms2, ms3, os0, os1, os2;
  int64_t rows_total;  // B * Hq * Lq
  int hq, hkv, lq, s, group, rows, zchunks, chunk, splits, mask_kind;
  int stages;        // of the K/V ring in shared memory: the kernel's NS, or fewer where a split has fewer items
  int finite_mask;   // 1: an additive mask, whose finite values can hide a whole row
  float scale_log2;  // scale * log2(e): scores live in log2 units (exp2f)
  float cap_log2;    // softcap * log2(e), 0: no soft-capping (a score x becomes cap * tanh(x / cap))
  float inv_cap_log2;
  // decode_attention_roll (a full sliding window moved one slot to the left while it is read): key j is read from
  // slot j + 1 (the last key: the new row) and written back into slot j. The first slot of each split after the
  // first is read by the split before it: its new value waits in `edge` until the combine writes it.
  int roll, bhkv;                  // bhkv: B x Hkv
  const void* new_k;
  const void* new_v;               // [B, Hkv, 1, D]
  int64_t nks0, nks1, nvs0, nvs1;  // their batch and head strides (elements)
  void* edge;                      // [2 (K, V)][splits - 1][B x Hkv][D], q's dtype; null: one split or no roll
};


// Element offset of a roll's parked row in `edge`: K (is_v 0) or V, the first slot of split `split` (>= 1), row bh.
__device__ __forceinline__ int64_t edge_row(const Params& p, bool is_v, int split, int64_t bh, int D) {
  return ((static_cast<int64_t>(is_v) * (p.splits - 1) + split - 1) * p.bhkv + bh) * D;
}

// A raw score (already times scale_log2) soft-capped where the op asks for it, in log2 units.
__device__ __forceinline__ float capped(const Params& p, float x) {
  return p.cap_log2 > 0.f ? p.cap_log2 * tanhf(x * p.inv_cap_log2) : x;
}

template <typename T>
__device__ __forceinline__ float mask_at(const Params& p, int64_t off) {
  switch (p.mask_kind) {
    case kBoolMask:
      return reinterpret_cast<const bool*>(p.mask)[off] ? 0.f : -INFINITY;
    case kSameMask:
      return to_float(reinterpret_cast<const T*>(p.mask)[off]) * kLog2e;
    case kFloatMask:
      return reinterpret_cast<const float*>(p.mask)[off] * kLog2e;
    default:
      return 0.f;
  }
}

// Four 8x8 b16 matrices from shared memory (lanes 8m..8m+7 give the row addresses of matrix m).
template <bool Trans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  }
}

// Two floats rounded to T, packed as one fragment register (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

template <int LPK>
__device__ __forceinline__ float sum_key_lanes(float x) {  // over the LPK lanes that share one key row
#pragma unroll
  for (int off = LPK / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// The K/V ring: two stages for a query group (four, with 3 CTAs per SM, were slower at batch 32). One query row
// (MHA) does almost no work per block: its CTA keeps more blocks in flight instead (kStagesOneRow).
constexpr int kStages = 2;
constexpr int kStagesOneRow = 3;  // (four: as fast at batch 32, 1-6% slower at batch 1; H100)

// CTAs per SM that the shared memory allows (2 stages of 64 keys, 2 x RT x 1 KB): registers to fit them.
template <int D, int RT>
constexpr int min_ctas() { return padded(D) == 256 ? 2 : RT <= 4 ? 5 : RT == 8 ? 4 : 3; }

// One CTA: 4 warps, RT rows (<= 16) of one KV head's query group, one split (<= max_chunk keys). The
// mask first (each distinct mask row once), then K and V of the visible blocks through a ring of kStages
// shared-memory stages (cp.async; rows XOR-swizzled by 16-byte chunk, so ldmatrix is conflict-free; q is read
// while the first blocks are in flight), on tensor cores: S = Q K^T with m16n8k16 (rows past RT are zeros), the
// split's softmax in shared memory (scale and mask applied there, off the ring's path), O = P V with P rounded
// to q's dtype (as PyTorch's fused SDPA kernels do), float32 sums. Warp w computes keys [16w, 16w + 16) of each
// block's scores and dims [w P/4, (w + 1) P/4) of the output (P = padded(D); dims past D: no work).
template <typename T, int D, int RT, int NS>
__global__ void __launch_bounds__(kWarps * 32, min_ctas<D, RT>()) decode_attention_kernel(const Params p) {
  static_assert(D % 16 == 0 && D <= 256, "head dims are whole k-steps of m16n8k16");
  constexpr int P = padded(D);                        // a shared-memory row's columns (the tile's)
  constexpr int CPR = P / 8;                          // 16-byte chunks per key row
  constexpr int RSTEP = kWarps * 32 / CPR;            // rows between one thread's copies
  constexpr int CPT = kBlockN / RSTEP;                // cp.async per thread per block
  constexpr int MC = max_chunk(P, RT);
  constexpr int KPT = MC / (kWarps * 32);             // mask keys per thread per row
  constexpr int DW = P / kWarps;                      // output dims per warp
  constexpr int NT = DW / 8;                          // n-tiles of 8 dims per warp
  extern __shared__ __align__(16) float smem[];
  T* stage = reinterpret_cast<T*>(smem);                                   // [stages][kBlockN][P], swizzled
  float* sc = smem + p.stages * kBlockN * P * sizeof(T) / sizeof(float);  // [RT][chunk] scores, then exp2
  float* smask = sc + RT * p.chunk;                                  // [RT][chunk] distinct mask rows
  __shared__ float s_m[RT], s_l[RT];
  __shared__ int64_t s_moff[RT];
  __shared__ int s_src[RT];
  __shared__ int s_vis[MC / kBlockN];

  pdl_wait();  // q, the cache and the mask: written by the kernels before
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int z = blockIdx.x % p.zchunks;
  const int bh = blockIdx.x / p.zchunks;
  const int b = bh / p.hkv, kvh = bh % p.hkv;
  const int split = blockIdx.y;
  const int key_begin = split * p.chunk;
  const int nblocks = (min(p.chunk, p.s - key_begin) + kBlockN - 1) / kBlockN;
  const int keys = nblocks * kBlockN;
  const int r0 = z * RT;
  const int nr = min(RT, p.rows - r0);
  const auto flat_row = [&](int rr) {  // a group row's index in [B, Hq, Lq] (the workspace's rows)
    return (static_cast<int64_t>(b) * p.hq + kvh * p.group + rr / p.lq) * p.lq + rr % p.lq;
  };

  if (tid < RT) {
    const int r = r0 + min(tid, nr - 1);
    s_moff[tid] = b * p.ms0 + (kvh * p.group + r / p.lq) * p.ms1 + (r % p.lq) * p.ms2;
  }
  if (tid < MC / kBlockN) s_vis[tid] = 0;
  __syncthreads();
  if (tid < RT) {  // the first row with the same mask row ([B,1,1,S] masks: one row for the whole CTA)
    int src = tid;
    for (int j = 0; j < tid; ++j) {
      if (s_moff[j] == s_moff[tid]) {
        src = j;
        break;
      }
    }
    s_src[tid] = tid < nr ? src : -1;
  }
  __syncthreads();

  // ---- the split's mask (each distinct row once, all loads in flight together) ----
  float mv[RT * KPT];  // [r][n]: key tid + 128 n of row r
#pragma unroll
  for (int i = 0; i < RT * KPT; ++i) {
    const int r = i / KPT, kl = tid + (i % KPT) * kWarps * 32, key = key_begin + kl;
    const bool load = s_src[r] == r && kl < keys && key < p.s;
    mv[i] = load ? (p.mask_kind == kNoMask ? 0.f : mask_at<T>(p, s_moff[r] + key * p.ms3)) : -INFINITY;
  }
#pragma unroll
  for (int i = 0; i < RT * KPT; ++i) {
    const int r = i / KPT, kl = tid + (i % KPT) * kWarps * 32;
    if (s_src[r] == r && kl < keys) {
      smask[r * p.chunk + kl] = mv[i];
      if (!(mv[i] <= kHiddenLog2)) s_vis[kl / kBlockN] = 1;  // a NaN counts as visible, as in the reference
    }
  }
  __syncthreads();
  int nvis = 0;
  uint64_t vlist = 0;  // the visible blocks: their indices in order (4 bits each, at most 16 blocks a split)
  uint32_t vbits = 0;  // and as bits
  for (int blk = 0; blk < nblocks; ++blk) {  // (a roll loads every block: each moves, visible or not)
    if (s_vis[blk]) vbits |= 1u << blk;
    if (s_vis[blk] || p.roll) vlist |= static_cast<uint64_t>(blk) << (4 * nvis++);
  }
  if (nvis == 0 && p.splits > 1) {  // (max, sum) = (-inf, 0): the combine reads no output of this split
    for (int r = tid; r < nr; r += kWarps * 32) {
      p.part_ml[split * p.rows_total + flat_row(r0 + r)] = make_float2(-INFINITY, 0.f);
    }
    return;
  }
  const auto nth_visible = [&](int n) { return static_cast<int>((vlist >> (4 * n)) & 0xfu); };
  static_assert(MC / kBlockN <= 16, "vlist holds 16 blocks");

  // ---- K, then V, of the visible blocks through the ring; one group committed per step ----
  // Thread tid copies chunk ccol of rows crow + i RSTEP of each block: its offsets are fixed but for the block.
  // Chunks past D (a padded head dim) are never copied: no step below reads them.
  const int crow = tid / CPR, ccol = tid % CPR;
  const bool copies = D == P || ccol < D / 8;
  const T* kb = static_cast<const T*>(p.k) + b * p.ks0 + kvh * p.ks1 + crow * p.ks2 + ccol * 8;
  const T* vb = static_cast<const T*>(p.v) + b * p.vs0 + kvh * p.vs1 + crow * p.vs2 + ccol * 8;
  const int sw[2] = {crow * P + (ccol ^ (crow & 7)) * 8, crow * P + (ccol ^ ((crow + RSTEP) & 7)) * 8};  // (even, odd i)
  const int items = 2 * nvis;
  const T* nkb = p.roll ? static_cast<const T*>(p.new_k) + b * p.nks0 + kvh * p.nks1 + ccol * 8 : nullptr;
  const T* nvb = p.roll ? static_cast<const T*>(p.new_v) + b * p.nvs0 + kvh * p.nvs1 + ccol * 8 : nullptr;
  const auto issue = [&](int item) {
    if (item < items && copies) {
      const bool is_v = item >= nvis;
      const int k0 = key_begin + nth_visible(is_v ? item - nvis : item) * kBlockN;
      T* dst = stage + (item % NS) * kBlockN * P;
      const int64_t rs = is_v ? p.vs2 : p.ks2, step = RSTEP * rs;
      const T* src = (is_v ? vb : kb) + k0 * rs;
      if (p.roll) {  // key j from slot j + 1, the last key the new row, keys past the cache zeros
        const T* fresh = is_v ? nvb : nkb;
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
          const int key = k0 + crow + i * RSTEP;
          cp_async16(dst + i * RSTEP * P + sw[i & 1], key + 1 < p.s ? src + (i * RSTEP + 1) * rs : fresh, key < p.s);
        }
      } else if (k0 + kBlockN <= p.s) {  // a whole block of the cache
#pragma unroll
        for (int i = 0; i < CPT; ++i, src += step) cp_async16(dst + i * RSTEP * P + sw[i & 1], src, true);
      } else {  // the cache's last, partial block: rows past it are zero-filled (from a valid address)
        const T* safe = src - crow * rs;
        const int left = p.s - k0 - crow;  // copy i reads a key of the cache: i RSTEP < left
#pragma unroll
        for (int i = 0; i < CPT; ++i, src += step) {
          cp_async16(dst + i * RSTEP * P + sw[i & 1], i * RSTEP < left ? src : safe, i * RSTEP < left);
        }
      }
    }
    cp_async_commit();  // empty past the last item: one group per step
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) issue(i);
  // A roll: the block's keys (slots k0 + 1 ..., landed for every thread) go back one slot down, to k0 ... Safe in
  // place: those slots were read by this block or the one before (landed too), and the ring's later loads read
  // slots above them; the split's first slot (read by the split before) goes to `edge` for the combine.
  const auto roll_store = [&](int item) {
    if (!p.roll || !copies) return;
    const bool is_v = item >= nvis;
    const int k0 = key_begin + nth_visible(is_v ? item - nvis : item) * kBlockN;
    const T* st = stage + (item % NS) * kBlockN * P;
    const int64_t rs = is_v ? p.vs2 : p.ks2;
    T* dst = const_cast<T*>(is_v ? vb : kb) + k0 * rs;
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      const int key = k0 + crow + i * RSTEP;
      if (key >= p.s) continue;
      const uint4 x = *reinterpret_cast<const uint4*>(st + i * RSTEP * P + sw[i & 1]);
      if (key == key_begin && split > 0) {
        *reinterpret_cast<uint4*>(static_cast<T*>(p.edge) + edge_row(p, is_v, split, bh, D) + ccol * 8) = x;
      } else {
        *reinterpret_cast<uint4*>(dst + i * RSTEP * rs) = x;
      }
    }
  };

  uint32_t qa[D / 16][4];  // A fragments of Q: rows g and g + 8 (zeros past the CTA's rows), read meanwhile
  {
    const T* qrow[2];
    bool ok[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h, rr = r0 + min(r, nr - 1);
      ok[h] = r < nr;
      qrow[h] = static_cast<const T*>(p.q) + b * p.qs0 + (kvh * p.group + rr / p.lq) * p.qs1 + (rr % p.lq) * p.qs2;
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // a0: (g, k), a1: (g + 8, k), a2: (g, k + 8), a3: (g + 8, k + 8)
        const int h = i & 1, c = ks * 16 + 2 * t4 + (i >> 1) * 8;
        qa[ks][i] = ok[h] ? pack2<T>(to_float(qrow[h][c]), to_float(qrow[h][c + 1])) : 0u;  // (exact round trip)
      }
    }
  }
  const int ml = lane / 8, mi = lane % 8;  // ldmatrix: this lane's matrix and row in it
  const bool row0 = g < nr, row1 = RT > 8 && g + 8 < nr;  // this lane's fragment rows g and g + 8 are the CTA's
  float* sc0 = sc + g * p.chunk;
  float* sc1 = sc + (RT > 8 ? g + 8 : 0) * p.chunk;

  // ---- scores: warp w takes keys [16w, 16w + 16) of the block (two n-tiles of 8 keys), raw dot products ----
  for (int item = 0; item < nvis; ++item) {
    issue(item + NS - 1);
    cp_async_wait<NS - 1>();
    __syncthreads();
    roll_store(item);
    const int blk = nth_visible(item);
    const T* st = stage + (item % NS) * kBlockN * P;
    if (vbits >> blk & 1u) {  // (a roll's hidden blocks only move)
      float acc[2][4] = {};
      const int krow = warp * 16 + (ml >> 1) * 8 + mi;  // matrices: (keys 0-7 | 8-15) x (dims 0-7 | 8-15)
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t kf[4];
        ldsm_x4<false>(kf, st + krow * P + (((ks * 2 + (ml & 1)) ^ (krow & 7)) * 8));
        mma16816<T>(acc[0], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], kf[0], kf[1]);
        mma16816<T>(acc[1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], kf[2], kf[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {  // c0, c1: (g, 2 t4 + {0, 1}); c2, c3: row g + 8
        const int kl = blk * kBlockN + warp * 16 + nt * 8 + 2 * t4;
        if (row0) *reinterpret_cast<float2*>(sc0 + kl) = make_float2(acc[nt][0], acc[nt][1]);
        if (row1) *reinterpret_cast<float2*>(sc1 + kl) = make_float2(acc[nt][2], acc[nt][3]);
      }
    }
    __syncthreads();  // the stage is read before a later step refills it
  }

  // ---- softmax numerators over this split: one warp per row (the first V blocks are in flight). A key of a
  // hidden block, or past the cache, has no score (its finite mask value must not enter the softmax) ----
  const int lim = min(keys, p.s - key_begin);
  for (int r = warp; r < nr; r += kWarps) {
    float* srow = sc + r * p.chunk;
    const float* mrow = smask + s_src[r] * p.chunk;
    float m = -INFINITY;
    for (int j = lane; j < keys; j += 32) {
      const float x = j < lim && (vbits >> (j / kBlockN) & 1u) ? capped(p, srow[j] * p.scale_log2) + mrow[j] : -INFINITY;
      srow[j] = x;
      m = fmaxf(m, x);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.f;
    for (int j = lane; j < keys; j += 32) {
      const float e = m == -INFINITY ? 0.f : exp2f(srow[j] - m);
      srow[j] = e;
      l += e;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) {
      s_m[r] = m;
      s_l[r] = l;
    }
  }

  // ---- O = P V: warp w takes dims [w DW, (w + 1) DW), NT n-tiles, over the visible blocks ----
  float o[NT][4] = {};
  for (int item = nvis; item < items; ++item) {
    issue(item + NS - 1);
    cp_async_wait<NS - 1>();
    __syncthreads();  // (the first time: the probabilities too)
    roll_store(item);
    const int blk = nth_visible(item - nvis);
    const T* st = stage + (item % NS) * kBlockN * P;
    if (vbits >> blk & 1u) {  // (a roll's hidden blocks only move)
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        uint32_t pa[4];  // A fragment of P, rounded to T (zeros past the CTA's rows)
        const int kl = blk * kBlockN + ks * 16 + 2 * t4;
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // a0: (g, k), a1: (g + 8, k), a2: (g, k + 8), a3: (g + 8, k + 8)
          const bool ok = i & 1 ? row1 : row0;
          const float2 pv = ok ? *reinterpret_cast<const float2*>((i & 1 ? sc1 : sc0) + kl + (i >> 1) * 8)
                               : make_float2(0.f, 0.f);
          pa[i] = pack2<T>(pv.x, pv.y);
        }
        const int vrow = ks * 16 + (ml & 1) * 8 + mi;  // matrices: (keys 0-7 | 8-15) x (dims 0-7 | 8-15)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          if (D != P && warp * DW + np * 16 >= D) break;  // past the head dim (warp-uniform)
          uint32_t vf[4];
          ldsm_x4<true>(vf, st + vrow * P + ((((warp * DW + np * 16) / 8 + (ml >> 1)) ^ (vrow & 7)) * 8));
          mma16816<T>(o[2 * np], pa[0], pa[1], pa[2], pa[3], vf[0], vf[1]);
          mma16816<T>(o[2 * np + 1], pa[0], pa[1], pa[2], pa[3], vf[2], vf[3]);
        }
      }
    }
    __syncthreads();
  }
  pdl_trigger();  // every load issued: the combine may launch
  cp_async_wait<0>();
  __syncthreads();  // s_m, s_l

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h, rr = r0 + r;
    if (r >= nr) continue;
    const int hd = kvh * p.group + rr / p.lq, qi = rr % p.lq;
    const int64_t row = flat_row(rr);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int d = warp * DW + nt * 8 + 2 * t4;
      if (D != P && d >= D) break;  // (D is a multiple of 16: d + 1 < D too)
      const float x = o[nt][2 * h], y = o[nt][2 * h + 1];
      if (p.splits == 1) {
        const float l = s_l[r];
        T* out = static_cast<T*>(p.out) + b * p.os0 + hd * p.os1 + qi * p.os2 + d;
        out[0] = from_float<T>(l > 0.f ? x / l : 0.f);
        out[1] = from_float<T>(l > 0.f ? y / l : 0.f);
      } else if (s_m[r] != -INFINITY) {  // else never read
        *reinterpret_cast<float2*>(p.part_o + (split * p.rows_total + row) * D + d) = make_float2(x, y);
      }
    }
    if (warp == 0 && t4 == 0) {
      if (p.splits == 1) {
        if (p.hidden) p.hidden[row] = !(s_m[r] > kHiddenLog2);
      } else {
        p.part_ml[split * p.rows_total + row] = make_float2(s_m[r], s_l[r]);
      }
    }
  }
}

// ---- the streaming one-row tile (sm_90+) ----
// One query row per KV head (MHA decode) has no group to share a key with: tensor cores do 1/16 of useful work
// and the cost is the stream itself. Here one thread per CTA moves each visible 64-key block's K and V rows
// (contiguous in the cache) into a ring of p.stages shared-memory stages with two bulk copies (mbarrier
// complete_tx), and the 4 warps read them on the CUDA cores: 8 lanes per key row (lane l8 takes the row's
// 16-byte chunks l8 and l8 + 8, so 8 lanes read 128 contiguous bytes: no bank conflict), 4 keys per warp at a time,
// each group of 8 lanes with its own online softmax; the 16 groups' (max, sum, output) are merged at the end.
// Probabilities stay float32 for P V. Writes what the other tiles write (unnormalized output and (max, sum) per
// split, or the output and the hidden flag with one split).
constexpr int kStreamWarps = 4;
constexpr int kStreamMaxStages = 6;
constexpr int kStreamMaxChunk = 4096;  // keys a split at most (64 blocks: one 64-bit word of visible blocks)
// The ring's stages by default: one (each CTA has one block in flight; more CTAs an SM keep more in flight). H200,
// the op alone (bench_decode_attention.py, GPT-NeoX / Phi-3 / StableLM-2 / GPT-2 widths): at batch 32 one stage
// was the fastest of 1, 2, 3 at every shape and position (position 1024: 93.2 / 104.3 / 115.1 us at GPT-NeoX
// widths; the tensor-core tile 103.2), at batch 1 within 0.6 us of the fastest tile and ring.
constexpr int kStreamStages = 1;

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& w, float (&f)[8]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      f[2 * i] = __uint_as_float(u[i] << 16), f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    } else {
      const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
      f[2 * i] = x.x, f[2 * i + 1] = x.y;
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kStreamWarps * 32) decode_attention_stream_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int C = D / 8;                  // 16-byte chunks a row
  constexpr int QC = (C + 7) / 8;           // chunks a lane (1 or 2)
  constexpr int BLK = kBlockN * D;          // elements of one K (or V) block
  constexpr int NG = kStreamWarps * 4;      // groups of 8 lanes
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* stage = reinterpret_cast<T*>(smem_raw);  // [stages][K, V][64][D]
  __shared__ __align__(8) uint64_t full[kStreamMaxStages];
  __shared__ unsigned s_vis[2];               // the split's visible blocks as bits (64)
  __shared__ float s_m[NG], s_l[NG];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, grp = lane / 8, l8 = lane % 8;
  const int b = blockIdx.x / p.hkv, h = blockIdx.x % p.hkv;
  const int64_t row = static_cast<int64_t>(b) * p.hq + h;  // [B, Hq, 1]: one row a (sequence, head)
  const int split = blockIdx.y, key_begin = split * p.chunk;
  const int lim = min(p.chunk, p.s - key_begin);  // keys of this split in the cache
  const int nblocks = (lim + kBlockN - 1) / kBlockN, keys = nblocks * kBlockN;
  if (tid < 2) s_vis[tid] = 0;
  if (tid < p.stages) mbar_init(&full[tid], 1);
  mbar_init_fence();
  __syncthreads();
  pdl_wait();  // q, the cache and the mask: written by the kernels before

  // ---- the split's mask (8 loads in flight a thread): a block is visible where one of its keys is ----
  const int64_t moff = b * p.ms0 + h * p.ms1;
  const auto mask_of = [&](int kl) {  // key kl of the split, in the cache
    return p.mask_kind == kNoMask ? 0.f : mask_at<T>(p, moff + (key_begin + kl) * p.ms3);
  };
  unsigned vis[2] = {0u, 0u};
  for (int k0 = 0; k0 < keys; k0 += 8 * kStreamWarps * 32) {
    float mv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int kl = k0 + tid + i * kStreamWarps * 32;
      mv[i] = kl < lim ? mask_of(kl) : -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int blk = (k0 + tid + i * kStreamWarps * 32) / kBlockN;
      if (!(mv[i] <= kHiddenLog2)) vis[blk / 32] |= 1u << (blk % 32);  // a NaN counts as visible, as in the reference
    }
  }
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    vis[w] = __reduce_or_sync(0xffffffffu, vis[w]);
    if (lane == 0 && vis[w]) atomicOr(&s_vis[w], vis[w]);
  }
  __syncthreads();
  const uint64_t vbits = s_vis[0] | static_cast<uint64_t>(s_vis[1]) << 32;
  const int nvis = __popcll(vbits);
  if (nvis == 0 && p.splits > 1) {  // (max, sum) = (-inf, 0): the combine reads no output of this split
    if (tid == 0) p.part_ml[split * p.rows_total + row] = make_float2(-INFINITY, 0.f);
    return;
  }
  // The visible blocks in order: the producer's cursor (thread 0, issuing ahead) and the consumers'.
  const auto next_visible = [](uint64_t& rest) {
    const int blk = __ffsll(static_cast<long long>(rest)) - 1;
    rest &= rest - 1;
    return blk;
  };
  uint64_t to_issue = vbits, to_read = vbits;

  // ---- K and V of the visible blocks: two bulk copies a block, by thread 0 ----
  const T* kb = static_cast<const T*>(p.k) + b * p.ks0 + h * p.ks1 + static_cast<int64_t>(key_begin) * D;
  const T* vb = static_cast<const T*>(p.v) + b * p.vs0 + h * p.vs1 + static_cast<int64_t>(key_begin) * D;
  const auto issue = [&](int item) {
    const int k0 = next_visible(to_issue) * kBlockN, st = item % p.stages;
    const uint32_t bytes = min(kBlockN, lim - k0) * D * sizeof(T);  // the cache's last block may be partial
    T* dst = stage + st * 2 * BLK;
    mbar_expect_tx(&full[st], 2 * bytes);
    bulk_load(dst, kb + static_cast<int64_t>(k0) * D, bytes, &full[st]);
    bulk_load(dst + BLK, vb + static_cast<int64_t>(k0) * D, bytes, &full[st]);
  };
  if (tid == 0) {
    for (int i = 0; i < min(p.stages, nvis); ++i) issue(i);
  }

  float qf[QC][8];  // this lane's chunks of q
  {
    const T* qp = static_cast<const T*>(p.q) + b * p.qs0 + h * p.qs1;
#pragma unroll
    for (int c = 0; c < QC; ++c) {
      const int ch = l8 + 8 * c;
#pragma unroll
      for (int e = 0; e < 8; ++e) qf[c][e] = ch < C ? to_float(qp[ch * 8 + e]) : 0.f;
    }
  }
  float m = -INFINITY, l = 0.f, acc[QC][8] = {};
  for (int item = 0; item < nvis; ++item) {
    const int st = item % p.stages, blk = next_visible(to_read);
    float mk[4];  // this group's keys' mask values (from L1: read above), loaded while the stage lands
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int kl = blk * kBlockN + warp * 16 + it * 4 + grp;
      mk[it] = kl < lim ? mask_of(kl) : -INFINITY;
    }
    mbar_wait(&full[st], (item / p.stages) & 1);
    const T* ks = stage + st * 2 * BLK;
    const T* vs = ks + BLK;
    float x[4];
#pragma unroll
    for (int it = 0; it < 4; ++it) {  // this group's keys: warp * 16 + it * 4 + grp of the block
      const int j = warp * 16 + it * 4 + grp;
      float dot = 0.f;
#pragma unroll
      for (int c = 0; c < QC; ++c) {
        const int ch = l8 + 8 * c;
        if (ch < C) {
          float kf[8];
          unpack8<T>(*reinterpret_cast<const uint4*>(ks + j * D + ch * 8), kf);
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(qf[c][e], kf[e], dot);
        }
      }
      dot = sum_key_lanes<8>(dot);
      const int kl = blk * kBlockN + j;
      x[it] = kl < lim ? capped(p, dot * p.scale_log2) + mk[it] : -INFINITY;
    }
    const float mn = fmaxf(m, fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3])));
    if (mn != -INFINITY) {  // else every key so far is hidden: nothing to add
      const float c0 = exp2f(m - mn);  // (m = -inf: 0)
      l *= c0;
#pragma unroll
      for (int c = 0; c < QC; ++c) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[c][e] *= c0;
      }
#pragma unroll
      for (int it = 0; it < 4; ++it) {
        const float w = exp2f(x[it] - mn);
        if (!(w > 0.f) && !(w != w)) continue;  // a hidden key (or one past the cache, not loaded): no V read
        l += w;
        const int j = warp * 16 + it * 4 + grp;
#pragma unroll
        for (int c = 0; c < QC; ++c) {
          const int ch = l8 + 8 * c;
          if (ch < C) {
            float vf[8];
            unpack8<T>(*reinterpret_cast<const uint4*>(vs + j * D + ch * 8), vf);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[c][e] = fmaf(w, vf[e], acc[c][e]);
          }
        }
      }
      m = mn;
    }
    __syncthreads();  // every warp is done with the stage
    if (tid == 0 && item + p.stages < nvis) issue(item + p.stages);
  }
  pdl_trigger();  // every load issued: the combine may launch

  // ---- the 16 groups' partial softmaxes merged: their outputs through the ring's memory (every copy landed) ----
  float* red = reinterpret_cast<float*>(smem_raw);  // [NG][D]
  const int g = warp * 4 + grp;
  if (l8 == 0) s_m[g] = m, s_l[g] = l;
#pragma unroll
  for (int c = 0; c < QC; ++c) {
    const int ch = l8 + 8 * c;
    if (ch < C) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red[g * D + ch * 8 + e] = acc[c][e];
    }
  }
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < NG; ++i) mx = fmaxf(mx, s_m[i]);
  if (tid < D) {
    float o = 0.f, sum = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int i = 0; i < NG; ++i) {
        if (s_m[i] == -INFINITY) continue;
        const float w = exp2f(s_m[i] - mx);
        o = fmaf(red[i * D + tid], w, o);
        sum = fmaf(s_l[i], w, sum);
      }
    }
    if (p.splits == 1) {
      static_cast<T*>(p.out)[b * p.os0 + h * p.os1 + tid] = from_float<T>(sum > 0.f ? o / sum : 0.f);
      if (tid == 0 && p.hidden) p.hidden[row] = !(mx > kHiddenLog2);
    } else {
      if (mx != -INFINITY) p.part_o[(split * p.rows_total + row) * D + tid] = o;  // else never read
      if (tid == 0) p.part_ml[split * p.rows_total + row] = make_float2(mx, sum);
    }
  }
#endif
}

template <typename T, int D, int W>
__device__ void recompute_row(const Params& p, int64_t row);

// A roll's key rows that the main kernel left in `edge` (the first slot of each split after the first), written
// into the cache by the combine's CTAs, D / 8 threads a row, once the main kernel is done.
template <typename T, int D>
__device__ void write_edges(const Params& p) {
  constexpr int C = D / 8;  // 16-byte chunks a row
  const int64_t per = static_cast<int64_t>(p.splits - 1) * p.bhkv, n = 2 * per;
  if (threadIdx.x >= C) return;
  for (int64_t e = blockIdx.x; e < n; e += gridDim.x) {
    const bool is_v = e >= per;
    const int split = static_cast<int>(e % per / p.bhkv) + 1, bh = static_cast<int>(e % p.bhkv);
    const int b = bh / p.hkv, h = bh % p.hkv;
    T* row = static_cast<T*>(const_cast<void*>(is_v ? p.v : p.k)) +
             b * (is_v ? p.vs0 : p.ks0) + h * (is_v ? p.vs1 : p.ks1) +
             static_cast<int64_t>(split) * p.chunk * (is_v ? p.vs2 : p.ks2);
    const T* src = static_cast<const T*>(p.edge) + edge_row(p, is_v, split, bh, D);
    reinterpret_cast<uint4*>(row)[threadIdx.x] = reinterpret_cast<const uint4*>(src)[threadIdx.x];
  }
}

// One block of padded(D) threads per output row (thread t < D writes dim t): rescale each split's partial sums to the common max (a row no key
// shows above -60000 under a finite mask is computed again here, see recompute_row). The splits' (max, sum)
// are read in parallel, one per thread; the splits that saw a key are listed in shared memory (in split order)
// and their partial outputs read 32 at a time: a short visible prefix of a long cache costs two memory round
// trips, not one per group of splits.
template <typename T, int D>
__global__ void __launch_bounds__(padded(D)) combine_splits(const Params p) {
  constexpr int kUnroll = 32;
  constexpr int P = padded(D);  // threads
  __shared__ float s_red[P / 32], s_w[P], s_l[P];
  __shared__ int s_idx[P], s_cnt[P / 32];
  pdl_wait();  // the main kernel's partial results
  if (p.edge) write_edges<T, D>(p);
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const float2* ml = p.part_ml + row;  // split s at ml[s * rows_total]
  float mx = -INFINITY;
  for (int s = t; s < p.splits; s += P) mx = fmaxf(mx, ml[s * p.rows_total].x);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) s_red[warp] = mx;
  __syncthreads();
  mx = s_red[0];
#pragma unroll
  for (int w = 1; w < P / 32; ++w) mx = fmaxf(mx, s_red[w]);
  if (p.finite_mask && !(mx > kHiddenLog2)) {  // mx is the CTA's: every thread takes this branch
    recompute_row<T, D, P / 32>(p, row);
    return;
  }
  float l = 0.f, acc = 0.f;
  for (int base = 0; base < p.splits; base += P) {
    const int n = min(P, p.splits - base);
    float2 x = make_float2(-INFINITY, 0.f);
    if (t < n) x = ml[(base + t) * p.rows_total];  // (from L1: read above)
    const bool ok = x.x != -INFINITY;  // a split that saw nothing wrote no partial output
    const unsigned bal = __ballot_sync(0xffffffffu, ok);
    __syncthreads();  // the list of the tile before is read
    if (lane == 0) s_cnt[warp] = __popc(bal);
    __syncthreads();
    int pos = __popc(bal & ((1u << lane) - 1)), nok = 0;
#pragma unroll
    for (int w = 0; w < P / 32; ++w) {
      pos += w < warp ? s_cnt[w] : 0;
      nok += s_cnt[w];
    }
    if (ok) {
      const float w = exp2f(x.x - mx);
      s_idx[pos] = base + t, s_w[pos] = w, s_l[pos] = x.y * w;
    }
    __syncthreads();
    for (int j0 = 0; j0 < nok; j0 += kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        v[u] = j0 + u < nok && (D == P || t < D) ? p.part_o[(s_idx[j0 + u] * p.rows_total + row) * D + t] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // split order, as one loop would: deterministic sums
        if (j0 + u < nok) {
          l += s_l[j0 + u];
          acc = fmaf(v[u], s_w[j0 + u], acc);
        }
      }
    }
  }
  pdl_trigger();
  const int64_t qi = row % p.lq, h = (row / p.lq) % p.hq, b = row / (static_cast<int64_t>(p.lq) * p.hq);
  if (D == P || t < D) static_cast<T*>(p.out)[b * p.os0 + h * p.os1 + qi * p.os2 + t] = from_float<T>(l > 0.f ? acc / l : 0.f);
}

// A row with no key above -60000 under a finite additive mask: the replaced attention weighs every key by
// exp(score + mask), so this row is computed again over all of them, without skipping (rare: a padded
// query row), by the W warps of the calling CTA. A row hidden by -inf everywhere gives 0.
template <typename T, int D, int W>
__device__ void recompute_row(const Params& p, int64_t row) {
  constexpr int E = padded(D) / 32;  // elements per lane (D is a multiple of E: a lane has all E or none)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool has = D == padded(D) || lane * E < D;
  const int64_t qi = row % p.lq, h = (row / p.lq) % p.hq, b = row / (static_cast<int64_t>(p.lq) * p.hq);
  const int64_t kvh = h / (p.hq / p.hkv);
  const T* qp = static_cast<const T*>(p.q) + b * p.qs0 + h * p.qs1 + qi * p.qs2 + lane * E;
  const T* kp = static_cast<const T*>(p.k) + b * p.ks0 + kvh * p.ks1 + lane * E;
  const T* vp = static_cast<const T*>(p.v) + b * p.vs0 + kvh * p.vs1 + lane * E;
  const int64_t moff = b * p.ms0 + h * p.ms1 + qi * p.ms2;
  // a roll's split boundaries: their rows wait in `edge` (another of the combine's CTAs may not have written them)
  const int64_t bh = b * p.hkv + kvh;
  const T* edge = p.edge ? static_cast<const T*>(p.edge) + lane * E : nullptr;
  const auto at_edge = [&](int j) { return edge != nullptr && j > 0 && j % p.chunk == 0; };
  float qr[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) qr[e] = has ? to_float(qp[e]) * p.scale_log2 : 0.f, acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int j = warp; j < p.s; j += W) {  // online softmax over this warp's keys
    float sc = 0.f;
    const T* kr = at_edge(j) ? edge + edge_row(p, false, j / p.chunk, bh, D) : kp + j * p.ks2;
#pragma unroll
    for (int e = 0; e < E; ++e) sc = has ? fmaf(qr[e], to_float(kr[e]), sc) : sc;
    sc = capped(p, sum_key_lanes<32>(sc)) + mask_at<T>(p, moff + j * p.ms3);
    if (sc == -INFINITY) continue;
    const float mn = fmaxf(m, sc), c = exp2f(m - mn), w = exp2f(sc - mn);
    l = l * c + w;
    const T* vr = at_edge(j) ? edge + edge_row(p, true, j / p.chunk, bh, D) : vp + j * p.vs2;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = acc[e] * c + (has ? w * to_float(vr[e]) : 0.f);
    m = mn;
  }
  __shared__ float s_m[W], s_l[W], s_acc[W][padded(D)];
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int e = 0; e < E; ++e) s_acc[warp][lane * E + e] = acc[e];
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < W; ++w) mx = fmaxf(mx, s_m[w]);
  for (int d = threadIdx.x; d < D; d += W * 32) {
    float num = 0.f, den = 0.f;
    if (mx != -INFINITY) {
      for (int w = 0; w < W; ++w) {
        if (s_m[w] == -INFINITY) continue;
        const float c = exp2f(s_m[w] - mx);
        num += s_acc[w][d] * c;
        den += s_l[w] * c;
      }
    }
    static_cast<T*>(p.out)[b * p.os0 + h * p.os1 + qi * p.os2 + d] = from_float<T>(den > 0.f ? num / den : 0.f);
  }
}

// One split only: the main kernel flagged the hidden rows; one CTA per row, other rows return at once.
template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32) hidden_rows(const Params p) {
  pdl_wait();
  if (!p.hidden[blockIdx.x]) return;
  recompute_row<T, D, kWarps>(p, blockIdx.x);
}

bool aligned16(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.size(i) > 1 && t.stride(i) % 8 != 0) return false;
  }
  return true;
}

}  // namespace

// decode_attention.h: the contract on q, k, v and the mask, shared with decode_attention_roll.cu
void decode_attention_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask) {
  check_cache_qkv(q, k, v, "decode_attention");
  TORCH_CHECK(q.size(2) > 0 && k.size(2) > 0, "fusekit: decode_attention needs a query and a key; got ",
              describe(q), ", ", describe(k));
  const int64_t d = q.size(3);
  TORCH_CHECK(d == 64 || d == 80 || d == 96 || d == 112 || d == 128 || d == 160 || d == 192 || d == 256,
              "fusekit: decode_attention: head dim must be 64, 80, 96, 112, 128, 160, 192 or 256; got ", describe(q));
  TORCH_CHECK(aligned16(k) && aligned16(v), "fusekit: decode_attention: k and v rows must be 16-byte aligned "
              "(strides and offset multiples of 8 elements)");
  TORCH_CHECK(k.size(2) <= (int64_t{1} << 30) && q.size(1) * q.size(2) <= (int64_t{1} << 20),
              "fusekit: decode_attention: sizes too large: ", describe(q), ", ", describe(k));
  if (mask) {
    check_attention_mask(*mask, q, {q.size(0), q.size(1), q.size(2), k.size(2)}, "decode_attention", "[B,Hq,Lq,S]",
                         /*float32_ok=*/true);
  }
}

namespace {

// The streaming one-row tile's shared memory: the ring's stages of K and V blocks.
size_t stream_smem(int d, int stages) { return static_cast<size_t>(stages) * 2 * kBlockN * d * 2; }

// Streaming one-row CTAs of head dim D that fit the GPU at once with a ring of `stages` (registers decide too). The
// runtime's occupancy is asked once per device and ring depth, not at every launch.
template <int D>
int64_t stream_wave_d(int stages) {
  static int per_sm[64][kStreamMaxStages + 1] = {};
  const int dev = c10::cuda::current_device();
  if (per_sm[dev][stages] == 0) {
    const auto kernel = decode_attention_stream_kernel<__nv_bfloat16, D>;  // (fp16's uses as many registers)
    opt_in_smem<decode_attention_stream_kernel<__nv_bfloat16, D>>(stream_smem(D, kStreamMaxStages));
    int n = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kStreamWarps * 32, stream_smem(D, stages)));
    per_sm[dev][stages] = std::max(n, 1);
  }
  return per_sm[dev][stages] * static_cast<int64_t>(sm_count());
}

int64_t stream_wave(int d, int stages) {
  switch (d) {
    case 64: return stream_wave_d<64>(stages);
    case 80: return stream_wave_d<80>(stages);
    case 96: return stream_wave_d<96>(stages);
    case 112: return stream_wave_d<112>(stages);
    default: return stream_wave_d<128>(stages);
  }
}

// Splits of the streaming tile: the fewest whose CTAs fill their last wave to >= 90% (at a full cache every CTA
// streams as much: the step ends with its last wave), else the fullest within four waves. H200, GPT-NeoX widths at
// batch 32 (512 rows, three CTAs an SM): 4 splits are 5.2 waves, 3 splits 3.9.
int stream_splits(int64_t blocks_x, int nb, int64_t wave) {
  int best = 1;
  double best_fill = 0.0;
  for (int s = (nb + kStreamMaxChunk / kBlockN - 1) / (kStreamMaxChunk / kBlockN); s <= nb; ++s) {
    const int per = (nb + s - 1) / s;
    if ((nb + per - 1) / per != s) continue;  // the splits of a smaller s
    const int64_t n = blocks_x * s;
    if (n > 4 * wave && best_fill > 0.0) break;
    const double fill = static_cast<double>(n) / static_cast<double>(wave * ((n + wave - 1) / wave));
    if (fill >= 0.9) return s;
    if (fill > best_fill) best = s, best_fill = fill;
  }
  return best;
}

// One-row CTAs that fit the GPU at once (their shared memory decides: the ring's stages and the scores).
int64_t one_row_wave(int cols, int64_t elem) {
  const int64_t smem = kStagesOneRow * kBlockN * cols * elem + 2 * max_chunk(cols, 1) * 4 + 1024;
  return std::clamp<int64_t>(smem_per_sm() / smem, 1, 8) * sm_count();
}

// What follows any tile's main kernel: the split combine, or with one split the hidden rows' recompute.
template <typename T, int D>
void launch_after(const Params& p, cudaStream_t stream, bool pdl) {
  if (p.splits > 1) launch_ex(combine_splits<T, D>, dim3(p.rows_total), dim3(padded(D)), 0, stream, pdl, 0, p);
  if (p.hidden) {  // one split: no combine to recompute the hidden rows in
    launch_ex(hidden_rows<T, D>, dim3(p.rows_total), dim3(kWarps * 32), 0, stream, pdl, 0, p);
  }
}

template <typename T, int D, int RT, int NS = kStages>
void launch(Params& p, int64_t blocks_x, const at::Tensor& q) {
  constexpr int P = padded(D);
  const auto smem_for = [](int chunk, int stages) {
    return stages * kBlockN * P * sizeof(T) + 2 * static_cast<size_t>(RT) * chunk * sizeof(float);
  };
  opt_in_smem<decode_attention_kernel<T, D, RT, NS>>(smem_for(max_chunk(P, RT), NS));
  // A split of one block has two items (its K and V): a deeper ring would only cost CTAs per SM
  p.stages = std::min(NS, 2 * p.chunk / kBlockN);
  // Each kernel with PDL (pdl.cuh): its launch overlaps the end of the kernel before it
  static const int version = binary_version(decode_attention_kernel<T, D, RT, NS>);
  const bool pdl = pdl_allowed(version, 'a');
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  launch_ex(decode_attention_kernel<T, D, RT, NS>, dim3(blocks_x, p.splits, 1), dim3(kWarps * 32),
            smem_for(p.chunk, p.stages), stream, pdl, 0, p);
  launch_after<T, D>(p, stream, pdl);
}


// Whether this build has the streaming one-row tile (compiled for sm_90+; elsewhere its body is empty).
bool stream_built() {
  static const int version = binary_version(decode_attention_stream_kernel<__nv_bfloat16, 128>);
  return version >= 90;
}

template <typename T, int D>
void launch_stream(Params& p, int64_t blocks_x) {
  static_assert(D <= 128, "one row of head dim 160-256 runs in the 4-row tile");
  opt_in_smem<decode_attention_stream_kernel<T, D>>(stream_smem(D, kStreamMaxStages));
  static const int version = binary_version(decode_attention_stream_kernel<T, D>);
  const bool pdl = pdl_allowed(version, 'a');
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  launch_ex(decode_attention_stream_kernel<T, D>, dim3(blocks_x, p.splits, 1), dim3(kStreamWarps * 32),
            stream_smem(D, p.stages), stream, pdl, 0, p);
  launch_after<T, D>(p, stream, pdl);
}

template <typename T, int D>
void launch_rows(Params& p, int64_t blocks_x, int rt, const at::Tensor& q) {
  if constexpr (padded(D) <= 128) {  // (one row of head dim 160-256 runs in the 4-row tile)
    if (rt == 0) return launch_stream<T, D>(p, blocks_x);
    if (rt == 1) {
      return launch<T, D, 1, kStagesOneRow>(p, blocks_x, q);
    }
  }
  if (rt <= 4) return launch<T, D, 4>(p, blocks_x, q);
  if (rt == 8) return launch<T, D, 8>(p, blocks_x, q);
  launch<T, D, 16>(p, blocks_x, q);
}

}  // namespace

at::Tensor decode_attention_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double scale, double softcap,
                                const WindowRoll* roll) {
  decode_attention_check(q, k, v, mask);
  c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty_like(q);  // the fake's layout
  const int64_t B = q.size(0), hq = q.size(1), lq = q.size(2), d = q.size(3), S = k.size(2);
  // One KV head broadcast to every query head (stride 0 along the heads: repeat_kv's view of an MQA cache) is
  // one group: its rows are read once for all the query heads, not once per head.
  const bool broadcast = k.size(1) == hq && hq > 1 && k.stride(1) == 0 && v.stride(1) == 0;
  const int64_t hkv = broadcast ? 1 : k.size(1);
  if (B == 0) return out;
  const int group = static_cast<int>(hq / hkv), rows = static_cast<int>(group * lq);
  // Rows per CTA: 4, 8 or 16 (the tensor-core tiles hold 16 rows whatever RT is; RT sizes the shared memory:
  // scores and mask rows, 2 x RT x 1 KB). A group of more than 16 rows takes several CTAs, each reading the
  // visible KV blocks (the later ones mostly from L2).
  // One row (MHA decode) has a tile of its own (rt 1: a deeper K/V ring in the shared memory the scores left).
  // On sm_90 builds a cache of contiguous rows streams through the bulk-copy tile (rt 0: one row too).
  const int forced_rows = debug::decode_attention_rows();
  const bool one_row = rows == 1 && d <= 128 && forced_rows != 4 && roll == nullptr;
  const bool stream = one_row && forced_rows != 1 && k.stride(2) == d && v.stride(2) == d && stream_built();
  const int rt = stream ? 0 : one_row ? 1 : rows <= 4 ? 4 : rows <= 8 ? 8 : 16;
  const int zchunks = rt <= 1 ? rows : (rows + rt - 1) / rt;
  // a roll: each key block read and written back by one CTA (decode_attention_roll.cu checks the rest)
  TORCH_CHECK(roll == nullptr || (zchunks == 1 && !broadcast), "fusekit: decode_attention_run: a roll needs one CTA "
              "row per KV head (at most 16 query rows a KV head) and a cache of its own heads: ", describe(q), ", ",
              describe(k));
  const int64_t blocks_x = B * hkv * zchunks;
  TORCH_CHECK(blocks_x < (int64_t{1} << 31), "fusekit: decode_attention: batch x heads too large: ", describe(q));

  // Splits: enough CTAs for ~8 per SM, at most max_chunk keys each (so that the CTAs a short visible prefix
  // keeps busy still fill the GPU; the others only read their mask), whole 64-key blocks. One-row CTAs: about one
  // wave of them, each streaming up to 16 blocks through its deeper ring (as many 1-block splits as the group
  // tiles take measured slower than PyTorch's fused SDPA near a full cache at batch 1).
  const int nb = static_cast<int>((S + kBlockN - 1) / kBlockN);
  // A roll: ~4 CTAs per SM of at least 2 blocks each where that still gives a CTA per two SMs (each split after the
  // first costs an edge row, and its CTA writes what it reads). H200, Mistral-style batch 32 (window 1024, 16
  // blocks; the step, CUDA graphs): splits of 1 / 2 / 4 / 8 blocks 0.922 / 0.878 / 0.832 / 0.836 ms; Gemma-3-style
  // (512, D 256) 1 / 2 blocks 0.749 / 0.744 (128 CTAs); Gemma-3-style batch 1 in 4 CTAs of 2 blocks: 0.98x the
  // two-pass step, in 8 of 1 block 1.02x.
  const int stages = debug::decode_attention_stages() ? debug::decode_attention_stages() : kStreamStages;
  const int64_t target = rt == 1 ? one_row_wave(padded(static_cast<int>(d)), q.element_size())
                                 : (roll ? 4 : 8) * static_cast<int64_t>(sm_count());
  int splits = rt == 0 ? stream_splits(blocks_x, nb, stream_wave(static_cast<int>(d), stages))
                       : static_cast<int>(std::min<int64_t>(std::max<int64_t>((target + blocks_x - 1) / blocks_x, 1), nb));
  if (roll && 2 * blocks_x * (nb / 2) >= sm_count()) splits = std::min(splits, nb / 2);
  const int max_blocks = (rt == 0 ? kStreamMaxChunk : max_chunk(padded(static_cast<int>(d)), rt)) / kBlockN;
  if (const int forced = debug::decode_attention_splits()) splits = std::min(forced, nb);
  splits = std::max(splits, (nb + max_blocks - 1) / max_blocks);
  const int chunk_blocks = (nb + splits - 1) / splits;
  splits = (nb + chunk_blocks - 1) / chunk_blocks;
  TORCH_CHECK(splits < 65536, "fusekit: decode_attention: cache too long: ", describe(k));

  Params p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.qs0 = q.stride(0), p.qs1 = q.stride(1), p.qs2 = q.stride(2);
  p.ks0 = k.stride(0), p.ks1 = k.stride(1), p.ks2 = k.stride(2);
  p.vs0 = v.stride(0), p.vs1 = v.stride(1), p.vs2 = v.stride(2);
  p.os0 = out.stride(0), p.os1 = out.stride(1), p.os2 = out.stride(2);
  at::Tensor m;
  p.mask_kind = kNoMask;
  if (mask) {
    m = *mask;
    while (m.dim() < 4) m = m.unsqueeze(0);
    m = m.expand({B, hq, lq, S});  // broadcast dims get stride 0
    p.mask = m.data_ptr();
    p.ms0 = m.stride(0), p.ms1 = m.stride(1), p.ms2 = m.stride(2), p.ms3 = m.stride(3);
    p.mask_kind = m.scalar_type() == at::kBool ? kBoolMask : m.scalar_type() == at::kFloat ? kFloatMask : kSameMask;
  }
  p.rows_total = B * hq * lq;
  p.hq = static_cast<int>(hq), p.hkv = static_cast<int>(hkv), p.lq = static_cast<int>(lq);
  p.s = static_cast<int>(S), p.group = group, p.rows = rows, p.zchunks = zchunks;
  p.chunk = chunk_blocks * kBlockN, p.splits = splits;
  if (rt == 0) p.stages = std::min(stages, chunk_blocks);  // (a split of fewer blocks needs no deeper ring)
  p.scale_log2 = static_cast<float>(scale) * kLog2e;
  p.cap_log2 = static_cast<float>(softcap) * kLog2e;
  p.inv_cap_log2 = softcap > 0 ? 1.f / p.cap_log2 : 0.f;
  at::Tensor part_o, part_ml, hidden;
  p.finite_mask = p.mask_kind == kSameMask || p.mask_kind == kFloatMask;  // finite values can hide a row
  if (p.finite_mask && splits == 1) {
    hidden = at::empty({p.rows_total}, q.options().dtype(at::kInt));
    p.hidden = hidden.data_ptr<int>();
  }
  at::Tensor edge;
  if (roll != nullptr) {
    const at::Tensor &nk = roll->new_k, &nv = roll->new_v;
    p.roll = 1, p.bhkv = static_cast<int>(B * hkv);
    p.new_k = nk.data_ptr(), p.new_v = nv.data_ptr();
    p.nks0 = nk.stride(0), p.nks1 = nk.stride(1), p.nvs0 = nv.stride(0), p.nvs1 = nv.stride(1);
    if (splits > 1) {
      edge = at::empty({2, splits - 1, B * hkv, d}, k.options());
      p.edge = edge.data_ptr();
    }
  }
  if (splits > 1) {
    part_o = at::empty({splits, p.rows_total, d}, q.options().dtype(at::kFloat));
    part_ml = at::empty({splits, p.rows_total, 2}, q.options().dtype(at::kFloat));
    p.part_o = part_o.data_ptr<float>();
    p.part_ml = reinterpret_cast<float2*>(part_ml.data_ptr<float>());
  }
  const auto dispatch = [&](auto tag) {
    using T = decltype(tag);
    switch (d) {
      case 64: return launch_rows<T, 64>(p, blocks_x, rt, q);
      case 80: return launch_rows<T, 80>(p, blocks_x, rt, q);
      case 96: return launch_rows<T, 96>(p, blocks_x, rt, q);
      case 112: return launch_rows<T, 112>(p, blocks_x, rt, q);
      case 128: return launch_rows<T, 128>(p, blocks_x, rt, q);
      case 160: return launch_rows<T, 160>(p, blocks_x, rt, q);
      case 192: return launch_rows<T, 192>(p, blocks_x, rt, q);
      default: return launch_rows<T, 256>(p, blocks_x, rt, q);
    }
  };
  dispatch_half_bf16(q.scalar_type(), dispatch);
  return out;
}

namespace {

at::Tensor decode_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::optional<at::Tensor>& mask, double scale) {
  return decode_attention_run(q, k, v, mask, scale, 0.0, nullptr);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_attention", &fusekit::decode_attention_cuda); }
