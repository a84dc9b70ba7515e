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
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "decode_gemm/decode_linear_fp8.cuh"
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace decode_fp8 {  // the one-weight int8 GEMMs, for decode_qkv_int8dyn.cu too (the header's extern declarations)
template void launch_fp8<__half, 1, true>(Fp8Params, const at::Tensor&, cudaStream_t);
template void launch_fp8<__nv_bfloat16, 1, true>(Fp8Params, const at::Tensor&, cudaStream_t);
}  // namespace decode_fp8

namespace {

at::Tensor decode_linear_int8dyn_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  constexpr const char* op = "decode_linear_int8dyn";
  decode_fp8::check_x(x, op);
  decode_fp8::check_weight(x, w, w_scale, op, "w", at::kChar);
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, w.size(0));
  if (out.numel() == 0) return out;
  decode_fp8::Fp8Params p{};
  p.x = x.data_ptr(), p.m = static_cast<int>(m), p.k = static_cast<int>(x.size(-1)), p.parts = 1;
  p.w[0] = w.data_ptr(), p.w_scale[0] = w_scale.data_ptr<float>(), p.out[0] = out.data_ptr();
  p.n[0] = static_cast<int>(w.size(0));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_half_bf16(x.scalar_type(), [&](auto tag) { decode_fp8::launch_fp8<decltype(tag), 1, true>(p, x, stream); });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_int8dyn", &fusekit::decode_linear_int8dyn_cuda); }
