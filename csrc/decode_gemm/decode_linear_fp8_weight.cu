// fusekit::decode_linear_fp8_weight -- a float8 (e4m3) weight-only linear at a decode step's few rows: each weight
// is scaled and rounded to x's dtype in registers, never written back as a 16-bit copy.
//
//   def decode_linear_fp8_weight_ref(x, w, w_scale):   # torchao's Float8WeightOnlyConfig (per-row scales)
//       return x @ (w.t().float() * w_scale.t()).to(x.dtype)
//
// Inductor runs that as a kernel writing the dequantized 16-bit weight (1 byte read, 2 written per weight) and a
// 16-bit GEMM reading it again: 5 bytes a weight where this reads 1.
//
// Contract: x [..., K] (M rows) float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; w [N, K]
// float8_e4m3fn, contiguous, 16-byte aligned; w_scale N contiguous float32 ([N] or [N, 1]). Returns [..., N] of x's
// dtype: each weight times its row's scale rounded to x's dtype (as the reference's dequantization does), the
// products summed in float32 (tensor cores), rounded once. Runs on the current stream, no workspace; on sm_90+
// launched with programmatic dependent launch. The kernel: decode_linear_w8.cuh.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "decode_gemm/decode_linear_w8.cuh"

namespace fusekit {
namespace {

at::Tensor decode_linear_fp8_weight_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  return decode_w8::run<true>(x, w, w_scale, "decode_linear_fp8_weight", [&] {
    TORCH_CHECK(w_scale.numel() == w.size(0) && w_scale.dim() >= 1 && w_scale.dim() <= 2 &&
                    w_scale.size(0) == w.size(0) && w_scale.is_contiguous() &&
                    w_scale.scalar_type() == at::kFloat && w_scale.device() == x.device(),
                "fusekit: decode_linear_fp8_weight: w_scale must be N contiguous float32 ([N] or [N, 1]) on x's "
                "device; got w ", describe(w), ", w_scale ", describe(w_scale));
  });
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear_fp8_weight", &fusekit::decode_linear_fp8_weight_cuda); }
