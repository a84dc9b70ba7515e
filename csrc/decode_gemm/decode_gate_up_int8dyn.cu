// fusekit::decode_gate_up_int8dyn -- an MLP's gate and up projections of a decode step as torchao's int8 dynamic
// per-row linears of one x (Int8DynamicActivationInt8WeightConfig), with SwiGLU's (or GeGLU's) product: both weights
// read in one launch, x quantized once.
//
//   def decode_gate_up_int8dyn_ref(x, wg, sg, wu, su, act):  # x [..., K] 16-bit, wg/wu [N, K] int8, sg/su [N, 1] fp32
//       gate, up = decode_linear_int8dyn_ref(x, wg, sg), decode_linear_int8dyn_ref(x, wu, su)
//       return (F.silu(gate) if act == "silu_mul" else F.gelu(gate, approximate="tanh")) * up
//
// Why: Inductor runs x's quantization, aten._int_mm and a scales kernel per weight, then the SiLU * up kernel (torch
// 2.11 folds the gate's last rounding into SiLU's upcast): six launches and the int32 products read back. Here one
// launch; each CTA holds the same 8 columns of both weights, so the product is its epilogue (gate and up with
// torchao's roundings, act rounded, as eager).
//
// Contract: x [..., K] float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; wg and wu contiguous,
// 16-byte aligned int8 [N, K] of one N, each with its contiguous float32 [N] / [N, 1] scales; act "silu_mul" or
// "gelu_tanh_mul". Returns [..., N] of x's dtype.
#include <torch/library.h>

#include <string>

#include "decode_gemm/decode_linear_fp8.cuh"

namespace fusekit {
namespace {

at::Tensor decode_gate_up_int8dyn_cuda(const at::Tensor& x, const at::Tensor& wg, const at::Tensor& sg,
                                       const at::Tensor& wu, const at::Tensor& su, const std::string& act) {
  return decode_fp8::gate_up_op<true>(x, wg, sg, wu, su, act, "decode_gate_up_int8dyn");
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_gate_up_int8dyn", &fusekit::decode_gate_up_int8dyn_cuda); }
