// Router: row softmax (one warp per row), top-k by k passes of an argmax per token (k is small;
// a strict '>' keeps the lower index on ties), and the Switch aux loss with one block per expert
// and its terms added in expert order (no atomics: the same value every run).
#include "common.cuh"
#include "kernels/cuda/router.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBlock = 256;

__global__ void SoftmaxForwardKernel(float* probs, const float* logits, int N, int E) {
  int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = logits + int64_t{row} * E;
  float* p = probs + int64_t{row} * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, x[e]);
  mx = internal::WarpMax(mx);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) {
    float v = expf(x[e] - mx);
    p[e] = v;
    sum += v;
  }
  float inv = 1.0f / internal::WarpSum(sum);
  for (int e = lane; e < E; e += 32) p[e] *= inv;
}

__global__ void SoftmaxBackwardKernel(float* dlogits, const float* dprobs, const float* probs,
                                      int N, int E) {
  int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* dp = dprobs + int64_t{row} * E;
  const float* p = probs + int64_t{row} * E;
  float dot = 0.0f;
  for (int e = lane; e < E; e += 32) dot += p[e] * dp[e];
  dot = internal::WarpSum(dot);
  float* dl = dlogits + int64_t{row} * E;
  for (int e = lane; e < E; e += 32) dl[e] += p[e] * (dp[e] - dot);
}

__global__ void TopKForwardKernel(int32_t* indices, float* gates, const float* probs, int N, int E,
                                  int k, bool normalize) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + int64_t{n} * E;
  int chosen[kMaxTopK];
  float value[kMaxTopK];
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_p = 0.0f;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= chosen[i] == e;
      if (taken) continue;
      if (best < 0 || p[e] > best_p) {
        best = e;
        best_p = p[e];
      }
    }
    chosen[j] = best;
    value[j] = best_p;
    sum += best_p;
  }
  for (int j = 0; j < k; ++j) {
    indices[int64_t{n} * k + j] = chosen[j];
    gates[int64_t{n} * k + j] = normalize ? value[j] / sum : value[j];
  }
}

// gates g_j = p_j / S with S = sum_i p_i (normalize): dp_j += dg_j / S - sum_i dg_i p_i / S^2.
__global__ void TopKBackwardKernel(float* dprobs, const float* dgates, const float* probs,
                                   const int32_t* indices, int N, int E, int k, bool normalize) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int32_t* idx = indices + int64_t{n} * k;
  const float* dg = dgates + int64_t{n} * k;
  const float* p = probs + int64_t{n} * E;
  float* dp = dprobs + int64_t{n} * E;
  if (!normalize) {
    for (int j = 0; j < k; ++j) dp[idx[j]] += dg[j];
    return;
  }
  float sum = 0.0f, dot = 0.0f;
  for (int j = 0; j < k; ++j) {
    sum += p[idx[j]];
    dot += dg[j] * p[idx[j]];
  }
  for (int j = 0; j < k; ++j) dp[idx[j]] += dg[j] / sum - dot / (sum * sum);
}

// Block e: count of assignments to e and the sum of p[:, e]; terms[e] = alpha E frac_e meanprob_e.
__global__ void AuxLossTermsKernel(float* terms, const float* probs, const int32_t* indices, int N,
                                   int E, int k, float alpha) {
  __shared__ float shared[32];
  int e = blockIdx.x;
  float psum = 0.0f, count = 0.0f;
  for (int n = threadIdx.x; n < N; n += blockDim.x) psum += probs[int64_t{n} * E + e];
  int64_t nk = int64_t{N} * k;
  for (int64_t i = threadIdx.x; i < nk; i += blockDim.x) count += indices[i] == e ? 1.0f : 0.0f;
  psum = internal::BlockSum(psum, shared);
  count = internal::BlockSum(count, shared);
  if (threadIdx.x == 0) {
    float frac = count / static_cast<float>(nk);
    float meanprob = psum / static_cast<float>(N);
    terms[e] = alpha * static_cast<float>(E) * frac * meanprob;
  }
}

// aux = terms[0] + terms[1] + ... in expert order (one thread: E is small), so it does not vary
// from run to run.
__global__ void AuxLossSumKernel(float* aux, const float* terms, int E) {
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += terms[e];
  *aux = sum;
}

