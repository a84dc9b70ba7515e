// fusekit::decode_linear -- the linears of a decode step: a few rows of activations against a weight
// matrix that is read once, straight from HBM, by as many thread blocks as fill the GPU.
//
//   def decode_linear_ref(x, w, w2=None, act="none"):
//       y = F.linear(x, w)                                       # x [..., K], w [N, K]
//       return y if act == "none" else F.silu(y) * F.linear(x, w2)   # "silu_mul": SwiGLU's gate and up
//
// Contract: x [..., K] contiguous, w (and w2) [N, K] contiguous, one CUDA device, one dtype in {float16,
// bfloat16}, K and N multiples of 8, 16-byte aligned data. Any number of rows M (the product of x's leading
// dims); the kernel is built for few (decode: M = batch x new tokens). Returns [..., N] contiguous, x's dtype.
// Float32 accumulation; "silu_mul" rounds the two products, silu(gate) and the result to x's dtype, as eager.
//
// Why: at M <= 8 a linear is a pass over its weight, and cuBLAS's small-M kernels leave HBM bandwidth unused
// (H100: 2 MB k/v projections at 13%; benchmarks/NOTES.md); SwiGLU's gate and up then take two such passes
// plus an elementwise kernel. Here a CTA of 8 warps owns 8 output columns of every weight and 16*MT rows
// (gridDim.y covers more rows), and all of K: its warps take the 32-wide chunks in turn (neighbouring warps,
// neighbouring chunks) and issue every load of U chunks before any product, so a lane's weight and activation
// loads are in flight together; the warps' partial sums are added in shared memory. Tensor cores (mma.sync
// m16n8k16) do the products: each lane loads 8 consecutive k of one weight row and of its activation rows,
// and both operands take the same permutation of k inside a chunk (see mma_chunk), so no shuffle or
// shared-memory staging is needed. Weights are streamed past L1 (no_allocate); x, read by every column
// tile, stays in L1/L2. Runs on the current stream, no workspace.
//
// Measured on an H100 (benchmarks/results/h100_decode_gemm.md): faster than cuBLAS + Inductor's silu-mul for
// gate/up at 1-8 rows (1.04-1.13x); slower than cuBLAS for every plain linear (0.43-0.98x), so that rule is
// off by default. More columns per CTA (16-64) and K split over a thread-block cluster (2-8 CTAs, DSMEM
// reduction) were slower at the decode shapes (the cluster split won only k/v at 1-8 rows, by up to 1.09x),
// and were taken out.
#include "fusekit.h"


