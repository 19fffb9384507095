// Backend selection: the CPU kind gives the table of kernels::cpu functions (fp32 only), the
// emulated kind its fp32 and bf16 tables, and the CUDA kind its tables in builds with CUDA (no GPU
// is needed to select one) and an error naming the kind and the precision elsewhere.
#include "runtime/device/backend.h"

#include <gtest/gtest.h>

#include <string>

#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/permute.h"
#include "kernels/router.h"
#include "runtime/device/emulated_device.h"
#include "tests/runtime/device/fake_device.h"
#if FURNACE_HAVE_CUDA
#include "runtime/device/cuda_backend.h"
#endif

namespace furnace::device {
namespace {

namespace k = kernels::cpu;

TEST(BackendTest, CpuKindGivesTheCpuTable) {
  absl::StatusOr<const Backend*> by_kind = BackendFor(Kind::kCpu);
  ASSERT_TRUE(by_kind.ok()) << by_kind.status();
  EXPECT_EQ(*by_kind, &CpuBackend());
  EXPECT_STREQ((*by_kind)->name, "cpu");

  std::unique_ptr<Device> cpu = CreateCpuDevice();
  absl::StatusOr<const Backend*> by_device = BackendFor(*cpu);
  ASSERT_TRUE(by_device.ok()) << by_device.status();
  EXPECT_EQ(*by_device, &CpuBackend());
}

// Every entry is the kernels::cpu function of its name: training through the table computes what
// calling the kernels does, bit for bit, and no entry is left null.
TEST(BackendTest, CpuTablePointsAtTheCpuKernels) {
  const Backend& b = CpuBackend();
  EXPECT_EQ(b.matmul_forward, &k::MatmulForward<float>);
  EXPECT_EQ(b.matmul_backward, &k::MatmulBackward<float>);
  EXPECT_EQ(b.grouped_matmul_forward, &k::GroupedMatmulForward<float>);
  EXPECT_EQ(b.grouped_matmul_backward, &k::GroupedMatmulBackward<float>);
  EXPECT_EQ(b.attention_forward, &k::AttentionForward<float>);
  EXPECT_EQ(b.attention_backward, &k::AttentionBackward<float>);
  EXPECT_EQ(b.attention_forward_row_stats, &k::AttentionForwardRowStats<float>);
  EXPECT_EQ(b.attention_backward_row_stats, &k::AttentionBackwardRowStats<float>);
  EXPECT_EQ(b.attention_probs, &k::AttentionProbs<float>);
  EXPECT_EQ(b.layernorm_forward, &k::LayerNormForward<float>);
  EXPECT_EQ(b.layernorm_backward, &k::LayerNormBackward<float>);
  EXPECT_EQ(b.gelu_forward, &k::GeluForward<float>);
  EXPECT_EQ(b.gelu_backward, &k::GeluBackward<float>);
  EXPECT_EQ(b.embedding_forward, &k::EmbeddingForward<float>);
  EXPECT_EQ(b.embedding_backward, &k::EmbeddingBackward<float>);
  EXPECT_EQ(b.cross_entropy_forward, &k::CrossEntropyForward<float>);
  EXPECT_EQ(b.cross_entropy_backward, &k::CrossEntropyBackward<float>);
  EXPECT_EQ(b.softmax_forward, &k::SoftmaxForward<float>);
  EXPECT_EQ(b.softmax_backward, &k::SoftmaxBackward<float>);
  EXPECT_EQ(b.topk_forward, &k::TopKForward<float>);
  EXPECT_EQ(b.topk_backward, &k::TopKBackward<float>);
  EXPECT_EQ(b.aux_loss_forward, &k::AuxLossForward<float>);
  EXPECT_EQ(b.aux_loss_backward, &k::AuxLossBackward<float>);
  EXPECT_EQ(b.make_dispatch_plan, &k::MakeDispatchPlan);
  EXPECT_EQ(b.permute_forward, &k::PermuteForward<float>);
  EXPECT_EQ(b.permute_backward, &k::PermuteBackward<float>);
  EXPECT_EQ(b.unpermute_forward, &k::UnpermuteForward<float>);
  EXPECT_EQ(b.unpermute_backward, &k::UnpermuteBackward<float>);
  EXPECT_EQ(b.adamw_update, &k::AdamWUpdate);
  EXPECT_EQ(b.sum_of_squares, &k::SumOfSquares);
  EXPECT_EQ(b.sum_of_squares_ranges, &k::SumOfSquaresRanges);
  EXPECT_EQ(b.scale, &k::Scale);
  EXPECT_EQ(b.cast_f32_to_bf16, &k::CastF32ToBf16);
  EXPECT_EQ(b.cast_bf16_to_f32, &k::CastBf16ToF32);
  EXPECT_EQ(b.quantize_fp8_e4m3, &k::QuantizeFp8E4M3);
  EXPECT_EQ(b.dequantize_fp8_e4m3, &k::DequantizeFp8E4M3);
}

TEST(BackendTest, CpuTableComputes) {
  const Backend& b = CpuBackend();
  const float inp[2] = {1.0f, 2.0f};     // (N=1, C=2)
  const float weight[2] = {3.0f, 4.0f};  // (C=2, OC=1)
  float out[1] = {-1.0f};
  b.matmul_forward(out, inp, weight, nullptr, 1, 2, 1);
  EXPECT_EQ(out[0], 11.0f);
  EXPECT_EQ(b.sum_of_squares(inp, 2), 5.0);
  const int64_t begin[2] = {1, 0}, count[2] = {1, 1};
  EXPECT_EQ(b.sum_of_squares_ranges(inp, begin, count, 2), 5.0);
}

#if FURNACE_HAVE_CUDA
TEST(BackendTest, CudaKindGivesTheCudaTables) {
  absl::StatusOr<const Backend*> fp32 = BackendFor(Kind::kCuda);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(*fp32, &CudaBackend());
  EXPECT_STREQ((*fp32)->name, "cuda");
  EXPECT_EQ((*fp32)->precision, Precision::kFp32);
  absl::StatusOr<const Backend*> bf16 = BackendFor(Kind::kCuda, Precision::kBf16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(*bf16, &CudaBf16Backend());
  EXPECT_STREQ((*bf16)->name, "cuda/bf16");
  EXPECT_EQ((*bf16)->precision, Precision::kBf16);

  testing_util::FakeDevice gpu(Kind::kCuda, "cuda:3");
  absl::StatusOr<const Backend*> by_device = BackendFor(gpu, Precision::kBf16);
  ASSERT_TRUE(by_device.ok()) << by_device.status();
  EXPECT_EQ(*by_device, &CudaBf16Backend());
  // Loading the kernels needs a CudaDevice (a GPU): a device only of the kind is refused.
  const absl::Status load = LoadCudaKernels(gpu);
  EXPECT_TRUE(absl::IsInvalidArgument(load)) << load;
  EXPECT_NE(load.message().find("'cuda:3' is not a CUDA device"), absl::string_view::npos) << load;

  // The bf16 table differs from the fp32 one exactly in the GEMMs and attention.
  const Backend& a = CudaBackend();
  const Backend& b = CudaBf16Backend();
  EXPECT_NE(a.matmul_forward, b.matmul_forward);
  EXPECT_NE(a.matmul_backward, b.matmul_backward);
  EXPECT_NE(a.grouped_matmul_forward, b.grouped_matmul_forward);
  EXPECT_NE(a.grouped_matmul_backward, b.grouped_matmul_backward);
  EXPECT_NE(a.attention_forward, b.attention_forward);
  EXPECT_NE(a.attention_backward, b.attention_backward);
  EXPECT_NE(a.attention_forward_row_stats, b.attention_forward_row_stats);
  EXPECT_NE(a.attention_backward_row_stats, b.attention_backward_row_stats);
  EXPECT_NE(a.attention_probs, b.attention_probs);
  EXPECT_EQ(a.layernorm_forward, b.layernorm_forward);
  EXPECT_EQ(a.permute_forward, b.permute_forward);
  EXPECT_EQ(a.adamw_update, b.adamw_update);
  EXPECT_EQ(a.sum_of_squares, b.sum_of_squares);
  EXPECT_EQ(a.sum_of_squares_ranges, b.sum_of_squares_ranges);
  // The dispatch plan is built on the host, by the CPU's functions, in every table.
  EXPECT_EQ(a.make_dispatch_plan, &k::MakeDispatchPlan);
  EXPECT_EQ(a.make_dispatch_plan_slice, &k::MakeDispatchPlanSlice);
  EXPECT_EQ(b.make_dispatch_plan_slice, &k::MakeDispatchPlanSlice);
}
#else
TEST(BackendTest, CudaKindIsRefusedWithoutCuda) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    absl::StatusOr<const Backend*> by_kind = BackendFor(Kind::kCuda, precision);
    ASSERT_FALSE(by_kind.ok());
    EXPECT_EQ(by_kind.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(by_kind.status().message());
    EXPECT_NE(message.find("no backend for device kind 'cuda' at precision"), std::string::npos)
        << message;
    EXPECT_NE(message.find(PrecisionName(precision)), std::string::npos) << message;
    EXPECT_NE(message.find("FURNACE_ENABLE_CUDA=OFF"), std::string::npos) << message;
  }
  testing_util::FakeDevice gpu(Kind::kCuda, "cuda:3");
  absl::StatusOr<const Backend*> by_device = BackendFor(gpu);
  ASSERT_FALSE(by_device.ok());
  EXPECT_EQ(by_device.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(by_device.status().message());
  EXPECT_NE(message.find("device 'cuda:3'"), std::string::npos) << message;
  EXPECT_NE(message.find("no backend for device kind 'cuda'"), std::string::npos) << message;
}
#endif

TEST(BackendTest, EmulatedKindGivesItsFp32AndBf16Tables) {
  absl::StatusOr<const Backend*> fp32 = BackendFor(Kind::kEmulated, Precision::kFp32);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(*fp32, &EmulatedBackend());
  EXPECT_EQ((*fp32)->precision, Precision::kFp32);
  absl::StatusOr<const Backend*> bf16 = BackendFor(Kind::kEmulated, Precision::kBf16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(*bf16, &EmulatedBf16Backend());
  EXPECT_STREQ((*bf16)->name, "emulated/bf16");
  EXPECT_EQ((*bf16)->precision, Precision::kBf16);
  auto emulated = CreateEmulatedDevice({.memory_bytes = 1 << 20});
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  absl::StatusOr<const Backend*> by_device = BackendFor(**emulated, Precision::kBf16);
  ASSERT_TRUE(by_device.ok()) << by_device.status();
  EXPECT_EQ(*by_device, &EmulatedBf16Backend());
}

// model.precision bf16 is a choice of table; the CPU has none (it trains in fp32), and says so.
TEST(BackendTest, TheCpuHasNoBf16Table) {
  absl::StatusOr<const Backend*> bf16 = BackendFor(Kind::kCpu, Precision::kBf16);
  ASSERT_FALSE(bf16.ok());
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bf16.status().message().find("the CPU trains in fp32"), std::string::npos)
      << bf16.status();
  EXPECT_EQ(CpuBackend().precision, Precision::kFp32);
  EXPECT_STREQ(PrecisionName(Precision::kBf16), "bf16");
  EXPECT_STREQ(PrecisionName(Precision::kFp32), "fp32");
  testing_util::FakeDevice cpu_like(Kind::kCpu, "cpu");
  absl::StatusOr<const Backend*> by_device = BackendFor(cpu_like, Precision::kBf16);
  ASSERT_FALSE(by_device.ok());
  EXPECT_NE(by_device.status().message().find("device 'cpu': precision bf16"), std::string::npos)
      << by_device.status();
}

TEST(BackendTest, KindNames) {
  EXPECT_STREQ(KindName(Kind::kCpu), "cpu");
  EXPECT_STREQ(KindName(Kind::kCuda), "cuda");
}

}  // namespace
}  // namespace furnace::device
