// The decode attention kernels' host entry, shared by the ops that run them (decode_attention.cu,
// decode_attention_softcap.cu, decode_attention_roll.cu). softcap 0: plain scores; > 0: softcap * tanh(score /
// softcap) (Gemma-2).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace fusekit {

// decode_attention_roll.cu: a full sliding window moved one slot to the left while it is read, the new rows (as
// [B, Hkv, 1, D], 16-byte aligned rows) into its last slot; k and v are then the caches, changed in place.
struct WindowRoll {
  at::Tensor new_k, new_v;
};

// decode_attention's contract on q, k, v and the mask (TORCH_CHECK).
void decode_attention_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask);

at::Tensor decode_attention_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double scale, double softcap,
                                const WindowRoll* roll = nullptr);

}  // namespace fusekit
