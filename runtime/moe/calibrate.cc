#include "runtime/moe/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/tensor/transfer.h"

namespace furnace::moe {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int SizeOf(const comm::Communicator* c) { return c == nullptr ? 1 : c->size(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One measured series: a (kind, group) fit and its points' x values; the y values are filled on
// this rank, averaged over world, then fitted.
struct Series {
  CollectiveKind kind;
  OpGroup group;
  std::vector<double> x;
  std::vector<double> seconds;
};

// A group's input and output buffers on the rank's device (host memory without one).
struct Buffers {
  device::Device* device = nullptr;  // nullptr: host vectors
  std::vector<char> host_in, host_out;
  tensor::DeviceMemory device_in, device_out;

  static absl::StatusOr<Buffers> Make(device::Device* device, int64_t in_bytes, int64_t out_bytes) {
    Buffers b;
    if (device == nullptr || device::HostAddressable(*device)) {
      b.host_in.assign(static_cast<size_t>(in_bytes), 1);
      b.host_out.assign(static_cast<size_t>(out_bytes), 0);
      return b;
    }
    b.device = device;
    ASSIGN_OR_RETURN(b.device_in,
                     tensor::DeviceMemory::Allocate(*device, in_bytes, "calibration input"));
    ASSIGN_OR_RETURN(b.device_out,
                     tensor::DeviceMemory::Allocate(*device, out_bytes, "calibration output"));
    RETURN_IF_ERROR(tensor::Fill(*device, b.device_in.data(), 1, in_bytes));
    RETURN_IF_ERROR(tensor::Fill(*device, b.device_out.data(), 0, out_bytes));
    return b;
  }
  void* in() { return device == nullptr ? host_in.data() : device_in.data(); }
  void* out() { return device == nullptr ? host_out.data() : device_out.data(); }
  // Until what this thread enqueued on the device has run (nothing to wait for on the host).
  absl::Status Wait() {
    return device == nullptr ? absl::OkStatus() : tensor::Synchronize(*device);
  }
};

// `bytes` logical bytes of `kind` on c, one call.
absl::Status RunOnce(comm::Communicator& c, CollectiveKind kind, int64_t bytes, Buffers& b) {
  const int n = c.size();
  switch (kind) {
    case CollectiveKind::kAllGather:
      return c.AllGather(b.in(), b.out(), bytes);
    case CollectiveKind::kAllToAll: {
      const std::vector<int64_t> chunks(n, bytes / n);
      return c.AllToAllV(b.in(), chunks, b.out(), chunks);
    }
    case CollectiveKind::kReduceScatter: {
      const int64_t per_rank = bytes / 4 / n;
      return c.ReduceScatter(static_cast<const float*>(b.in()), static_cast<float*>(b.out()),
                             per_rank);
    }
  }
  return absl::InternalError("unknown collective kind");
}

// The median of `repeats` calls, each timed until it has completed on the device.
absl::StatusOr<double> TimeCollective(comm::Communicator& c, CollectiveKind kind, int64_t bytes,
                                      int repeats, Buffers& b) {
  RETURN_IF_ERROR(b.Wait());
  RETURN_IF_ERROR(c.Barrier());
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const Clock::time_point start = Clock::now();
    RETURN_IF_ERROR(RunOnce(c, kind, bytes, b));
    RETURN_IF_ERROR(b.Wait());
    times.push_back(Since(start));
  }
  return Median(std::move(times));
}

absl::StatusOr<double> TimeLocal(const std::function<absl::StatusOr<double>(int64_t)>& measure,
                                 int64_t x, int repeats) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    ASSIGN_OR_RETURN(const double t, measure(x));
    times.push_back(t);
  }
  return Median(std::move(times));
}

}  // namespace

