#include "runtime/comm/device_staging.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/current_stream.h"

namespace furnace::comm {

namespace {

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

}  // namespace

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> transport,
                                       device::Device& device)
    : StagedCommunicator(transport.get(), device) {
  owned_ = std::move(transport);
}

StagedCommunicator::StagedCommunicator(Communicator* transport, device::Device& device)
    : transport_(transport),
      device_(device),
      in_(std::make_unique<PinnedStaging>(device)),
      out_(std::make_unique<PinnedStaging>(device)) {}

StagedCommunicator::~StagedCommunicator() = default;

template <typename Call>
absl::Status StagedCommunicator::Counted(CollectiveOp op, const CallTimer& timer, Call&& call) {
  const CommCounters& c = transport_->counters();
  const int64_t before = c.bytes(op);
  absl::Status s = call();
  if (s.ok()) counters_.Add(op, c.bytes(op) - before, timer.Seconds());
  return s;
}

absl::Status StagedCommunicator::Staged(absl::Status s) {
  if (!s.ok()) {
    transport_->Abort(absl::StrCat("staging on ", device_.name(), " failed: ", s.message()));
  }
  return s;
}

namespace {

// The host view of one buffer of a call: the buffer itself when it is host memory, else the
// staging bytes (filled from the device first when `load`).
struct Side {
  void* device = nullptr;  // the caller's buffer when it is device memory, else nullptr
  void* host = nullptr;    // what the transport reads or writes
  int64_t bytes = 0;
};

}  // namespace

// Copies in each device input (load), synchronises, runs `call` on the host views, copies each
// device output back and synchronises again. A failure here returns after the stream has run what
// was enqueued (an earlier side's copy into staging that a later Reserve may free).
#define FURNACE_STAGE(side, staging, ptr, nbytes, load)                    \
  Side side;                                                               \
  side.bytes = (nbytes);                                                   \
  if ((ptr) != nullptr && side.bytes > 0 && device_.IsDeviceMemory(ptr)) { \
    absl::StatusOr<char*> h_ = (staging)->Reserve(side.bytes);             \
    absl::Status s_ = h_.status();                                         \
    if (s_.ok() && (load)) {                                               \
      s_ = device_.Copy(*h_, ptr, static_cast<size_t>(side.bytes),         \
                        device::CopyKind::kDeviceToHost, stream);          \
    }                                                                      \
    if (!s_.ok()) {                                                        \
      device_.SynchronizeStream(stream).IgnoreError();                     \
      return Staged(std::move(s_));                                        \
    }                                                                      \
    side.device = const_cast<void*>(static_cast<const void*>(ptr));        \
    side.host = *h_;                                                       \
  } else {                                                                 \
    side.host = const_cast<void*>(static_cast<const void*>(ptr));          \
  }

namespace {

absl::Status Settle(device::Device& device, device::Stream& stream, bool any) {
  return any ? device.SynchronizeStream(stream) : absl::OkStatus();
}

absl::Status CopyBack(device::Device& device, device::Stream& stream, const Side& side) {
  if (side.device == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(device.Copy(side.device, side.host, static_cast<size_t>(side.bytes),
                              device::CopyKind::kHostToDevice, stream));
  return device.SynchronizeStream(stream);
}

}  // namespace

absl::Status StagedCommunicator::AllReduce(float* data, int64_t count) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(d, in_, data, count * 4, true);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, d.device != nullptr)));
  RETURN_IF_ERROR(Counted(CollectiveOp::kAllReduce, timer, [&] {
    return transport_->AllReduce(static_cast<float*>(d.host), count);
  }));
  return Staged(CopyBack(device_, stream, d));
}

absl::Status StagedCommunicator::ReduceScatter(const float* in, float* out,
                                               int64_t count_per_rank) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(i, in_, in, count_per_rank * size() * 4, true);
  FURNACE_STAGE(o, out_, out, count_per_rank * 4, false);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, i.device != nullptr)));
  RETURN_IF_ERROR(Counted(CollectiveOp::kReduceScatter, timer, [&] {
    return transport_->ReduceScatter(static_cast<const float*>(i.host), static_cast<float*>(o.host),
                                     count_per_rank);
  }));
  return Staged(CopyBack(device_, stream, o));
}

