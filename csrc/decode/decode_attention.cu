// fusekit::decode_attention -- a few query rows per sequence against a KV cache, grouped query heads read
// from their shared KV head (no repeat_kv copy), KV blocks the mask hides skipped, the cache split across
// thread blocks (flash-decoding) and the partial softmaxes combined.
//
//   def decode_attention_ref(q, k, v, mask=None, scale=0.125):
//       n = q.shape[1] // k.shape[1]                 # query heads per KV head (1: MHA)
//       return F.scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), attn_mask=mask, scale=scale)
//
// Contract: q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with Hq % Hkv == 0, on one CUDA device, one dtype in
// {float16, bfloat16}, D in {64, 128, 256}, unit last-dim stride; k and v 16-byte aligned (every other
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
// One CTA (4 warps) per (sequence, KV head, split of the cache, up to 4 rows of its query group). It reads
// its split's mask first, all of it at once, and skips the K and V of every 64-key block in which every
// row's mask hides every key (a split with nothing visible writes (-inf, 0) and ends); each visible key row
// is read once (16 bytes per lane) for all the rows of the group. With more
// than one split, partial (max, sum, output) go to a float32 workspace and a second kernel combines them.
// Splits hold at most 4 blocks: a short visible prefix of a long cache still spreads over many CTAs.
// Runs on the current stream; the workspace comes from the caching allocator (CUDA-graph safe).
#include "fusekit.h"

#include <cmath>

namespace fusekit {
namespace {

constexpr int kWarps = 4;
constexpr int kBlockN = 64;     // keys per mask-skip block
constexpr int kMaxChunk = 256;   // keys per split at most (4 blocks; the scores live in shared memory)
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
  int finite_mask;   // 1: an additive mask, whose finite values can hide a whole row
  float scale_log2;  // scale * log2(e): scores live in log2 units (exp2f)
};


__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8], const __half*) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __half22float2(h[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8], const __nv_bfloat16*) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
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

// UNROLL key rows' 16-byte slices, issued back to back (key = first + u * step; past the cache: zeros).
template <int UNROLL, typename T>
__device__ __forceinline__ void load_rows(uint4 (&out)[UNROLL], const T* base, int64_t row_stride, int first,
                                          int step, int s) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int key = first + u * step;
    out[u] = key < s ? __ldg(reinterpret_cast<const uint4*>(base + key * row_stride)) : make_uint4(0, 0, 0, 0);
  }
}

