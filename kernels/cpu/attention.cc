// Causal attention per (batch, head) on GEMMs. Rows are processed in blocks of kRowBlock query
// positions; a block [r0, r1) only needs keys [0, r1), so the GEMMs skip most of the masked upper
// triangle (about half the work of a full T x T product) while staying large enough for BLAS.
//   forward:  S = scale * Q K^T (rows r0..r1, cols 0..r1);  att = causal softmax(S);  out = att V
//   backward: datt = dout V^T;  dV += att^T dout;  dS = att * (datt - rowsum(att * datt));
//             dQ += scale * dS K;  dK += scale * dS^T Q
// q, k and v are strided views into qkv (leading dimension 3C), out and dout have leading
// dimension C, so no head is ever copied. The backward keeps one (kRowBlock, T) scratch per thread.
//
// The RowStats pair (kStats) keeps (m, r) per row instead of att and rebuilds each block of P in
// backward (attention.h).
//
// The bf16 variants (attention_bf16.h) are the same code with kBf16: qkv and dout are read from
// bf16-rounded copies, and the probabilities (forward and dV) and dS are rounded into a block
// scratch before they enter a product; att itself stays the fp32 softmax. With kBf16 false every
// step is the fp32 code as it always was.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "fast_math.h"
#include "gemm.h"
#include "kernels/attention_bf16.h"
#include "kernels/cast.h"

