// Embedding: a grid-stride loop over (B, T, C) for the forward; the backward scatters dout rows
// into dwte with atomicAdd (a token may repeat) and sums over the batch for dwpe without atomics.
#include "common.cuh"
#include "kernels/cuda/encoder.h"

namespace furnace::kernels::cuda {
namespace {

__global__ void EmbeddingForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, int64_t BT, int Tlen, int C) {
  int64_t total = BT * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t bt = i / C;
    int c = static_cast<int>(i % C);
    int t = static_cast<int>(bt % Tlen);
    out[i] = wte[int64_t{tokens[bt]} * C + c] + wpe[int64_t{t} * C + c];
  }
}

__global__ void EmbeddingBackwardWteKernel(float* dwte, const float* dout, const int32_t* tokens,
                                           int64_t BT, int C) {
  int64_t total = BT * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t bt = i / C;
    int c = static_cast<int>(i % C);
    atomicAdd(&dwte[int64_t{tokens[bt]} * C + c], dout[i]);
  }
}

__global__ void EmbeddingBackwardWpeKernel(float* dwpe, const float* dout, int B, int Tlen, int C) {
  int64_t total = int64_t{Tlen} * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) sum += dout[int64_t{b} * total + i];
    dwpe[i] += sum;
  }
}

constexpr int kBlock = 256;

FURNACE_PRELOAD_KERNELS(EmbeddingForwardKernel, EmbeddingBackwardWteKernel,
                        EmbeddingBackwardWpeKernel);

}  // namespace

void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                      int Tlen, int C, cudaStream_t stream) {
  int64_t BT = int64_t{B} * Tlen;
  if (BT * C == 0) return;
  EmbeddingForwardKernel<<<internal::GridFor(BT * C, kBlock), kBlock, 0, stream>>>(
      out, tokens, wte, wpe, BT, Tlen, C);
  FURNACE_CHECK_LAUNCH("EmbeddingForward");
}

void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                       int Tlen, int C, cudaStream_t stream) {
  int64_t BT = int64_t{B} * Tlen;
  if (BT * C == 0) return;
  EmbeddingBackwardWteKernel<<<internal::GridFor(BT * C, kBlock), kBlock, 0, stream>>>(
      dwte, dout, tokens, BT, C);
  FURNACE_CHECK_LAUNCH("EmbeddingBackward");
  EmbeddingBackwardWpeKernel<<<internal::GridFor(int64_t{Tlen} * C, kBlock), kBlock, 0, stream>>>(
      dwpe, dout, B, Tlen, C);
  FURNACE_CHECK_LAUNCH("EmbeddingBackward");
}

}  // namespace furnace::kernels::cuda