template <int LPK>
__device__ __forceinline__ float sum_key_lanes(float x) {  // over the LPK lanes that share one key row
#pragma unroll
  for (int off = LPK / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

template <typename T, int D, int RT>
__global__ void __launch_bounds__(kWarps * 32) decode_attention_kernel(const Params p) {
  constexpr int LPK = D / 8;          // lanes per key row, 16 bytes each
  constexpr int KPW = 32 / LPK;       // key rows per warp per step
  constexpr int KPS = kWarps * KPW;   // key rows per CTA per step
  constexpr int STEPS = kBlockN / KPS;
  constexpr int UNROLL = STEPS < 8 ? STEPS : 8;  // 16-byte loads in flight per lane
  extern __shared__ float smem[];
  float* sc = smem;                  // [RT][chunk] scores, then probabilities
  float* so = smem + RT * p.chunk;   // [RT][D] the CTA's output sum
  __shared__ float s_m[RT], s_l[RT];
  __shared__ int64_t s_moff[RT];
  __shared__ int s_vis[kMaxChunk / kBlockN];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int kslot = lane / LPK, dsub = lane % LPK;
  const int z = blockIdx.x % p.zchunks;
  const int bh = blockIdx.x / p.zchunks;
  const int b = bh / p.hkv, kvh = bh % p.hkv;
  const int split = blockIdx.y;
  const int key_begin = split * p.chunk;
  const int nblocks = (min(p.chunk, p.s - key_begin) + kBlockN - 1) / kBlockN;
  const int r0 = z * RT;
  const int nr = min(RT, p.rows - r0);

  if (tid < RT) {
    const int r = r0 + min(tid, nr - 1);
    s_moff[tid] = b * p.ms0 + (kvh * p.group + r / p.lq) * p.ms1 + (r % p.lq) * p.ms2;
  }
  if (tid < kMaxChunk / kBlockN) s_vis[tid] = 0;
  __syncthreads();

  // ---- the split's whole mask first, its loads in flight together (and with q's): a block no row can see
  // is never read, and a split with no visible key ends here (most CTAs of a long cache early in decoding) ----
  constexpr int MPT = RT * kMaxChunk / (kWarps * 32);  // mask values per thread, at most
  const int keys = nblocks * kBlockN;
  float mv[MPT];
#pragma unroll
  for (int n = 0; n < MPT; ++n) {
    const int i = tid + n * kWarps * 32, r = i / keys, key = key_begin + i % keys;
    mv[n] = -INFINITY;
    if (i < RT * keys && r < nr && key < p.s) mv[n] = p.mask_kind == kNoMask ? 0.f : mask_at<T>(p, s_moff[r] + key * p.ms3);
  }
  float qr[RT][8];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const int rr = r0 + min(r, nr - 1);
    const T* qp = static_cast<const T*>(p.q) + b * p.qs0 + (kvh * p.group + rr / p.lq) * p.qs1 +
                  (rr % p.lq) * p.qs2 + dsub * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) qr[r][e] = r < nr ? to_float(qp[e]) * p.scale_log2 : 0.f;
  }
#pragma unroll
  for (int n = 0; n < MPT; ++n) {
    const int i = tid + n * kWarps * 32;
    if (i < RT * keys) {
      sc[(i / keys) * p.chunk + i % keys] = mv[n];
      if (!(mv[n] <= kHiddenLog2)) s_vis[(i % keys) / kBlockN] = 1;  // a NaN counts as visible, as in the reference
    }
  }
  __syncthreads();
  bool any_vis = false;
  for (int blk = 0; blk < nblocks; ++blk) any_vis |= s_vis[blk] != 0;
  if (!any_vis && p.splits > 1) {  // (max, sum) = (-inf, 0): the combine reads no output of this split
    for (int r = tid; r < nr; r += kWarps * 32) {
      const int rr = r0 + r;
      const int64_t row = (static_cast<int64_t>(b) * p.hq + kvh * p.group + rr / p.lq) * p.lq + rr % p.lq;
      p.part_ml[split * p.rows_total + row] = make_float2(-INFINITY, 0.f);
    }
    return;
  }
#pragma unroll
  for (int n = 0; n < MPT; ++n) {  // finite hidden values must not enter the softmax without their scores
    const int i = tid + n * kWarps * 32;
    if (i < RT * keys && !s_vis[(i % keys) / kBlockN]) sc[(i / keys) * p.chunk + i % keys] = -INFINITY;
  }

  const T* kbase = static_cast<const T*>(p.k) + b * p.ks0 + kvh * p.ks1 + dsub * 8;
  const T* vbase = static_cast<const T*>(p.v) + b * p.vs0 + kvh * p.vs1 + dsub * 8;

  // ---- scores of the visible blocks ----
  for (int blk = 0; blk < nblocks; ++blk) {
    if (!s_vis[blk]) continue;
    const int k0 = key_begin + blk * kBlockN;
#pragma unroll
    for (int st0 = 0; st0 < STEPS; st0 += UNROLL) {
      uint4 kv[UNROLL];
      load_rows(kv, kbase, p.ks2, k0 + st0 * KPS + warp * KPW + kslot, KPS, p.s);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int j = (st0 + u) * KPS + warp * KPW + kslot;
        float f[8];
        unpack8(kv[u], f, static_cast<const T*>(nullptr));
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d = fmaf(qr[r][e], f[e], d);
          d = sum_key_lanes<LPK>(d);
          if (dsub == 0 && r < nr && k0 + j < p.s) sc[r * p.chunk + blk * kBlockN + j] += d;
        }
      }
    }
  }
  __syncthreads();

  // ---- softmax numerators over this split: one warp per row ----
  for (int r = warp; r < RT; r += kWarps) {
    float m = -INFINITY;
    for (int j = lane; j < keys; j += 32) m = fmaxf(m, sc[r * p.chunk + j]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.f;
    for (int j = lane; j < keys; j += 32) {
      const float e = m == -INFINITY ? 0.f : exp2f(sc[r * p.chunk + j] - m);
      sc[r * p.chunk + j] = e;
      l += e;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) {
      s_m[r] = m;
      s_l[r] = l;
    }
  }
  for (int i = tid; i < RT * D; i += kWarps * 32) so[i] = 0.f;
  __syncthreads();

  // ---- probabilities @ V over the visible blocks ----
  float o[RT][8];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.f;
  for (int blk = 0; blk < nblocks; ++blk) {
    if (!s_vis[blk]) continue;
    const int k0 = key_begin + blk * kBlockN;
#pragma unroll
    for (int st0 = 0; st0 < STEPS; st0 += UNROLL) {
      uint4 vv[UNROLL];
      load_rows(vv, vbase, p.vs2, k0 + st0 * KPS + warp * KPW + kslot, KPS, p.s);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int j = blk * kBlockN + (st0 + u) * KPS + warp * KPW + kslot;
        float f[8];
        unpack8(vv[u], f, static_cast<const T*>(nullptr));
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const float pr = sc[r * p.chunk + j];
#pragma unroll
          for (int e = 0; e < 8; ++e) o[r][e] = fmaf(pr, f[e], o[r][e]);
        }
      }
    }
  }
  // the key slots of a warp, then the warps in turn (a fixed order: deterministic sums)
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int off = LPK; off < 32; off <<= 1) o[r][e] += __shfl_xor_sync(0xffffffffu, o[r][e], off);
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w && kslot == 0) {
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) so[r * D + dsub * 8 + e] += o[r][e];
    }
    __syncthreads();
  }

  for (int i = tid; i < nr * D; i += kWarps * 32) {
    const int r = i / D, d = i % D, rr = r0 + r;
    const int h = kvh * p.group + rr / p.lq, qi = rr % p.lq;
    const int64_t row = (static_cast<int64_t>(b) * p.hq + h) * p.lq + qi;
    if (p.splits == 1) {
      const float l = s_l[r];
      static_cast<T*>(p.out)[b * p.os0 + h * p.os1 + qi * p.os2 + d] = from_float<T>(l > 0.f ? so[i] / l : 0.f);
      if (p.hidden && d == 0) p.hidden[row] = !(s_m[r] > kHiddenLog2);
    } else {
      if (s_m[r] != -INFINITY) p.part_o[(split * p.rows_total + row) * D + d] = so[i];  // else never read
      if (d == 0) p.part_ml[split * p.rows_total + row] = make_float2(s_m[r], s_l[r]);
    }
  }
}

