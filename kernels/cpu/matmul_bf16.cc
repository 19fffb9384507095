// The bf16 GEMMs on the CPU: round the operands (a scratch copy per call, freed on return), then
// the fp32 GEMMs of matmul.cc on the rounded copies. Bias terms use the unrounded fp32 values in
// the loop order of matmul.cc, so a bias gradient is bit-identical to the fp32 one.
#include "kernels/matmul_bf16.h"

#include <cstdint>
#include <memory>

#include "kernels/cast.h"
#include "kernels/matmul.h"

namespace furnace::kernels::cpu {
namespace {

// A bf16-rounded copy of x (n floats); not zero-initialised (every element is written).
std::unique_ptr<float[]> Rounded(const float* x, int64_t n) {
  std::unique_ptr<float[]> r(new float[n > 0 ? n : 1]);
  RoundToBf16(r.get(), x, n);
  return r;
}

// dbias (OC) += column sums of dout (rows, OC), as MatmulBackward's loop.
void AccumulateBias(float* dbias, const float* dout, int64_t rows, int OC) {
  for (int64_t n = 0; n < rows; ++n) {
    const float* d = dout + n * OC;
    for (int j = 0; j < OC; ++j) dbias[j] += d[j];
  }
}

}  // namespace

void MatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC) {
  if (N == 0 || OC == 0) return;
  auto inp_r = Rounded(inp, int64_t{N} * C);
  auto weight_r = Rounded(weight, int64_t{C} * OC);
  MatmulForward<float>(out, inp_r.get(), weight_r.get(), bias, N, C, OC);
}

void MatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC) {
  if (N == 0) return;
  auto dout_r = Rounded(dout, int64_t{N} * OC);
  auto inp_r = Rounded(inp, int64_t{N} * C);
  auto weight_r = dinp != nullptr ? Rounded(weight, int64_t{C} * OC) : nullptr;
  MatmulBackward<float>(dinp, dweight, nullptr, dout_r.get(), inp_r.get(),
                        dinp != nullptr ? weight_r.get() : weight, N, C, OC);
  if (dbias != nullptr) AccumulateBias(dbias, dout, N, OC);
}

void GroupedMatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias,
                              const int64_t* offsets, int E, int C, int OC) {
  const int64_t S = offsets[E];
  if (S == 0 || OC == 0) return;
  auto inp_r = Rounded(inp, S * C);
  auto weight_r = Rounded(weight, int64_t{E} * C * OC);
  GroupedMatmulForward<float>(out, inp_r.get(), weight_r.get(), bias, offsets, E, C, OC);
}

void GroupedMatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const int64_t* offsets, int E,
                               int C, int OC) {
  const int64_t S = offsets[E];
  if (S == 0) return;
  auto dout_r = Rounded(dout, S * OC);
  auto inp_r = Rounded(inp, S * C);
  auto weight_r = dinp != nullptr ? Rounded(weight, int64_t{E} * C * OC) : nullptr;
  GroupedMatmulBackward<float>(dinp, dweight, nullptr, dout_r.get(), inp_r.get(),
                               dinp != nullptr ? weight_r.get() : weight, offsets, E, C, OC);
  if (dbias == nullptr) return;
  for (int e = 0; e < E; ++e) {
    const int64_t begin = offsets[e], rows = offsets[e + 1] - begin;
    if (rows > 0) AccumulateBias(dbias + int64_t{e} * OC, dout + begin * OC, rows, OC);
  }
}

}  // namespace furnace::kernels::cpu
