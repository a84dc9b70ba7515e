// The host side of fusekit::decode_linear and fusekit::decode_qkv, and of their RMSNorm forms
// (fusekit::decode_rms_linear, fusekit::decode_rms_qkv): the checks, the outputs and the launch, once for both
// forms (NORM: x is h, normalized inside the kernels with norm_w and eps; decode_linear.cuh's RMSNorm section).
// The .cu files are the ops' bindings.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/gelu.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "checks.h"                  // describe, aligned16
#include "decode_linear_splitk.cuh"  // launch_decode_linear, check_x, check_weight, check_bias, rows, out_like
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace decode_gemm {

// The norm ops' h and RMSNorm weight: K > 0 (an empty row has no mean), the weight a contiguous, 16-byte aligned [K]
// of h's dtype and device.
inline void check_norm(const at::Tensor& x, const at::Tensor& nw, const char* op) {
  TORCH_CHECK(x.size(-1) > 0, "fusekit: ", op, ": K must be positive (RMSNorm of an empty row); got h ", describe(x));
  TORCH_CHECK(nw.dim() == 1 && nw.size(0) == x.size(-1) && nw.is_contiguous() && aligned16(nw.data_ptr()) &&
                  nw.scalar_type() == x.scalar_type() && nw.device() == x.device(),
              "fusekit: ", op, ": norm_w must be a contiguous, 16-byte aligned [K] vector of h's dtype and device; "
              "got h ", describe(x), ", norm_w ", describe(nw));
}

// The NORM kernels' parameters: h's RMSNorm weight and eps.
inline void set_norm(Params& p, const at::Tensor& nw, double eps) {
  p.norm_w = nw.data_ptr(), p.eps = static_cast<float>(eps);
}

template <bool NORM>
at::Tensor linear_op(const char* op, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& w2,
                     c10::string_view act, const std::optional<at::Tensor>& b, const std::optional<at::Tensor>& r,
                     const at::Tensor* nw = nullptr, double eps = 0.0) {
  check_x(x, op);
  TORCH_CHECK(act == "none" || act == "silu_mul" || act == "gelu_tanh_mul" || act == "silu_mul_halves" ||
                  act == "gelu" || act == "gelu_tanh",
              "fusekit: ", op, ": act must be 'none', 'silu_mul', 'gelu_tanh_mul', 'silu_mul_halves', 'gelu' or "
              "'gelu_tanh', got '", std::string(act), "'");
  const bool halves = act == "silu_mul_halves", two = act == "silu_mul" || act == "gelu_tanh_mul";
  const bool gated = two || halves;
  TORCH_CHECK(two == w2.has_value(), "fusekit: ", op, ": w2 is needed by act='silu_mul' and 'gelu_tanh_mul', and "
              "only by them");
  check_weight(x, w, op, "w");
  TORCH_CHECK(!(gated && b.has_value()), "fusekit: ", op, ": a bias b is taken with act 'none', 'gelu' and "
              "'gelu_tanh' only, not '", std::string(act), "'");
  check_bias(x, w, b, op, "b");
  if (halves) TORCH_CHECK(w.size(0) % 16 == 0, "fusekit: ", op, ": silu_mul_halves needs N / 2 a multiple of 8; "
                          "got ", describe(w));
  if constexpr (NORM) check_norm(x, *nw, op);
  // silu_mul_halves: one [2N, K] weight, gate rows then up rows (a fused gate_up projection); each half is a
  // contiguous [N, K] block, as two weights would be.
  const at::Tensor wg = halves ? w.narrow(0, 0, w.size(0) / 2) : w;
  const at::Tensor wu = halves ? w.narrow(0, w.size(0) / 2, w.size(0) / 2) : gated ? *w2 : at::Tensor();
  if (two) {
    check_weight(x, *w2, op, "w2");
    TORCH_CHECK(w2->size(0) == w.size(0), "fusekit: ", op, ": w and w2 must have one shape; got ", describe(w),
                ", ", describe(*w2));
  }
  const int64_t K = x.size(-1), N = wg.size(0), M = rows(x, op);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = out_like(x, N);
  if (r.has_value()) {
    TORCH_CHECK(r->sizes() == out.sizes() && r->is_contiguous() && r->scalar_type() == x.scalar_type() &&
                    r->device() == x.device(),
                "fusekit: ", op, ": the residual r must be a contiguous tensor of the output's shape ", out.sizes(),
                ", x's dtype and device; got ", describe(*r));
  }
  if (M == 0 || N == 0) return out;
  if (K == 0) {  // the product is 0: act(b) (+ r), computed as the reference does
    if (!b.has_value()) out.zero_();
    else {
      const at::Tensor y = b->expand_as(out);
      out.copy_(act == "gelu" ? at::gelu(y) : act == "gelu_tanh" ? at::gelu(y, "tanh") : y);
    }
    return r.has_value() ? out.add_(*r) : out;
  }
  Params p{};
  p.x = x.data_ptr(), p.w[0] = wg.data_ptr(), p.w[1] = gated ? wu.data_ptr() : nullptr, p.out[0] = out.data_ptr();
  p.bias[0] = b.has_value() ? b->data_ptr() : nullptr;
  p.residual = r.has_value() ? r->data_ptr() : nullptr;
  p.n[0] = static_cast<int>(N), p.parts = 1;
  p.m = static_cast<int>(M), p.k = static_cast<int>(K);
  p.act = act == "gelu_tanh_mul" ? kGeluTanhMul : act == "silu_mul" || halves ? kSiluMul : act == "gelu" ? kGelu
          : act == "gelu_tanh" ? kGeluTanh : kNoAct;
  if constexpr (NORM) set_norm(p, *nw, eps);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto dispatch = [&](auto tag) {
    using T = decltype(tag);
    if (gated) return launch_decode_linear<T, 2, NORM>(p, stream);
    launch_decode_linear<T, 1, NORM>(p, stream);
  };
  dispatch_half_bf16(x.scalar_type(), dispatch);
  return out;
}

template <bool NORM>
std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_op(const char* op, const at::Tensor& x, const at::Tensor& wq,
                                                      const at::Tensor& wk, const at::Tensor& wv,
                                                      const std::optional<at::Tensor>& bq,
                                                      const std::optional<at::Tensor>& bk,
                                                      const std::optional<at::Tensor>& bv,
                                                      const at::Tensor* nw = nullptr, double eps = 0.0) {
  check_x(x, op);
  check_weight(x, wq, op, "wq");
  check_weight(x, wk, op, "wk");
  check_weight(x, wv, op, "wv");
  check_bias(x, wq, bq, op, "bq");
  check_bias(x, wk, bk, op, "bk");
  check_bias(x, wv, bv, op, "bv");
  if constexpr (NORM) check_norm(x, *nw, op);
  const int64_t K = x.size(-1), M = rows(x, op);
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
    if constexpr (NORM) set_norm(p, *nw, eps);
    if (p.parts > 0) {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      dispatch_half_bf16(x.scalar_type(),
                         [&](auto tag) { launch_decode_linear<decltype(tag), 1, NORM>(p, stream, /*qkv=*/true); });
    }
  }
  return {outs[0], outs[1], outs[2]};
}

}  // namespace decode_gemm
}  // namespace fusekit