namespace fusekit {
namespace {

constexpr int kWarps = 8;
constexpr int kChunk = 32;  // k per lane group per step: 4 lanes x 8 elements

// Both loads are volatile asm, as the products are, and unconditional (a lane past the edge reads the tensor's
// first 16 bytes and drops them): straight-line code keeps them in program order, all issued before the first
// product. (As __ldg behind branches, ptxas held fewer registers than one round of loads needs.)
__device__ __forceinline__ uint4 load_stream(const void* p) {  // a weight: read once, keep it out of L1
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ uint4 load_cached(const void* p) {  // an activation: every column tile reads it
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

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

// One 32-wide k chunk of a 16x8 tile. Lane (g = lane/4, t = lane%4) holds k [8t, 8t+8) of activation rows g and
// g+8 (lo, hi) and of weight row g (w), as 4 words of 2 elements. m16n8k16 wants, per lane, k {2t, 2t+1, 2t+8,
// 2t+9} of a 16-wide slice; giving the first mma words 0-1 and the second words 2-3 maps each of the 32 k
// to one slot of one mma, identically for both operands, so the dot products are the chunk's.
template <typename T>
__device__ __forceinline__ void mma_chunk(float (&c)[4], const uint4& lo, const uint4& hi, const uint4& w) {
  mma16816<T>(c, lo.x, hi.x, lo.y, hi.y, w.x, w.y);
  mma16816<T>(c, lo.z, hi.z, lo.w, hi.w, w.z, w.w);
}

template <typename T>
__device__ __forceinline__ float round_to(float x) { return to_float(from_float<T>(x)); }

struct Params {
  const void* x;
  const void* w[2];  // w, w2 (NW = 2: silu(x w^T) * (x w2^T))
  void* out;
  int m, n, k;
};

// CTA: 8 warps, 8 columns (blockIdx.x) of each of NW weights, 16*MT rows (blockIdx.y), all of K.
template <typename T, int MT, int NW>
__global__ void __launch_bounds__(kWarps * 32) decode_linear_kernel(const Params p) {
  constexpr int U = MT * NW <= 2 ? 4 : 2;       // chunks in flight per lane: fewer loads per chunk, more chunks
  constexpr int F = MT * 4;                     // accumulators per lane and weight
  extern __shared__ float red[];                // [kWarps][NW][F][32]: the warps' partial sums
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * 8, m0 = blockIdx.y * 16 * MT;
  const int chunks = (p.k + kChunk - 1) / kChunk;
  const T* x = static_cast<const T*>(p.x);

  float acc[NW][MT][4];
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[w][i][c] = 0.f;

  for (int c0 = warp; c0 < chunks; c0 += kWarps * U) {
    uint4 a[U][MT][2], b[U][NW];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of U chunks first, then their products
      const int kk = (c0 + u * kWarps) * kChunk + t * 8;
      const bool kin = kk < p.k;  // K % 8 == 0: a lane's 8 elements all in or all out
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + i * 16 + h * 8 + g;
          const bool ok = kin && row < p.m;
          a[u][i][h] = load_cached(ok ? x + static_cast<int64_t>(row) * p.k + kk : x);
          if (!ok) a[u][i][h] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        const int col = n0 + g;
        const bool ok = kin && col < p.n;
        const T* wp = static_cast<const T*>(p.w[w]);
        b[u][w] = load_stream(ok ? wp + static_cast<int64_t>(col) * p.k + kk : wp);
        if (!ok) b[u][w] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int i = 0; i < MT; ++i) mma_chunk<T>(acc[w][i], a[u][i][0], a[u][i][1], b[u][w]);
  }

  // the warps' sums, in warp order (deterministic), then the epilogue; C fragment: c0,c1 row g, c2,c3 row g+8,
  // columns 2t, 2t+1
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[((warp * NW + w) * F + i * 4 + c) * 32 + lane] = acc[w][i][c];
  __syncthreads();
  T* out = static_cast<T*>(p.out);
  for (int e = threadIdx.x; e < F * 32; e += kWarps * 32) {
    const int l = e % 32, f = e / 32, c = f % 4, i = f / 4;
    const int row = m0 + i * 16 + (l / 4) + (c / 2) * 8, col = n0 + (l % 4) * 2 + c % 2;
    float s[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      s[w] = 0.f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) s[w] += red[((v * NW + w) * F + f) * 32 + l];
    }
    if (row < p.m && col < p.n) {
      float y = s[0];
      if constexpr (NW == 2) y = round_to<T>(fast_silu(round_to<T>(s[0]))) * round_to<T>(s[1]);
      out[static_cast<int64_t>(row) * p.n + col] = from_float<T>(y);
    }
  }
}

template <typename T, int MT, int NW>
void launch(const Params& p, cudaStream_t stream) {
  const dim3 grid((p.n + 7) / 8, (p.m + 16 * MT - 1) / (16 * MT));
  const size_t smem = sizeof(float) * kWarps * NW * MT * 4 * 32;  // <= 32 KB
  decode_linear_kernel<T, MT, NW><<<grid, kWarps * 32, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int NW>
void launch_rows(const Params& p, cudaStream_t stream) {
  if (p.m <= 16) return launch<T, 1, NW>(p, stream);
  if (p.m <= 32) return launch<T, 2, NW>(p, stream);
  launch<T, 4, NW>(p, stream);
}

void check_weight(const at::Tensor& x, const at::Tensor& w, const char* name) {
  TORCH_CHECK(w.dim() == 2 && w.size(1) == x.size(-1), "fusekit: decode_linear: ", name, " must be [N, K] with K = ",
              "x.shape[-1]; got x ", describe(x), ", ", name, " ", describe(w));
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && w.device() == x.device(), "fusekit: decode_linear: ", name,
              " must have x's dtype and device; got x ", describe(x), ", ", name, " ", describe(w));
  TORCH_CHECK(w.is_contiguous() && aligned16(w.data_ptr()), "fusekit: decode_linear: ", name,
              " must be contiguous and 16-byte aligned; got ", describe(w));
}

at::Tensor decode_linear_cuda(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& w2,
                              c10::string_view act) {
  FK_CHECK_CUDA(x);
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              "fusekit: decode_linear takes float16 or bfloat16, got x ", describe(x));
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && aligned16(x.data_ptr()),
              "fusekit: decode_linear: x must be contiguous and 16-byte aligned; got ", describe(x));
  TORCH_CHECK(act == "none" || act == "silu_mul", "fusekit: decode_linear: act must be 'none' or 'silu_mul', got '",
              std::string(act), "'");
  const bool gated = act == "silu_mul";
  TORCH_CHECK(gated == w2.has_value(), "fusekit: decode_linear: w2 is needed by act='silu_mul' and only by it");
  check_weight(x, w, "w");
  if (gated) {
    check_weight(x, *w2, "w2");
    TORCH_CHECK(w2->size(0) == w.size(0), "fusekit: decode_linear: w and w2 must have one shape; got ", describe(w),
                ", ", describe(*w2));
  }
  const int64_t K = x.size(-1), N = w.size(0);
  int64_t M = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);
  TORCH_CHECK(K % 8 == 0 && N % 8 == 0, "fusekit: decode_linear: K and N must be multiples of 8; got x ",
              describe(x), ", w ", describe(w));
  TORCH_CHECK(M <= 65535 * 16 && N < (int64_t{1} << 31) && K < (int64_t{1} << 31),
              "fusekit: decode_linear: sizes too large: x ", describe(x), ", w ", describe(w));
  c10::cuda::CUDAGuard guard(x.device());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor out = at::empty(shape, x.options());
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  Params p{};
  p.x = x.data_ptr(), p.w[0] = w.data_ptr(), p.w[1] = gated ? w2->data_ptr() : nullptr, p.out = out.data_ptr();
  p.m = static_cast<int>(M), p.n = static_cast<int>(N), p.k = static_cast<int>(K);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto dispatch = [&](auto tag) {
    using T = decltype(tag);
    if (gated) return launch_rows<T, 2>(p, stream);
    launch_rows<T, 1>(p, stream);
  };
  dispatch_half_bf16(x.scalar_type(), dispatch);
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear", &fusekit::decode_linear_cuda); }
