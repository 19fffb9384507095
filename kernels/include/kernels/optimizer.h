// AdamW (MODEL.md: bias-corrected; decoupled weight decay applied where weight_decay > 0) and the
// global-norm helper for clipping.
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
// step is 1-based. param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param)
void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step);
double SumOfSquares(const float* x, int64_t n);  // accumulated in double
// The sum of SumOfSquares(x + begin[i], count[i]) over i < ranges, added in that order.
double SumOfSquaresRanges(const float* x, const int64_t* begin, const int64_t* count, int ranges);
void Scale(float* x, float s, int64_t n);
}  // namespace furnace::kernels::cpu
