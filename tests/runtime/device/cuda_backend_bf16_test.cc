// The CUDA bf16 table against the CPU bf16 oracle (kernels/matmul_bf16.h, attention_bf16.h: the
// same roundings, so only the order of fp32 sums differs: kSameRounding) and against the fp32 CPU
// table (the stated bounds of backend.h, and more than 1e-4: the operands were rounded), at small
// odd shapes and at the 1B-class MoE's (d 2048, f 5632). Every entry that is not a GEMM or
// attention is the fp32 table's. gpu label: skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/attention_bf16.h"
#include "kernels/matmul_bf16.h"
#include "runtime/device/backend.h"
#include "runtime/device/cuda_backend.h"
#include "tests/runtime/device/cuda_backend_fixture.h"

namespace furnace::device {
namespace {

namespace k = kernels::cpu;
using testing_util::Bytes;
using testing_util::Check;
using testing_util::CudaBackendTest;
using testing_util::FromBytes;
using testing_util::P;
using testing_util::Poison;
using testing_util::Ptrs;
using testing_util::Random;
using testing_util::RelativeError;

// GEMMs on identical bf16 operands: fp32 sums in another order (and the tensor cores' adders,
// which published measurements of Hopper describe as truncating, not rounding, in the fp32
// accumulator: estimated 6-9e-6 norm-relative at an inner dimension of 5632, so the bound leaves
// room above that; a wrong rounding of the operands is off by ~1e-3, far above it either way).
constexpr Check kSameRounding{3e-5};
// Attention: the device's fp32 probabilities and dS differ from the CPU's in the last bits, so a
// rare element rounds to the neighbouring bf16 value.
constexpr Check kSameRoundingAttention{1e-4};

Backend Bf16Oracle() {
  Backend b = CpuBackend();
  b.name = "cpu bf16 oracle";
  b.precision = Precision::kBf16;
  b.matmul_forward = &k::MatmulForwardBf16;
  b.matmul_backward = &k::MatmulBackwardBf16;
  b.grouped_matmul_forward = &k::GroupedMatmulForwardBf16;
  b.grouped_matmul_backward = &k::GroupedMatmulBackwardBf16;
  b.attention_forward = &k::AttentionForwardBf16;
  b.attention_backward = &k::AttentionBackwardBf16;
  b.attention_forward_row_stats = &k::AttentionForwardRowStatsBf16;
  b.attention_backward_row_stats = &k::AttentionBackwardRowStatsBf16;
  b.attention_probs = &k::AttentionProbsBf16;
  return b;
}

class CudaBf16TableTest : public CudaBackendTest {
 protected:
  // The op against the bf16 oracle (same_rounding) and against fp32 (bound, and not equal).
  void Both(const std::string& what, const std::vector<Bytes>& buffers,
            const std::vector<int>& outputs, Check same_rounding, double bound,
            const std::function<void(const Backend&, const Ptrs&)>& op) {
    std::vector<Check> oracle_checks(buffers.size()), fp32_checks(buffers.size());
    for (int i : outputs) {
      oracle_checks[i] = same_rounding;
      fp32_checks[i] = Check{bound};
    }
    const Backend oracle = Bf16Oracle();
    std::vector<Bytes> got =
        Compare(what + " vs bf16 oracle", oracle, CudaBf16Backend(), buffers, oracle_checks, op);
    std::vector<Bytes> fp32 = buffers;
    Ptrs host;
    for (Bytes& b : fp32) host.push_back(b.data());
    op(CpuBackend(), host);
    for (int i : outputs) {
      const double error = RelativeError(FromBytes<float>(got[i]), FromBytes<float>(fp32[i]));
      std::printf("cuda bf16 vs fp32: %-40s buffer %d: %.2e\n", what.c_str(), i, error);
      EXPECT_LE(error, bound) << what << " buffer " << i;
      EXPECT_GT(error, 1e-4) << what << " buffer " << i << ": nothing was rounded";
    }
  }
};

TEST_F(CudaBf16TableTest, TableIsTheFp32OneExceptTheGemmsAndAttention) {
  const Backend& f = CudaBackend();
  const Backend& b = CudaBf16Backend();
  EXPECT_EQ(b.precision, Precision::kBf16);
  EXPECT_EQ(b.layernorm_forward, f.layernorm_forward);
  EXPECT_EQ(b.gelu_backward, f.gelu_backward);
  EXPECT_EQ(b.permute_backward, f.permute_backward);
  EXPECT_EQ(b.aux_loss_forward, f.aux_loss_forward);
  EXPECT_EQ(b.adamw_update, f.adamw_update);
  EXPECT_NE(b.matmul_forward, f.matmul_forward);
  EXPECT_NE(b.attention_backward, f.attention_backward);
  EXPECT_NE(b.attention_forward_row_stats, f.attention_forward_row_stats);
  EXPECT_NE(b.attention_backward_row_stats, f.attention_backward_row_stats);
  EXPECT_NE(b.attention_probs, f.attention_probs);
}

struct Gemm {
  int N, C, OC;
};

TEST_F(CudaBf16TableTest, Matmul) {
  uint32_t seed = 1;
  for (const Gemm g : {Gemm{45, 70, 33}, Gemm{512, 2048, 5632}, Gemm{512, 5632, 2048}}) {
    const int N = g.N, C = g.C, OC = g.OC;
    Both("matmul_forward",
         {Poison(N * OC), Random(N * C, seed++), Random(C * OC, seed++), Random(OC, seed++)}, {0},
         kSameRounding, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
           b.matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3), N, C,
                            OC);
         });
    Both("matmul_backward",
         {Random(N * C, seed++), Random(C * OC, seed++), Random(OC, seed++), Random(N * OC, seed++),
          Random(N * C, seed++), Random(C * OC, seed++)},
         {0, 1}, kSameRounding, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
           b.matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                             P<float>(p, 4), P<float>(p, 5), N, C, OC);
         });
    // The bias gradient is an fp32 sum in both tables.
    Compare("matmul_backward (bias, no dinp)", CpuBackend(), CudaBf16Backend(),
            {Random(C * OC, seed++), Random(OC, seed++), Random(N * OC, seed++),
             Random(N * C, seed++), Random(C * OC, seed++)},
            {Check{kBf16MatmulTolerance}, Check{1e-5}}, [&](const Backend& b, const Ptrs& p) {
              b.matmul_backward(nullptr, P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                P<float>(p, 3), P<float>(p, 4), N, C, OC);
            });
  }
}

