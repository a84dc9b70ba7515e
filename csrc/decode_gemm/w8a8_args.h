// The arguments of the two int8 x int8 linears (decode_linear_w8a8 at decode rows, linear_w8a8 tiled; one schema,
// one fake in fusion_backend/ops.py), checked in one place: each op passes only its own limits on M and N.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "checks.h"  // describe, aligned16

namespace fusekit {

struct W8A8Shape {
  int64_t m, n, k;
  bool f32;  // float32 output (out_dtype float32, the folded-gate form)
};

// xq [..., K] int8, contiguous, 16-byte aligned, K a positive multiple of 16, at most max_rows rows; w [N, K] int8,
// contiguous, 16-byte aligned, on xq's device, N a multiple of n_multiple under n_limit; xs M and ws N
// contiguous float32 scales on xq's device; dtype float16 or bfloat16; out_dtype None, dtype or float32.
// (Counts are spelled by std::to_string: an H200 run segfaulted building a message with an int streamed in.)
inline W8A8Shape check_w8a8_args(const char* op, const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& w,
                                 const at::Tensor& ws, at::ScalarType dtype, std::optional<at::ScalarType> out_dtype,
                                 int64_t max_rows, int64_t n_multiple, int64_t n_limit) {
  const std::string name = std::string("fusekit: ") + op + ": ";
  TORCH_CHECK(xq.is_cuda(), name + "xq must be a CUDA tensor; got " + describe(xq));
  TORCH_CHECK(xq.scalar_type() == at::kChar && xq.dim() >= 1 && xq.is_contiguous() && aligned16(xq.data_ptr()),
              name + "xq must be contiguous, 16-byte aligned int8; got " + describe(xq));
  const int64_t k = xq.size(-1);
  TORCH_CHECK(k > 0 && k % 16 == 0 && k < (int64_t{1} << 31),
              name + "K = xq.shape[-1] must be a positive multiple of 16; got " + describe(xq));
  const int64_t n = w.dim() == 2 ? w.size(0) : 0;
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && w.size(1) == k && w.device() == xq.device() &&
                  w.is_contiguous() && aligned16(w.data_ptr()) && n % n_multiple == 0 && n < n_limit,
              name + "w must be a contiguous, 16-byte aligned int8 [N, K] on xq's device with K = xq.shape[-1], N a "
                  "multiple of " + std::to_string(n_multiple) + " under " + std::to_string(n_limit) +
                  "; got xq " + describe(xq) + ", w " + describe(w));
  const int64_t m = xq.numel() / k;
  TORCH_CHECK(m <= max_rows, name + "too many rows (at most " + std::to_string(max_rows) + "); got xq " +
                                 describe(xq));
  TORCH_CHECK(xs.scalar_type() == at::kFloat && xs.numel() == m && xs.is_contiguous() && xs.device() == xq.device(),
              name + "xs must be " + std::to_string(m) + " contiguous float32 row scales on xq's device; got " +
                  describe(xs));
  TORCH_CHECK(ws.scalar_type() == at::kFloat && ws.numel() == n && ws.is_contiguous() && ws.device() == xq.device(),
              name + "ws must be " + std::to_string(n) + " contiguous float32 weight scales on xq's device; got " +
                  describe(ws));
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16,
              name + "dtype must be float16 or bfloat16; got " + c10::toString(dtype));
  const bool f32 = out_dtype.has_value() && *out_dtype != dtype;
  TORCH_CHECK(!f32 || *out_dtype == at::kFloat,
              name + "out_dtype must be None, dtype or float32; got " + c10::toString(*out_dtype));
  return {m, n, k, f32};
}

}  // namespace fusekit
