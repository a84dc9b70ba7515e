// fusekit::decode_gate_up_fp8 -- an MLP's gate and up projections of a decode step as torchao's float8 dynamic
// per-row linears of one x, with SwiGLU's (or GeGLU's) product: both weights read in one launch, x quantized once.
//
//   def decode_gate_up_fp8_ref(x, wg, sg, wu, su, act):  # x [..., K] 16-bit, wg/wu [N, K] e4m3, sg/su [N, 1] fp32
//       gate, up = decode_linear_fp8_ref(x, wg, sg), decode_linear_fp8_ref(x, wu, su)
//       return (F.silu(gate) if act == "silu_mul" else F.gelu(gate, approximate="tanh")) * up
//
// Why: torchao quantizes x once per linear and Inductor keeps each (a Triton kernel and aten._scaled_mm), then the
// SiLU * up kernel: five launches and two [M, N] round trips. Here one launch; each CTA holds the same 8 columns of
// both weights, so the product is its epilogue (the gate and up rounded to x's dtype, act rounded, as eager).
//
// Contract: x [..., K] float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; wg and wu contiguous,
// 16-byte aligned float8_e4m3fn [N, K] of one N, each with its contiguous float32 [N] / [N, 1] scales; act
// "silu_mul" or "gelu_tanh_mul". Returns [..., N] of x's dtype.
#include <torch/library.h>

#include <string>

#include "decode_gemm/decode_linear_fp8.cuh"

namespace fusekit {
namespace {

at::Tensor decode_gate_up_fp8_cuda(const at::Tensor& x, const at::Tensor& wg, const at::Tensor& sg,
                                   const at::Tensor& wu, const at::Tensor& su, const std::string& act) {
  return decode_fp8::gate_up_op<false>(x, wg, sg, wu, su, act, "decode_gate_up_fp8");
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_gate_up_fp8", &fusekit::decode_gate_up_fp8_cuda); }