TEST_F(CudaBf16TableTest, GroupedMatmul) {
  uint32_t seed = 100;
  struct Layout {
    int C, OC;
    std::vector<int64_t> offsets;
  };
  for (const Layout& l :
       {Layout{96, 80, {0, 0, 113, 113, 120}}, Layout{2048, 5632, {0, 700, 900, 900, 1024}}}) {
    const int C = l.C, OC = l.OC, E = static_cast<int>(l.offsets.size()) - 1;
    const int S = static_cast<int>(l.offsets.back());
    const int64_t* offsets = l.offsets.data();
    Both("grouped_matmul_forward",
         {Poison(S * OC), Random(S * C, seed++), Random(int64_t{E} * C * OC, seed++),
          Random(E * OC, seed++)},
         {0}, kSameRounding, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
           b.grouped_matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                    offsets, E, C, OC);
         });
    Both("grouped_matmul_backward",
         {Random(S * C, seed++), Random(int64_t{E} * C * OC, seed++), Random(E * OC, seed++),
          Random(S * OC, seed++), Random(S * C, seed++), Random(int64_t{E} * C * OC, seed++)},
         {0, 1}, kSameRounding, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
           b.grouped_matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                     P<float>(p, 4), P<float>(p, 5), offsets, E, C, OC);
         });
  }
}

TEST_F(CudaBf16TableTest, Attention) {
  uint32_t seed = 200;
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape s : {Shape{2, 19, 48, 4}, Shape{1, 1024, 2048, 16}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    const Bytes qkv = Random(int64_t{B} * T * 3 * C, seed++, -2, 2);
    Both("attention_forward", {Poison(int64_t{B} * T * C), Poison(int64_t{B} * NH * T * T), qkv},
         {0, 1}, kSameRoundingAttention, kBf16AttentionTolerance,
         [&](const Backend& b, const Ptrs& p) {
           b.attention_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), B, T, C, NH);
         });
    Both("attention_probs", {Poison(int64_t{B} * NH * T * T), qkv}, {0}, kSameRoundingAttention,
         kBf16AttentionTolerance, [&](const Backend& b, const Ptrs& p) {
           b.attention_probs(P<float>(p, 0), P<float>(p, 1), B, T, C, NH);
         });
    std::vector<float> out(int64_t{B} * T * C), att(int64_t{B} * NH * T * T);
    const std::vector<float> q = FromBytes<float>(qkv);
    CpuBackend().attention_forward(out.data(), att.data(), q.data(), B, T, C, NH);
    Both("attention_backward",
         {Random(int64_t{B} * T * 3 * C, seed++), Random(int64_t{B} * T * C, seed++), qkv,
          testing_util::AsBytes(att)},
         {0}, kSameRoundingAttention, kBf16AttentionTolerance,
         [&](const Backend& b, const Ptrs& p) {
           b.attention_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3), B,
                                T, C, NH);
         });
  }
}

// The RowStats pair: one query block at T 19, two (896 rows and a partial 204) at T 1100 with 16
// heads (kernels/cuda/attention.h's automatic block).
TEST_F(CudaBf16TableTest, AttentionRowStats) {
  uint32_t seed = 250;
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape s : {Shape{2, 19, 48, 4}, Shape{1, 1100, 256, 16}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    const int64_t n_qkv = int64_t{B} * T * 3 * C, n_out = int64_t{B} * T * C;
    const int64_t n_stats = int64_t{B} * NH * T * 2;
    const Bytes qkv = Random(n_qkv, seed++, -2, 2);
    Both("attention_forward_row_stats", {Poison(n_out), Poison(n_stats), qkv}, {0, 1},
         kSameRoundingAttention, kBf16AttentionTolerance, [&](const Backend& b, const Ptrs& p) {
           b.attention_forward_row_stats(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), B, T, C,
                                         NH);
         });
    std::vector<float> out(n_out), stats(n_stats);
    const std::vector<float> q = FromBytes<float>(qkv);
    CpuBackend().attention_forward_row_stats(out.data(), stats.data(), q.data(), B, T, C, NH);
    Both("attention_backward_row_stats",
         {Random(n_qkv, seed++), Random(n_out, seed++), qkv, testing_util::AsBytes(stats)}, {0},
         kSameRoundingAttention, kBf16AttentionTolerance, [&](const Backend& b, const Ptrs& p) {
           b.attention_backward_row_stats(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                          P<float>(p, 3), B, T, C, NH);
         });
  }
}

}  // namespace
}  // namespace furnace::device