absl::StatusOr<CostProfile> Calibrate(const CalibrationGroups& g, const CalibrationOptions& o) {
  if (o.sizes_bytes.empty()) return absl::InvalidArgumentError("calibrate: no sizes_bytes");
  if (o.repeats < 1) return absl::InvalidArgumentError("calibrate: repeats must be >= 1");
  const Clock::time_point start = Clock::now();

  const std::pair<OpGroup, comm::Communicator*> groups[] = {
      {OpGroup::kTp, g.tp}, {OpGroup::kEp, g.ep}, {OpGroup::kEsp, g.esp}};
  std::vector<Series> series;
  const int64_t max_bytes = *std::max_element(o.sizes_bytes.begin(), o.sizes_bytes.end());
  for (const auto& [group, c] : groups) {
    if (SizeOf(c) <= 1) continue;
    std::vector<CollectiveKind> kinds;
    if (group == OpGroup::kTp) kinds = {CollectiveKind::kAllGather};
    if (group == OpGroup::kEp) kinds = {CollectiveKind::kAllToAll};
    if (group == OpGroup::kEsp)
      kinds = {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter};
    // in: the largest whole input (reduce-scatter, a2a) or contribution; out: an all-gather's.
    ASSIGN_OR_RETURN(Buffers buffers,
                     Buffers::Make(o.device, max_bytes + 64, max_bytes * c->size() + 64));
    for (CollectiveKind kind : kinds) {
      Series s{kind, group, {}, {}};
      for (int64_t bytes : o.sizes_bytes) {
        ASSIGN_OR_RETURN(const double t, TimeCollective(*c, kind, bytes, o.repeats, buffers));
        s.x.push_back(static_cast<double>(bytes));
        s.seconds.push_back(t);
      }
      series.push_back(std::move(s));
    }
  }
  std::vector<double> gemm_x, gemm_y, copy_x, copy_y;
  if (o.gemm_seconds) {
    for (int64_t flops : o.gemm_flops) {
      gemm_x.push_back(static_cast<double>(flops));
      ASSIGN_OR_RETURN(const double t, TimeLocal(o.gemm_seconds, flops, o.repeats));
      gemm_y.push_back(t);
    }
  }
  if (o.copy_seconds) {
    for (int64_t bytes : o.sizes_bytes) {
      copy_x.push_back(static_cast<double>(bytes));
      ASSIGN_OR_RETURN(const double t, TimeLocal(o.copy_seconds, bytes, o.repeats));
      copy_y.push_back(t);
    }
  }

  // Every timing, then the elapsed time, averaged over world in one AllReduce.
  std::vector<float> all;
  for (const Series& s : series) all.insert(all.end(), s.seconds.begin(), s.seconds.end());
  all.insert(all.end(), gemm_y.begin(), gemm_y.end());
  all.insert(all.end(), copy_y.begin(), copy_y.end());
  all.push_back(static_cast<float>(Since(start)));
  const int world = SizeOf(g.world);
  if (world > 1) {
    RETURN_IF_ERROR(g.world->AllReduce(all.data(), static_cast<int64_t>(all.size())));
    for (float& v : all) v /= static_cast<float>(world);
  }

  CostProfile p = DefaultProfile(true, true, true);
  for (OpGroup group : kCommGroups) {
    for (CollectiveKind kind : kAllCollectiveKinds) p.at(kind, group) = AlphaBeta{};
  }
  size_t next = 0;
  auto fit = [&](const std::vector<double>& x) {
    std::vector<std::pair<double, double>> points;
    for (double xi : x) points.emplace_back(xi, static_cast<double>(all[next++]));
    return FitAlphaBeta(points);
  };
  for (const Series& s : series) p.at(s.kind, s.group) = fit(s.x);
  if (!gemm_x.empty()) p.gemm = fit(gemm_x);
  if (!copy_x.empty()) p.copy = fit(copy_x);
  p.seconds_spent = all[next];
  p.source = absl::StrCat("fitted on tp ", SizeOf(g.tp), " x ep ", SizeOf(g.ep), " x esp ",
                          SizeOf(g.esp), " (world ", world, ")");
  return p;
}

}  // namespace furnace::moe
