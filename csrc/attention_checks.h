// Input checks of the attention ops that read a KV cache (decode_attention, gqa_attention) and of every
// attention op's mask.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

#include "checks.h"  // describe

namespace fusekit {

// Whether `m` broadcasts to the 4-D shape `full` (at most 4 dims, each 1 or equal to full's, right-aligned).
inline bool broadcasts_to(const at::Tensor& m, const std::array<int64_t, 4>& full) {
  if (m.dim() > 4) return false;
  for (int64_t i = 1; i <= m.dim(); ++i) {
    if (m.size(-i) != 1 && m.size(-i) != full[4 - i]) return false;
  }
  return true;
}

// Attention against a KV cache (decode_attention, gqa_attention): q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with
// Hq % Hkv == 0, float16 or bfloat16 on one CUDA device, unit last-dim strides.
inline void check_cache_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op) {
  TORCH_CHECK(q.is_cuda(), "fusekit: q must be a CUDA tensor, got ", describe(q));
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "fusekit: ", op,
              " takes float16 or bfloat16, got q ", describe(q));
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "fusekit: ", op, ": q, k, v must be 4-D; got ",
              describe(q), ", ", describe(k), ", ", describe(v));
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  k.device() == q.device() && v.device() == q.device(),
              "fusekit: ", op, ": q, k, v must share dtype and device; got ", describe(q), ", ", describe(k), ", ",
              describe(v));
  TORCH_CHECK(k.size(0) == q.size(0) && v.sizes() == k.sizes() && k.size(3) == q.size(3) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0,
              "fusekit: ", op, ": want q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with Hq % Hkv == 0; got ", describe(q),
              ", ", describe(k), ", ", describe(v));
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "fusekit: ", op,
              ": q, k, v need a unit last-dim stride");
}

// An attention mask: on q's device, bool or q's dtype (or float32 where `float32_ok`), broadcastable to
// `full` (named `shape` in the message).
inline void check_attention_mask(const at::Tensor& m, const at::Tensor& q, const std::array<int64_t, 4>& full,
                                 const char* op, const char* shape, bool float32_ok) {
  TORCH_CHECK(m.device() == q.device(), "fusekit: ", op, ": mask on another device: ", describe(m));
  TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == q.scalar_type() ||
                  (float32_ok && m.scalar_type() == at::kFloat),
              "fusekit: ", op, ": mask must be ", float32_ok ? "bool, float32" : "bool", " or q's dtype; got ",
              describe(m));
  TORCH_CHECK(broadcasts_to(m, full), "fusekit: ", op, ": mask ", describe(m), " does not broadcast to ", shape);
}

}  // namespace fusekit
