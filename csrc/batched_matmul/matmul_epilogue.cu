// fusekit::matmul_epilogue -- a tensor-core GEMM whose epilogue (scale, bias, activation, residual)
// runs in registers before the one store of the output (Hopper: CUTLASS 3 wgmma + TMA, warp-specialized
// persistent kernel, fp32 accumulation).
//
//   def matmul_epilogue_ref(a, b, bias=None, residual=None, scale=1.0, act="none", linear=False,
//                           out_dtype=None):
//       y = F.linear(a, b) if linear else torch.matmul(a, b)      # linear: b is a weight [N, K]
//       y = ACT[act](y * scale + bias) + residual                 # each term only when given
//       return y if out_dtype is None else y.to(out_dtype)        # the output cast
//
// Contract: a [L, M, K] or [M, K] (or [..., K] with 2-D b: leading dims flattened into M when they are
// viewable); b [L, K, N] or [K, N] ([.., N, K] when linear); 4-D and higher a [B, H, M, K] @ b [B, H, K, N]
// (same leading dims) run as L = B * H; fp16, bf16 or fp32, one dtype (fp32 runs on TF32 tensor cores,
// as cuBLAS does under allow_tf32; a [K, N] b with a unit N stride is then copied K-major first, since
// TF32 wgmma reads K-major operands only); each operand has a unit stride in one of its last two dims,
// 16-byte-aligned data and leading/batch strides that are multiples of 8 elements (TMA); K and N
// multiples of 8. bias [N] and residual [L, M, N] (unit last stride) of the same dtype. act in {none,
// gelu, gelu_tanh, relu, silu}. out_dtype: None (a's dtype) or float32. Returns a new contiguous [.., M, N]
// tensor. The epilogue computes in fp32; with out_dtype float32 it stores fp32 without the intermediate
// rounding to a's dtype. sm_90 only (the files are compiled only for sm_90a; elsewhere the op has no CUDA
// kernel and the pattern stays with Inductor).
// Requires CUTLASS headers (pip install --no-deps nvidia-cutlass, or CUTLASS_PATH); see fusion_backend/_ext.py.
// fusekit-build: cutlass sm_90a
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checks.h"        // FK_CHECK_CUDA, describe, aligned16
#include "scalar_args.cuh"
// last: it defines NDEBUG for the CUTLASS headers, after every torch header (see there)
#include "matmul_dispatch.cuh"  // GemmProblem, the configurations and their launch

