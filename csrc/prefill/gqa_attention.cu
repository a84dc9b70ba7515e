// fusekit::gqa_attention -- attention of many query rows (a prompt) with grouped KV heads, without the
// repeat_kv copy: PyTorch's cuDNN attention takes the KV heads as they are.
//
//   def gqa_attention_ref(q, k, v, mask=None, scale=0.125):   # decode_attention_ref
//       n = q.shape[1] // k.shape[1]
//       return F.scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), attn_mask=mask, scale=scale)
//
// Contract: q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with Hq % Hkv == 0, one CUDA device, one dtype in {float16,
// bfloat16}, unit last-dim strides; mask none, bool (True = attend) or q's dtype (additive), broadcastable to
// [B,Hq,Lq,S]. Returns [B,Hq,Lq,D] in q's layout (empty_like(q)). A row the mask hides entirely (-inf or False
// everywhere) gives 0, as PyTorch's SDPA kernels do.
//
// Why: Inductor runs transformers' repeat_kv as a copy of the whole cache (every slot, every query head)
// before its fused SDPA kernel. PyTorch's SDPA takes grouped heads (enable_gqa) in its cuDNN kernel, with a
// mask, where flash and memory-efficient refuse (H100, torch 2.11; a 512-token prompt against 4096 slots,
// 16/4 heads: Inductor's chain 222 us, cuDNN with grouped heads 108 us).
// How: PyTorch picks the kernel (at::_fused_sdp_choice with enable_gqa, so its own support checks apply);
// where that is not cuDNN (a backend switched off, a shape or layout cuDNN does not take), the op runs the
// replaced chain instead: the repeat, then PyTorch's SDPA. Either way on the current stream, allocations from
// the caching allocator (CUDA-graph safe).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/expand.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>

#include "attention_checks.h"  // check_cache_qkv, check_attention_mask

namespace fusekit {
namespace {

constexpr int64_t kCudnnBackend = 3;  // sdp::SDPBackend::cudnn_attention

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& mask) {
  check_cache_qkv(q, k, v, "gqa_attention");
  if (mask) {
    check_attention_mask(*mask, q, {q.size(0), q.size(1), q.size(2), k.size(2)}, "gqa_attention", "[B,Hq,Lq,S]",
                         /*float32_ok=*/false);
  }
}

at::Tensor repeat_kv(const at::Tensor& x, int64_t n) {  // [B,Hkv,S,D] -> [B,Hkv*n,S,D], as transformers does
  if (n == 1) return x;
  return x.unsqueeze(2).expand({x.size(0), x.size(1), n, x.size(2), x.size(3)}).reshape(
      {x.size(0), x.size(1) * n, x.size(2), x.size(3)});
}

at::Tensor gqa_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, double scale) {
  check_inputs(q, k, v, mask);
  c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty_like(q);
  if (q.numel() == 0) return out;
  std::optional<at::Tensor> bias;  // additive, q's dtype, 4-D
  at::Tensor hidden;               // [.., Lq, 1]: rows the mask hides entirely
  if (mask) {
    at::Tensor m = *mask;
    while (m.dim() < 4) m = m.unsqueeze(0);
    if (m.scalar_type() == at::kBool) {
      hidden = m.logical_not().all(-1, /*keepdim=*/true);
      m = at::zeros(m.sizes(), q.options()).masked_fill_(m.logical_not(), -INFINITY);
    } else {
      hidden = m.amax(-1, /*keepdim=*/true).eq(-INFINITY);
    }
    bias = m;
  }
  const int64_t n = q.size(1) / k.size(1);
  at::Tensor res;
  if (at::_fused_sdp_choice(q, k, v, bias, 0.0, false, scale, /*enable_gqa=*/true) == kCudnnBackend) {
    res = at::scaled_dot_product_attention(q, k, v, bias, 0.0, false, scale, /*enable_gqa=*/true);
  } else {  // the replaced chain
    res = at::scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), bias, 0.0, false, scale);
  }
  if (res.strides() == out.strides()) {  // q's layout, the fake's (cuDNN allocates its output so)
    out = res;
  } else {
    out.copy_(res);
  }
  if (hidden.defined()) out.masked_fill_(hidden, 0);
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("gqa_attention", &fusekit::gqa_attention_cuda); }
