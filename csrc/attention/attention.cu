// fusekit::attention -- softmax(q @ k^T * scale + mask) @ v in one fused attention kernel, replacing
// the math decomposition Inductor emits (fp32 upcast, two FFMA bmms, a separate softmax, casts).
//
//   def attention_ref(q, k, v, mask=None, scale=0.125, safe=True):
//       if safe:  # SDPA's math backend: fully masked rows give 0 (_safe_softmax)
//           with sdpa_kernel(SDPBackend.MATH):
//               return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
//       s = torch.matmul(q, k.transpose(-1, -2)) * scale
//       if mask is not None:
//           s = s + mask
//       return torch.matmul(torch.softmax(s, dim=-1), v)      # fully masked rows give NaN
//
// Contract: q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,D] on one CUDA device, one dtype in {float16, bfloat16},
// D % 8 == 0 and D <= 256, unit last-dim stride (any other strides). mask: none, bool (True = attend) or
// q's dtype (additive), broadcastable to [B,H,Sq,Sk]. Returns [B,H,Sq,D] in q's layout (empty_like(q)).
//
// The kernel is PyTorch's own fused SDPA (cuDNN, flash or memory-efficient, as its dispatcher picks for
// these inputs; fp32 accumulation, no [Sq,Sk] matrix in HBM). A bool mask becomes an additive 0/-inf
// mask first: with -inf rows those kernels return 0 like the math backend, which the GPU tests check. A
// mask whose rows are not 16-byte aligned is copied into aligned rows first (see aligned_rows).
// Runs on the current stream; allocates only through the caching allocator (CUDA-graph safe).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "attention_checks.h"  // check_attention_mask
#include "checks.h"            // FK_CHECK_CUDA, describe

namespace fusekit {
namespace {

// safe=False: a row whose additive mask is all -inf is NaN in a plain softmax. One warp per output row
// scans that row's mask and writes NaN over the row only when it is dead (no read of `out`).
template <typename T>
__global__ void nan_dead_rows(T* __restrict__ out, int64_t so0, int64_t so1, int64_t so2,
                              const T* __restrict__ bias, int64_t sb0, int64_t sb1, int64_t sb2, int64_t sb3,
                              int64_t heads, int64_t sq, int64_t sk, int64_t d, int64_t rows) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows) return;
  const int64_t b = warp / (heads * sq), h = (warp / sq) % heads, i = warp % sq;
  const T* row = bias + b * sb0 + h * sb1 + i * sb2;
  bool alive = false;
  for (int64_t j = lane; j < sk && !alive; j += 32) {
    const float x = static_cast<float>(row[j * sb3]);
    alive = !(isinf(x) && x < 0.f);
  }
  if (__any_sync(0xffffffffu, alive)) return;
  T* o = out + b * so0 + h * so1 + i * so2;
  for (int64_t j = lane; j < d; j += 32) o[j] = static_cast<T>(__int_as_float(0x7fc00000));
}

void nan_fill_dead_rows(at::Tensor& out, const at::Tensor& bias, int64_t sk) {
  const at::Tensor m = bias.expand({out.size(0), out.size(1), out.size(2), sk});
  const int64_t rows = out.size(0) * out.size(1) * out.size(2);
  if (rows == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "nan_dead_rows", [&] {
    nan_dead_rows<scalar_t><<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        out.data_ptr<scalar_t>(), out.stride(0), out.stride(1), out.stride(2), m.data_ptr<scalar_t>(),
        m.stride(0), m.stride(1), m.stride(2), m.stride(3), out.size(1), out.size(2), sk, out.size(3), rows);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& mask) {
  FK_CHECK_CUDA(q);
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "fusekit: attention takes float16 or bfloat16, got q ", describe(q));
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "fusekit: attention: q, k, v must be 4-D [B, H, S, D]; got ", describe(q), ", ", describe(k),
              ", ", describe(v));
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  k.device() == q.device() && v.device() == q.device(),
              "fusekit: attention: q, k, v must share dtype and device; got ", describe(q), ", ",
              describe(k), ", ", describe(v));
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                  v.size(1) == q.size(1) && v.size(2) == k.size(2) && k.size(3) == q.size(3) &&
                  v.size(3) == q.size(3),
              "fusekit: attention: want q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,D]; got ", describe(q), ", ",
              describe(k), ", ", describe(v));
  TORCH_CHECK(q.size(2) > 0 && k.size(2) > 0, "fusekit: attention needs at least one query and one key; got ",
              describe(q), ", ", describe(k));
  const int64_t d = q.size(3);
  TORCH_CHECK(d > 0 && d % 8 == 0 && d <= 256, "fusekit: attention: head dim must be a multiple of 8 in "
              "[8, 256]; got ", describe(q));
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "fusekit: attention: q, k, v need a unit last-dim stride");
  if (mask) {
    check_attention_mask(*mask, q, {q.size(0), q.size(1), q.size(2), k.size(2)}, "attention", "[B,H,Sq,Sk]",
                         /*float32_ok=*/false);
  }
}