template <typename T, int D, int W>
__device__ void recompute_row(const Params& p, int64_t row);

// One block of D threads per output row: rescale each split's partial sums to the common max (a row no key
// shows above -60000 under a finite mask is computed again here, see recompute_row). The splits'
// (max, sum) are read in parallel, one per thread, and their weights shared; the partial outputs are then read
// 16 splits at a time (independent loads: a long cache's many splits cost a few memory latencies, not one each).
template <typename T, int D>
__global__ void __launch_bounds__(D) combine_splits(const Params p) {
  constexpr int kUnroll = 16;
  __shared__ float s_red[D / 32], s_w[D], s_l[D];
  __shared__ int s_ok[D];
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x;
  const float2* ml = p.part_ml + row;  // split s at ml[s * rows_total]
  float mx = -INFINITY;
  for (int s = t; s < p.splits; s += D) mx = fmaxf(mx, ml[s * p.rows_total].x);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (t % 32 == 0) s_red[t / 32] = mx;
  __syncthreads();
  mx = s_red[0];
#pragma unroll
  for (int w = 1; w < D / 32; ++w) mx = fmaxf(mx, s_red[w]);
  if (p.finite_mask && !(mx > kHiddenLog2)) {  // mx is the CTA's: every thread takes this branch
    recompute_row<T, D, D / 32>(p, row);
    return;
  }
  float l = 0.f, acc = 0.f;
  for (int base = 0; base < p.splits; base += D) {
    const int n = min(D, p.splits - base);
    __syncthreads();  // the previous tile's weights are read
    if (t < n) {
      const float2 x = ml[(base + t) * p.rows_total];
      const bool ok = x.x != -INFINITY;  // a split that saw nothing wrote no partial output
      const float w = ok ? exp2f(x.x - mx) : 0.f;
      s_ok[t] = ok, s_w[t] = w, s_l[t] = ok ? x.y * w : 0.f;
    }
    __syncthreads();
    const float* po = p.part_o + (base * p.rows_total + row) * D + t;
    for (int j0 = 0; j0 < n; j0 += kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = j0 + u < n && s_ok[j0 + u] ? po[(j0 + u) * p.rows_total * D] : 0.f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // split order, as one loop would: deterministic sums
        if (j0 + u < n && s_ok[j0 + u]) {
          l += s_l[j0 + u];
          acc = fmaf(v[u], s_w[j0 + u], acc);
        }
      }
    }
  }
  const int64_t qi = row % p.lq, h = (row / p.lq) % p.hq, b = row / (static_cast<int64_t>(p.lq) * p.hq);
  static_cast<T*>(p.out)[b * p.os0 + h * p.os1 + qi * p.os2 + t] = from_float<T>(l > 0.f ? acc / l : 0.f);
}

