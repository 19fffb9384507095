// The emulated backend against the CPU oracle: each op runs once through the CPU table on host
// buffers and once through the emulated table on device copies of the same buffers (inputs copied
// in and results copied out through the Device interface, the op enqueued on the current stream);
// every buffer must come back bit-identical. Then the stream contract: ops enqueue and return,
// they run on the thread's current stream, and a pointer that is not device memory is a sticky
// error naming the op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/permute.h"
#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"
#include "tests/runtime/device/emulated_backend_fixture.h"

namespace furnace::device {
namespace {

using testing_util::AsBytes;
using testing_util::Bytes;
using testing_util::EmulatedBackendTest;
using testing_util::Ints;
using testing_util::P;
using testing_util::Ptrs;
using testing_util::Random;
using testing_util::Zeros;

TEST_F(EmulatedBackendTest, TableIsTheEmulatedOne) {
  auto by_kind = BackendFor(Kind::kEmulated);
  ASSERT_TRUE(by_kind.ok()) << by_kind.status();
  EXPECT_EQ(*by_kind, &EmulatedBackend());
  EXPECT_STREQ((*by_kind)->name, "emulated");
  auto by_device = BackendFor(*dev_);
  ASSERT_TRUE(by_device.ok());
  EXPECT_EQ(*by_device, &EmulatedBackend());
  EXPECT_STREQ(KindName(Kind::kEmulated), "emulated");
}

constexpr int N = 24, C = 16, OC = 12, E = 3;

TEST_F(EmulatedBackendTest, Matmul) {
  ExpectSameAsCpu({Zeros(N * OC), Random(N * C, 1), Random(C * OC, 2), Random(OC, 3)},
                  [](const Backend& b, const Ptrs& p) {
                    b.matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                     N, C, OC);
                  });
  ExpectSameAsCpu({Random(N * C, 4), Random(C * OC, 5), Random(OC, 6), Random(N * OC, 7),
                   Random(N * C, 8), Random(C * OC, 9)},
                  [](const Backend& b, const Ptrs& p) {
                    b.matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                      P<float>(p, 3), P<float>(p, 4), P<float>(p, 5), N, C, OC);
                  });
}

TEST_F(EmulatedBackendTest, GroupedMatmulWithHostOffsets) {
  const std::vector<int64_t> offsets = {0, 5, 5, N};  // one empty group
  ExpectSameAsCpu({Zeros(N * OC), Random(N * C, 1), Random(E * C * OC, 2), Random(E * OC, 3)},
                  [&](const Backend& b, const Ptrs& p) {
                    b.grouped_matmul_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                             P<float>(p, 3), offsets.data(), E, C, OC);
                  });
  ExpectSameAsCpu({Random(N * C, 4), Random(E * C * OC, 5), Random(E * OC, 6), Random(N * OC, 7),
                   Random(N * C, 8), Random(E * C * OC, 9)},
                  [&](const Backend& b, const Ptrs& p) {
                    b.grouped_matmul_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                              P<float>(p, 3), P<float>(p, 4), P<float>(p, 5),
                                              offsets.data(), E, C, OC);
                  });
}

TEST_F(EmulatedBackendTest, Attention) {
  constexpr int B = 2, T = 6, AC = 8, NH = 2;
  std::vector<Bytes> fwd = ExpectSameAsCpu(
      {Zeros(B * T * AC), Zeros(B * NH * T * T), Random(B * T * 3 * AC, 1)},
      [](const Backend& b, const Ptrs& p) {
        b.attention_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), B, T, AC, NH);
      });
  ExpectSameAsCpu({Zeros(B * T * 3 * AC), Random(B * T * AC, 2), fwd[2], fwd[1]},
                  [](const Backend& b, const Ptrs& p) {
                    b.attention_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                         P<float>(p, 3), B, T, AC, NH);
                  });
  std::vector<Bytes> fwd_rs = ExpectSameAsCpu(
      {Zeros(B * T * AC), Zeros(B * NH * T * 2), Random(B * T * 3 * AC, 1)},
      [](const Backend& b, const Ptrs& p) {
        b.attention_forward_row_stats(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), B, T, AC, NH);
      });
  ExpectSameAsCpu({Zeros(B * T * 3 * AC), Random(B * T * AC, 2), fwd_rs[2], fwd_rs[1]},
                  [](const Backend& b, const Ptrs& p) {
                    b.attention_backward_row_stats(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                                   P<float>(p, 3), B, T, AC, NH);
                  });
  std::vector<Bytes> probs = ExpectSameAsCpu(
      {Random(B * NH * T * T, 3), Random(B * T * 3 * AC, 1)}, [](const Backend& b, const Ptrs& p) {
        b.attention_probs(P<float>(p, 0), P<float>(p, 1), B, T, AC, NH);
      });
  EXPECT_EQ(probs[0], fwd[1]);
}

