// fusekit::decode_linear_int8dyn -- torchao's int8 dynamic per-row linear (Int8DynamicActivationInt8WeightConfig) at
// a decode step's few rows, the activation's quantization included.
//
//   def decode_linear_int8dyn_ref(x, w, w_scale):   # x [..., K] 16-bit, w [N, K] int8, w_scale [N, 1] float32
//       xq, s = _int8_rows(x)     # s = max|x| / 127.5 rounded to x's dtype, floored at 2**-23; xq = round(x * (1 / s))
//       y = (torch._int_mm(xq.reshape(-1, K), w.t()) * s.reshape(-1, 1)).to(x.dtype)
//       return (y * w_scale.flatten()).reshape(x.shape[:-1] + (N,)).to(x.dtype)
//
// Inductor leaves that as a Triton kernel (the rows' scales and int8 x), aten._int_mm (cuBLAS, which refuses 16 rows
// or fewer: the step fails there) and a kernel for both scales, which reads the int32 products back. Here one launch
// up to 8 rows (every CTA quantizes its rows), above that quantize_rows and the GEMM: x's int8 values and the output
// are eager's to the bit.
//
// Contract: x [..., K] (M rows) float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; w [N, K] int8,
// contiguous, 16-byte aligned; w_scale N float32 ([N] or [N, 1]), contiguous. Returns [..., N] of x's dtype, computed
// as decode_linear_fp8.cuh says for I8 (its kernel, one part). Runs on the current stream.
#include <torch/library.h>

#include "decode_gemm/decode_linear_fp8.cuh"

namespace fusekit {
namespace decode_fp8 {  // the one-weight int8 GEMMs, for decode_qkv_int8dyn.cu too (the header's extern declarations)
template void launch_fp8<__half, 1, true>(Fp8Params, const at::Tensor&, cudaStream_t);
template void launch_fp8<__nv_bfloat16, 1, true>(Fp8Params, const at::Tensor&, cudaStream_t);
}  // namespace decode_fp8

namespace {

at::Tensor decode_linear_int8dyn_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  return decode_fp8::linear_op<true>(x, w, w_scale, "decode_linear_int8dyn");
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_int8dyn", &fusekit::decode_linear_int8dyn_cuda); }
