// The stream contract of backend.h on a real GPU: an op of the CUDA table enqueues on the calling
// thread's current stream and returns (while that stream is held by a host function that blocks
// until the test releases it, the op has not run: a copy on another stream reads the old bytes,
// even after the device's default stream is drained); with no current stream it runs on the
// default stream of the device whose memory it was given; two streams are ordered only by an
// event; and a launch that fails at enqueue becomes the device's sticky error naming the op.
// gpu label: skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "runtime/device/cuda_backend.h"
#include "tests/runtime/device/cuda_backend_fixture.h"

namespace furnace::device {
namespace {

using testing_util::CudaBackendTest;

// Holds a stream: a host function enqueued on it spins until Release (or the destructor).
class StreamHold {
 public:
  explicit StreamHold(cudaStream_t stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &StreamHold::Wait, &released_), cudaSuccess);
  }
  ~StreamHold() { Release(); }
  void Release() { released_.store(true); }

 private:
  static void Wait(void* flag) {
    auto* released = static_cast<std::atomic<bool>*>(flag);
    while (!released->load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::atomic<bool> released_{false};
};

class CudaStreamContractTest : public CudaBackendTest {
 protected:
  float* Upload(const std::vector<float>& v) {
    auto d = dev_->Allocate(v.size() * sizeof(float));
    EXPECT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(dev_->Copy(*d, v.data(), v.size() * sizeof(float), CopyKind::kHostToDevice,
                           dev_->default_stream())
                    .ok());
    EXPECT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
    return static_cast<float*>(*d);
  }
  // Read through a stream of its own, so that neither held stream orders the read.
  std::vector<float> Read(const float* d, size_t n) {
    auto reader = dev_->CreateStream();
    EXPECT_TRUE(reader.ok());
    std::vector<float> out(n, -1.0f);
    EXPECT_TRUE(
        dev_->Copy(out.data(), d, n * sizeof(float), CopyKind::kDeviceToHost, **reader).ok());
    EXPECT_TRUE(dev_->SynchronizeStream(**reader).ok());
    return out;
  }
  cudaStream_t Native(Stream& s) { return static_cast<cudaStream_t>(s.native()); }
};

TEST_F(CudaStreamContractTest, OpsEnqueueOnTheCurrentStreamAndReturn) {
  constexpr size_t n = 4096;
  const std::vector<float> x(n, 2.0f);
  float* dx = Upload(x);
  {
    StreamHold hold(Native(*stream_));
    {
      StreamScope scope(*stream_);
      CudaBackend().scale(dx, 3.0f, n);  // returns although the stream is held
    }
    // Not on the default stream (drained here) nor anywhere else: still the old values.
    ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
    EXPECT_EQ(Read(dx, n), x);
    EXPECT_EQ(cudaStreamQuery(Native(*stream_)), cudaErrorNotReady);
    cudaGetLastError();
    hold.Release();
  }
  ASSERT_TRUE(dev_->SynchronizeStream(*stream_).ok());
  EXPECT_EQ(Read(dx, n), std::vector<float>(n, 6.0f));

  // No current stream: the default stream of the device holding the pointer.
  {
    StreamHold hold(Native(dev_->default_stream()));
    CudaBackend().scale(dx, 0.5f, n);
    ASSERT_TRUE(dev_->SynchronizeStream(*stream_).ok());
    EXPECT_EQ(Read(dx, n), std::vector<float>(n, 6.0f));  // behind the held default stream
    hold.Release();
  }
  ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
  EXPECT_EQ(Read(dx, n), std::vector<float>(n, 3.0f));
  EXPECT_EQ(CurrentStream(), nullptr);
  dev_->Free(dx);
}

// Stream 1 (held) adds x into y; stream 2 scales y after waiting for stream 1's event. Without
// the event stream 2 would run first; with it the result is (y + x) * 2 exactly, and stream 2
// does not finish while stream 1 is held.
TEST_F(CudaStreamContractTest, TwoStreamsAreOrderedByAnEvent) {
  constexpr size_t n = 1 << 16;
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 97) * 0.25f;
    y[i] = static_cast<float>(i % 89) - 40.0f;
  }
  float* dx = Upload(x);
  float* dy = Upload(y);
  auto s2 = dev_->CreateStream();
  auto event = dev_->CreateEvent();
  ASSERT_TRUE(s2.ok() && event.ok());
  {
    StreamHold hold(Native(*stream_));
    {
      StreamScope scope(*stream_);
      CudaBackend().add_inplace(dy, dx, n);
      ASSERT_TRUE(dev_->RecordEvent(**event, *stream_).ok());
    }
    ASSERT_TRUE(dev_->WaitEvent(**s2, **event).ok());
    {
      StreamScope scope(**s2);
      CudaBackend().scale(dy, 2.0f, n);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cudaStreamQuery(Native(**s2)), cudaErrorNotReady) << "stream 2 did not wait";
    cudaGetLastError();
    hold.Release();
  }
  ASSERT_TRUE(dev_->SynchronizeStream(**s2).ok());
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = (y[i] + x[i]) * 2.0f;
  EXPECT_EQ(Read(dy, n), want);
  dev_->Free(dx);
  dev_->Free(dy);
}

// The host-scalar ops synchronise the current stream: the value reflects every op before them.
TEST_F(CudaStreamContractTest, HostScalarsSeeTheWorkBeforeThem) {
  constexpr size_t n = 1 << 20;
  float* dx = Upload(std::vector<float>(n, 1.0f));
  StreamScope scope(*stream_);
  CudaBackend().scale(dx, 3.0f, n);
  EXPECT_EQ(CudaBackend().sum_of_squares(dx, n), 9.0 * n);
  dev_->Free(dx);
}

TEST_F(CudaStreamContractTest, AFailedLaunchIsAStickyErrorNamingTheOp) {
  constexpr int N = 8, E = 20, K = 17;  // k above kernels::cuda::kMaxTopK: refused at enqueue
  float* probs = Upload(std::vector<float>(N * E, 0.05f));
  float* gates = Upload(std::vector<float>(N * K, 0.0f));
  auto idx = dev_->Allocate(N * K * sizeof(int32_t));
  ASSERT_TRUE(idx.ok());
  {
    StreamScope scope(*stream_);
    CudaBackend().topk_forward(static_cast<int32_t*>(*idx), gates, probs, N, E, K, true);
  }
  absl::Status s = dev_->SynchronizeStream(*stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find("topk_forward"), std::string::npos) << s;
  EXPECT_EQ(dev_->SynchronizeStream(dev_->default_stream()).code(), absl::StatusCode::kInternal)
      << "sticky";
  // A host scalar after the error is NaN-free only if the op itself worked; the error stays.
  EXPECT_FALSE(cuda_->sticky_error().ok());
  dev_->Free(probs);
  dev_->Free(gates);
  dev_->Free(*idx);
  // The fixture's TearDown expects no sticky error: this device is done with, replace it.
  stream_.reset();
  dev_.reset();
}

}  // namespace
}  // namespace furnace::device