// cuDNN's fused attention takes a mask whose rows are not 16-byte aligned (e.g. 197 keys) on a path 1.7x
// slower (H200, [32,12,197,64]: 0.070 ms against 0.042 ms). Copying the small mask into rows padded to a
// multiple of 8 elements costs ~5 us and takes the fast path; the padding is never read.
at::Tensor aligned_rows(const at::Tensor& bias) {
  bool ok = bias.stride(-1) == 1 && reinterpret_cast<uintptr_t>(bias.data_ptr()) % 16 == 0;
  for (int64_t i = 0; ok && i + 1 < bias.dim(); ++i) {
    ok = bias.size(i) == 1 || bias.stride(i) % 8 == 0;
  }
  if (ok) return bias;
  std::vector<int64_t> padded(bias.sizes().begin(), bias.sizes().end());
  const int64_t sk = padded.back();
  padded.back() = (sk + 7) / 8 * 8;
  at::Tensor view = at::empty(padded, bias.options()).narrow(-1, 0, sk);
  view.copy_(bias);
  return view;
}

// bool mask (True = attend) -> additive 0 / -inf in q's dtype, written straight into aligned rows: one launch
// instead of a fill, a where and an aligning copy.
template <typename T>
__global__ void bool_to_bias(T* __restrict__ out, int64_t row_pitch, const bool* __restrict__ mask, int64_t s0,
                             int64_t s1, int64_t s2, int64_t s3, int64_t d1, int64_t d2, int64_t d3, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t c = i % d3, r = i / d3;
  const int64_t b2 = r % d2, b1 = (r / d2) % d1, b0 = r / (d2 * d1);
  const bool keep = mask[b0 * s0 + b1 * s1 + b2 * s2 + c * s3];
  out[r * row_pitch + c] = keep ? static_cast<T>(0.f) : static_cast<T>(-INFINITY);
}

at::Tensor bool_mask_to_bias(const at::Tensor& mask, const at::TensorOptions& opts) {
  at::Tensor m4 = mask;
  while (m4.dim() < 4) m4 = m4.unsqueeze(0);
  const std::vector<int64_t> sizes(m4.sizes().begin(), m4.sizes().end());
  std::vector<int64_t> padded = sizes;
  padded[3] = (sizes[3] + 7) / 8 * 8;
  at::Tensor buf = at::empty(padded, opts);
  const int64_t n = m4.numel();
  if (n > 0) {
    constexpr int kThreads = 256;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, buf.scalar_type(), "bool_to_bias", [&] {
      bool_to_bias<scalar_t><<<(n + kThreads - 1) / kThreads, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          buf.data_ptr<scalar_t>(), padded[3], m4.data_ptr<bool>(), m4.stride(0), m4.stride(1), m4.stride(2),
          m4.stride(3), sizes[1], sizes[2], sizes[3], n);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  at::Tensor out = buf.narrow(-1, 0, sizes[3]);
  while (out.dim() > mask.dim()) out = out.squeeze(0);
  return out;
}

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, double scale, bool safe) {
  check_inputs(q, k, v, mask);
  c10::cuda::CUDAGuard guard(q.device());
  std::optional<at::Tensor> bias;
  if (mask) {
    at::Tensor m4 = *mask;  // SDPA's fused paths index mask dims -2.. : give them [.., .., Sq|1, Sk]
    while (m4.dim() < 4) m4 = m4.unsqueeze(0);
    bias = m4.scalar_type() == at::kBool ? bool_mask_to_bias(m4, q.options()) : aligned_rows(m4);
  }
  at::Tensor out = at::scaled_dot_product_attention(q, k, v, bias, /*dropout_p=*/0.0, /*is_causal=*/false,
                                                    scale);
  if (bias && !safe) {  // a plain softmax over an all -inf row is NaN
    nan_fill_dead_rows(out, *bias, k.size(2));
  }
  if (q.is_non_overlapping_and_dense() && out.strides() == q.strides()) {
    return out;
  }
  at::Tensor like_q = at::empty_like(q);  // the fake's layout
  like_q.copy_(out);
  return like_q;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("attention", &fusekit::attention_cuda); }
