// How the kernels record a failure for their caller (kernels/cuda/common.h): the first error on
// the thread, with whether it was a failed allocation, so the CUDA backend reports a cuBLAS
// workspace or launch that did not fit as out of memory (ResourceExhausted). The checks classify
// the codes they are given: no GPU needed.
#include <gtest/gtest.h>

#include <string>

#include "common.cuh"

namespace furnace::kernels::cuda {
namespace {

TEST(KernelErrorTest, AFailedAllocationIsReportedAsOutOfMemory) {
  TakeLastKernelError();  // whatever the runtime left on this thread
  internal::CheckCublas(CUBLAS_STATUS_ALLOC_FAILED, "GroupedMatmul", "cublasGemmEx", __FILE__,
                        __LINE__);
  KernelError error = TakeLastKernelError();
  EXPECT_TRUE(error.out_of_memory) << error.message;
  EXPECT_NE(error.message.find("GroupedMatmul: cublasGemmEx failed"), std::string::npos)
      << error.message;

  internal::CheckCuda(cudaErrorMemoryAllocation, "Permute", "cudaMallocAsync", __FILE__, __LINE__);
  error = TakeLastKernelError();
  EXPECT_TRUE(error.out_of_memory) << error.message;
  EXPECT_NE(error.message.find("out of memory"), std::string::npos) << error.message;
}

TEST(KernelErrorTest, OnlyTheFirstErrorIsKeptWithItsKind) {
  TakeLastKernelError();
  internal::CheckCuda(cudaErrorInvalidValue, "Permute", "cudaMemcpyAsync", __FILE__, __LINE__);
  // A later allocation failure neither replaces nor relabels it.
  internal::CheckCublas(CUBLAS_STATUS_ALLOC_FAILED, "Matmul", "cublasGemmEx", __FILE__, __LINE__);
  KernelError error = TakeLastKernelError();
  EXPECT_FALSE(error.out_of_memory) << error.message;
  EXPECT_NE(error.message.find("Permute: cudaMemcpyAsync failed"), std::string::npos)
      << error.message;
  // Taken once: the kind is cleared with the message.
  internal::CheckCublas(CUBLAS_STATUS_INVALID_VALUE, "Matmul", "cublasGemmEx", __FILE__, __LINE__);
  error = TakeLastKernelError();
  EXPECT_FALSE(error.out_of_memory) << error.message;
  EXPECT_NE(error.message.find("Matmul"), std::string::npos) << error.message;
}

}  // namespace
}  // namespace furnace::kernels::cuda
