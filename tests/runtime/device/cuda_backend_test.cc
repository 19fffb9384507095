// Every entry of the CUDA fp32 table against the CPU table (the oracle), on fresh random inputs of
// two or three shapes each, through device copies on a stream of the CUDA device (the fixture:
// cuda_backend_fixture.h). Outputs the op overwrites start as NaN; accumulated ones start random.
// Tolerances (||got - want|| / ||want||): 0 (bit-identical) where the arithmetic is the same
// operations in the same order (the residual adds, transpose, embedding forward, permute forward,
// scale, the casts); kSum = 1e-5 where fp32 sums run in another order (cuBLAS vs OpenBLAS, warp
// reductions, atomics) or the math library differs (expf vs the CPU's exp in GELU, FMA
// contraction); kElementwise = 1e-6 for elementwise formulas that FMA contraction alone changes.
// gpu label: skips without a GPU.
#include "runtime/device/cuda_backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/device/backend.h"
#include "tests/runtime/device/cuda_backend_fixture.h"

namespace furnace::device {
namespace {

using testing_util::Bytes;
using testing_util::Check;
using testing_util::CudaBackendTest;
using testing_util::FromBytes;
using testing_util::Ints;
using testing_util::P;
using testing_util::Poison;
using testing_util::Ptrs;
using testing_util::Random;

constexpr Check kExact{0};
constexpr Check kSum{1e-5};
constexpr Check kElementwise{1e-6};

class CudaFp32TableTest : public CudaBackendTest {
 protected:
  std::vector<Bytes> Same(const std::string& what, const std::vector<Bytes>& buffers,
                          const std::vector<Check>& checks,
                          const std::function<void(const Backend&, const Ptrs&)>& op) {
    return Compare(what, CpuBackend(), CudaBackend(), buffers, checks, op);
  }
};

struct Gemm {
  int N, C, OC;
};
constexpr Gemm kGemms[] = {{45, 70, 33}, {256, 512, 384}, {1, 128, 1000}};

TEST_F(CudaFp32TableTest, Matmul) {
  uint32_t seed = 1;
  for (const Gemm g : kGemms) {
    const int N = g.N, C = g.C, OC = g.OC;
    Same("matmul_forward",
         {Poison(N * OC), Random(N * C, seed++), Random(C * OC, seed++), Random(OC, seed++)},
         {kSum}, [&](const Backend& b, const Ptrs& p) {
           b.matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3), N, C,
                            OC);
         });
    Same("matmul_forward (no bias)",
         {Poison(N * OC), Random(N * C, seed++), Random(C * OC, seed++)}, {kSum},
         [&](const Backend& b, const Ptrs& p) {
           b.matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), nullptr, N, C, OC);
         });
    Same("matmul_backward",
         {Random(N * C, seed++), Random(C * OC, seed++), Random(OC, seed++), Random(N * OC, seed++),
          Random(N * C, seed++), Random(C * OC, seed++)},
         {kSum, kSum, kSum}, [&](const Backend& b, const Ptrs& p) {
           b.matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                             P<float>(p, 4), P<float>(p, 5), N, C, OC);
         });
    Same("matmul_backward (no dinp, no dbias)",
         {Random(C * OC, seed++), Random(N * OC, seed++), Random(N * C, seed++),
          Random(C * OC, seed++)},
         {kSum}, [&](const Backend& b, const Ptrs& p) {
           b.matmul_backward(nullptr, P<float>(p, 0), nullptr, P<float>(p, 1), P<float>(p, 2),
                             P<float>(p, 3), N, C, OC);
         });
  }
}

