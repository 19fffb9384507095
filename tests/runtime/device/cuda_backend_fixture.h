// The fixture of the CUDA backend tests (gpu label; they skip themselves, saying why, without a
// GPU): a CUDA device and a stream of it, and Compare, which runs one op through an oracle table
// on host buffers and through a CUDA table on device copies of the same buffers (uploaded and
// downloaded through the Device interface, the op enqueued on the fixture's stream as the
// thread's current stream), then checks each buffer against the oracle's: bit-identical where the
// buffer's tolerance is 0, else ||got - want|| / ||want|| <= tolerance with every element finite
// (outputs that the op overwrites start as NaN on both sides, so an element the device did not
// write fails). Buffers the op only reads must come back unchanged.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/device/backend.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/device.h"

namespace furnace::device::testing_util {

using Bytes = std::vector<char>;
using Ptrs = std::vector<void*>;

template <typename T>
Bytes AsBytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <typename T>
std::vector<T> FromBytes(const Bytes& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// Fresh random floats per call site (the seed), uniform in [lo, hi).
inline Bytes Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return AsBytes(v);
}
// An output the op overwrites: NaN, so an unwritten element cannot pass.
inline Bytes Poison(size_t n) {
  return AsBytes(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}
inline Bytes Ints(size_t n, int32_t bound, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(bound));
  return AsBytes(v);
}

template <typename T>
T* P(const Ptrs& p, int i) {
  return static_cast<T*>(p[i]);
}

// ||got - want|| / ||want|| over floats; infinity when got or want holds a NaN or an infinity.
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      return std::numeric_limits<double>::infinity();
    }
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

// How a buffer is checked: exact bytes (tolerance 0), or floats within a relative-norm tolerance.
struct Check {
  double tolerance = 0;
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = CreateCudaDevice(0);
    if (!dev.ok()) {
      if (dev.status().code() == absl::StatusCode::kUnavailable) {
        GTEST_SKIP() << "no GPU: " << dev.status().message();
      }
      FAIL() << dev.status();
    }
    dev_ = std::move(*dev);
    cuda_ = dynamic_cast<CudaDevice*>(dev_.get());
    ASSERT_NE(cuda_, nullptr);
    // As a rank does (BackendFor): a test that holds a stream with a host function and then runs
    // an op must not be the first launch of a lazily loaded kernel (it would wait for the hold).
    ASSERT_TRUE(BackendFor(*dev_).ok());
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::move(*s);
  }
  void TearDown() override {
    if (dev_ != nullptr && cuda_ != nullptr) {
      EXPECT_TRUE(cuda_->sticky_error().ok()) << cuda_->sticky_error();
    }
  }

  // Runs `op` through `oracle` on host copies of `buffers` and through `table` on device copies;
  // buffer i is then checked with checks[i] (missing: exact). Returns the device's buffers.
  std::vector<Bytes> Compare(const std::string& what, const Backend& oracle, const Backend& table,
                             const std::vector<Bytes>& buffers, const std::vector<Check>& checks,
                             const std::function<void(const Backend&, const Ptrs&)>& op) {
    std::vector<Bytes> want = buffers;
    Ptrs host;
    for (Bytes& b : want) host.push_back(b.data());
    op(oracle, host);
    std::vector<Bytes> got = RunOnDevice(table, buffers, op);
    for (size_t i = 0; i < buffers.size(); ++i) {
      const double tolerance = i < checks.size() ? checks[i].tolerance : 0;
      if (tolerance == 0) {
        EXPECT_TRUE(got[i] == want[i])
            << what << ": buffer " << i << " differs from " << oracle.name << " (exact expected)";
      } else {
        const double error = RelativeError(FromBytes<float>(got[i]), FromBytes<float>(want[i]));
        EXPECT_LE(error, tolerance) << what << ": buffer " << i << " vs " << oracle.name;
      }
    }
    return got;
  }

  // `op` through `table` on device copies of `buffers`, on stream_ (the current stream).
  std::vector<Bytes> RunOnDevice(const Backend& table, const std::vector<Bytes>& buffers,
                                 const std::function<void(const Backend&, const Ptrs&)>& op) {
    // Everything on stream_: the buffers are allocated in its order (stream-ordered memory is
    // usable by the allocating stream's later work; another stream would need an event), used,
    // read back and freed there.
    StreamScope on_stream(*stream_);
    Ptrs dev;
    for (const Bytes& b : buffers) {
      auto d = dev_->Allocate(b.size());
      EXPECT_TRUE(d.ok()) << d.status();
      EXPECT_TRUE(dev_->Copy(*d, b.data(), b.size(), CopyKind::kHostToDevice, *stream_).ok());
      dev.push_back(*d);
    }
    op(table, dev);
    std::vector<Bytes> out;
    for (size_t i = 0; i < buffers.size(); ++i) {
      out.emplace_back(buffers[i].size());
      EXPECT_TRUE(
          dev_->Copy(out[i].data(), dev[i], out[i].size(), CopyKind::kDeviceToHost, *stream_).ok());
    }
    absl::Status s = dev_->SynchronizeStream(*stream_);
    EXPECT_TRUE(s.ok()) << s;
    for (void* d : dev) dev_->Free(d);
    return out;
  }

  std::unique_ptr<Device> dev_;
  CudaDevice* cuda_ = nullptr;
  std::unique_ptr<Stream> stream_;
};

}  // namespace furnace::device::testing_util
