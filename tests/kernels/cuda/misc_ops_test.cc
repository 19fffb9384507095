// AdamW, the global-norm helpers, the bf16/fp8 casts (bit-exact against the CPU) and the error
// reporting contract of kernels/cuda/common.h.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cast.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/cuda/router.h"
#include "kernels/optimizer.h"

namespace furnace::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::RandomVector;

TEST(CudaKernelsTest, AdamW) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 5000;
  auto param = RandomVector(n, 130), m = RandomVector(n, 131, -0.1f, 0.1f),
       v = RandomVector(n, 132, 0.0f, 0.01f);
  DeviceBuffer<float> d_param(param), d_m(m), d_v(v), d_grad(n);
  for (int64_t step = 1; step <= 3; ++step) {
    auto grad = RandomVector(n, 140 + static_cast<uint32_t>(step));
    d_grad.Upload(grad);
    AdamWUpdate(d_param.get(), d_grad.get(), d_m.get(), d_v.get(), n, 6e-4f, 0.9f, 0.95f, 1e-8f,
                0.1f, step, nullptr);
    cpu::AdamWUpdate(param.data(), grad.data(), m.data(), v.data(), n, 6e-4f, 0.9f, 0.95f, 1e-8f,
                     0.1f, step);
  }
  ASSERT_KERNELS_OK();
  ExpectClose(d_param.Download(), param, 1e-6f, 1e-7f, "param");
  ExpectClose(d_m.Download(), m, 1e-6f, 1e-8f, "m");
  ExpectClose(d_v.Download(), v, 1e-6f, 1e-9f, "v");
}

TEST(CudaKernelsTest, SumOfSquaresAndScale) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1000003;
  auto x = RandomVector(n, 150);
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<double> d_sum(1), d_again(1);
  DeviceBuffer<double> partials(kSumOfSquaresPartials);
  SumOfSquares(d_sum.get(), partials.get(), d_x.get(), n, /*accumulate=*/false, nullptr);
  ASSERT_KERNELS_OK();
  const double once = d_sum.Download()[0];
  double want = cpu::SumOfSquares(x.data(), n);
  EXPECT_NEAR(once, want, 1e-10 * want);
  // The same bits every time (a fixed order, no atomics: the blocks' partials added in a fixed
  // tree, where atomics would add them in whatever order the blocks finish).
  for (int run = 0; run < 16; ++run) {
    SumOfSquares(d_again.get(), partials.get(), d_x.get(), n, /*accumulate=*/false, nullptr);
    ASSERT_KERNELS_OK();
    const double again = d_again.Download()[0];
    ASSERT_EQ(std::memcmp(&again, &once, sizeof(double)), 0) << "run " << run;
  }
  // Accumulating: onto what is there.
  SumOfSquares(d_again.get(), partials.get(), d_x.get(), n, /*accumulate=*/true, nullptr);
  ASSERT_KERNELS_OK();
  EXPECT_EQ(d_again.Download()[0], once + once);
  Scale(d_x.get(), 0.37f, n, nullptr);
  ASSERT_KERNELS_OK();
  cpu::Scale(x.data(), 0.37f, n);
  ExpectClose(d_x.Download(), x, 0.0f, 0.0f, "scaled");
}

TEST(CudaKernelsTest, Bf16CastsAreBitExact) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 4099;
  auto x = RandomVector(n, 160, -1000.0f, 1000.0f);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 1.00390625f;  // exactly halfway between two bf16 values: ties to even
  x[3] = 3.0e38f;
  x[4] = 1e-40f;  // subnormal
  // NaNs keep their sign and payload's top bits as on the CPU (not the GPU intrinsic's 0x7FFF).
  for (const auto& [i, bits] : {std::pair{5, 0xFFC01234u}, std::pair{6, 0x7F812345u},
                                std::pair{7, 0x7F800000u}}) {  // -qNaN, sNaN, +inf
    std::memcpy(&x[i], &bits, sizeof(float));
  }
  DeviceBuffer<float> d_x(x), d_back(n);
  DeviceBuffer<uint16_t> d_h(n);
  CastF32ToBf16(d_h.get(), d_x.get(), n, nullptr);
  CastBf16ToF32(d_back.get(), d_h.get(), n, nullptr);
  ASSERT_KERNELS_OK();
  std::vector<uint16_t> h(n);
  std::vector<float> back(n);
  cpu::CastF32ToBf16(h.data(), x.data(), n);
  cpu::CastBf16ToF32(back.data(), h.data(), n);
  EXPECT_EQ(d_h.Download(), h);
  const std::vector<float> got = d_back.Download();  // bit for bit (NaN == NaN by bits)
  ASSERT_EQ(got.size(), back.size());
  EXPECT_EQ(std::memcmp(got.data(), back.data(), back.size() * sizeof(float)), 0);
}

TEST(CudaKernelsTest, Fp8E4M3IsBitExact) {
  SKIP_WITHOUT_GPU();
  const int block = 128;
  const int64_t n = 5 * block + 37;  // a ragged last block
  auto x = RandomVector(n, 170, -3.0f, 3.0f);
  for (int i = 0; i < block; ++i) x[block + i] = 0.0f;        // an all-zero block: scale 1
  for (int i = 0; i < block; ++i) x[2 * block + i] *= 1e-4f;  // small values: subnormal codes
  x[3 * block] = 1e6f;                                        // one huge value sets the scale
  const int64_t blocks = (n + block - 1) / block;
  DeviceBuffer<float> d_x(x), d_scales(blocks), d_back(n);
  DeviceBuffer<uint8_t> d_q(n);
  QuantizeFp8E4M3(d_q.get(), d_scales.get(), d_x.get(), n, block, nullptr);
  DequantizeFp8E4M3(d_back.get(), d_q.get(), d_scales.get(), n, block, nullptr);
  ASSERT_KERNELS_OK();
  std::vector<uint8_t> q(n);
  std::vector<float> scales(blocks), back(n);
  cpu::QuantizeFp8E4M3(q.data(), scales.data(), x.data(), n, block);
  cpu::DequantizeFp8E4M3(back.data(), q.data(), scales.data(), n, block);
  ExpectClose(d_scales.Download(), scales, 0.0f, 0.0f, "scales");
  EXPECT_EQ(d_q.Download(), q);
  ExpectClose(d_back.Download(), back, 0.0f, 0.0f, "dequantized");
}

TEST(CudaKernelsTest, ErrorsAreRecordedForTheCaller) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(TakeLastError(), "");
  // k beyond kMaxTopK is refused before any launch.
  TopKForward(nullptr, nullptr, nullptr, 1, 64, kMaxTopK + 1, true, nullptr);
  std::string err = TakeLastError();
  EXPECT_NE(err.find("TopKForward"), std::string::npos) << err;
  EXPECT_EQ(TakeLastError(), "");  // taken once
  // A GEMM without a handle.
  MatmulForward(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, nullptr, nullptr);
  err = TakeLastError();
  EXPECT_NE(err.find("MatmulForward"), std::string::npos) << err;
  // Only the first error is kept.
  TopKForward(nullptr, nullptr, nullptr, 1, 64, 0, true, nullptr);
  MatmulForward(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, nullptr, nullptr);
  err = TakeLastError();
  EXPECT_NE(err.find("TopKForward"), std::string::npos) << err;
  EXPECT_EQ(err.find("MatmulForward"), std::string::npos) << err;
}

}  // namespace
}  // namespace furnace::kernels::cuda
