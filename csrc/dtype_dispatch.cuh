// Dtype dispatch of the ops whose kernels take float16 and bfloat16 only, as CUDA's own types.
#pragma once

#include <c10/core/ScalarType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fusekit {

// f(__half{}) for float16, f(__nv_bfloat16{}) otherwise (callers check that t is one of the two).
template <typename F>
void dispatch_half_bf16(at::ScalarType t, F&& f) {
  if (t == at::kHalf) {
    f(__half{});
  } else {
    f(__nv_bfloat16{});
  }
}

}  // namespace fusekit