// d aux / d p[n, e] = alpha E frac_e / N.
__global__ void AuxLossBackwardKernel(float* dprobs, const int32_t* indices, int N, int E, int k,
                                      float alpha, float daux) {
  __shared__ float shared[32];
  int e = blockIdx.x;
  float count = 0.0f;
  int64_t nk = int64_t{N} * k;
  for (int64_t i = threadIdx.x; i < nk; i += blockDim.x) count += indices[i] == e ? 1.0f : 0.0f;
  count = internal::BlockSum(count, shared);
  float grad = daux * alpha * static_cast<float>(E) * (count / static_cast<float>(nk)) /
               static_cast<float>(N);
  for (int n = threadIdx.x; n < N; n += blockDim.x) dprobs[int64_t{n} * E + e] += grad;
}

FURNACE_PRELOAD_KERNELS(SoftmaxForwardKernel, SoftmaxBackwardKernel, TopKForwardKernel,
                        TopKBackwardKernel, AuxLossTermsKernel, AuxLossSumKernel,
                        AuxLossBackwardKernel);

}  // namespace

void SoftmaxForward(float* probs, const float* logits, int N, int E, cudaStream_t stream) {
  if (N <= 0 || E <= 0) return;
  SoftmaxForwardKernel<<<static_cast<unsigned>(internal::CeilDiv(N, kWarpsPerBlock)),
                         kWarpsPerBlock * 32, 0, stream>>>(probs, logits, N, E);
  FURNACE_CHECK_LAUNCH("SoftmaxForward");
}

void SoftmaxBackward(float* dlogits, const float* dprobs, const float* probs, int N, int E,
                     cudaStream_t stream) {
  if (N <= 0 || E <= 0) return;
  SoftmaxBackwardKernel<<<static_cast<unsigned>(internal::CeilDiv(N, kWarpsPerBlock)),
                          kWarpsPerBlock * 32, 0, stream>>>(dlogits, dprobs, probs, N, E);
  FURNACE_CHECK_LAUNCH("SoftmaxBackward");
}

void TopKForward(int32_t* indices, float* gates, const float* probs, int N, int E, int k,
                 bool normalize, cudaStream_t stream) {
  if (k < 1 || k > kMaxTopK || k > E) {
    internal::RecordError("TopKForward", "argument check", "need 1 <= k <= min(E, kMaxTopK)",
                          __FILE__, __LINE__);
    return;
  }
  if (N <= 0) return;
  TopKForwardKernel<<<static_cast<unsigned>(internal::CeilDiv(N, kBlock)), kBlock, 0, stream>>>(
      indices, gates, probs, N, E, k, normalize);
  FURNACE_CHECK_LAUNCH("TopKForward");
}

void TopKBackward(float* dprobs, const float* dgates, const float* probs, const int32_t* indices,
                  int N, int E, int k, bool normalize, cudaStream_t stream) {
  if (N <= 0 || k <= 0) return;
  TopKBackwardKernel<<<static_cast<unsigned>(internal::CeilDiv(N, kBlock)), kBlock, 0, stream>>>(
      dprobs, dgates, probs, indices, N, E, k, normalize);
  FURNACE_CHECK_LAUNCH("TopKBackward");
}

void AuxLossForward(float* aux, float* terms, const float* probs, const int32_t* indices, int N,
                    int E, int k, float alpha, cudaStream_t stream) {
  if (N <= 0 || E <= 0 || k <= 0) {
    FURNACE_CHECK_CUDA("AuxLossForward", cudaMemsetAsync(aux, 0, sizeof(float), stream));
    return;
  }
  AuxLossTermsKernel<<<E, kBlock, 0, stream>>>(terms, probs, indices, N, E, k, alpha);
  if (!FURNACE_CHECK_LAUNCH("AuxLossForward")) return;
  AuxLossSumKernel<<<1, 1, 0, stream>>>(aux, terms, E);
  FURNACE_CHECK_LAUNCH("AuxLossForward");
}

void AuxLossBackward(float* dprobs, const int32_t* indices, int N, int E, int k, float alpha,
                     float daux, cudaStream_t stream) {
  if (N <= 0 || E <= 0 || k <= 0) return;
  AuxLossBackwardKernel<<<E, kBlock, 0, stream>>>(dprobs, indices, N, E, k, alpha, daux);
  FURNACE_CHECK_LAUNCH("AuxLossBackward");
}

}  // namespace furnace::kernels::cuda
