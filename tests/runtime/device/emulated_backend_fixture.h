// The fixture of the emulated backend tests (emulated_backend_test.cc for the fp32 table,
// emulated_bf16_backend_test.cc for the bf16 one): ExpectSameAs runs an op through an oracle table
// on host buffers and through a device table on device copies of the same buffers (inputs copied in
// and results copied out through the Device interface, the op enqueued on the current stream), and
// requires every buffer to come back bit-identical.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"

namespace furnace::device::testing_util {

using Bytes = std::vector<char>;
using Ptrs = std::vector<void*>;

template <typename T>
Bytes AsBytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

inline Bytes Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return AsBytes(v);
}

inline Bytes Zeros(size_t n) { return Bytes(n * sizeof(float), 0); }

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

class EmulatedBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = CreateEmulatedDevice({.memory_bytes = 64 << 20});
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok());
    stream_ = std::move(*s);
  }

  // Runs `op` on the CPU table over host copies of `buffers` and on the emulated table over device
  // copies; every buffer must end equal. Returns the oracle's buffers.
  std::vector<Bytes> ExpectSameAsCpu(const std::vector<Bytes>& buffers,
                                     const std::function<void(const Backend&, const Ptrs&)>& op) {
    return ExpectSameAs(CpuBackend(), EmulatedBackend(), buffers, op);
  }

  // The same for any pair: `oracle` on host buffers, `table` on this device's copies.
  std::vector<Bytes> ExpectSameAs(const Backend& oracle, const Backend& table,
                                  const std::vector<Bytes>& buffers,
                                  const std::function<void(const Backend&, const Ptrs&)>& op) {
    std::vector<Bytes> cpu = buffers;
    Ptrs host;
    for (Bytes& b : cpu) host.push_back(b.data());
    op(oracle, host);

    Ptrs dev;
    for (const Bytes& b : buffers) {
      auto d = dev_->Allocate(b.size());
      EXPECT_TRUE(d.ok()) << d.status();
      EXPECT_TRUE(dev_->Copy(*d, b.data(), b.size(), CopyKind::kHostToDevice, *stream_).ok());
      dev.push_back(*d);
    }
    {
      StreamScope scope(*stream_);
      op(table, dev);
    }
    std::vector<Bytes> out;
    for (size_t i = 0; i < buffers.size(); ++i) {
      out.emplace_back(buffers[i].size());
      EXPECT_TRUE(
          dev_->Copy(out[i].data(), dev[i], out[i].size(), CopyKind::kDeviceToHost, *stream_).ok());
    }
    EXPECT_TRUE(dev_->SynchronizeStream(*stream_).ok());
    bool changed = false;
    for (size_t i = 0; i < buffers.size(); ++i) {
      EXPECT_TRUE(out[i] == cpu[i]) << "buffer " << i << " differs from the oracle (" << oracle.name
                                    << " vs " << table.name << ")";
      changed = changed || cpu[i] != buffers[i];
      dev_->Free(dev[i]);
    }
    EXPECT_TRUE(changed) << "the op wrote nothing";
    return cpu;
  }

  std::unique_ptr<EmulatedDevice> dev_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace furnace::device::testing_util
