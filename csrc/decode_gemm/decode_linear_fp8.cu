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
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "decode_gemm/decode_linear_fp8.cuh"
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace decode_fp8 {  // the one-weight GEMMs, for decode_qkv_fp8.cu too (the header's extern declarations)
template void launch_fp8<__half, 1, false>(Fp8Params, const at::Tensor&, cudaStream_t);
template void launch_fp8<__nv_bfloat16, 1, false>(Fp8Params, const at::Tensor&, cudaStream_t);
}  // namespace decode_fp8

namespace {

at::Tensor decode_linear_fp8_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  constexpr const char* op = "decode_linear_fp8";
  decode_fp8::check_x(x, op);
  decode_fp8::check_weight(x, w, w_scale, op, "w");
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, w.size(0));
  if (out.numel() == 0) return out;
  decode_fp8::Fp8Params p{};
  p.x = x.data_ptr(), p.m = static_cast<int>(m), p.k = static_cast<int>(x.size(-1)), p.parts = 1;
  p.w[0] = w.data_ptr(), p.w_scale[0] = w_scale.data_ptr<float>(), p.out[0] = out.data_ptr();
  p.n[0] = static_cast<int>(w.size(0));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_half_bf16(x.scalar_type(), [&](auto tag) { decode_fp8::launch_fp8<decltype(tag), 1, false>(p, x, stream); });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_fp8", &fusekit::decode_linear_fp8_cuda); }