TEST_F(EmulatedBackendTest, LayerNormAndGelu) {
  std::vector<Bytes> fwd = ExpectSameAsCpu(
      {Zeros(N * C), Zeros(N), Zeros(N), Random(N * C, 1), Random(C, 2), Random(C, 3)},
      [](const Backend& b, const Ptrs& p) {
        b.layernorm_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                            P<float>(p, 4), P<float>(p, 5), N, C, 1e-5f);
      });
  ExpectSameAsCpu(
      {Zeros(N * C), Zeros(C), Zeros(C), Random(N * C, 4), fwd[3], fwd[4], fwd[1], fwd[2]},
      [](const Backend& b, const Ptrs& p) {
        b.layernorm_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                             P<float>(p, 4), P<float>(p, 5), P<float>(p, 6), P<float>(p, 7), N, C);
      });
  ExpectSameAsCpu({Zeros(N * C), Random(N * C, 5, -3, 3)}, [](const Backend& b, const Ptrs& p) {
    b.gelu_forward(P<float>(p, 0), P<float>(p, 1), N * C);
  });
  ExpectSameAsCpu({Zeros(N * C), Random(N * C, 6), Random(N * C, 7)},
                  [](const Backend& b, const Ptrs& p) {
                    b.gelu_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), N * C);
                  });
}

TEST_F(EmulatedBackendTest, ResidualAddsAndTranspose) {
  ExpectSameAsCpu({Random(N * C, 1), Random(N * C, 2)}, [](const Backend& b, const Ptrs& p) {
    b.add_inplace(P<float>(p, 0), P<float>(p, 1), N * C);
  });
  ExpectSameAsCpu({Random(N * C, 3), Random(C, 4), Random(N * C, 5)},
                  [](const Backend& b, const Ptrs& p) {
                    b.bias_residual(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), N, C);
                  });
  const Bytes row = Random(C, 6);  // host memory: add_row reads it at the call
  ExpectSameAsCpu({Random(N * C, 7)}, [&](const Backend& b, const Ptrs& p) {
    b.add_row(P<float>(p, 0), reinterpret_cast<const float*>(row.data()), N, C);
  });
  std::vector<Bytes> t = ExpectSameAsCpu(
      {Zeros(C * N), Random(N * C, 8)},
      [](const Backend& b, const Ptrs& p) { b.transpose(P<float>(p, 0), P<float>(p, 1), N, C); });
  const float* in = reinterpret_cast<const float*>(t[1].data());
  const float* out = reinterpret_cast<const float*>(t[0].data());
  EXPECT_EQ(out[int64_t{3} * N + 5], in[int64_t{5} * C + 3]);
}

TEST_F(EmulatedBackendTest, EmbeddingAndCrossEntropy) {
  constexpr int B = 2, T = 5, V = 11;
  ExpectSameAsCpu({Zeros(B * T * C), Ints(B * T, V, 1), Random(V * C, 2), Random(T * C, 3)},
                  [](const Backend& b, const Ptrs& p) {
                    b.embedding_forward(P<float>(p, 0), P<int32_t>(p, 1), P<float>(p, 2),
                                        P<float>(p, 3), B, T, C);
                  });
  ExpectSameAsCpu({Zeros(V * C), Zeros(T * C), Random(B * T * C, 4), Ints(B * T, V, 5)},
                  [](const Backend& b, const Ptrs& p) {
                    b.embedding_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                         P<int32_t>(p, 3), B, T, C);
                  });
  std::vector<Bytes> fwd =
      ExpectSameAsCpu({Zeros(N), Zeros(N * V), Random(N * V, 6, -4, 4), Ints(N, V, 7)},
                      [](const Backend& b, const Ptrs& p) {
                        b.cross_entropy_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                                P<int32_t>(p, 3), N, V);
                      });
  ExpectSameAsCpu({Zeros(N * V), fwd[1], fwd[3]}, [](const Backend& b, const Ptrs& p) {
    b.cross_entropy_backward(P<float>(p, 0), P<float>(p, 1), P<int32_t>(p, 2), 1.0f / N, N, V);
  });
}

