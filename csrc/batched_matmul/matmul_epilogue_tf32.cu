// fusekit::matmul_epilogue on fp32 operands: TF32 tensor cores (wgmma reads the top 19 bits of each fp32
// operand, as cuBLAS does under torch.backends.cuda.matmul.allow_tf32), fp32 accumulation and output.
//
//   def matmul_epilogue_ref(a, b, bias, residual, scale, act, linear):     # with allow_tf32 = True
//       return ACT[act](matmul(a, b) * scale + bias)                        # residual: added after the kernel
//
// Contract: as csrc/batched_matmul/matmul_epilogue.cu (which checks the arguments, copies an N-major b K-major, and calls
// this), a, b, bias and out fp32, b K-major.
// fusekit-build: cutlass sm_90a
#include "matmul_dispatch.cuh"

namespace fusekit {

void matmul_tf32(const GemmProblem& p, const at::Tensor& out) {
  TORCH_CHECK(p.b_kmajor, "fusekit: matmul_epilogue: TF32 needs a K-major b");
  matmul_detail::dispatch_c<float, cutlass::layout::ColumnMajor, false, float>(p, out);
}

}  // namespace fusekit
