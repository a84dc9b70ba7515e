// The decode attention kernels' host entry, shared by the ops that run them (decode_attention.cu,
// decode_attention_softcap.cu). softcap 0: plain scores; > 0: softcap * tanh(score / softcap) (Gemma-2).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace fusekit {

at::Tensor decode_attention_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double scale, double softcap);

}  // namespace fusekit
