#include "runtime/comm/fused_exchange.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/stream_communicator.h"
#include "runtime/device/current_stream.h"

namespace furnace::comm {
namespace {

std::string Where(const Communicator& a2a, const Communicator& ag) {
  return absl::StrCat("fused all_to_all+all_gather (a2a ", a2a.name(), " rank ", a2a.rank(),
                      ", ag ", ag.name(), " rank ", ag.rank(), ")");
}

absl::Status CheckLayout(const Communicator& a2a, const Communicator& ag, const void* in,
                         const void* out, int64_t out_bytes, const FusedLayout& layout) {
  const std::string where = Where(a2a, ag);
  auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  if (&a2a == &ag) return invalid("a2a and ag must be different Communicator objects");
  const int G = a2a.size(), n = ag.size();
  if (static_cast<int>(layout.send_bytes.size()) != G) {
    return invalid(absl::StrCat("send_bytes has ", layout.send_bytes.size(), " entries, want ", G));
  }
  int64_t in_bytes = 0;
  for (int j = 0; j < G; ++j) {
    if (layout.send_bytes[j] < 0) {
      return invalid(absl::StrCat("send_bytes[", j, "] = ", layout.send_bytes[j], " < 0"));
    }
    in_bytes += layout.send_bytes[j];
  }
  if (in_bytes > 0 && in == nullptr)
    return invalid(absl::StrCat("in is null, ", in_bytes, " bytes due"));
  if (out_bytes < 0) return invalid(absl::StrCat("out_bytes = ", out_bytes, " < 0"));
  if (out_bytes > 0 && out == nullptr) return invalid("out is null");
  if (static_cast<int>(layout.chunk_bytes.size()) != n ||
      static_cast<int>(layout.chunk_offset.size()) != n) {
    return invalid(absl::StrCat("chunk_bytes has ", layout.chunk_bytes.size(),
                                " rows and chunk_offset ", layout.chunk_offset.size(), ", want ", n,
                                " (ag size)"));
  }
  std::vector<std::pair<int64_t, int64_t>> spans;  // (offset, bytes) of the non-empty chunks
  for (int q = 0; q < n; ++q) {
    if (static_cast<int>(layout.chunk_bytes[q].size()) != G ||
        static_cast<int>(layout.chunk_offset[q].size()) != G) {
      return invalid(absl::StrCat("chunk_bytes[", q, "] has ", layout.chunk_bytes[q].size(),
                                  " entries and chunk_offset[", q, "] ",
                                  layout.chunk_offset[q].size(), ", want ", G, " (a2a size)"));
    }
    for (int i = 0; i < G; ++i) {
      const int64_t bytes = layout.chunk_bytes[q][i], offset = layout.chunk_offset[q][i];
      if (bytes < 0 || offset < 0 || bytes > out_bytes || offset > out_bytes - bytes) {
        return invalid(absl::StrCat("chunk [", q, "][", i, "] (", bytes, " bytes at offset ",
                                    offset, ") is not within out (", out_bytes, " bytes)"));
      }
      if (bytes > 0) spans.emplace_back(offset, bytes);
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k - 1].first + spans[k - 1].second > spans[k].first) {
      return invalid(absl::StrCat("chunks at offsets ", spans[k - 1].first, " (",
                                  spans[k - 1].second, " bytes) and ", spans[k].first,
                                  " overlap in out"));
    }
  }
  const int a = a2a.rank(), q0 = ag.rank();
  if (layout.chunk_bytes[q0][0] != layout.send_bytes[a]) {
    return invalid(absl::StrCat("chunk_bytes[", q0, "][0] = ", layout.chunk_bytes[q0][0],
                                ", but the self chunk send_bytes[", a,
                                "] = ", layout.send_bytes[a]));
  }
  return absl::OkStatus();
}

// The handshake between the caller's thread (the exchange; it reports each step whose chunk has
// landed in `out`) and the gather thread (it waits for them): a step counter under a mutex, and
// the first error of either thread, after which nobody waits any longer.
class StepHandshake {
 public:
  void Landed(int step) {
    std::lock_guard<std::mutex> lock(mu_);
    landed_ = step + 1;
    cv_.notify_all();
  }
  // Blocks until `step` has landed (true) or the exchange gave up or failed (false).
  bool WaitLanded(int step) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return landed_ > step || stopped_ || !error_.ok(); });
    return landed_ > step && error_.ok();
  }
  // Records `status` if it is the first error; wakes the waiter.
  void Fail(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = std::move(status);
    cv_.notify_all();
  }
  // No more steps will land: the exchange stopped (on any path).
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }
  absl::Status error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int landed_ = 0;  // steps 0..landed_-1 are in `out`
  bool stopped_ = false;
  absl::Status error_;
};

