#include "cuda_test_util.h"

#include <cmath>

namespace furnace::kernels::cuda::testing {

std::string NoGpuReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "cudaGetDeviceCount returned 0";
  return "";
}

std::vector<float> RandomVector(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> RandomInts(size_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rtol,
                 float atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    double limit = atol + rtol * std::fabs(static_cast<double>(want[i]));
    if (!(diff <= limit)) {  // also catches NaN
      worst = std::max(worst, diff);
      if (++bad <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: cuda " << got[i] << " vs cpu " << want[i]
                      << " (diff " << diff << ", limit " << limit << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " elements out of tolerance; worst diff " << worst;
}

}  // namespace furnace::kernels::cuda::testing
