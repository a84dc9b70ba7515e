// fusekit::decode_qkv -- the q, k and v projections of a decode step: three linears of one input, the three
// weights read in one launch.
//
//   def decode_qkv_ref(x, wq, wk, wv, bq=None, bk=None, bv=None):
//       return F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)   # x [..., K], w* [N*, K], b* [N*]
//
// Contract: x [..., K] contiguous, wq, wk, wv [N*, K] contiguous (each its own N), biases none or [N*]
// contiguous (each optional), one CUDA device, one dtype in {float16, bfloat16}, K and every N multiples of 8,
// 16-byte aligned x and weights. Any number of rows M; built for few (decode). Returns three [..., N*]
// contiguous tensors of x's dtype; float32 accumulation, the bias added in float32, each output rounded once,
// as eager's mm / addmm.
//
// Why: at a decode step's few rows each projection is one pass over its weight, and cuBLAS takes one launch
// per projection, each too small to fill an H100 (Llama-style k/v: 2 MB in 5.6 us, 13% of the copy
// bandwidth). One launch with the three weights' column tiles side by side in its grid streams all of them
// at once. The kernel is decode_linear's (decode_linear.cuh); at 33-64 rows the split-K one
// (decode_linear_splitk.cuh, launch_decode_linear's selection).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "decode_linear_splitk.cuh"  // launch_decode_linear, check_x, check_weight, check_bias, rows, out_like
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace {

using namespace decode_gemm;

std::tuple<at::Tensor, at::Tensor, at::Tensor> decode_qkv_cuda(const at::Tensor& x, const at::Tensor& wq,
                                                               const at::Tensor& wk, const at::Tensor& wv,
                                                               const std::optional<at::Tensor>& bq,
                                                               const std::optional<at::Tensor>& bk,
                                                               const std::optional<at::Tensor>& bv) {
  constexpr const char* kOp = "decode_qkv";
  check_x(x, kOp);
  check_weight(x, wq, kOp, "wq");
  check_weight(x, wk, kOp, "wk");
  check_weight(x, wv, kOp, "wv");
  check_bias(x, wq, bq, kOp, "bq");
  check_bias(x, wk, bk, kOp, "bk");
  check_bias(x, wv, bv, kOp, "bv");
  const int64_t K = x.size(-1), M = rows(x, kOp);
  const at::Tensor* ws[kMaxParts] = {&wq, &wk, &wv};
  const std::optional<at::Tensor>* bs[kMaxParts] = {&bq, &bk, &bv};
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor outs[kMaxParts] = {out_like(x, wq.size(0)), out_like(x, wk.size(0)), out_like(x, wv.size(0))};
  if (M > 0 && K == 0) {
    for (int i = 0; i < kMaxParts; ++i) bs[i]->has_value() ? outs[i].copy_(**bs[i]) : outs[i].zero_();
  } else if (M > 0) {
    Params p{};
    p.x = x.data_ptr(), p.m = static_cast<int>(M), p.k = static_cast<int>(K);
    for (int i = 0; i < kMaxParts; ++i) {  // parts with no columns are left out (launch counts the column tiles)
      if (ws[i]->size(0) == 0) continue;
      p.w[p.parts] = ws[i]->data_ptr(), p.out[p.parts] = outs[i].data_ptr();
      p.bias[p.parts] = bs[i]->has_value() ? (*bs[i])->data_ptr() : nullptr;
      p.n[p.parts] = static_cast<int>(ws[i]->size(0));
      ++p.parts;
    }
    if (p.parts > 0) {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      dispatch_half_bf16(x.scalar_type(), [&](auto tag) { launch_decode_linear<decltype(tag), 1>(p, stream, /*qkv=*/true); });
    }
  }
  return {outs[0], outs[1], outs[2]};
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_qkv", &fusekit::decode_qkv_cuda); }