TEST_F(EmulatedBackendTest, RouterPermuteAndTheHostScalars) {
  constexpr int K = 2;
  std::vector<Bytes> probs =
      ExpectSameAsCpu({Zeros(N * E), Random(N * E, 1, -2, 2)}, [](const Backend& b, const Ptrs& p) {
        b.softmax_forward(P<float>(p, 0), P<float>(p, 1), N, E);
      });
  std::vector<Bytes> top = ExpectSameAsCpu(
      {Bytes(N * K * 4, 0), Zeros(N * K), probs[0]}, [](const Backend& b, const Ptrs& p) {
        b.topk_forward(P<int32_t>(p, 0), P<float>(p, 1), P<float>(p, 2), N, E, K, true);
      });
  ExpectSameAsCpu({Zeros(N * E), Random(N * K, 2), probs[0], top[0]},
                  [](const Backend& b, const Ptrs& p) {
                    b.topk_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                    P<int32_t>(p, 3), N, E, K, true);
                  });
  ExpectSameAsCpu({Zeros(N * E), top[0]}, [](const Backend& b, const Ptrs& p) {
    b.aux_loss_backward(P<float>(p, 0), P<int32_t>(p, 1), N, E, K, 0.01f, 1.0f);
  });

  // The dispatch plan is built on the host from host indices, then used by the device ops.
  std::vector<int32_t> indices(N * K);
  std::memcpy(indices.data(), top[0].data(), top[0].size());
  const DispatchPlan plan = EmulatedBackend().make_dispatch_plan(indices.data(), N, E, K, 1.0);
  const int64_t S = plan.rows();
  ExpectSameAsCpu({Zeros(S * C), Random(N * C, 3)}, [&](const Backend& b, const Ptrs& p) {
    b.permute_forward(P<float>(p, 0), P<float>(p, 1), plan, C);
  });
  ExpectSameAsCpu({Zeros(N * C), Random(S * C, 4), top[1]}, [&](const Backend& b, const Ptrs& p) {
    b.unpermute_forward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), plan, C);
  });
  ExpectSameAsCpu({Zeros(S * C), Zeros(N * K), Random(N * C, 5), Random(S * C, 6), top[1]},
                  [&](const Backend& b, const Ptrs& p) {
                    b.unpermute_backward(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2),
                                         P<float>(p, 3), P<float>(p, 4), plan, C);
                  });
  ExpectSameAsCpu({Zeros(N * C), Random(S * C, 7)}, [&](const Backend& b, const Ptrs& p) {
    b.permute_backward(P<float>(p, 0), P<float>(p, 1), plan, C);
  });

  // Scalars come back to the host: the op synchronizes its stream.
  std::vector<Bytes> in = {probs[0], top[0], Random(N * C, 8)};
  float aux_cpu = 0, aux_emu = 0;
  double sum_cpu = 0, sum_emu = 0, ranges_cpu = 0, ranges_emu = 0;
  const int64_t begin[2] = {3, 40}, count[2] = {20, N * C - 40};
  ExpectSameAsCpu({in[0], in[1], in[2], Zeros(1)}, [&](const Backend& b, const Ptrs& p) {
    const bool cpu = &b == &CpuBackend();
    (cpu ? aux_cpu : aux_emu) =
        b.aux_loss_forward(P<float>(p, 0), P<int32_t>(p, 1), N, E, K, 0.01f);
    (cpu ? sum_cpu : sum_emu) = b.sum_of_squares(P<float>(p, 2), N * C);
    (cpu ? ranges_cpu : ranges_emu) = b.sum_of_squares_ranges(P<float>(p, 2), begin, count, 2);
    b.scale(P<float>(p, 2), 0.5f, N * C);
  });
  EXPECT_EQ(aux_emu, aux_cpu);
  EXPECT_EQ(sum_emu, sum_cpu);
  EXPECT_EQ(ranges_emu, ranges_cpu);
  EXPECT_GT(ranges_cpu, 0.0);
  EXPECT_GT(sum_cpu, 0.0);
}

