// fusekit::decode_linear -- the linears of a decode step: a few rows of activations against a weight
// matrix that is read once, straight from HBM, by as many thread blocks as fill the GPU.
//
//   def decode_linear_ref(x, w, w2=None, act="none", b=None, r=None):
//       return _act(x, w, w2, act, b) + (0 if r is None else r)  # r: a residual shaped as the output
//
//   def _act(x, w, w2, act, b):
//       y = F.linear(x, w, b)                                    # x [..., K], w [N, K], b None or [N]
//       if act == "silu_mul_halves":                             # w [2N, K]: gate rows, then up rows
//           gate, up = y.chunk(2, dim=-1)
//           return F.silu(gate) * up
//       if act == "gelu_tanh_mul":                               # GeGLU's gate and up
//           return F.gelu(y, approximate="tanh") * F.linear(x, w2)
//       if act in ("gelu", "gelu_tanh"):                         # an MLP's up projection (GPT-NeoX, Phi-2)
//           return F.gelu(y, approximate="tanh" if act == "gelu_tanh" else "none")
//       return y if act == "none" else F.silu(y) * F.linear(x, w2)   # "silu_mul": SwiGLU's gate and up
//
// Contract: x [..., K] contiguous, w (and w2) [N, K] contiguous, b (acts none, gelu, gelu_tanh only) a contiguous
// [N], one CUDA device, one dtype in {float16, bfloat16}, K and N multiples of 8 (silu_mul_halves: N / 2), 16-byte
// aligned x and weights. Any number of rows M (the product of x's leading dims); the kernel is built for few
// (decode: M = batch x new tokens). Returns [..., N] contiguous, x's dtype.
// Float32 accumulation; the bias is added in float32 and the sum rounded once (addmm), GELU applied to that rounded
// value; the gated acts round the two products, act(gate) and the result to x's dtype, as eager; a residual r (a
// contiguous tensor of the output's shape and x's dtype) is added to that rounded result and rounded again.
//
// The kernel, why it is shaped so and what it measured: decode_linear.cuh; the host side: decode_linear_ops.cuh.
#include <torch/library.h>

#include "decode_linear_ops.cuh"

namespace fusekit {
namespace {

at::Tensor decode_linear_cuda(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& w2,
                              c10::string_view act, const std::optional<at::Tensor>& b,
                              const std::optional<at::Tensor>& r) {
  return decode_gemm::linear_op<false>("decode_linear", x, w, w2, act, b, r);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear", &fusekit::decode_linear_cuda); }
