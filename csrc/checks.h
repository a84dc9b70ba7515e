// Input checks shared by the ops' host code: the FK_CHECK_* macros, a tensor's description for their
// messages, 16-byte alignment, and the bias of the bias-epilogue ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#define FK_CHECK_CUDA(t) TORCH_CHECK((t).is_cuda(), "fusekit: " #t " must be a CUDA tensor, got ", fusekit::describe(t))
#define FK_CHECK_CONTIGUOUS(t) TORCH_CHECK((t).is_contiguous(), "fusekit: " #t " must be contiguous")
#define FK_CHECK_FLOATING(t)                                                                          \
  TORCH_CHECK((t).scalar_type() == at::kFloat || (t).scalar_type() == at::kHalf ||                     \
                  (t).scalar_type() == at::kBFloat16,                                                 \
              "fusekit: " #t " must be float32, float16 or bfloat16, got ", c10::toString((t).scalar_type()))
// Messages are built as plain strings (describe): streaming an IntArrayRef or a Device into TORCH_CHECK from
// nvcc-compiled code crashes the process instead of raising (torch 2.11 on an H200).
#define FK_CHECK_SAME(a, b)                                                                           \
  TORCH_CHECK((a).sizes() == (b).sizes() && (a).scalar_type() == (b).scalar_type() &&                 \
                  (a).device() == (b).device(),                                                       \
              "fusekit: " #a " and " #b " must have one shape, dtype and device; got ",               \
              fusekit::describe(a), " and ", fusekit::describe(b))

namespace fusekit {

// "[2, 3] Half cuda:0": shape, dtype and device, for error messages.
inline std::string describe(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] " + c10::toString(t.scalar_type()) + " " + t.device().str();
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// x [..., N] and a bias [N] of x's dtype and device, both contiguous (the bias-epilogue ops).
inline void check_bias(const at::Tensor& x, const at::Tensor& bias) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  FK_CHECK_CONTIGUOUS(bias);
  TORCH_CHECK(x.dim() >= 1 && bias.dim() == 1 && bias.size(0) == x.size(-1) &&
                  bias.scalar_type() == x.scalar_type() && bias.device() == x.device(),
              "fusekit: bias must be [x.shape[-1]] with x's dtype and device; got x ", describe(x),
              ", bias ", describe(bias));
}

}  // namespace fusekit
