// fusekit::decode_attention_roll -- one decode step of a full sliding-window layer in one pass over the window:
// the window moved one slot to the left in place, the new K and V rows into its last slot, and the query rows'
// attention over the moved window.
//
//   def decode_attention_roll_ref(q, k, v, new_k, new_v, mask=None, scale=0.125, softcap=0.0):  # k, v change
//       window_roll_ref(k, new_k)      # k.copy_(torch.cat([k[:, :, 1:], new_k], dim=2))
//       window_roll_ref(v, new_v)
//       if softcap:
//           return decode_attention_softcap_ref(q, k, v, mask, scale, softcap)
//       return decode_attention_ref(q, k, v, mask, scale)
//
// transformers' StaticSlidingWindowLayer rolls a full window at every decode step; window_roll then
// decode_attention read the window twice and write it once (Mistral-style, batch 32, window 1024: 2 x 18.8 us of
// roll and 37 us of attention a layer on an H200). Here the attention's CTAs write back each key block they read,
// one slot down (decode_attention.cu, Params::roll): one read and one write.
//
// Contract: decode_attention's on q, k, v, mask and scale (k and v: the caches [B, Hkv, W, D], changed in place);
// softcap 0 (none) or positive and finite (Gemma-2's); new_k and new_v [B, Hkv, 1, D] in k's dtype, on its device.
// The one-pass kernel takes at most 16 query rows per KV head, caches that overlap neither themselves nor each
// other nor the new rows, and new rows with unit last stride, 16-byte aligned; elsewhere (or with
// FUSEKIT_ROLL_ATTENTION=separate) the op runs window_roll on k and on v, then decode_attention: the same result.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "cache/window_roll.h"
#include "checks.h"  // describe
#include "debug_overrides.h"
#include "decode/decode_attention.h"

namespace fusekit {
namespace {

bool rows_aligned(const at::Tensor& t) {  // [B, H, 1, D]: every row 16-byte aligned, unit last stride
  const int64_t es = t.element_size();
  if (t.stride(3) != 1 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int i = 0; i < 2; ++i) {
    if (t.size(i) > 1 && (t.stride(i) * es) % 16 != 0) return false;
  }
  return true;
}

bool apart(const at::Tensor& a, const at::Tensor& b) {
  return at::get_overlap_status(a, b) == at::MemOverlapStatus::No;
}

bool one_pass(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& nk,
              const at::Tensor& nv) {
  if (debug::roll_attention_separate()) return false;
  if (q.size(1) % k.size(1) != 0 || q.size(1) / k.size(1) * q.size(2) > 16) return false;  // one CTA per KV head
  if (at::has_internal_overlap(k) != at::MemOverlap::No || at::has_internal_overlap(v) != at::MemOverlap::No) {
    return false;
  }
  return apart(k, v) && apart(k, nk) && apart(k, nv) && apart(v, nk) && apart(v, nv) && rows_aligned(nk) &&
         rows_aligned(nv);
}

at::Tensor decode_attention_roll_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& new_k, const at::Tensor& new_v,
                                      const std::optional<at::Tensor>& mask, double scale, double softcap) {
  // (a double streamed into TORCH_CHECK from nvcc-compiled code crashes the process: checks.h)
  TORCH_CHECK(softcap >= 0 && std::isfinite(softcap), "fusekit: decode_attention_roll: softcap must be 0 or positive "
              "and finite; got " + std::to_string(softcap));
  decode_attention_check(q, k, v, mask);
  for (const at::Tensor* n : {&new_k, &new_v}) {
    TORCH_CHECK(n->dim() == 4 && n->size(0) == k.size(0) && n->size(1) == k.size(1) && n->size(2) == 1 &&
                    n->size(3) == k.size(3) && n->scalar_type() == k.scalar_type() && n->device() == k.device(),
                "fusekit: decode_attention_roll: new rows must be [B, Hkv, 1, D] of the cache's B, Hkv, D, dtype and "
                "device: ", describe(k), ", ", describe(*n));
  }
  if (!one_pass(q, k, v, new_k, new_v)) {
    window_roll_cuda(k, new_k);
    window_roll_cuda(v, new_v);
    return decode_attention_run(q, k, v, mask, scale, softcap);
  }
  const WindowRoll roll{new_k, new_v};
  return decode_attention_run(q, k, v, mask, scale, softcap, &roll);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_attention_roll", &fusekit::decode_attention_roll_cuda); }