// A row with no key above -60000 under a finite additive mask: the replaced attention weighs every key by
// exp(score + mask), so this row is computed again over all of them, without skipping (rare: a padded
// query row), by the W warps of the calling CTA. A row hidden by -inf everywhere gives 0.
template <typename T, int D, int W>
__device__ void recompute_row(const Params& p, int64_t row) {
  constexpr int E = D / 32;  // elements per lane
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t qi = row % p.lq, h = (row / p.lq) % p.hq, b = row / (static_cast<int64_t>(p.lq) * p.hq);
  const int64_t kvh = h / (p.hq / p.hkv);
  const T* qp = static_cast<const T*>(p.q) + b * p.qs0 + h * p.qs1 + qi * p.qs2 + lane * E;
  const T* kp = static_cast<const T*>(p.k) + b * p.ks0 + kvh * p.ks1 + lane * E;
  const T* vp = static_cast<const T*>(p.v) + b * p.vs0 + kvh * p.vs1 + lane * E;
  const int64_t moff = b * p.ms0 + h * p.ms1 + qi * p.ms2;
  float qr[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) qr[e] = to_float(qp[e]) * p.scale_log2, acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int j = warp; j < p.s; j += W) {  // online softmax over this warp's keys
    float sc = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) sc = fmaf(qr[e], to_float(kp[j * p.ks2 + e]), sc);
    sc = sum_key_lanes<32>(sc) + mask_at<T>(p, moff + j * p.ms3);
    if (sc == -INFINITY) continue;
    const float mn = fmaxf(m, sc), c = exp2f(m - mn), w = exp2f(sc - mn);
    l = l * c + w;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = acc[e] * c + w * to_float(vp[j * p.vs2 + e]);
    m = mn;
  }
  __shared__ float s_m[W], s_l[W], s_acc[W][D];
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

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& mask) {
  check_cache_qkv(q, k, v, "decode_attention");
  TORCH_CHECK(q.size(2) > 0 && k.size(2) > 0, "fusekit: decode_attention needs a query and a key; got ",
              describe(q), ", ", describe(k));
  const int64_t d = q.size(3);
  TORCH_CHECK(d == 64 || d == 128 || d == 256, "fusekit: decode_attention: head dim must be 64, 128 or 256; got ",
              describe(q));
  TORCH_CHECK(aligned16(k) && aligned16(v), "fusekit: decode_attention: k and v rows must be 16-byte aligned "
              "(strides and offset multiples of 8 elements)");
  TORCH_CHECK(k.size(2) <= (int64_t{1} << 30) && q.size(1) * q.size(2) <= (int64_t{1} << 20),
              "fusekit: decode_attention: sizes too large: ", describe(q), ", ", describe(k));
  if (mask) {
    check_attention_mask(*mask, q, {q.size(0), q.size(1), q.size(2), k.size(2)}, "decode_attention", "[B,Hq,Lq,S]",
                         /*float32_ok=*/true);
  }
}

