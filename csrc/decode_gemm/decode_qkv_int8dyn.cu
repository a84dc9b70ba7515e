// fusekit::decode_qkv_int8dyn -- q, k and v of a decode step as torchao's int8 dynamic per-row linears of one x
// (Int8DynamicActivationInt8WeightConfig): the three weights read in one launch, x quantized once.
//
//   def decode_qkv_int8dyn_ref(x, wq, sq, wk, sk, wv, sv):   # x [..., K] 16-bit, w* [N*, K] int8, s* [N*, 1] fp32
//       return tuple(decode_linear_int8dyn_ref(x, w, s) for w, s in ((wq, sq), (wk, sk), (wv, sv)))
//
// Why: Inductor runs one quantization of x (the three torchao makes are one after CSE), then aten._int_mm and a
// scales kernel per weight: seven launches for three passes over small weights. Here one launch with the three
// weights' column tiles side by side in its grid (decode_qkv's layout), above 8 rows after one quantize_rows.
//
// Contract: x [..., K] float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; each weight a contiguous,
// 16-byte aligned int8 [N*, K] with its contiguous float32 [N*] / [N*, 1] scales. Returns three [..., N*] contiguous
// tensors of x's dtype, each as decode_linear_int8dyn computes it (decode_linear_fp8.cuh, I8).
#include <torch/library.h>

#include <tuple>

#include "decode_gemm/decode_linear_fp8.cuh"

namespace fusekit {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> decode_qkv_int8dyn_cuda(
    const at::Tensor& x, const at::Tensor& wq, const at::Tensor& sq, const at::Tensor& wk, const at::Tensor& sk,
    const at::Tensor& wv, const at::Tensor& sv) {
  return decode_fp8::qkv_op<true>(x, wq, sq, wk, sk, wv, sv, "decode_qkv_int8dyn");
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_qkv_int8dyn", &fusekit::decode_qkv_int8dyn_cuda); }
