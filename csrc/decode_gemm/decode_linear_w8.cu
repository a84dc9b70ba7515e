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
#include <torch/library.h>

#include "decode_gemm/decode_linear_w8.cuh"

namespace fusekit {
namespace {

at::Tensor decode_linear_w8_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  return decode_w8::run<false>(x, w, scales, "decode_linear_w8", [&] {
    TORCH_CHECK(scales.dim() == 1 && scales.size(0) == w.size(0) && scales.is_contiguous() &&
                    scales.scalar_type() == x.scalar_type() && scales.device() == x.device(),
                "fusekit: decode_linear_w8: scales must be a contiguous [N] vector of x's dtype and device; got x ",
                describe(x), ", w ", describe(w), ", scales ", describe(scales));
  });
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_w8", &fusekit::decode_linear_w8_cuda); }
