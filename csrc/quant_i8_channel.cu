// fusekit::quant_i8_channel -- per-channel INT8: one fp32 scale and zero point per column ([N]) or per
// row ([M, 1]), bit-exact with eager CUDA.
//
//   def quant_i8_channel_ref(x: Tensor, scale: Tensor, zp: Tensor, qmin: int = -128,
//                            qmax: int = 127) -> Tensor:
//       return torch.clamp(torch.round(x / scale + zp), qmin, qmax).to(torch.int8)
//
// Contract: x [M, N] CUDA, contiguous, float32/float16/bfloat16; scale and zp float32, contiguous, both
// [N] or both [M, 1]. x / scale promotes to float32 (a true division), then + zp, round half to even.
#include "fusekit.h"

namespace fusekit {
namespace {

template <typename T, int V, bool PER_ROW>
__global__ void __launch_bounds__(kThreads) quant_channel_kernel(const T* __restrict__ x, const float* __restrict__ scale,
                                                                 const float* __restrict__ zp, int8_t* __restrict__ q,
                                                                 int64_t n, int64_t cols, float qmin, float qmax) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  auto quant = [&](float v, int64_t e) {
    const int64_t c = PER_ROW ? e / cols : e % cols;
    float t = rintf(__fadd_rn(__fdiv_rn(v, scale[c]), zp[c]));
    if (!isnan(t)) t = fminf(fmaxf(t, qmin), qmax);
    return static_cast<int8_t>(t);
  };
  const int64_t nvec = n / V;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    Vec<T, V> v = reinterpret_cast<const Vec<T, V>*>(x)[i];
    Vec<int8_t, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = quant(static_cast<float>(v.v[j]), i * V + j);
    reinterpret_cast<Vec<int8_t, V>*>(q)[i] = o;
  }
  for (int64_t e = nvec * V + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    q[e] = quant(static_cast<float>(x[e]), e);
}

at::Tensor quant_i8_channel_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zp,
                                 int64_t qmin, int64_t qmax) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  TORCH_CHECK(x.dim() == 2, "fusekit: quant_i8_channel needs x [M, N], got ", describe(x));
  TORCH_CHECK(scale.scalar_type() == at::kFloat && zp.scalar_type() == at::kFloat && scale.device() == x.device() &&
                  zp.device() == x.device() && scale.is_contiguous() && zp.is_contiguous(),
              "fusekit: scale and zp must be contiguous float32 on x's device; got ", describe(scale), ", ",
              describe(zp));
  const bool per_row = scale.dim() == 2;
  const bool ok = per_row ? (scale.size(0) == x.size(0) && scale.size(1) == 1)
                          : (scale.dim() == 1 && scale.size(0) == x.size(1));
  TORCH_CHECK(ok && scale.sizes() == zp.sizes(), "fusekit: scale/zp must both be [N] or [M, 1] for x ",
              describe(x), "; got ", describe(scale), ", ", describe(zp));
  TORCH_CHECK(-128 <= qmin && qmin <= qmax && qmax <= 127, "fusekit: need -128 <= qmin <= qmax <= 127");
  c10::cuda::CUDAGuard guard(x.device());
  auto q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  const int64_t n = x.numel();
  if (n == 0) return q;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "quant_i8_channel", [&] {
    constexpr int V = 16 / sizeof(scalar_t);
    auto args = std::make_tuple(x.data_ptr<scalar_t>(), scale.data_ptr<float>(), zp.data_ptr<float>(),
                                q.data_ptr<int8_t>(), n, x.size(1), float(qmin), float(qmax));
    const bool vec = aligned16(x.data_ptr());
    auto launch = [&](auto kernel, int64_t units) {
      std::apply([&](auto... a) { kernel<<<blocks_for(units), kThreads, 0, stream>>>(a...); }, args);
    };
    if (per_row) vec ? launch(quant_channel_kernel<scalar_t, V, true>, n / V + 1) : launch(quant_channel_kernel<scalar_t, 1, true>, n);
    else vec ? launch(quant_channel_kernel<scalar_t, V, false>, n / V + 1) : launch(quant_channel_kernel<scalar_t, 1, false>, n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return q;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("quant_i8_channel", &fusekit::quant_i8_channel_cuda); }
