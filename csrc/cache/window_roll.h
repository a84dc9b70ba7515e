// fusekit::window_roll's host entry (window_roll.cu), also the fallback of decode_attention_roll.cu: the cache
// [B, H, W, D] moved one slot to the left in place, `fresh` [B, H, 1, D] into its last slot.
#pragma once

#include <ATen/core/Tensor.h>

namespace fusekit {

void window_roll_cuda(const at::Tensor& cache, const at::Tensor& fresh);

}  // namespace fusekit