namespace fusekit {
namespace {

using namespace cute;

Act parse_act(const std::string& act) {
  if (act == "none") return kNone;
  if (act == "gelu") return kGelu;
  if (act == "gelu_tanh") return kGeluTanh;
  if (act == "relu") return kRelu;
  if (act == "silu") return kSilu;
  TORCH_CHECK(false, "fusekit: act must be one of none, gelu, gelu_tanh, relu, silu; got '", act, "'");
}

bool ok_stride(int64_t s) { return s % 8 == 0 && s > 0; }

// (unit-stride dim is the last) -> row-major; returns false when neither of the last two dims is unit.
// `rows`: the operand's row count, `cols`: its column count (the logical [rows, cols] matrix).
bool layout_of(const at::Tensor& t, bool& row_major, int64_t& ld, int64_t& batch) {
  const int64_t r = t.dim();
  const int64_t rows = t.size(r - 2), cols = t.size(r - 1);
  const int64_t s_r = t.stride(r - 2), s_c = t.stride(r - 1);
  if (s_c == 1 || cols == 1) {
    row_major = true;
    ld = rows == 1 ? std::max<int64_t>(cols, 8) : s_r;
  } else if (s_r == 1 || rows == 1) {
    row_major = false;
    ld = cols == 1 ? std::max<int64_t>(rows, 8) : s_c;
  } else {
    return false;
  }
  // a single matrix gets a nominal batch stride (TMA wants a real one)
  batch = (r == 3 && t.size(0) > 1) ? t.stride(0) : (row_major ? rows : cols) * ld;
  return true;
}

at::Tensor matmul_epilogue_cuda(const at::Tensor& a_in, const at::Tensor& b_in, const std::optional<at::Tensor>& bias,
                                const std::optional<at::Tensor>& residual, std::optional<double> scale, c10::string_view act,
                                bool linear, std::optional<at::ScalarType> out_dtype,
                                const std::optional<at::Tensor>& scale_t) {
  FK_CHECK_CUDA(a_in);
  FK_CHECK_CUDA(b_in);
  const at::ScalarType dt = a_in.scalar_type();
  TORCH_CHECK(dt == at::kHalf || dt == at::kBFloat16 || dt == at::kFloat,
              "fusekit: matmul_epilogue: a must be float16, bfloat16 or float32 (TF32), got ", describe(a_in));
  const at::ScalarType out_dt = out_dtype.value_or(dt);
  TORCH_CHECK(out_dt == dt || out_dt == at::kFloat, "fusekit: matmul_epilogue: out_dtype must be None, a's dtype "
              "or float32; got ", out_dt);
  TORCH_CHECK(b_in.scalar_type() == a_in.scalar_type() && b_in.device() == a_in.device(),
              "fusekit: matmul_epilogue: b must have a's dtype and device; got a ", describe(a_in), ", b ",
              describe(b_in));
  const int act_id = parse_act(std::string(act));
  at::Tensor b = linear ? b_in.transpose(-1, -2) : b_in;
  at::Tensor a = a_in;
  TORCH_CHECK(b.dim() >= 2, "fusekit: matmul_epilogue: b must have at least 2 dims, got ", describe(b_in));
  std::vector<int64_t> out_shape(a.sizes().begin(), a.sizes().end() - 1);  // [..., M] + [N]
  if (b.dim() == 2) {
    TORCH_CHECK(a.dim() >= 2, "fusekit: matmul_epilogue: a must have at least 2 dims, got ", describe(a_in));
    if (a.dim() > 2) {  // [..., M, K] @ [K, N]: the rows of all leading dims form M
      TORCH_CHECK(a.stride(-1) == 1, "fusekit: matmul_epilogue: a with more than 2 dims needs a unit last stride");
      a = a.reshape({-1, a.size(-1)});
      TORCH_CHECK(a.is_alias_of(a_in), "fusekit: matmul_epilogue: a's leading dims must be viewable as one");
    }
  } else {
    TORCH_CHECK(a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2),
                "fusekit: matmul_epilogue: batched a and b must be [..., M, K] and [..., K, N] with the same "
                "leading dims; got a ", describe(a_in), ", b ", describe(b_in));
    if (b.dim() > 3) {  // [B, H, .., M, K] @ [B, H, .., K, N]: the leading dims form L (views where they merge;
      // the rules fire only there, a direct call with unmergeable ones gets a copy)
      a = a.reshape({-1, a.size(-2), a.size(-1)});
      b = b.reshape({-1, b.size(-2), b.size(-1)});
    }
  }
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1), L = b.dim() == 3 ? b.size(0) : 1;
  TORCH_CHECK(b.size(-2) == K, "fusekit: matmul_epilogue: inner dims differ: a ", describe(a_in), ", b ",
              describe(b_in), linear ? " (linear: b is [N, K])" : "");
  TORCH_CHECK(K % 8 == 0 && N % 8 == 0 && K > 0, "fusekit: matmul_epilogue: K and N must be positive multiples "
              "of 8 (16-byte rows); got K=" + std::to_string(K) + ", N=" + std::to_string(N));

  GemmProblem p{};
  p.L = L, p.M = M, p.N = N, p.K = K;
  bool a_row = false;
  TORCH_CHECK(layout_of(a, a_row, p.lda, p.sa) && a_row && ok_stride(p.lda) && ok_stride(p.sa) &&
                  aligned16(a.data_ptr()),
              "fusekit: matmul_epilogue: a needs a unit last stride, strides that are multiples of 8 and 16-byte "
              "aligned data; got ", describe(a_in));
  TORCH_CHECK(layout_of(b, p.b_kmajor, p.ldb, p.sb) && ok_stride(p.ldb) && ok_stride(p.sb) && aligned16(b.data_ptr()),
              "fusekit: matmul_epilogue: b needs a unit stride in one of its last two dims, strides that are "
              "multiples of 8 and 16-byte aligned data; got ", describe(b_in));
  p.b_kmajor = !p.b_kmajor;  // a row-major [K, N] b is N-major; a column-major one is K-major
  if (dt == at::kFloat && !p.b_kmajor) {  // TF32 wgmma reads K-major B only: copy b K-major
    b = b.transpose(-1, -2).contiguous().transpose(-1, -2);
    TORCH_CHECK(layout_of(b, p.b_kmajor, p.ldb, p.sb), "fusekit: matmul_epilogue: internal: b's K-major copy");
    p.b_kmajor = !p.b_kmajor;
  }

