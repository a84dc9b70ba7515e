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
// mask first: with -inf rows those kernels return 0 like the math backend, which the GPU tests check.
// Runs on the current stream; allocates only through the caching allocator (CUDA-graph safe).
#include "fusekit.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <limits>

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
    const at::Tensor& m = *mask;
    TORCH_CHECK(m.device() == q.device(), "fusekit: attention: mask on another device: ", describe(m));
    TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == q.scalar_type(),
                "fusekit: attention: mask must be bool or q's dtype; got ", describe(m));
    const int64_t full[4] = {q.size(0), q.size(1), q.size(2), k.size(2)};
    bool ok = m.dim() <= 4;
    for (int64_t i = 1; ok && i <= m.dim(); ++i) {
      ok = m.size(-i) == 1 || m.size(-i) == full[4 - i];
    }
    TORCH_CHECK(ok, "fusekit: attention: mask ", describe(m), " does not broadcast to [B,H,Sq,Sk]");
  }
}

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, double scale, bool safe) {
  check_inputs(q, k, v, mask);
  c10::cuda::CUDAGuard guard(q.device());
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::optional<at::Tensor> bias;
  if (mask) {
    // a 0-dim zeros() is a device fill, not a host copy: no sync, CUDA-graph safe
    bias = mask->scalar_type() == at::kBool ? at::where(*mask, at::zeros({}, q.options()), kNegInf) : *mask;
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
