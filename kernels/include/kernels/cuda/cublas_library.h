// cuBLAS, loaded on first use (kernels/cuda/lazy_library.h says why). The programs link
// kernels/cuda/cublas_library.cc instead of libcublas: it defines each cuBLAS entry point Furnace
// calls, and the first call loads libcublas.so.<major of the build's headers> (the dynamic
// loader's search first, then the toolkit directory the build found). Where the library cannot be
// loaded, every call returns CUBLAS_STATUS_NOT_INITIALIZED and cublasGetStatusString returns why
// (each path tried), so the existing error paths (CublasHandle) carry the reason.
#pragma once

#include <string>

namespace furnace::kernels::cuda {

// Loads cuBLAS now if no call has yet: "" when it is loaded with every entry point Furnace calls,
// else the reason. Thread-safe; the first attempt's outcome holds for the process's life.
std::string LoadCublas();

}  // namespace furnace::kernels::cuda
