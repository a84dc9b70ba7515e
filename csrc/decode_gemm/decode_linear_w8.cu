// fusekit::decode_linear_w8 -- an int8 weight-only linear (w8a16) at a decode step's few rows: the int8 weight
// is read once and widened in registers, never written back as a 16-bit copy.
//
//   def decode_linear_w8_ref(x, w, scales):      # aten._weight_int8pack_mm's contract
//       return ((x.float() @ w.float().T) * scales.float()).to(x.dtype)
//
// torchao's Int8WeightOnlyConfig computes F.linear(x, w.to(x.dtype)) * scales; Inductor rewrites that into
// aten._weight_int8pack_mm (its woq_int8 lowering, bf16), whose CUDA kernel measured 61.9 us against cuBLAS's
// 34.0 for the 16-bit weight at 1 row and 4,251 us against 39.9 at 32 rows (H200, 4096 -> 14336): the int8
// weight, half the bytes, ended slower than the 16-bit one.
//
// Contract: x [..., K] (M rows) float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; w [N, K] int8,
// contiguous, 16-byte aligned; scales [N] of x's dtype, contiguous. Returns [..., N] of x's dtype: the products
// summed in float32 (tensor cores), times the scale, rounded once. Runs on the current stream, no workspace;
// on sm_90+ launched with programmatic dependent launch.
//
// The kernel: decode_linear_w8.cuh.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "decode_gemm/decode_linear_w8.cuh"

namespace fusekit {
namespace {

at::Tensor decode_linear_w8_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  constexpr const char* op = "decode_linear_w8";
  decode_gemm::check_x(x, op);
  TORCH_CHECK(x.size(-1) % 16 == 0, "fusekit: decode_linear_w8: K = x.shape[-1] must be a multiple of 16; got x ",
              describe(x));
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && w.size(1) == x.size(-1) && w.device() == x.device(),
              "fusekit: decode_linear_w8: w must be an int8 [N, K] on x's device with K = x.shape[-1]; got x ",
              describe(x), ", w ", describe(w));
  TORCH_CHECK(w.is_contiguous() && aligned16(w.data_ptr()) && w.size(0) < (int64_t{1} << 30),
              "fusekit: decode_linear_w8: w must be contiguous and 16-byte aligned; got ", describe(w));
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == w.size(0) && scales.is_contiguous() &&
                  scales.scalar_type() == x.scalar_type() && scales.device() == x.device(),
              "fusekit: decode_linear_w8: scales must be a contiguous [N] vector of x's dtype and device; got x ",
              describe(x), ", w ", describe(w), ", scales ", describe(scales));
  const int64_t m = decode_gemm::rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = decode_gemm::out_like(x, w.size(0));
  if (out.numel() == 0) return out;
  const decode_w8::W8Params p{x.data_ptr(), w.data_ptr(), scales.data_ptr(), out.data_ptr(), static_cast<int>(m),
                              static_cast<int>(w.size(0)), static_cast<int>(x.size(-1))};
  decode_w8::launch_rows<false>(p, x.scalar_type(), c10::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_w8", &fusekit::decode_linear_w8_cuda); }