TEST_F(CudaFp32TableTest, GroupedMatmul) {
  uint32_t seed = 100;
  constexpr int C = 96, OC = 80;
  // Balanced, skewed with empty groups, and a single expert.
  const std::vector<std::vector<int64_t>> layouts = {
      {0, 30, 60, 90, 120}, {0, 0, 113, 113, 120}, {0, 57}};
  for (const auto& offsets : layouts) {
    const int E = static_cast<int>(offsets.size()) - 1;
    const int S = static_cast<int>(offsets.back());
    Same(
        "grouped_matmul_forward",
        {Poison(S * OC), Random(S * C, seed++), Random(E * C * OC, seed++), Random(E * OC, seed++)},
        {kSum}, [&](const Backend& b, const Ptrs& p) {
          b.grouped_matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                   offsets.data(), E, C, OC);
        });
    Same("grouped_matmul_backward",
         {Random(S * C, seed++), Random(E * C * OC, seed++), Random(E * OC, seed++),
          Random(S * OC, seed++), Random(S * C, seed++), Random(E * C * OC, seed++)},
         {kSum, kSum, kSum}, [&](const Backend& b, const Ptrs& p) {
           b.grouped_matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                     P<float>(p, 4), P<float>(p, 5), offsets.data(), E, C, OC);
         });
  }
}

TEST_F(CudaFp32TableTest, Attention) {
  uint32_t seed = 200;
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape s : {Shape{2, 19, 48, 4}, Shape{1, 130, 256, 2}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    std::vector<Bytes> fwd =
        Same("attention_forward",
             {Poison(B * T * C), Poison(B * NH * T * T), Random(B * T * 3 * C, seed++, -2, 2)},
             {kSum, kSum}, [&](const Backend& b, const Ptrs& p) {
               b.attention_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), B, T, C, NH);
             });
    // The probabilities alone (the planner's rebuild of a dropped att), from the same qkv.
    Same("attention_probs", {Poison(B * NH * T * T), fwd[2]}, {kSum},
         [&](const Backend& b, const Ptrs& p) {
           b.attention_probs(P<float>(p, 0), P<float>(p, 1), B, T, C, NH);
         });
    // The backward from the CPU's probabilities of the same qkv (the device's differ in the last
    // bits; both tables must get the same input).
    std::vector<float> out(B * T * C), att(B * NH * T * T);
    const std::vector<float> qkv = FromBytes<float>(fwd[2]);
    CpuBackend().attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    Same("attention_backward",
         {Random(B * T * 3 * C, seed++), Random(B * T * C, seed++), fwd[2],
          testing_util::AsBytes(att)},
         {kSum}, [&](const Backend& b, const Ptrs& p) {
           b.attention_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3), B,
                                T, C, NH);
         });
  }
}

// The RowStats pair: one query block at the small shapes, two (896 rows and a partial 204) at
// T 1100 with 16 heads (kernels/cuda/attention.h's automatic block).
TEST_F(CudaFp32TableTest, AttentionRowStats) {
  uint32_t seed = 250;
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape s : {Shape{2, 19, 48, 4}, Shape{1, 130, 256, 2}, Shape{1, 1100, 256, 16}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    const int64_t n_qkv = int64_t{B} * T * 3 * C, n_out = int64_t{B} * T * C;
    const int64_t n_stats = int64_t{B} * NH * T * 2;
    std::vector<Bytes> fwd = Same("attention_forward_row_stats",
                                  {Poison(n_out), Poison(n_stats), Random(n_qkv, seed++, -2, 2)},
                                  {kSum, kSum}, [&](const Backend& b, const Ptrs& p) {
                                    b.attention_forward_row_stats(P<float>(p, 0), P<float>(p, 1),
                                                                  P<float>(p, 2), B, T, C, NH);
                                  });
    // The backward from the CPU's statistics of the same qkv (both tables get the same input).
    std::vector<float> out(n_out), stats(n_stats);
    const std::vector<float> qkv = FromBytes<float>(fwd[2]);
    CpuBackend().attention_forward_row_stats(out.data(), stats.data(), qkv.data(), B, T, C, NH);
    Same("attention_backward_row_stats",
         {Random(n_qkv, seed++), Random(n_out, seed++), fwd[2], testing_util::AsBytes(stats)},
         {kSum}, [&](const Backend& b, const Ptrs& p) {
           b.attention_backward_row_stats(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                          P<float>(p, 3), B, T, C, NH);
         });
  }
}