absl::Status StagedCommunicator::ReduceScatterV(const float* in, float* out,
                                                const std::vector<int64_t>& counts) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  const int64_t mine = rank() < static_cast<int>(counts.size()) ? counts[rank()] : 0;
  FURNACE_STAGE(i, in_, in, Sum(counts) * 4, true);
  FURNACE_STAGE(o, out_, out, mine * 4, false);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, i.device != nullptr)));
  RETURN_IF_ERROR(Counted(CollectiveOp::kReduceScatter, timer, [&] {
    return transport_->ReduceScatterV(static_cast<const float*>(i.host),
                                      static_cast<float*>(o.host), counts);
  }));
  return Staged(CopyBack(device_, stream, o));
}

absl::Status StagedCommunicator::AllGather(const void* in, void* out, int64_t bytes_per_rank) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(i, in_, in, bytes_per_rank, true);
  FURNACE_STAGE(o, out_, out, bytes_per_rank * size(), false);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, i.device != nullptr)));
  RETURN_IF_ERROR(Counted(CollectiveOp::kAllGather, timer,
                          [&] { return transport_->AllGather(i.host, o.host, bytes_per_rank); }));
  return Staged(CopyBack(device_, stream, o));
}

absl::Status StagedCommunicator::AllGatherV(const void* in, int64_t in_bytes, void* out,
                                            const std::vector<int64_t>& recv_bytes) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(i, in_, in, in_bytes, true);
  FURNACE_STAGE(o, out_, out, Sum(recv_bytes), false);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, i.device != nullptr)));
  RETURN_IF_ERROR(Counted(CollectiveOp::kAllGather, timer, [&] {
    return transport_->AllGatherV(i.host, in_bytes, o.host, recv_bytes);
  }));
  return Staged(CopyBack(device_, stream, o));
}

absl::Status StagedCommunicator::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes,
                                           void* out, const std::vector<int64_t>& recv_bytes) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(i, in_, in, Sum(send_bytes), true);
  FURNACE_STAGE(o, out_, out, Sum(recv_bytes), false);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, i.device != nullptr)));
  RETURN_IF_ERROR(Counted(CollectiveOp::kAllToAll, timer, [&] {
    return transport_->AllToAllV(i.host, send_bytes, o.host, recv_bytes);
  }));
  return Staged(CopyBack(device_, stream, o));
}

absl::Status StagedCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(d, in_, data, bytes, rank() == root);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, d.device != nullptr)));
  RETURN_IF_ERROR(Counted(CollectiveOp::kBroadcast, timer,
                          [&] { return transport_->Broadcast(d.host, bytes, root); }));
  if (rank() == root) return absl::OkStatus();
  return Staged(CopyBack(device_, stream, d));
}

absl::Status StagedCommunicator::Send(const void* data, int64_t bytes, int peer, uint32_t tag) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(d, in_, data, bytes, true);
  RETURN_IF_ERROR(Staged(Settle(device_, stream, d.device != nullptr)));
  // The transport copies the payload before it returns (buffered sends), so staging is free again.
  return Counted(CollectiveOp::kSend, timer,
                 [&] { return transport_->Send(d.host, bytes, peer, tag); });
}

absl::Status StagedCommunicator::Recv(void* data, int64_t bytes, int peer, uint32_t tag) {
  const CallTimer timer;
  device::Stream& stream = device::CurrentStreamOf(device_);
  FURNACE_STAGE(d, out_, data, bytes, false);
  RETURN_IF_ERROR(Counted(CollectiveOp::kRecv, timer,
                          [&] { return transport_->Recv(d.host, bytes, peer, tag); }));
  return Staged(CopyBack(device_, stream, d));
}

#undef FURNACE_STAGE

absl::Status StagedCommunicator::WaitSends() { return transport_->WaitSends(); }
absl::Status StagedCommunicator::PostSends() { return transport_->PostSends(); }

absl::Status StagedCommunicator::Barrier() {
  const CallTimer timer;
  return Counted(CollectiveOp::kBarrier, timer, [&] { return transport_->Barrier(); });
}

std::unique_ptr<Communicator> ForDevice(std::unique_ptr<Communicator> transport,
                                        device::Device& device) {
  if (transport == nullptr || device::HostAddressable(device)) return transport;
  return std::make_unique<StagedCommunicator>(std::move(transport), device);
}

}  // namespace furnace::comm