TEST_F(EmulatedBackendTest, AdamWAndCasts) {
  constexpr int64_t n = 1000;
  ExpectSameAsCpu({Random(n, 1), Random(n, 2), Random(n, 3, 0, 0.1f), Random(n, 4, 0, 0.01f)},
                  [](const Backend& b, const Ptrs& p) {
                    b.adamw_update(P<float>(p, 0), P<float>(p, 1), P<float>(p, 2), P<float>(p, 3),
                                   n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
                  });
  std::vector<Bytes> bf16 = ExpectSameAsCpu(
      {Bytes(n * 2, 0), Random(n, 5, -100, 100)}, [](const Backend& b, const Ptrs& p) {
        b.cast_f32_to_bf16(P<uint16_t>(p, 0), P<float>(p, 1), n);
      });
  ExpectSameAsCpu({Zeros(n), bf16[0]}, [](const Backend& b, const Ptrs& p) {
    b.cast_bf16_to_f32(P<float>(p, 0), P<uint16_t>(p, 1), n);
  });
  constexpr int block = 100;
  std::vector<Bytes> fp8 = ExpectSameAsCpu(
      {Bytes(n, 0), Zeros(n / block), Random(n, 6, -50, 50)}, [](const Backend& b, const Ptrs& p) {
        b.quantize_fp8_e4m3(P<uint8_t>(p, 0), P<float>(p, 1), P<float>(p, 2), n, block);
      });
  ExpectSameAsCpu({Zeros(n), fp8[0], fp8[1]}, [](const Backend& b, const Ptrs& p) {
    b.dequantize_fp8_e4m3(P<float>(p, 0), P<uint8_t>(p, 1), P<float>(p, 2), n, block);
  });
}

// Ops enqueue on the thread's current stream and return: while that stream is held the output
// is untouched (read through another stream), and after it runs the result is there.
TEST_F(EmulatedBackendTest, OpsEnqueueOnTheCurrentStreamAndReturn) {
  std::vector<float> x(8, 2.0f), out(8, -1.0f);
  auto d = dev_->Allocate(x.size() * 4);
  ASSERT_TRUE(d.ok());
  float* dx = static_cast<float*>(*d);
  ASSERT_TRUE(dev_->Copy(dx, x.data(), 32, CopyKind::kHostToDevice, *stream_).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(*stream_).ok());
  ASSERT_TRUE(dev_->PauseStream(*stream_).ok());
  {
    StreamScope scope(*stream_);
    EmulatedBackend().scale(dx, 3.0f, 8);  // returns although the stream is held
  }
  Stream& other = dev_->default_stream();
  ASSERT_TRUE(dev_->Copy(out.data(), dx, 32, CopyKind::kDeviceToHost, other).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(other).ok());
  EXPECT_EQ(out, x);  // not scaled yet
  ASSERT_TRUE(dev_->ResumeStream(*stream_).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(*stream_).ok());
  // No current stream: the device's default stream, which is in order with the copy after it.
  EmulatedBackend().scale(dx, 0.5f, 8);
  ASSERT_TRUE(dev_->Copy(out.data(), dx, 32, CopyKind::kDeviceToHost, other).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(other).ok());
  EXPECT_EQ(out, std::vector<float>(8, 3.0f));
  EXPECT_EQ(CurrentStream(), nullptr);
}

TEST_F(EmulatedBackendTest, AHostPointerIsAStickyErrorNamingTheOp) {
  auto d = dev_->Allocate(64);
  ASSERT_TRUE(d.ok());
  std::vector<float> host(16, 1.0f);
  StreamScope scope(*stream_);
  EmulatedBackend().gelu_forward(static_cast<float*>(*d), host.data(), 16);
  absl::Status s = dev_->SynchronizeStream(*stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("gelu_forward: pointer argument 1"), std::string::npos)
      << s;
  EXPECT_EQ(dev_->SynchronizeStream(dev_->default_stream()).code(),
            absl::StatusCode::kInvalidArgument);  // sticky
}

}  // namespace
}  // namespace furnace::device
