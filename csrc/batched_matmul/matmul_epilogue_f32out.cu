// fusekit::matmul_epilogue with an output cast to fp32: fp16/bf16 operands, fp32 output written by the
// epilogue's store (no separate cast kernel, no intermediate rounding to 16 bits).
//
//   def matmul_epilogue_ref(a, b, bias, residual, scale, act, linear, out_dtype=torch.float32):
//       return ACT[act](matmul(a, b) * scale + bias).to(torch.float32)   # residual: added after the kernel
//
// Contract: as csrc/batched_matmul/matmul_epilogue.cu (which checks the arguments and calls these), a and b fp16 or bf16,
// bias of their dtype, out fp32. A translation unit of its own so that its CUTLASS instantiations compile
// in parallel with the others.
// fusekit-build: cutlass sm_90a
#include "matmul_dispatch.cuh"

namespace fusekit {

void matmul_fp16_f32out(const GemmProblem& p, const at::Tensor& out) {
  matmul_detail::dispatch_no_c<cutlass::half_t, float>(p, out);
}

void matmul_bf16_f32out(const GemmProblem& p, const at::Tensor& out) {
  matmul_detail::dispatch_no_c<cutlass::bfloat16_t, float>(p, out);
}

}  // namespace fusekit
