// The emulated bf16 table against the CPU bf16 oracle (kernels/matmul_bf16.h, attention_bf16.h
// on host buffers): every GEMM and attention op bit-identical, op by op, through device copies on
// the emulated device's stream; every other entry is the fp32 emulated table's. And the oracle is
// not the fp32 arithmetic (its results differ), so the comparison cannot pass by accident.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/attention_bf16.h"
#include "kernels/matmul_bf16.h"
#include "runtime/device/backend.h"
#include "tests/runtime/device/emulated_backend_fixture.h"

namespace furnace::device {
namespace {

namespace k = kernels::cpu;
using testing_util::Bytes;
using testing_util::EmulatedBackendTest;
using testing_util::P;
using testing_util::Ptrs;
using testing_util::Random;
using testing_util::Zeros;

// The CPU table with the bf16 oracle kernels: what the emulated bf16 table must compute.
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

class EmulatedBf16BackendTest : public EmulatedBackendTest {
 protected:
  // The op through the oracle and the emulated bf16 table (bit-identical), and through the fp32
  // CPU table, whose results must differ somewhere (the roundings happened).
  std::vector<Bytes> Check(const std::vector<Bytes>& buffers,
                           const std::function<void(const Backend&, const Ptrs&)>& op) {
    const Backend oracle = Bf16Oracle();
    std::vector<Bytes> bf16 = ExpectSameAs(oracle, EmulatedBf16Backend(), buffers, op);
    std::vector<Bytes> fp32 = buffers;
    Ptrs host;
    for (Bytes& b : fp32) host.push_back(b.data());
    op(CpuBackend(), host);
    EXPECT_NE(bf16, fp32) << "the bf16 oracle computed the fp32 result";
    return bf16;
  }
};

constexpr int N = 24, C = 40, OC = 36, E = 3;

TEST_F(EmulatedBf16BackendTest, OnlyTheGemmsAndAttentionDiffer) {
  const Backend& f = EmulatedBackend();
  const Backend& b = EmulatedBf16Backend();
  EXPECT_STREQ(b.name, "emulated/bf16");
  EXPECT_EQ(b.precision, Precision::kBf16);
  EXPECT_NE(b.matmul_forward, f.matmul_forward);
  EXPECT_NE(b.matmul_backward, f.matmul_backward);
  EXPECT_NE(b.grouped_matmul_forward, f.grouped_matmul_forward);
  EXPECT_NE(b.grouped_matmul_backward, f.grouped_matmul_backward);
  EXPECT_NE(b.attention_forward, f.attention_forward);
  EXPECT_NE(b.attention_backward, f.attention_backward);
  EXPECT_NE(b.attention_forward_row_stats, f.attention_forward_row_stats);
  EXPECT_NE(b.attention_backward_row_stats, f.attention_backward_row_stats);
  EXPECT_NE(b.attention_probs, f.attention_probs);
  EXPECT_EQ(b.layernorm_forward, f.layernorm_forward);
  EXPECT_EQ(b.layernorm_backward, f.layernorm_backward);
  EXPECT_EQ(b.gelu_forward, f.gelu_forward);
  EXPECT_EQ(b.add_inplace, f.add_inplace);
  EXPECT_EQ(b.add_row, f.add_row);
  EXPECT_EQ(b.embedding_backward, f.embedding_backward);
  EXPECT_EQ(b.cross_entropy_forward, f.cross_entropy_forward);
  EXPECT_EQ(b.softmax_forward, f.softmax_forward);
  EXPECT_EQ(b.topk_forward, f.topk_forward);
  EXPECT_EQ(b.aux_loss_forward, f.aux_loss_forward);
  EXPECT_EQ(b.permute_forward, f.permute_forward);
  EXPECT_EQ(b.unpermute_backward, f.unpermute_backward);
  EXPECT_EQ(b.adamw_update, f.adamw_update);
  EXPECT_EQ(b.sum_of_squares, f.sum_of_squares);
  EXPECT_EQ(b.sum_of_squares_ranges, f.sum_of_squares_ranges);
  EXPECT_EQ(b.cast_f32_to_bf16, f.cast_f32_to_bf16);
}

TEST_F(EmulatedBf16BackendTest, Matmul) {
  Check({Random(N * OC, 90), Random(N * C, 1), Random(C * OC, 2), Random(OC, 3)},
        [](const Backend& b, const Ptrs& p) {
          b.matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3), N, C,
                           OC);
        });
  Check({Random(N * C, 4), Random(C * OC, 5), Random(OC, 6), Random(N * OC, 7), Random(N * C, 8),
         Random(C * OC, 9)},
        [](const Backend& b, const Ptrs& p) {
          b.matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                            P<float>(p, 4), P<float>(p, 5), N, C, OC);
        });
  // No dinp and no bias.
  Check({Random(C * OC, 10), Random(N * OC, 11), Random(N * C, 12), Random(C * OC, 13)},
        [](const Backend& b, const Ptrs& p) {
          b.matmul_backward(nullptr, P<float>(p, 0), nullptr, P<float>(p, 1), P<float>(p, 2),
                            P<float>(p, 3), N, C, OC);
        });
}