TEST_F(CudaFp32TableTest, LayerNormAndGelu) {
  uint32_t seed = 300;
  for (auto [N, C] : {std::pair{37, 200}, std::pair{512, 2048}}) {
    std::vector<Bytes> fwd =
        Same("layernorm_forward",
             {Poison(N * C), Poison(N), Poison(N), Random(N * C, seed++, -2, 3), Random(C, seed++),
              Random(C, seed++)},
             {kSum, kSum, kSum}, [&](const Backend& b, const Ptrs& p) {
               b.layernorm_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                   P<float>(p, 4), P<float>(p, 5), N, C, 1e-5f);
             });
    // The backward from the CPU's saved mean and rstd.
    std::vector<float> out(N * C), mean(N), rstd(N);
    const auto inp = FromBytes<float>(fwd[3]), w = FromBytes<float>(fwd[4]),
               bias = FromBytes<float>(fwd[5]);
    CpuBackend().layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                   bias.data(), N, C, 1e-5f);
    Same("layernorm_backward",
         {Random(N * C, seed++), Random(C, seed++), Random(C, seed++), Random(N * C, seed++),
          fwd[3], fwd[4], testing_util::AsBytes(mean), testing_util::AsBytes(rstd)},
         {kSum, kSum, kSum}, [&](const Backend& b, const Ptrs& p) {
           b.layernorm_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                P<float>(p, 4), P<float>(p, 5), P<float>(p, 6), P<float>(p, 7), N,
                                C);
         });
    const int64_t n = int64_t{N} * C;
    Same("gelu_forward", {Poison(n), Random(n, seed++, -5, 5)}, {kSum},
         [&](const Backend& b, const Ptrs& p) {
           b.gelu_forward(P<float>(p, 0), P<float>(p, 1), n);
         });
    Same("gelu_backward", {Random(n, seed++), Random(n, seed++, -5, 5), Random(n, seed++)}, {kSum},
         [&](const Backend& b, const Ptrs& p) {
           b.gelu_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), n);
         });
  }
}

TEST_F(CudaFp32TableTest, ResidualAddsAndTransposeAreBitIdentical) {
  uint32_t seed = 400;
  for (auto [N, C] : {std::pair{24, 16}, std::pair{1000, 2048}, std::pair{33, 65}}) {
    const int64_t n = int64_t{N} * C;
    Same(
        "add_inplace", {Random(n, seed++), Random(n, seed++)}, {kExact},
        [&](const Backend& b, const Ptrs& p) { b.add_inplace(P<float>(p, 0), P<float>(p, 1), n); });
    Same("bias_residual", {Random(n, seed++), Random(C, seed++), Random(n, seed++)}, {kExact},
         [&](const Backend& b, const Ptrs& p) {
           b.bias_residual(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), N, C);
         });
    const std::vector<float> row = FromBytes<float>(Random(C, seed++));  // host memory
    Same("add_row", {Random(n, seed++)}, {kExact},
         [&](const Backend& b, const Ptrs& p) { b.add_row(P<float>(p, 0), row.data(), N, C); });
    Same("transpose", {Poison(n), Random(n, seed++)}, {kExact},
         [&](const Backend& b, const Ptrs& p) {
           b.transpose(P<float>(p, 0), P<float>(p, 1), N, C);
         });
  }
}

TEST_F(CudaFp32TableTest, EmbeddingAndCrossEntropy) {
  uint32_t seed = 500;
  struct Shape {
    int B, T, C, V;
  };
  for (const Shape s : {Shape{2, 5, 16, 11}, Shape{4, 256, 512, 1000}}) {
    const int B = s.B, T = s.T, C = s.C, V = s.V, N = B * T;
    Same("embedding_forward",
         {Poison(N * C), Ints(N, V, seed++), Random(V * C, seed++), Random(T * C, seed++)},
         {kExact}, [&](const Backend& b, const Ptrs& p) {
           b.embedding_forward(P<float>(p, 0), P<int32_t>(p, 1), P<float>(p, 2), P<float>(p, 3), B,
                               T, C);
         });
    Same("embedding_backward",  // adds in the CPU's order (encoder.h): the same bits
         {Random(V * C, seed++), Random(T * C, seed++), Random(N * C, seed++), Ints(N, V, seed++)},
         {kExact, kExact}, [&](const Backend& b, const Ptrs& p) {
           b.embedding_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<int32_t>(p, 3), B,
                                T, C);
         });
    std::vector<Bytes> fwd =
        Same("cross_entropy_forward",
             {Poison(N), Poison(N * V), Random(N * V, seed++, -4, 4), Ints(N, V, seed++)},
             {kSum, kSum}, [&](const Backend& b, const Ptrs& p) {
               b.cross_entropy_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                       P<int32_t>(p, 3), N, V);
             });
    Same("cross_entropy_backward", {Random(N * V, seed++), fwd[1], fwd[3]}, {kElementwise},
         [&](const Backend& b, const Ptrs& p) {
           b.cross_entropy_backward(P<float>(p, 0), P<float>(p, 1), P<int32_t>(p, 2), 1.0f / N, N,
                                    V);
         });
  }
}

