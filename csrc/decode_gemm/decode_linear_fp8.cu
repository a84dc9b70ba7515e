// fusekit::decode_linear_fp8 -- torchao's float8 dynamic per-row linear (Float8DynamicActivationFloat8WeightConfig
// with PerRow) at a decode step's few rows, the activation's quantization included.
//
//   def decode_linear_fp8_ref(x, w, w_scale):         # x [..., K] 16-bit, w [N, K] e4m3, w_scale [N, 1] float32
//       s = (x.abs().amax(-1, keepdim=True) / 448.0).float()              # the division rounded to x's dtype
//       xq = (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
//       return torch._scaled_mm(xq.reshape(-1, K), w.t(), s.reshape(-1, 1), w_scale.t(), out_dtype=x.dtype)
//
// Inductor leaves that as a Triton kernel (the row's scale and the fp8 x) and aten._scaled_mm, whose kernels are
// built for large M: on an H200 a 4096 -> 14336 linear took 91.2 us at 1 row and 112.2 at 32 against 33.4 / 40.2 for
// the 16-bit weight, although the fp8 weight is half the bytes.
//
// Contract: x [..., K] (M rows) float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; w [N, K]
// float8_e4m3fn, contiguous, 16-byte aligned; w_scale N float32 ([N] or [N, 1]), contiguous. Returns [..., N] of x's
// dtype, computed as decode_linear_fp8.cuh says (its kernel, one part). Runs on the current stream.
#include <torch/library.h>

#include "decode_gemm/decode_linear_fp8.cuh"

namespace fusekit {
namespace decode_fp8 {  // the one-weight GEMMs, for decode_qkv_fp8.cu too (the header's extern declarations)
template void launch_fp8<__half, 1, false>(Fp8Params, const at::Tensor&, cudaStream_t);
template void launch_fp8<__nv_bfloat16, 1, false>(Fp8Params, const at::Tensor&, cudaStream_t);
}  // namespace decode_fp8

namespace {

at::Tensor decode_linear_fp8_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  return decode_fp8::linear_op<false>(x, w, w_scale, "decode_linear_fp8");
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_fp8", &fusekit::decode_linear_fp8_cuda); }