  out_shape.push_back(N);
  at::Tensor out = at::empty(out_shape, a.options().dtype(out_dt));
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == a.scalar_type() &&
                    bias->device() == a.device() && bias->stride(0) == 1 && aligned16(bias->data_ptr()),
                "fusekit: matmul_epilogue: bias must be a contiguous, 16-byte aligned [N=" + std::to_string(N) +
                    "] tensor of a's dtype and device; got " + describe(*bias));
  }
  at::Tensor c = out;
  p.ldc = N, p.sc = M * N;
  // CUTLASS's epilogue adds C before the activation (act(alpha acc + beta C + bias)); the op's contract
  // adds the residual after it. With an activation the residual is added by a separate kernel.
  // The kernels with a C operand are built for a's output dtype only (fp16/bf16).
  const bool residual_in_epilogue = residual.has_value() && act_id == kNone && out_dt == dt && dt != at::kFloat;
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == out.sizes() && residual->scalar_type() == a.scalar_type() &&
                    residual->device() == a.device(),
                "fusekit: matmul_epilogue: residual must match the output ", describe(out), "; got ",
                describe(*residual));
  }
  if (residual_in_epilogue) {
    c = *residual;
    if (b.dim() == 2 && c.dim() > 2) c = c.reshape({-1, N});  // a view when viewable
    if (b.dim() == 3 && c.dim() > 3) c = c.reshape({-1, M, N});
    bool c_row = false;
    int64_t ldc = 0, sc = 0;
    TORCH_CHECK(layout_of(c, c_row, ldc, sc) && c_row && ok_stride(ldc) && ok_stride(sc) && aligned16(c.data_ptr()),
                "fusekit: matmul_epilogue: residual needs a unit last stride, strides that are multiples of 8 "
                "and 16-byte aligned data; got ", describe(*residual));
    p.ldc = ldc, p.sc = sc;
  }
  if (out.numel() == 0) return out;

  c10::cuda::CUDAGuard guard(a.device());
  ScalarArg s = scalar_arg("scale", scale.value_or(1.0), scale_t, a.device());  // no scale: alpha = 1
  p.a = a.data_ptr(), p.b = b.data_ptr(), p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  p.c = c.data_ptr(), p.d = out.data_ptr();
  p.alpha = s.value, p.alpha_ptr = s.ptr;
  p.beta = residual_in_epilogue ? 1.f : 0.f;  // beta == 0: C (here the output itself) is never read
  p.act = act_id;
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, a.device().index()));
  TORCH_CHECK(major == 9, "fusekit: matmul_epilogue runs on sm_90 GPUs only");
  using matmul_detail::dispatch;
  if (dt == at::kFloat) {
    matmul_tf32(p, out);
  } else if (out_dt == at::kFloat) {
    if (dt == at::kHalf) matmul_fp16_f32out(p, out);
    else matmul_bf16_f32out(p, out);
  } else if (dt == at::kHalf) {
    if (p.b_kmajor) dispatch<cutlass::half_t, cutlass::layout::ColumnMajor>(p, out);
    else dispatch<cutlass::half_t, cutlass::layout::RowMajor>(p, out);
  } else {
    if (p.b_kmajor) dispatch<cutlass::bfloat16_t, cutlass::layout::ColumnMajor>(p, out);
    else dispatch<cutlass::bfloat16_t, cutlass::layout::RowMajor>(p, out);
  }
  if (residual.has_value() && !residual_in_epilogue) out.add_(*residual);
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("matmul_epilogue", &fusekit::matmul_epilogue_cuda); }
