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
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "decode_gemm/decode_linear_fp8.cuh"
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> decode_qkv_int8dyn_cuda(const at::Tensor& x, const at::Tensor& wq,
                                                                   const at::Tensor& sq, const at::Tensor& wk,
                                                                   const at::Tensor& sk, const at::Tensor& wv,
                                                                   const at::Tensor& sv) {
  constexpr const char* op = "decode_qkv_int8dyn";
  decode_fp8::check_x(x, op);
  decode_fp8::check_weight(x, wq, sq, op, "wq", at::kChar);
  decode_fp8::check_weight(x, wk, sk, op, "wk", at::kChar);
  decode_fp8::check_weight(x, wv, sv, op, "wv", at::kChar);
  const int64_t m = decode_gemm::rows(x, op);
  const at::Tensor* ws[3] = {&wq, &wk, &wv};
  const at::Tensor* ss[3] = {&sq, &sk, &sv};
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor outs[3] = {decode_gemm::out_like(x, wq.size(0)), decode_gemm::out_like(x, wk.size(0)),
                        decode_gemm::out_like(x, wv.size(0))};
  if (m == 0) return {outs[0], outs[1], outs[2]};
  decode_fp8::Fp8Params p{};
  p.x = x.data_ptr(), p.m = static_cast<int>(m), p.k = static_cast<int>(x.size(-1));
  for (int i = 0; i < 3; ++i) {  // parts with no columns are left out (the grid counts the column tiles)
    if (ws[i]->size(0) == 0) continue;
    p.w[p.parts] = ws[i]->data_ptr(), p.w_scale[p.parts] = ss[i]->data_ptr<float>();
    p.out[p.parts] = outs[i].data_ptr(), p.n[p.parts] = static_cast<int>(ws[i]->size(0));
    ++p.parts;
  }
  if (p.parts > 0) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    dispatch_half_bf16(x.scalar_type(), [&](auto tag) { decode_fp8::launch_fp8<decltype(tag), 1, true>(p, x, stream); });
  }
  return {outs[0], outs[1], outs[2]};
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_qkv_int8dyn", &fusekit::decode_qkv_int8dyn_cuda); }