namespace furnace::kernels::cpu {
using internal::Gemm;
namespace {
constexpr int kRowBlock = 128;

// A bf16-rounded copy of x (n floats).
std::unique_ptr<float[]> RoundedCopy(const float* x, int64_t n) {
  std::unique_ptr<float[]> r(new float[n > 0 ? n : 1]);
  RoundToBf16(r.get(), x, n);
  return r;
}

// Rounds rows [0, rows) x cols [0, cols) of a (.., ld) block to bf16 into dst (same layout).
void RoundBlock(float* dst, const float* src, int rows, int cols, int ld) {
  for (int r = 0; r < rows; ++r) {
    RoundToBf16(dst + static_cast<int64_t>(r) * ld, src + static_cast<int64_t>(r) * ld, cols);
  }
}

// One query block's causal softmax, rows [r0, r1) of S held in blk (leading dimension Tlen): row t
// becomes its probabilities over keys [0, t] and zeros after. stats, where not null, gets (m, r)
// of row t at stats[2t], stats[2t + 1].
template <typename T>
void SoftmaxBlock(T* blk, int r0, int r1, int Tlen, T* stats) {
  for (int t = r0; t < r1; ++t) {
    T* row = blk + static_cast<int64_t>(t - r0) * Tlen;
    const T mx = internal::Max(row, t + 1);
    const T sum = internal::ExpShifted(row, row, mx, t + 1);
    const T inv = T(1) / sum;
    internal::ScaleInPlace(row, inv, t + 1);
    std::fill(row + t + 1, row + Tlen, T(0));
    if (stats != nullptr) {
      stats[2 * static_cast<int64_t>(t)] = mx;
      stats[2 * static_cast<int64_t>(t) + 1] = inv;
    }
  }
}

// kStats: att is the (B, NH, T, 2) row statistics and the probabilities live only in a block
// scratch; else att is the (B, NH, T, T) probabilities, written in place. out null: the
// probabilities alone (AttentionProbs: the product and softmax, not the weighted sum).
template <typename T, bool kBf16, bool kStats>
void Forward(T* out, T* att, const T* qkv_in, int B, int Tlen, int C, int NH) {
  const int hs = C / NH;
  const int ld = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  std::unique_ptr<T[]> qkv_r;
  std::vector<T> p_r;  // (kRowBlock, T): the rounded probabilities of a block (bf16 only)
  if constexpr (kBf16) {
    qkv_r = RoundedCopy(qkv_in, static_cast<int64_t>(B) * Tlen * ld);
    if (out != nullptr) p_r.resize(static_cast<size_t>(kRowBlock) * Tlen);
  }
  std::vector<T> s_blk;  // (kRowBlock, T): a block's scores then probabilities (kStats only)
  if constexpr (kStats) s_blk.resize(static_cast<size_t>(std::min(kRowBlock, Tlen)) * Tlen);
  const T* qkv = kBf16 ? qkv_r.get() : qkv_in;
  for (int b = 0; b < B; ++b) {
    const T* qkv_b = qkv + static_cast<int64_t>(b) * Tlen * ld;
    for (int h = 0; h < NH; ++h) {
      const T* q = qkv_b + h * hs;
      const T* k = q + C;
      const T* v = q + 2 * C;
      const int64_t bh = static_cast<int64_t>(b) * NH + h;
      T* a = kStats ? nullptr : att + bh * Tlen * Tlen;
      T* stats = kStats ? att + bh * Tlen * 2 : nullptr;
      T* o = out == nullptr ? nullptr : out + static_cast<int64_t>(b) * Tlen * C + h * hs;
      for (int r0 = 0; r0 < Tlen; r0 += kRowBlock) {
        const int r1 = std::min(Tlen, r0 + kRowBlock);
        const int rows = r1 - r0;
        T* a_blk = kStats ? s_blk.data() : a + static_cast<int64_t>(r0) * Tlen;
        Gemm(false, true, rows, r1, hs, scale, q + static_cast<int64_t>(r0) * ld, ld, k, ld, T(0),
             a_blk, Tlen);
        SoftmaxBlock(a_blk, r0, r1, Tlen, stats);
        if (o == nullptr) continue;
        const T* p_blk = a_blk;
        if constexpr (kBf16) {
          RoundBlock(p_r.data(), a_blk, rows, r1, Tlen);
          p_blk = p_r.data();
        }
        Gemm(false, false, rows, hs, r1, T(1), p_blk, Tlen, v, ld, T(0),
             o + static_cast<int64_t>(r0) * C, C);
      }
    }
  }
}

// kStats: att is the row statistics, and each block's probabilities are rebuilt from Q, K and
// them with the forward's own operations (the same product into the same layout, the same
// exponentials and scaling), so they are the forward's bit for bit.
template <typename T, bool kBf16, bool kStats>
void Backward(T* dqkv, const T* dout_in, const T* qkv_in, const T* att, int B, int Tlen, int C,
              int NH) {
  const int hs = C / NH;
  const int ld = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  thread_local std::vector<T> scratch;
  scratch.resize(static_cast<size_t>(kRowBlock) * Tlen);
  T* ds = scratch.data();    // (rows, r1) of the current block, leading dimension Tlen
  std::vector<T> p_rebuilt;  // (kRowBlock, T): a block's rebuilt probabilities (kStats only)
  if constexpr (kStats) p_rebuilt.resize(static_cast<size_t>(std::min(kRowBlock, Tlen)) * Tlen);
  std::unique_ptr<T[]> qkv_r, dout_r;
  std::vector<T> p_r;  // (kRowBlock, T): the rounded probabilities of a block (bf16 only)
  if constexpr (kBf16) {
    qkv_r = RoundedCopy(qkv_in, static_cast<int64_t>(B) * Tlen * ld);
    dout_r = RoundedCopy(dout_in, static_cast<int64_t>(B) * Tlen * C);
    p_r.resize(static_cast<size_t>(kRowBlock) * Tlen);
  }
  const T* qkv = kBf16 ? qkv_r.get() : qkv_in;
  const T* dout = kBf16 ? dout_r.get() : dout_in;
  for (int b = 0; b < B; ++b) {
    const int64_t off_b = static_cast<int64_t>(b) * Tlen * ld;
    for (int h = 0; h < NH; ++h) {
      const T* q = qkv + off_b + h * hs;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* dq = dqkv + off_b + h * hs;
      T* dk = dq + C;
      T* dv = dq + 2 * C;
      const int64_t bh = static_cast<int64_t>(b) * NH + h;
      const T* d = dout + static_cast<int64_t>(b) * Tlen * C + h * hs;
      for (int r0 = 0; r0 < Tlen; r0 += kRowBlock) {
        const int r1 = std::min(Tlen, r0 + kRowBlock);
        const int rows = r1 - r0;
        const T* a_blk;  // rows [r0, r1) of P, leading dimension Tlen
        if constexpr (kStats) {
          T* p = p_rebuilt.data();
          Gemm(false, true, rows, r1, hs, scale, q + static_cast<int64_t>(r0) * ld, ld, k, ld, T(0),
               p, Tlen);
          const T* stats = att + bh * Tlen * 2;
          for (int t = r0; t < r1; ++t) {
            T* row = p + static_cast<int64_t>(t - r0) * Tlen;
            internal::ExpShifted(row, row, stats[2 * static_cast<int64_t>(t)], t + 1);
            internal::ScaleInPlace(row, stats[2 * static_cast<int64_t>(t) + 1], t + 1);
            std::fill(row + t + 1, row + r1, T(0));
          }
          a_blk = p;
        } else {
          a_blk = att + bh * Tlen * Tlen + static_cast<int64_t>(r0) * Tlen;
        }
        const T* d_blk = d + static_cast<int64_t>(r0) * C;
        const T* p_blk = a_blk;
        if constexpr (kBf16) {
          RoundBlock(p_r.data(), a_blk, rows, r1, Tlen);
          p_blk = p_r.data();
        }
        // dV[0:r1] += att[r0:r1, 0:r1]^T @ dout[r0:r1]
        Gemm(true, false, r1, hs, rows, T(1), p_blk, Tlen, d_blk, C, T(1), dv, ld);
        // datt = dout[r0:r1] @ V[0:r1]^T, then the softmax backward in place.
        Gemm(false, true, rows, r1, hs, T(1), d_blk, C, v, ld, T(0), ds, Tlen);
        for (int t = r0; t < r1; ++t) {
          const T* arow = a_blk + static_cast<int64_t>(t - r0) * Tlen;
          T* drow = ds + static_cast<int64_t>(t - r0) * Tlen;
          T dot = 0;
          for (int j = 0; j <= t; ++j) dot += arow[j] * drow[j];
          for (int j = 0; j <= t; ++j) drow[j] = arow[j] * (drow[j] - dot);
          for (int j = t + 1; j < r1; ++j) drow[j] = 0;
        }
        if constexpr (kBf16) RoundBlock(ds, ds, rows, r1, Tlen);
        // dQ[r0:r1] += scale * dS @ K[0:r1];  dK[0:r1] += scale * dS^T @ Q[r0:r1]
        Gemm(false, false, rows, hs, r1, scale, ds, Tlen, k, ld, T(1),
             dq + static_cast<int64_t>(r0) * ld, ld);
        Gemm(true, false, r1, hs, rows, scale, ds, Tlen, q + static_cast<int64_t>(r0) * ld, ld,
             T(1), dk, ld);
      }
    }
  }
}

}  // namespace

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int B, int Tlen, int C, int NH) {
  Forward<T, false, false>(out, att, qkv, B, Tlen, C, NH);
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tlen, int C,
                       int NH) {
  Backward<T, false, false>(dqkv, dout, qkv, att, B, Tlen, C, NH);
}

