// fusekit::decode_attention_softcap -- decode_attention with Gemma-2's logit soft-capping: the same kernels
// (decode_attention.cu), the cap applied to each score in their softmax pass.
//
//   def decode_attention_softcap_ref(q, k, v, mask, scale, softcap):   # transformers' eager attention, eval
//       w = torch.tanh(q @ repeat_kv(k, n).transpose(2, 3) * scale / softcap) * softcap
//       return torch.softmax(w + mask, -1, dtype=torch.float32).to(q.dtype) @ repeat_kv(v, n)
//
// Contract: decode_attention's (q [B,Hq,Lq,D], k and v [B,Hkv,S,D], fp16/bf16, the same head dims, strides and
// masks), softcap positive and finite. Scores, cap and softmax in float32.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <string>

#include "decode/decode_attention.h"

namespace fusekit {
namespace {

at::Tensor decode_attention_softcap_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const std::optional<at::Tensor>& mask, double scale, double softcap) {
  // the message as a string: a double streamed into TORCH_CHECK from nvcc-compiled code crashes the process (H100,
  // torch 2.11), as an IntArrayRef or a Device does (checks.h)
  TORCH_CHECK(softcap > 0 && std::isfinite(softcap), "fusekit: decode_attention_softcap: softcap must be positive and "
              "finite; got " + std::to_string(softcap));
  return decode_attention_run(q, k, v, mask, scale, softcap);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_attention_softcap", &fusekit::decode_attention_softcap_cuda); }
