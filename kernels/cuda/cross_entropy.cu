// Fused softmax cross-entropy: one block per row (max, sum of exponentials, probabilities, loss);
// the backward is elementwise over (N, V).
#include "common.cuh"
#include "kernels/cuda/cross_entropy.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void CrossEntropyForwardKernel(float* losses, float* probs, const float* logits,
                                          const int32_t* targets, int V) {
  __shared__ float shared[32];
  int64_t n = blockIdx.x;
  const float* x = logits + n * V;
  float* p = probs + n * V;
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
  mx = internal::BlockMax(mx, shared);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float e = expf(x[v] - mx);
    p[v] = e;
    sum += e;
  }
  sum = internal::BlockSum(sum, shared);
  float inv = 1.0f / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] *= inv;
  // log(sum) - (logit - max) rather than -log(p): keeps precision when p underflows (as the CPU).
  if (threadIdx.x == 0) losses[n] = logf(sum) - (x[targets[n]] - mx);
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* probs,
                                           const int32_t* targets, float dloss, int64_t N, int V) {
  int64_t total = N * V;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t n = i / V;
    int v = static_cast<int>(i % V);
    float indicator = v == targets[n] ? 1.0f : 0.0f;
    dlogits[i] += dloss * (probs[i] - indicator);
  }
}

FURNACE_PRELOAD_KERNELS(CrossEntropyForwardKernel, CrossEntropyBackwardKernel);

}  // namespace

void CrossEntropyForward(float* losses, float* probs, const float* logits, const int32_t* targets,
                         int N, int V, cudaStream_t stream) {
  if (N <= 0 || V <= 0) return;
  CrossEntropyForwardKernel<<<N, kBlock, 0, stream>>>(losses, probs, logits, targets, V);
  FURNACE_CHECK_LAUNCH("CrossEntropyForward");
}

void CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                          int N, int V, cudaStream_t stream) {
  int64_t total = int64_t{N} * V;
  if (total <= 0) return;
  CrossEntropyBackwardKernel<<<internal::GridFor(total, kBlock), kBlock, 0, stream>>>(
      dlogits, probs, targets, dloss, N, V);
  FURNACE_CHECK_LAUNCH("CrossEntropyBackward");
}

}  // namespace furnace::kernels::cuda