template <typename T>
void AttentionProbs(T* att, const T* qkv, int B, int Tlen, int C, int NH) {
  Forward<T, false, false>(nullptr, att, qkv, B, Tlen, C, NH);
}

template <typename T>
void AttentionForwardRowStats(T* out, T* stats, const T* qkv, int B, int Tlen, int C, int NH) {
  Forward<T, false, true>(out, stats, qkv, B, Tlen, C, NH);
}

template <typename T>
void AttentionBackwardRowStats(T* dqkv, const T* dout, const T* qkv, const T* stats, int B,
                               int Tlen, int C, int NH) {
  Backward<T, false, true>(dqkv, dout, qkv, stats, B, Tlen, C, NH);
}

void AttentionForwardBf16(float* out, float* att, const float* qkv, int B, int Tlen, int C,
                          int NH) {
  Forward<float, true, false>(out, att, qkv, B, Tlen, C, NH);
}

void AttentionBackwardBf16(float* dqkv, const float* dout, const float* qkv, const float* att,
                           int B, int Tlen, int C, int NH) {
  Backward<float, true, false>(dqkv, dout, qkv, att, B, Tlen, C, NH);
}

void AttentionProbsBf16(float* att, const float* qkv, int B, int Tlen, int C, int NH) {
  Forward<float, true, false>(nullptr, att, qkv, B, Tlen, C, NH);
}

void AttentionForwardRowStatsBf16(float* out, float* stats, const float* qkv, int B, int Tlen,
                                  int C, int NH) {
  Forward<float, true, true>(out, stats, qkv, B, Tlen, C, NH);
}

void AttentionBackwardRowStatsBf16(float* dqkv, const float* dout, const float* qkv,
                                   const float* stats, int B, int Tlen, int C, int NH) {
  Backward<float, true, true>(dqkv, dout, qkv, stats, B, Tlen, C, NH);
}

#define FURNACE_INSTANTIATE(T)                                                              \
  template void AttentionForward<T>(T*, T*, const T*, int, int, int, int);                  \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, int, int, int, int); \
  template void AttentionProbs<T>(T*, const T*, int, int, int, int);                        \
  template void AttentionForwardRowStats<T>(T*, T*, const T*, int, int, int, int);          \
  template void AttentionBackwardRowStats<T>(T*, const T*, const T*, const T*, int, int, int, int);
FURNACE_INSTANTIATE(float)
FURNACE_INSTANTIATE(double)
#undef FURNACE_INSTANTIATE

}  // namespace furnace::kernels::cpu