TEST_F(EmulatedBf16BackendTest, GroupedMatmulWithHostOffsets) {
  const std::vector<int64_t> offsets = {0, 7, 7, N};  // one empty group
  Check({Random(N * OC, 91), Random(N * C, 1), Random(E * C * OC, 2), Random(E * OC, 3)},
        [&](const Backend& b, const Ptrs& p) {
          b.grouped_matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                   offsets.data(), E, C, OC);
        });
  Check({Random(N * C, 4), Random(E * C * OC, 5), Random(E * OC, 6), Random(N * OC, 7),
         Random(N * C, 8), Random(E * C * OC, 9)},
        [&](const Backend& b, const Ptrs& p) {
          b.grouped_matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                    P<float>(p, 4), P<float>(p, 5), offsets.data(), E, C, OC);
        });
}

TEST_F(EmulatedBf16BackendTest, Attention) {
  constexpr int B = 2, T = 9, AC = 16, NH = 2;
  std::vector<Bytes> fwd =
      Check({Random(B * T * AC, 92), Random(B * NH * T * T, 93), Random(B * T * 3 * AC, 1, -2, 2)},
            [](const Backend& b, const Ptrs& p) {
              b.attention_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), B, T, AC, NH);
            });
  Check({Random(B * T * 3 * AC, 3), Random(B * T * AC, 2), fwd[2], fwd[1]},
        [](const Backend& b, const Ptrs& p) {
          b.attention_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3), B, T,
                               AC, NH);
        });
  // The RowStats pair: the same out and dqkv as the stored pair, bit for bit.
  std::vector<Bytes> fwd_rs = Check(
      {Random(B * T * AC, 92), Random(B * NH * T * 2, 94), Random(B * T * 3 * AC, 1, -2, 2)},
      [](const Backend& b, const Ptrs& p) {
        b.attention_forward_row_stats(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), B, T, AC, NH);
      });
  EXPECT_EQ(fwd_rs[0], fwd[0]);
  std::vector<Bytes> bwd =
      Check({Random(B * T * 3 * AC, 3), Random(B * T * AC, 2), fwd[2], fwd[1]},
            [](const Backend& b, const Ptrs& p) {
              b.attention_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                   B, T, AC, NH);
            });
  std::vector<Bytes> bwd_rs =
      Check({Random(B * T * 3 * AC, 3), Random(B * T * AC, 2), fwd_rs[2], fwd_rs[1]},
            [](const Backend& b, const Ptrs& p) {
              b.attention_backward_row_stats(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                             P<float>(p, 3), B, T, AC, NH);
            });
  EXPECT_EQ(bwd_rs[0], bwd[0]);
  // The probabilities alone: the forward's att.
  std::vector<Bytes> probs =
      Check({Random(B * NH * T * T, 95), Random(B * T * 3 * AC, 1, -2, 2)},
            [](const Backend& b, const Ptrs& p) {
              b.attention_probs(P<float>(p, 0), P<float>(p, 1), B, T, AC, NH);
            });
  EXPECT_EQ(probs[0], fwd[1]);
}

}  // namespace
}  // namespace furnace::device
