// Helpers for the kernel tests: seeded random buffers, a random projection loss, central finite
// differences in double, and float-vs-double comparison.
//
// Gradient checks follow one pattern: the op's gradient buffers are pre-filled with random values
// (GradBuffer), the backward runs once, and Delta() (buffer minus pre-fill) is what is compared
// against the finite differences, so every check also checks the += convention.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace furnace::kernels::testing {

inline std::vector<double> RandomVector(std::mt19937_64& rng, size_t n, double lo = -1.0,
                                        double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// A gradient output buffer pre-filled with random values.
struct GradBuffer {
  GradBuffer(std::mt19937_64& rng, size_t n) : pre(RandomVector(rng, n)), buf(pre) {}
  double* data() { return buf.data(); }
  std::vector<double> Delta() const {
    std::vector<double> d(buf.size());
    for (size_t i = 0; i < buf.size(); ++i) d[i] = buf[i] - pre[i];
    return d;
  }
  std::vector<double> pre, buf;
};

// Compares `analytic` with central differences of loss() over every element of x (x is restored).
template <typename Loss>
void ExpectGradient(const std::string& name, std::vector<double>& x,
                    const std::vector<double>& analytic, Loss&& loss, double rtol = 1e-6,
                    double atol = 1e-8, double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  int failures = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double fd = (lp - lm) / (2 * h);
    const double err = std::fabs(fd - analytic[i]);
    const double bound = rtol * std::max(std::fabs(fd), std::fabs(analytic[i])) + atol;
    if (err > bound && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: analytic " << analytic[i] << " vs finite diff " << fd
                    << " (err " << err << ")";
    }
  }
  EXPECT_EQ(failures, 0) << name;
}

// |f - d| <= rtol * max|d| elementwise: float results against the double oracle.
inline void ExpectClose(const std::vector<float>& f, const std::vector<double>& d,
                        double rtol = 1e-5, const std::string& name = "") {
  ASSERT_EQ(f.size(), d.size()) << name;
  double scale = 0;
  for (double x : d) scale = std::max(scale, std::fabs(x));
  const double bound = rtol * std::max(scale, 1e-30);
  int failures = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (!(std::fabs(f[i] - d[i]) <= bound) && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: float " << f[i] << " vs double " << d[i];
    }
  }
  EXPECT_EQ(failures, 0) << name;
}

inline void ExpectClose(const std::vector<double>& a, const std::vector<double>& b, double tol,
                        const std::string& name = "") {
  ASSERT_EQ(a.size(), b.size()) << name;
  int failures = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= tol) && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  EXPECT_EQ(failures, 0) << name;
}

}  // namespace furnace::kernels::testing