// Joins the gather thread on every path; steps that have not landed by then never will.
class JoinOnExit {
 public:
  JoinOnExit(StepHandshake& handshake, std::thread thread)
      : handshake_(handshake), thread_(std::move(thread)) {}
  ~JoinOnExit() { Join(); }
  JoinOnExit(const JoinOnExit&) = delete;
  JoinOnExit& operator=(const JoinOnExit&) = delete;
  void Join() {
    handshake_.Stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  StepHandshake& handshake_;
  std::thread thread_;
};

// The gather thread: for every step, once its chunk has landed, all-gathers it over `ag` into
// `scratch` and places the other members' chunks in `out`.
void GatherSteps(Communicator& ag, char* out, const FusedLayout& layout, int steps,
                 std::vector<char>& scratch, StepHandshake& handshake) {
  const int n = ag.size(), q0 = ag.rank();
  std::vector<int64_t> recv_bytes(n);
  for (int i = 0; i < steps; ++i) {
    if (!handshake.WaitLanded(i)) return;
    for (int q = 0; q < n; ++q) recv_bytes[q] = layout.chunk_bytes[q][i];
    const absl::Status status = ag.AllGatherV(
        out + layout.chunk_offset[q0][i], layout.chunk_bytes[q0][i], scratch.data(), recv_bytes);
    if (!status.ok()) {
      handshake.Fail(status);
      return;
    }
    int64_t from = 0;
    for (int q = 0; q < n; ++q) {
      if (q != q0 && recv_bytes[q] > 0) {
        std::memcpy(out + layout.chunk_offset[q][i], scratch.data() + from, recv_bytes[q]);
      }
      from += recv_bytes[q];
    }
  }
}

// The device communicators of the fused op when it runs on streams: both StreamCommunicators of
// one device, with the buffers in its memory.
struct OnStreams {
  StreamCommunicator* a2a = nullptr;
  StreamCommunicator* ag = nullptr;
};

OnStreams DeviceCommunicators(Communicator& a2a, Communicator& ag, const void* in, const void* out,
                              const FusedLayout& layout) {
  auto* da = dynamic_cast<StreamCommunicator*>(&a2a);
  auto* dg = dynamic_cast<StreamCommunicator*>(&ag);
  if (da == nullptr || dg == nullptr || &da->device() != &dg->device()) return {};
  device::Device& device = da->device();
  int64_t in_bytes = 0;
  for (int64_t b : layout.send_bytes) in_bytes += b;
  const bool in_ok = in_bytes == 0 || device.IsDeviceMemory(in);
  const bool out_ok = out == nullptr || device.IsDeviceMemory(out);
  if (!in_ok || !out_ok) return {};
  return {da, dg};
}

// Device scratch for the all-gathers, allocated and freed in the order of the stream that uses it.
class StreamScratch {
 public:
  StreamScratch(device::Device& device, device::Stream& stream)
      : device_(device), stream_(stream) {}
  ~StreamScratch() {
    if (data_ == nullptr) return;
    const device::StreamScope scope(stream_);
    device_.Free(data_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  absl::StatusOr<char*> Allocate(int64_t bytes) {
    if (bytes == 0) return nullptr;
    const device::StreamScope scope(stream_);
    ASSIGN_OR_RETURN(void* p, device_.Allocate(static_cast<size_t>(bytes)));
    data_ = static_cast<char*>(p);
    return data_;
  }

 private:
  device::Device& device_;
  device::Stream& stream_;
  char* data_ = nullptr;
};

// The fused op on the two communication streams (the header's "on device communicators").
absl::Status FusedOnStreams(StreamCommunicator& a2a, StreamCommunicator& ag, const char* src,
                            char* dst, const FusedLayout& layout,
                            const std::vector<int64_t>& send_offset, int64_t scratch_bytes) {
  const int G = a2a.size(), n = ag.size(), a = a2a.rank(), q0 = ag.rank();
  device::Device& device = a2a.device();
  device::Stream& caller = device::CurrentStreamOf(device);
  // Both streams start after the producer of `in` (and of whatever `out` held). A failed `ag`
  // does not stop the exchange (as on host threads).
  RETURN_IF_ERROR(a2a.OrderAfter(caller));
  absl::Status exchanged, gathered = ag.OrderAfter(caller);
  {
    StreamScratch scratch(device, ag.stream());
    absl::StatusOr<char*> gather_buffer = scratch.Allocate(scratch_bytes);
    if (!gather_buffer.ok()) {
      exchanged = gather_buffer.status();
    } else {
      std::vector<int64_t> recv_bytes(n);
      // Step i's all-gather on ag's stream, after a2a's stream has landed step i's chunk; then its
      // chunks copied into place on the same stream. After a failure the exchange goes on without
      // it (the a2a peers are not left waiting).
      auto gather = [&](int i) {
        if (!gathered.ok()) return;
        for (int q = 0; q < n; ++q) recv_bytes[q] = layout.chunk_bytes[q][i];
        gathered = ag.AllGatherV(dst + layout.chunk_offset[q0][i], layout.chunk_bytes[q0][i],
                                 *gather_buffer, recv_bytes);
        int64_t from = 0;
        for (int q = 0; q < n && gathered.ok(); ++q) {
          if (q != q0 && recv_bytes[q] > 0) {
            gathered = device.Copy(dst + layout.chunk_offset[q][i], *gather_buffer + from,
                                   static_cast<size_t>(recv_bytes[q]),
                                   device::CopyKind::kDeviceToDevice, ag.stream());
          }
          from += recv_bytes[q];
        }
      };
      const StreamCommunicator::ScopedOrdering on_a2a(a2a, /*after=*/nullptr, /*join=*/false);
      const StreamCommunicator::ScopedOrdering on_ag(ag, &a2a.stream(), /*join=*/false);
      // Step 0: the chunk to this rank itself.
      if (layout.send_bytes[a] > 0) {
        exchanged = device.Copy(dst + layout.chunk_offset[q0][0], src + send_offset[a],
                                static_cast<size_t>(layout.send_bytes[a]),
                                device::CopyKind::kDeviceToDevice, a2a.stream());
      }
      if (exchanged.ok()) gather(0);
      for (int i = 1; i < G && exchanged.ok(); ++i) {
        const int to = (a + i) % G, from = (a - i + G) % G;
        const uint32_t tag = kFusedExchangeTagBase + static_cast<uint32_t>(i);
        exchanged = a2a.Send(src + send_offset[to], layout.send_bytes[to], to, tag);
        if (exchanged.ok()) {
          exchanged =
              a2a.Recv(dst + layout.chunk_offset[q0][i], layout.chunk_bytes[q0][i], from, tag);
        }
        if (exchanged.ok()) gather(i);
      }
    }
  }  // the scratch is freed in ag's stream order, after the last copy out of it
  // The caller's stream waits for both, on every path: whatever was enqueued still uses `in`,
  // `out` and the scratch.
  const absl::Status joined_a2a = a2a.OrderBefore(caller);
  const absl::Status joined_ag = ag.OrderBefore(caller);
  RETURN_IF_ERROR(exchanged);
  RETURN_IF_ERROR(gathered);
  RETURN_IF_ERROR(joined_a2a);
  return joined_ag;
}

}  // namespace

bool FusedExchangeOnStreams(Communicator& a2a, Communicator& ag) {
  auto* da = dynamic_cast<StreamCommunicator*>(&a2a);
  auto* dg = dynamic_cast<StreamCommunicator*>(&ag);
  return da != nullptr && dg != nullptr && &da->device() == &dg->device();
}

absl::Status FusedAllToAllAllGather(Communicator& a2a, Communicator& ag, const void* in, void* out,
                                    int64_t out_bytes, const FusedLayout& layout) {
  RETURN_IF_ERROR(CheckLayout(a2a, ag, in, out, out_bytes, layout));
  const int G = a2a.size(), n = ag.size(), a = a2a.rank(), q0 = ag.rank();
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  std::vector<int64_t> send_offset(G, 0);
  for (int j = 1; j < G; ++j) send_offset[j] = send_offset[j - 1] + layout.send_bytes[j - 1];
  int64_t scratch_bytes = 0;
  for (int i = 0; i < G; ++i) {
    int64_t step_bytes = 0;
    for (int q = 0; q < n; ++q) step_bytes += layout.chunk_bytes[q][i];
    scratch_bytes = std::max(scratch_bytes, step_bytes);
  }
  if (const OnStreams on = DeviceCommunicators(a2a, ag, in, out, layout); on.a2a != nullptr) {
    return FusedOnStreams(*on.a2a, *on.ag, src, dst, layout, send_offset, scratch_bytes);
  }
  std::vector<char> scratch(scratch_bytes);

  StepHandshake handshake;
  JoinOnExit gather(handshake,
                    std::thread([&] { GatherSteps(ag, dst, layout, G, scratch, handshake); }));
  auto fail = [&](absl::Status status) {
    handshake.Fail(std::move(status));
    gather.Join();
    return handshake.error();  // the first error of either thread
  };

  // Step 0: the chunk to this rank itself.
  if (layout.send_bytes[a] > 0) {
    std::memcpy(dst + layout.chunk_offset[q0][0], src + send_offset[a], layout.send_bytes[a]);
  }
  handshake.Landed(0);
  // A failed all-gather does not stop the exchange: finishing it keeps the a2a peers from
  // waiting out their timeouts and leaves no message of this call behind for the next one.
  for (int i = 1; i < G; ++i) {
    const int to = (a + i) % G, from = (a - i + G) % G;
    const uint32_t tag = kFusedExchangeTagBase + static_cast<uint32_t>(i);
    if (absl::Status status = a2a.Send(src + send_offset[to], layout.send_bytes[to], to, tag);
        !status.ok()) {
      return fail(std::move(status));
    }
    if (absl::Status status =
            a2a.Recv(dst + layout.chunk_offset[q0][i], layout.chunk_bytes[q0][i], from, tag);
        !status.ok()) {
      return fail(std::move(status));
    }
    handshake.Landed(i);
  }
  if (absl::Status status = a2a.WaitSends(); !status.ok()) return fail(std::move(status));
  gather.Join();
  return handshake.error();
}

}  // namespace furnace::comm
