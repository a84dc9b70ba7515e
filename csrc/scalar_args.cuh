// The float arguments that may arrive as a Python number or as a 0-dim tensor (`<name>_t`; see
// fusion_backend/ops.py): a host value is passed by value, a device tensor is read inside the kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "checks.h"  // describe

namespace fusekit {

// A host value is used directly; a device tensor is read inside the kernel (no host sync, CUDA-graph safe).
struct ScalarArg {
  float value = 0.f;
  const float* ptr = nullptr;  // device pointer to a float32 copy, when the scalar lives on the GPU
  bool on_host = true;
  at::Tensor keep;             // keeps the float32 copy alive until the launch is enqueued
  __host__ __device__ float get() const {
#ifdef __CUDA_ARCH__
    return ptr ? *ptr : value;
#else
    return value;
#endif
  }
};

inline ScalarArg scalar_arg(const char* name, double v, const std::optional<at::Tensor>& t,
                            const at::Device& device) {
  ScalarArg s;
  if (!t.has_value()) {
    s.value = static_cast<float>(v);
    return s;
  }
  TORCH_CHECK(t->dim() == 0 && t->is_floating_point(), "fusekit: ", name,
              "_t must be a 0-dim floating tensor, got ", describe(*t));
  if (t->is_cpu()) {
    s.value = static_cast<float>(t->item<double>());
    return s;
  }
  TORCH_CHECK(t->device() == device, "fusekit: ", name, "_t is on ", t->device().str(), ", inputs on ",
              device.str());
  s.keep = t->scalar_type() == at::kFloat ? *t : t->to(at::kFloat);
  s.ptr = s.keep.data_ptr<float>();
  s.on_host = false;
  return s;
}

}  // namespace fusekit