template <typename T, int D, int RT>
void launch(Params& p, int64_t blocks_x, const at::Tensor& q) {
  const size_t smem = (static_cast<size_t>(RT) * p.chunk + RT * D) * sizeof(float);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  decode_attention_kernel<T, D, RT><<<dim3(blocks_x, p.splits, 1), kWarps * 32, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (p.splits > 1) {
    combine_splits<T, D><<<p.rows_total, D, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (p.hidden) {  // one split: no combine to recompute the hidden rows in
    hidden_rows<T, D><<<p.rows_total, kWarps * 32, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <typename T, int D>
void launch_rows(Params& p, int64_t blocks_x, int rt, const at::Tensor& q) {
  if (rt == 1) return launch<T, D, 1>(p, blocks_x, q);
  launch<T, D, 4>(p, blocks_x, q);
}

at::Tensor decode_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::optional<at::Tensor>& mask, double scale) {
  check_inputs(q, k, v, mask);
  c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty_like(q);  // the fake's layout
  const int64_t B = q.size(0), hq = q.size(1), lq = q.size(2), d = q.size(3), hkv = k.size(1), S = k.size(2);
  if (B == 0) return out;
  const int group = static_cast<int>(hq / hkv), rows = static_cast<int>(group * lq);
  // Rows per CTA: 1 or 4. A larger group takes several CTAs, each reading the KV blocks (the later ones mostly
  // from L2): with 8 rows per CTA, Qwen2-style's 6-row groups ran slower at every batch (H100, the op alone:
  // b1 21.1 -> 15.4 us, b32 @1024 45.7 -> 36.6 us with 4; benchmarks/NOTES.md), twice the registers and
  // half the CTAs.
  const int rt = rows <= 1 ? 1 : 4;
  const int zchunks = (rows + rt - 1) / rt;
  const int64_t blocks_x = B * hkv * zchunks;
  TORCH_CHECK(blocks_x < (int64_t{1} << 31), "fusekit: decode_attention: batch x heads too large: ", describe(q));

  // Splits: enough CTAs for ~8 per SM, at most kMaxChunk keys each (so that the CTAs a short visible prefix
  // keeps busy still fill the GPU; the others only read their mask), whole 64-key blocks.
  const int nb = static_cast<int>((S + kBlockN - 1) / kBlockN);
  const int64_t target = 8 * static_cast<int64_t>(sm_count());
  int splits = static_cast<int>(std::min<int64_t>(std::max<int64_t>((target + blocks_x - 1) / blocks_x, 1), nb));
  splits = std::max(splits, (nb + kMaxChunk / kBlockN - 1) / (kMaxChunk / kBlockN));
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
  p.scale_log2 = static_cast<float>(scale) * kLog2e;
  at::Tensor part_o, part_ml, hidden;
  p.finite_mask = p.mask_kind == kSameMask || p.mask_kind == kFloatMask;  // finite values can hide a row
  if (p.finite_mask && splits == 1) {
    hidden = at::empty({p.rows_total}, q.options().dtype(at::kInt));
    p.hidden = hidden.data_ptr<int>();
  }
  if (splits > 1) {
    part_o = at::empty({splits, p.rows_total, d}, q.options().dtype(at::kFloat));
    part_ml = at::empty({splits, p.rows_total, 2}, q.options().dtype(at::kFloat));
    p.part_o = part_o.data_ptr<float>();
    p.part_ml = reinterpret_cast<float2*>(part_ml.data_ptr<float>());
  }
  const auto dispatch = [&](auto tag) {
    using T = decltype(tag);
    if (d == 64) return launch_rows<T, 64>(p, blocks_x, rt, q);
    if (d == 128) return launch_rows<T, 128>(p, blocks_x, rt, q);
    return launch_rows<T, 256>(p, blocks_x, rt, q);
  };
  dispatch_half_bf16(q.scalar_type(), dispatch);
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_attention", &fusekit::decode_attention_cuda); }
