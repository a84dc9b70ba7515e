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
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>

#include "decode_gemm/decode_linear_fp8.cuh"
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace {

at::Tensor decode_gate_up_int8dyn_cuda(const at::Tensor& x, const at::Tensor& wg, const at::Tensor& sg,
                                   const at::Tensor& wu, const at::Tensor& su, const std::string& act) {
  constexpr const char* op = "decode_gate_up_int8dyn";
  TORCH_CHECK(act == "silu_mul" || act == "gelu_tanh_mul", "fusekit: ", op,
              ": act must be \"silu_mul\" or \"gelu_tanh_mul\"; got \"", act, "\"");
  decode_fp8::check_x(x, op);
  decode_fp8::check_weight(x, wg, sg, op, "wg", at::kChar);
  decode_fp8::check_weight(x, wu, su, op, "wu", at::kChar);
  TORCH_CHECK(wg.size(0) == wu.size(0), "fusekit: ", op, ": wg and wu must have one N; got wg ", describe(wg),
              ", wu ", describe(wu));
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, wg.size(0));
  if (out.numel() == 0) return out;
  decode_fp8::Fp8Params p{};
  p.x = x.data_ptr(), p.m = static_cast<int>(m), p.k = static_cast<int>(x.size(-1)), p.parts = 1;
  p.w[0] = wg.data_ptr(), p.w[1] = wu.data_ptr();
  p.w_scale[0] = sg.data_ptr<float>(), p.w_scale[1] = su.data_ptr<float>();
  p.out[0] = out.data_ptr(), p.n[0] = static_cast<int>(wg.size(0));
  p.act = act == "silu_mul" ? decode_gemm::kSiluMul : decode_gemm::kGeluTanhMul;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_half_bf16(x.scalar_type(), [&](auto tag) { decode_fp8::launch_fp8<decltype(tag), 2, true>(p, x, stream); });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_gate_up_int8dyn", &fusekit::decode_gate_up_int8dyn_cuda); }