TEST_F(CudaFp32TableTest, RouterPermuteAndTheHostScalars) {
  uint32_t seed = 600;
  struct Shape {
    int N, E, K, C;
    double capacity;
  };
  for (const Shape s :
       {Shape{24, 3, 2, 16, 1.0}, Shape{2048, 64, 2, 256, 0.0}, Shape{512, 8, 1, 128, 1.25}}) {
    const int N = s.N, E = s.E, K = s.K, C = s.C;
    std::vector<Bytes> probs =
        Same("softmax_forward", {Poison(N * E), Random(N * E, seed++, -2, 2)}, {kSum},
             [&](const Backend& b, const Ptrs& p) {
               b.softmax_forward(P<float>(p, 0), P<float>(p, 1), N, E);
             });
    // The router's later ops read the CPU's probabilities (identical inputs on both sides).
    std::vector<float> cpu_probs(N * E);
    const std::vector<float> logits = FromBytes<float>(probs[1]);
    CpuBackend().softmax_forward(cpu_probs.data(), logits.data(), N, E);
    const Bytes pb = testing_util::AsBytes(cpu_probs);
    Same("softmax_backward", {Random(N * E, seed++), Random(N * E, seed++), pb}, {kSum},
         [&](const Backend& b, const Ptrs& p) {
           b.softmax_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), N, E);
         });
    std::vector<Bytes> top =
        Same("topk_forward", {Bytes(N * K * 4, char(0xff)), Poison(N * K), pb},
             {kExact, kElementwise}, [&](const Backend& b, const Ptrs& p) {
               b.topk_forward(P<int32_t>(p, 0), P<float>(p, 1), P<float>(p, 2), N, E, K, true);
             });
    Same("topk_backward", {Random(N * E, seed++), Random(N * K, seed++), pb, top[0]},
         {kElementwise}, [&](const Backend& b, const Ptrs& p) {
           b.topk_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<int32_t>(p, 3), N, E,
                           K, true);
         });
    Same("aux_loss_backward", {Random(N * E, seed++), top[0]}, {kElementwise},
         [&](const Backend& b, const Ptrs& p) {
           b.aux_loss_backward(P<float>(p, 0), P<int32_t>(p, 1), N, E, K, 0.01f, 1.0f);
         });

    // The plan is built on the host from host indices; the device ops get it uploaded.
    const std::vector<int32_t> indices = FromBytes<int32_t>(top[0]);
    const DispatchPlan plan = CudaBackend().make_dispatch_plan(indices.data(), N, E, K, s.capacity);
    const int64_t S = plan.rows();
    const Bytes gates = top[1];
    Same("permute_forward", {Poison(S * C), Random(N * C, seed++)}, {kExact},
         [&](const Backend& b, const Ptrs& p) {
           b.permute_forward(P<float>(p, 0), P<float>(p, 1), plan, C);
         });
    Same("permute_backward", {Random(N * C, seed++), Random(S * C, seed++)}, {kElementwise},
         [&](const Backend& b, const Ptrs& p) {
           b.permute_backward(P<float>(p, 0), P<float>(p, 1), plan, C);
         });
    Same("unpermute_forward", {Poison(N * C), Random(S * C, seed++), gates}, {kElementwise},
         [&](const Backend& b, const Ptrs& p) {
           b.unpermute_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), plan, C);
         });
    Same("unpermute_backward",
         {Random(S * C, seed++), Random(N * K, seed++), Random(N * C, seed++),
          Random(S * C, seed++), gates},
         {kElementwise, kSum}, [&](const Backend& b, const Ptrs& p) {
           b.unpermute_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                P<float>(p, 4), plan, C);
         });

    // Host scalars: the op synchronizes its stream and returns the value.
    float aux_cpu = 0, aux_cuda = 0;
    double sum_cpu = 0, sum_cuda = 0, ranges_cpu = 0, ranges_cuda = 0;
    const int64_t NC = int64_t{N} * C;
    const int64_t begin[3] = {0, NC / 3, NC / 2}, count[3] = {NC / 4, 0, NC - NC / 2};
    Same("aux_loss_forward, sum_of_squares, scale", {pb, top[0], Random(N * C, seed++)},
         {kExact, kExact, kExact}, [&](const Backend& b, const Ptrs& p) {
           const bool cpu = &b == &CpuBackend();
           (cpu ? aux_cpu : aux_cuda) =
               b.aux_loss_forward(P<float>(p, 0), P<int32_t>(p, 1), N, E, K, 0.01f);
           (cpu ? sum_cpu : sum_cuda) = b.sum_of_squares(P<float>(p, 2), NC);
           (cpu ? ranges_cpu : ranges_cuda) =
               b.sum_of_squares_ranges(P<float>(p, 2), begin, count, 3);
           b.scale(P<float>(p, 2), 0.5f, NC);
         });
    EXPECT_NEAR(aux_cuda, aux_cpu, 1e-5 * std::fabs(aux_cpu)) << N << " tokens, " << E;
    EXPECT_NEAR(sum_cuda, sum_cpu, 1e-12 * sum_cpu);
    EXPECT_NEAR(ranges_cuda, ranges_cpu, 1e-12 * ranges_cpu);
    EXPECT_GT(ranges_cpu, 0.0);
    EXPECT_LT(ranges_cpu, sum_cpu);
    EXPECT_GT(sum_cpu, 0.0);
  }
}

