#include "runtime/memory/copy_engine.h"

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::memory {
namespace {

// A link sleeper that holds the copy thread until released (for jobs that must stay in flight),
// and otherwise moves a FakeClock to the wake-up time.
class HeldLink {
 public:
  explicit HeldLink(FakeClock& clock) : clock_(clock) {}
  void Hold() { held_.store(true); }
  void Release() {
    held_.store(false);
    release_.Notify();
  }
  void WaitEntered() { entered_.WaitForNotification(); }
  // How many sleeps were held (both directions' threads can be).
  int held_sleeps() const { return held_sleeps_.load(); }
  void SleepUntil(double until) {
    if (held_.load()) {
      if (held_sleeps_++ == 0) entered_.Notify();  // (both threads may get here at once)
      release_.WaitForNotification();
    }
    // (Both directions' threads sleep here: the clock moves to the later of their wake-ups.)
    absl::MutexLock lock(&mu_);
    const double now = clock_.MonotonicSeconds();
    if (until > now) clock_.Advance(until - now);
    wakeups_.push_back(until);
  }
  std::vector<double> wakeups() {
    absl::MutexLock lock(&mu_);
    return wakeups_;
  }

 private:
  FakeClock& clock_;
  std::atomic<bool> held_{false};
  std::atomic<int> held_sleeps_{0};
  absl::Notification entered_, release_;
  absl::Mutex mu_;
  std::vector<double> wakeups_;
};

class CopyEngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<CopyEngine> Make(double gbps) {
    CopyEngineOptions o;
    o.host_link_gbps = gbps;
    o.clock = &clock_;
    o.sleep_until = [this](double until) { link_.SleepUntil(until); };
    absl::StatusOr<std::unique_ptr<CopyEngine>> e = CopyEngine::Create(*device_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
  FakeClock clock_;
  HeldLink link_{clock_};
};

// The jobs of each direction complete in their submission order (the two directions are two
// threads, independent of each other).
TEST_F(CopyEngineTest, JobsCompleteInSubmissionOrderWithTheirBytes) {
  std::unique_ptr<CopyEngine> engine = Make(0);
  ASSERT_NE(engine, nullptr);
  constexpr int kJobs = 20;
  std::vector<std::vector<float>> src(kJobs), dst(kJobs);
  std::vector<int> order[2];  // per direction, appended by the hooks on that direction's thread
  std::vector<CopyTicket> tickets;
  uint64_t to_host = 0, to_device = 0;
  for (int j = 0; j < kJobs; ++j) {
    src[j].resize(16 * (j + 1));
    std::iota(src[j].begin(), src[j].end(), 1000.0f * j);
    dst[j].assign(src[j].size(), -1.0f);
    const auto dir = j % 2 == 0 ? CopyDirection::kDeviceToHost : CopyDirection::kHostToDevice;
    const uint64_t bytes = 4 * src[j].size();
    (j % 2 == 0 ? to_host : to_device) += bytes;
    tickets.push_back(engine->Submit(dir, dst[j].data(), src[j].data(), bytes,
                                     [&order, j](const absl::Status& s) {
                                       EXPECT_TRUE(s.ok()) << s;
                                       order[j % 2].push_back(j);
                                     }));
  }
  for (const CopyTicket& t : tickets) ASSERT_TRUE(engine->Wait(t).ok());
  std::vector<int> want[2];
  for (int j = 0; j < kJobs; ++j) want[j % 2].push_back(j);
  EXPECT_EQ(order[0], want[0]);  // device->host
  EXPECT_EQ(order[1], want[1]);  // host->device
  for (int j = 0; j < kJobs; ++j) EXPECT_EQ(dst[j], src[j]) << "job " << j;
  const CopyEngineStats s = engine->stats();
  EXPECT_EQ(s.bytes_to_host, to_host);
  EXPECT_EQ(s.bytes_to_device, to_device);
  EXPECT_EQ(s.jobs, kJobs);
  EXPECT_EQ(s.modelled_seconds, 0.0);  // unpaced
  EXPECT_TRUE(link_.wakeups().empty());
  EXPECT_EQ(s.late_reloads, 0);
}

TEST_F(CopyEngineTest, PacingChargesBytesOverTheLinkRate) {
  std::unique_ptr<CopyEngine> engine = Make(2.0);  // 2 GB/s
  ASSERT_NE(engine, nullptr);
  std::vector<char> a(1'000'000, 'a'), b(3'000'000, 'b'), out_a(a.size()), out_b(b.size());
  CopyTicket ta = engine->Submit(CopyDirection::kHostToDevice, out_a.data(), a.data(), a.size());
  CopyTicket tb = engine->Submit(CopyDirection::kHostToDevice, out_b.data(), b.data(), b.size());
  ASSERT_TRUE(engine->Wait(tb).ok());
  EXPECT_TRUE(engine->Done(ta));
  EXPECT_EQ(out_a, a);
  EXPECT_EQ(out_b, b);
  // Each job sleeps until its start + bytes / rate; on the fake clock the copies take no time, so
  // the second job of the direction starts where the first ended.
  const double da = 1e6 / 2e9, db = 3e6 / 2e9;
  ASSERT_THAT(link_.wakeups(),
              ::testing::ElementsAre(::testing::DoubleEq(da), ::testing::DoubleEq(da + db)));
  const CopyEngineStats s = engine->stats();
  EXPECT_DOUBLE_EQ(s.modelled_seconds, da + db);
  EXPECT_DOUBLE_EQ(s.busy_seconds, da + db);
  EXPECT_DOUBLE_EQ(clock_.MonotonicSeconds(), da + db);
  EXPECT_EQ(engine->host_link_gbps(), 2.0);
}

// The rate is each way (full duplex, as a GPU's PCIe link): an offload and a reload submitted
// together both start at once, and the pair takes the longer one's time, not the sum.
TEST_F(CopyEngineTest, TheTwoDirectionsArePacedIndependently) {
  std::unique_ptr<CopyEngine> engine = Make(2.0);
  ASSERT_NE(engine, nullptr);
  std::vector<char> a(1'000'000, 'a'), b(3'000'000, 'b'), out_a(a.size()), out_b(b.size());
  // Both threads held in their pacing sleep, so both jobs launched at 0 (on the CPU device each
  // direction's thread launches its jobs: without the hold, the fake clock could jump to one
  // wake-up before the other thread had launched).
  link_.Hold();
  CopyTicket ta = engine->Submit(CopyDirection::kDeviceToHost, out_a.data(), a.data(), a.size());
  CopyTicket tb = engine->Submit(CopyDirection::kHostToDevice, out_b.data(), b.data(), b.size());
  while (link_.held_sleeps() < 2) absl::SleepFor(absl::Milliseconds(1));
  link_.Release();
  ASSERT_TRUE(engine->Wait(ta).ok());
  ASSERT_TRUE(engine->Wait(tb).ok());
  EXPECT_EQ(out_a, a);
  EXPECT_EQ(out_b, b);
  const double da = 1e6 / 2e9, db = 3e6 / 2e9;
  EXPECT_THAT(link_.wakeups(),
              ::testing::UnorderedElementsAre(::testing::DoubleEq(da), ::testing::DoubleEq(db)));
  EXPECT_DOUBLE_EQ(clock_.MonotonicSeconds(), db);  // not da + db
  EXPECT_DOUBLE_EQ(engine->stats().modelled_seconds, da + db);
}

TEST_F(CopyEngineTest, AReloadNotDoneByItsDeadlineIsLate) {
  std::unique_ptr<CopyEngine> engine = Make(1.0);
  ASSERT_NE(engine, nullptr);
  std::vector<char> src(4096, 'x'), dst(4096, 0);
  // Done before the deadline: not late.
  CopyTicket early = engine->Submit(CopyDirection::kHostToDevice, dst.data(), src.data(), 64);
  ASSERT_TRUE(engine->Wait(early).ok());
  bool late = true;
  ASSERT_TRUE(engine->Wait(early, /*deadline=*/-1.0, &late).ok());
  EXPECT_FALSE(late);
  EXPECT_EQ(engine->stats().late_reloads, 0);

  // Held in flight, waited for with a deadline already passed: late.
  link_.Hold();
  CopyTicket held =
      engine->Submit(CopyDirection::kHostToDevice, dst.data(), src.data(), src.size());
  link_.WaitEntered();
  clock_.Advance(10);
  const int64_t blocked_before = engine->stats().blocked_waits;
  std::thread waiter([&] {
    bool l = false;
    EXPECT_TRUE(engine->Wait(held, /*deadline=*/5.0, &l).ok());
    EXPECT_TRUE(l);
  });
  while (engine->stats().late_reloads == 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(engine->Done(held));
  link_.Release();
  waiter.join();
  EXPECT_TRUE(engine->Done(held));
  EXPECT_EQ(dst, src);
  EXPECT_EQ(engine->stats().late_reloads, 1);
  EXPECT_EQ(engine->stats().blocked_waits, blocked_before + 1);  // found the job not done
  EXPECT_TRUE(engine->Wait(held, /*deadline=*/5.0).ok());  // done now: neither late nor blocked
  EXPECT_EQ(engine->stats().late_reloads, 1);
  EXPECT_EQ(engine->stats().blocked_waits, blocked_before + 1);
}

TEST_F(CopyEngineTest, ShutdownFinishesTheJobInFlightAndCancelsTheQueue) {
  std::unique_ptr<CopyEngine> engine = Make(1.0);
  ASSERT_NE(engine, nullptr);
  std::vector<char> src(1024, 'q'), a(1024, 0), a2(1024, 0), b(1024, 0), c(1024, 0);
  std::vector<absl::StatusCode> hooks(4, absl::StatusCode::kUnknown);
  auto hook = [&hooks](int i) {
    return [&hooks, i](const absl::Status& s) { hooks[i] = s.code(); };
  };
  // One job in flight in each direction (both threads held in their pacing sleep), then one queued
  // behind each.
  link_.Hold();
  CopyTicket ta = engine->Submit(CopyDirection::kDeviceToHost, a.data(), src.data(), 1024, hook(0));
  CopyTicket ta2 =
      engine->Submit(CopyDirection::kHostToDevice, a2.data(), src.data(), 1024, hook(1));
  while (link_.held_sleeps() < 2) absl::SleepFor(absl::Milliseconds(1));
  CopyTicket tb = engine->Submit(CopyDirection::kDeviceToHost, b.data(), src.data(), 1024, hook(2));
  CopyTicket tc = engine->Submit(CopyDirection::kHostToDevice, c.data(), src.data(), 1024, hook(3));
  std::thread stopper([&] { engine->Shutdown(); });
  // The queued jobs are cancelled while the others are still in flight.
  EXPECT_EQ(engine->Wait(tb).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(engine->Wait(tc).code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(engine->Done(ta));
  EXPECT_FALSE(engine->Done(ta2));
  link_.Release();
  stopper.join();
  EXPECT_TRUE(engine->Wait(ta).ok());
  EXPECT_TRUE(engine->Wait(ta2).ok());
  EXPECT_EQ(a, src);
  EXPECT_EQ(a2, src);
  EXPECT_EQ(b, std::vector<char>(1024, 0));
  EXPECT_EQ(c, std::vector<char>(1024, 0));
  EXPECT_EQ(hooks, (std::vector<absl::StatusCode>{absl::StatusCode::kOk, absl::StatusCode::kOk,
                                                  absl::StatusCode::kCancelled,
                                                  absl::StatusCode::kCancelled}));
}

// A device whose events cannot be made (a CUDA context after a sticky error): every other call
// goes to the CPU device.
class NoEventsDevice : public device::Device {
 public:
  device::Kind kind() const override { return inner_->kind(); }
  std::string name() const override { return "no-events"; }
  size_t total_memory() const override { return inner_->total_memory(); }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  void Free(void* ptr) override { inner_->Free(ptr); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override { return inner_->AllocateHost(bytes); }
  void FreeHost(void* ptr) override { inner_->FreeHost(ptr); }
  bool IsDeviceMemory(const void* ptr) const override { return inner_->IsDeviceMemory(ptr); }
  device::Stream& default_stream() override { return inner_->default_stream(); }
  absl::StatusOr<std::unique_ptr<device::Stream>> CreateStream() override {
    return inner_->CreateStream();
  }
  absl::StatusOr<std::unique_ptr<device::Event>> CreateEvent() override {
    return absl::InternalError("an illegal memory access was encountered");
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes, device::CopyKind kind,
                    device::Stream& stream) override {
    return inner_->Copy(dst, src, bytes, kind, stream);
  }
  absl::Status Memset(void* dst, int value, size_t bytes, device::Stream& stream) override {
    return inner_->Memset(dst, value, bytes, stream);
  }
  absl::Status RecordEvent(device::Event& event, device::Stream& stream) override {
    return inner_->RecordEvent(event, stream);
  }
  absl::Status WaitEvent(device::Stream& stream, device::Event& event) override {
    return inner_->WaitEvent(stream, event);
  }
  absl::Status SynchronizeEvent(device::Event& event) override {
    return inner_->SynchronizeEvent(event);
  }
  absl::Status SynchronizeStream(device::Stream& stream) override {
    return inner_->SynchronizeStream(stream);
  }

 private:
  std::unique_ptr<device::Device> inner_ = device::CreateCpuDevice();
};

// A job whose events cannot be made is refused at Submit: done at once with the device's error,
// and its hook never runs on the calling thread (the stash submits under the lock its hooks take:
// running the hook there deadlocked the rank).
TEST_F(CopyEngineTest, AJobWhoseEventsCannotBeMadeIsRefusedWithoutItsHook) {
  NoEventsDevice device;
  absl::StatusOr<std::unique_ptr<CopyEngine>> engine = CopyEngine::Create(device);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<char> src(64, 1), dst(64, 0);
  absl::Mutex caller;  // what the stash holds around Submit
  bool called = false;
  caller.Lock();
  const CopyTicket t = (*engine)->Submit(CopyDirection::kDeviceToHost, dst.data(), src.data(),
                                         src.size(), [&](const absl::Status&) {
                                           absl::MutexLock lock(&caller);
                                           called = true;
                                         });
  caller.Unlock();
  EXPECT_TRUE((*engine)->Done(t));
  const absl::Status s = (*engine)->Wait(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("illegal memory access"));
  EXPECT_FALSE(called);
  EXPECT_EQ(dst[0], 0);
}

TEST_F(CopyEngineTest, BadLinkRateIsRefused) {
  CopyEngineOptions o;
  o.host_link_gbps = -1;
  EXPECT_EQ(CopyEngine::Create(*device_, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace furnace::memory
