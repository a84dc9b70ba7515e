// fusekit::decode_linear -- the linears of a decode step: a few rows of activations against a weight
// matrix that is read once, straight from HBM, by as many thread blocks as fill the GPU.
//
//   def decode_linear_ref(x, w, w2=None, act="none", b=None):
//       y = F.linear(x, w, b)                                    # x [..., K], w [N, K], b None or [N]
//       if act == "silu_mul_halves":                             # w [2N, K]: gate rows, then up rows
//           gate, up = y.chunk(2, dim=-1)
//           return F.silu(gate) * up
//       if act == "gelu_tanh_mul":                               # GeGLU's gate and up
//           return F.gelu(y, approximate="tanh") * F.linear(x, w2)
//       if act in ("gelu", "gelu_tanh"):                         # an MLP's up projection (GPT-NeoX, Phi-2)
//           return F.gelu(y, approximate="tanh" if act == "gelu_tanh" else "none")
//       return y if act == "none" else F.silu(y) * F.linear(x, w2)   # "silu_mul": SwiGLU's gate and up
//
// Contract: x [..., K] contiguous, w (and w2) [N, K] contiguous, b (acts none, gelu, gelu_tanh only) a contiguous
// [N], one CUDA device, one dtype in {float16, bfloat16}, K and N multiples of 8 (silu_mul_halves: N / 2), 16-byte
// aligned x and weights. Any number of rows M (the product of x's leading dims); the kernel is built for few
// (decode: M = batch x new tokens). Returns [..., N] contiguous, x's dtype.
// Float32 accumulation; the bias is added in float32 and the sum rounded once (addmm), GELU applied to that rounded
// value; the gated acts round the two products, act(gate) and the result to x's dtype, as eager.
//
// The kernel, why it is shaped so and what it measured: decode_linear.cuh.
#include <ATen/core/Tensor.h>
#include <ATen/ops/gelu.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>

#include "decode_linear_splitk.cuh"  // launch_decode_linear, check_x, check_weight, check_bias, rows, out_like
#include "checks.h"                  // describe
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace {

using namespace decode_gemm;

at::Tensor decode_linear_cuda(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& w2,
                              c10::string_view act, const std::optional<at::Tensor>& b) {
  constexpr const char* kOp = "decode_linear";
  check_x(x, kOp);
  TORCH_CHECK(act == "none" || act == "silu_mul" || act == "gelu_tanh_mul" || act == "silu_mul_halves" ||
                  act == "gelu" || act == "gelu_tanh",
              "fusekit: decode_linear: act must be 'none', 'silu_mul', 'gelu_tanh_mul', 'silu_mul_halves', 'gelu' or "
              "'gelu_tanh', got '", std::string(act), "'");
  const bool halves = act == "silu_mul_halves", two = act == "silu_mul" || act == "gelu_tanh_mul";
  const bool gated = two || halves;
  TORCH_CHECK(two == w2.has_value(), "fusekit: decode_linear: w2 is needed by act='silu_mul' and 'gelu_tanh_mul', and "
              "only by them");
  check_weight(x, w, kOp, "w");
  TORCH_CHECK(!(gated && b.has_value()), "fusekit: decode_linear: a bias b is taken with act 'none', 'gelu' and "
              "'gelu_tanh' only, not '", std::string(act), "'");
  check_bias(x, w, b, kOp, "b");
  if (halves) TORCH_CHECK(w.size(0) % 16 == 0, "fusekit: decode_linear: silu_mul_halves needs N / 2 a multiple of 8; "
                          "got ", describe(w));
  // silu_mul_halves: one [2N, K] weight, gate rows then up rows (a fused gate_up projection); each half is a
  // contiguous [N, K] block, as two weights would be.
  const at::Tensor wg = halves ? w.narrow(0, 0, w.size(0) / 2) : w;
  const at::Tensor wu = halves ? w.narrow(0, w.size(0) / 2, w.size(0) / 2) : gated ? *w2 : at::Tensor();
  if (two) {
    check_weight(x, *w2, kOp, "w2");
    TORCH_CHECK(w2->size(0) == w.size(0), "fusekit: decode_linear: w and w2 must have one shape; got ", describe(w),
                ", ", describe(*w2));
  }
  const int64_t K = x.size(-1), N = wg.size(0), M = rows(x, kOp);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = out_like(x, N);
  if (M == 0 || N == 0) return out;
  if (K == 0) {  // the product is 0: act(b), computed as the reference does
    if (!b.has_value()) return out.zero_();
    const at::Tensor y = b->expand_as(out);
    return out.copy_(act == "gelu" ? at::gelu(y) : act == "gelu_tanh" ? at::gelu(y, "tanh") : y);
  }
  Params p{};
  p.x = x.data_ptr(), p.w[0] = wg.data_ptr(), p.w[1] = gated ? wu.data_ptr() : nullptr, p.out[0] = out.data_ptr();
  p.bias[0] = b.has_value() ? b->data_ptr() : nullptr;
  p.n[0] = static_cast<int>(N), p.parts = 1;
  p.m = static_cast<int>(M), p.k = static_cast<int>(K);
  p.act = act == "gelu_tanh_mul" ? kGeluTanhMul : act == "silu_mul" || halves ? kSiluMul : act == "gelu" ? kGelu
          : act == "gelu_tanh" ? kGeluTanh : kNoAct;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto dispatch = [&](auto tag) {
    using T = decltype(tag);
    if (gated) return launch_decode_linear<T, 2>(p, stream);
    launch_decode_linear<T, 1>(p, stream);
  };
  dispatch_half_bf16(x.scalar_type(), dispatch);
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear", &fusekit::decode_linear_cuda); }