TEST_F(CudaFp32TableTest, AdamWAndCasts) {
  uint32_t seed = 700;
  for (int64_t n : {int64_t{1000}, int64_t{1} << 20}) {
    Same("adamw_update",
         {Random(n, seed++), Random(n, seed++), Random(n, seed++, 0, 0.1f),
          Random(n, seed++, 0, 0.01f)},
         {kElementwise, kExact, kElementwise, kElementwise}, [&](const Backend& b, const Ptrs& p) {
           b.adamw_update(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3), n, 1e-3f,
                          0.9f, 0.95f, 1e-8f, 0.1f, 3);
         });
    std::vector<Bytes> bf16 =
        Same("cast_f32_to_bf16", {Bytes(n * 2, char(0x7f)), Random(n, seed++, -100, 100)}, {kExact},
             [&](const Backend& b, const Ptrs& p) {
               b.cast_f32_to_bf16(P<uint16_t>(p, 0), P<float>(p, 1), n);
             });
    Same("cast_bf16_to_f32", {Poison(n), bf16[0]}, {kExact}, [&](const Backend& b, const Ptrs& p) {
      b.cast_bf16_to_f32(P<float>(p, 0), P<uint16_t>(p, 1), n);
    });
    constexpr int block = 128;
    const int64_t blocks = (n + block - 1) / block;
    std::vector<Bytes> fp8 = Same(
        "quantize_fp8_e4m3", {Bytes(n, char(0x7f)), Poison(blocks), Random(n, seed++, -50, 50)},
        {kExact, kExact}, [&](const Backend& b, const Ptrs& p) {
          b.quantize_fp8_e4m3(P<uint8_t>(p, 0), P<float>(p, 1), P<float>(p, 2), n, block);
        });
    Same("dequantize_fp8_e4m3", {Poison(n), fp8[0], fp8[1]}, {kExact},
         [&](const Backend& b, const Ptrs& p) {
           b.dequantize_fp8_e4m3(P<float>(p, 0), P<uint8_t>(p, 1), P<float>(p, 2), n, block);
         });
  }
}

}  // namespace
}  // namespace furnace::device
