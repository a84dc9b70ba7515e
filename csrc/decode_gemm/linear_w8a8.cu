// fusekit::linear_w8a8 -- an int8 x int8 linear of many rows (prefill) with torchao's two scale roundings in the
// epilogue: Int8DynamicActivationInt8WeightConfig after x's per-row quantization (Hopper: CUTLASS 3 wgmma s8 + TMA,
// warp-specialized persistent kernel, exact int32 accumulation).
//
//   def linear_w8a8_ref(xq, xs, w, ws, dtype, out_dtype=None):    # patterns/decode_gemm.py: decode_linear_w8a8_ref
//       rows = xq.reshape(-1, xq.shape[-1])
//       y = (torch._int_mm(rows, w.t()) * xs.reshape(-1, 1).expand(rows.shape[0], w.shape[0])).to(dtype)
//       y = (y * ws.flatten()).reshape(xq.shape[:-1] + w.shape[:1])
//       return y.to(out_dtype or dtype)
//
// Inductor runs that as cuBLAS's aten._int_mm, which writes the int32 products to memory, and a kernel for the
// scales that reads them back: 8 bytes an output more than the product itself. Here the products stay in
// registers: float(acc) * xs[m] rounded to dtype, times ws[n], rounded again (or stored as float32), each step
// IEEE round-to-nearest as eager's: the output equals eager's to the bit.
//
// Contract: xq [..., K] (M rows) int8, contiguous, 16-byte aligned, K a multiple of 16; xs M float32 row scales,
// contiguous (any shape: [..., 1]); w [N, K] int8, contiguous, 16-byte aligned, N a multiple of 8 (16-byte output
// rows); ws N float32 scales, contiguous ([N, 1] or [N]); dtype float16 or bfloat16; out_dtype None, dtype or
// float32. Returns a new contiguous [..., N] tensor of out_dtype or dtype. Runs on the current stream; its
// workspace (if any) comes from the caching allocator. sm_90 only (compiled for sm_90a; elsewhere the op has no
// CUDA kernel and its rule stays with Inductor).
// Requires CUTLASS headers (pip install --no-deps nvidia-cutlass, or CUTLASS_PATH); see fusion_backend/_ext.py.
// fusekit-build: cutlass sm_90a
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "decode_gemm/w8a8_args.h"
#include "launch.cuh"  // sm_count

// CUTLASS wants NDEBUG, set after every torch header (csrc/batched_matmul/matmul_dispatch.cuh says why)
#ifndef NDEBUG
#define NDEBUG 1
#endif
#include <cassert>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

namespace fusekit {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// T: the 16-bit dtype of torchao's first rounding; D: the output (T, or float for the unrounded form).
// Tile 128 x 128 x 128 (128 int8 of K: one 128-byte TMA row), 2 x 1 clusters sharing their weight tile, ping-pong
// consumer warpgroups (one's epilogue under the other's MMAs).
template <class T, class D>
struct W8A8Gemm {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_2, _1, _1>;
  // the epilogue tree: ((acc * xs[m]) -> T) * ws[n] -> D; the scales are loaded one element at a time (alignment 1:
  // no constraint on M, N or the scales' addresses; they are 4 bytes a row or column)
  using XS = fusion::Sm90ColBroadcast<0, Tile, float, float, Stride<_1, _0, _0>, 1>;
  using WS = fusion::Sm90RowBroadcast<0, Tile, float, float, Stride<_0, _1, _0>, 1>;
  using RowScaled = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, T, float, kRound>, fusion::Sm90AccFetch, XS>;
  using Fusion = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, D, float, kRound>, RowScaled, WS>;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<D>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void, cutlass::layout::RowMajor, kAlignD, D,
      cutlass::layout::RowMajor, kAlignD, cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16, int8_t,
      cutlass::layout::ColumnMajor, 16, int32_t, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class T, class D>
void run(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& w, const at::Tensor& ws, at::Tensor& out,
         int64_t m, int64_t n, int64_t k) {
  using G = W8A8Gemm<T, D>;
  using Device = typename G::Device;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = xq.device().index();
  hw.sm_count = sm_count(hw.device_id);
  const typename G::Kernel::StrideA sA = make_stride(k, Int<1>{}, m * k);
  const typename G::Kernel::StrideB sB = make_stride(k, Int<1>{}, n * k);  // w [N, K]: K-major
  const typename G::Kernel::StrideD sD = make_stride(n, Int<1>{}, m * n);
  typename Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {int(m), int(n), int(k), 1},
      {xq.data_ptr<int8_t>(), sA, w.data_ptr<int8_t>(), sB},
      {{}, nullptr, sD, static_cast<D*>(out.data_ptr()), sD},
      hw};
  // {{{acc}, {xs}, {}}, {ws}, {}}: each node's children's arguments, then its own
  args.epilogue.thread = {
      {{}, {xs.data_ptr<float>(), 0.f, {}}, {}},
      {ws.data_ptr<float>(), 0.f, {}},
      {}};
  Device gemm;
  TORCH_CHECK(gemm.can_implement(args) == cutlass::Status::kSuccess,
              "fusekit: linear_w8a8: CUTLASS cannot run this problem (alignment or strides): xq ", describe(xq),
              ", w ", describe(w));
  const size_t ws_bytes = Device::get_workspace_size(args);
  at::Tensor workspace = at::empty({int64_t(ws_bytes)}, xq.options().dtype(at::kByte));  // caching allocator
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto st = gemm.initialize(args, ws_bytes ? workspace.data_ptr() : nullptr, stream);
  TORCH_CHECK(st == cutlass::Status::kSuccess, "fusekit: linear_w8a8: initialize failed: ", cutlassGetStatusString(st));
  st = gemm.run(stream);
  TORCH_CHECK(st == cutlass::Status::kSuccess, "fusekit: linear_w8a8: launch failed: ", cutlassGetStatusString(st));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor linear_w8a8_cuda(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& w, const at::Tensor& ws,
                            at::ScalarType dtype, std::optional<at::ScalarType> out_dtype) {
  // N a multiple of 8: 16-byte output rows for the TMA store; M and N under 2^31: CUTLASS's int problem shape
  const W8A8Shape a = check_w8a8_args("linear_w8a8", xq, xs, w, ws, dtype, out_dtype, (int64_t{1} << 31) - 1, 8,
                                      int64_t{1} << 31);
  const int64_t m = a.m, n = a.n, k = a.k;
  const bool f32 = a.f32;
  c10::cuda::CUDAGuard guard(xq.device());
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, xq.device().index()));
  TORCH_CHECK(major == 9, "fusekit: linear_w8a8 runs on sm_90 GPUs only");
  std::vector<int64_t> shape(xq.sizes().begin(), xq.sizes().end());
  shape.back() = n;
  at::Tensor out = at::empty(shape, xq.options().dtype(f32 ? at::kFloat : dtype));
  if (out.numel() == 0) return out;
  if (dtype == at::kBFloat16) {
    if (f32) run<cutlass::bfloat16_t, float>(xq, xs, w, ws, out, m, n, k);
    else run<cutlass::bfloat16_t, cutlass::bfloat16_t>(xq, xs, w, ws, out, m, n, k);
  } else {
    if (f32) run<cutlass::half_t, float>(xq, xs, w, ws, out, m, n, k);
    else run<cutlass::half_t, cutlass::half_t>(xq, xs, w, ws, out, m, n, k);
  }
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("linear_w8a8", &fusekit::linear_w8a8_cuda); }
