// Internal to the CUDA backend tables: the adapters from a CPU kernel's signature to its CUDA
// launcher (Streamed: the same arguments plus the op's stream; Cublased: plus the op's cuBLAS
// handle and stream), and the hand-written entries both tables share (cuda_backend.cc).
#pragma once

#include <cstdint>
#include <type_traits>

#include "runtime/device/backend.h"
#include "runtime/device/cuda_op.h"

namespace furnace::device::cuda_internal {

template <typename A>
const void* PointerOf(const A& arg) {
  if constexpr (std::is_pointer_v<A>) {
    return arg;
  } else {
    return nullptr;
  }
}

// Cpu names the argument list (the table's entry type); Cuda is called with it and the stream.
template <const char* Name, auto Cpu, auto Cuda>
struct Streamed;
template <const char* Name, typename... P, void (*Cpu)(P...), auto Cuda>
struct Streamed<Name, Cpu, Cuda> {
  static void Run(P... args) {
    CudaOp op(Name, {PointerOf(args)...});
    if (op.ok()) Cuda(args..., op.stream());
  }
};

template <const char* Name, auto Cpu, auto Cuda>
struct Cublased;
template <const char* Name, typename... P, void (*Cpu)(P...), auto Cuda>
struct Cublased<Name, Cpu, Cuda> {
  static void Run(P... args) {
    CudaOp op(Name, {PointerOf(args)...});
    cublasHandle_t handle = op.cublas();
    if (op.ok()) Cuda(args..., handle, op.stream());
  }
};

void PermuteForward(float* out, const float* inp, const DispatchPlan& plan, int C);
void PermuteBackward(float* dinp, const float* dout, const DispatchPlan& plan, int C);
void UnpermuteForward(float* out, const float* expert_out, const float* gates,
                      const DispatchPlan& plan, int C);
void UnpermuteBackward(float* dexpert_out, float* dgates, const float* dout,
                       const float* expert_out, const float* gates, const DispatchPlan& plan,
                       int C);
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                       int T, int C, int NH);
void AttentionForwardRowStats(float* out, float* stats, const float* qkv, int B, int T, int C,
                              int NH);
void AttentionBackwardRowStats(float* dqkv, const float* dout, const float* qkv, const float* stats,
                               int B, int T, int C, int NH);
void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                       int T, int C);
void AddRow(float* out, const float* row, int64_t N, int C);
float AuxLossForward(const float* probs, const int32_t* indices, int N, int E, int k, float alpha);
double SumOfSquares(const float* x, int64_t n);
double SumOfSquaresRanges(const float* x, const int64_t* begin, const int64_t* count, int ranges);

}  // namespace furnace::device::cuda_internal
