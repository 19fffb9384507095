#include "bench/controlplane/fleet.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "bench/common/stats.h"

namespace furnace::bench {

namespace v1 = furnace::v1;

namespace {

void SetDeadline(grpc::ClientContext& context, double seconds) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(
                           std::chrono::duration<double>(seconds)));
}

}  // namespace

// What a tag on one of the fleet's completion queues points to.
class Event {
 public:
  virtual ~Event() = default;
  virtual void Proceed(bool ok) = 0;
};

namespace {

// One unary call: `done` runs on the queue's thread when it completes, then the call is deleted.
template <typename Resp>
class UnaryCall final : public Event {
 public:
  grpc::ClientContext context;
  Resp response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> reader;
  std::function<void(UnaryCall&)> done;
  void Proceed(bool) override {
    done(*this);
    delete this;
  }
};

}  // namespace

// One agent's WatchCommands stream: reads commands until the controller or Stop() ends it. One
// operation outstanding at a time (start, then reads, then finish); Cancel may come from any
// thread.
class CommandStream {
 public:
  CommandStream(Fleet& fleet, SimAgent& agent, v1::AgentService::Stub& stub,
                grpc::CompletionQueue* queue)
      : fleet_(fleet), agent_(agent) {
    request_.set_worker_id(agent.worker_id);
    request_.set_session_id(agent.session_id);
    reader_ = stub.PrepareAsyncWatchCommands(&context_, request_, queue);
    reader_->StartCall(&start_tag_);
  }
  void Cancel() { context_.TryCancel(); }

 private:
  enum class Kind { kStart, kRead, kFinish };
  struct Tag final : Event {
    Tag(CommandStream* s, Kind k) : stream(s), kind(k) {}
    void Proceed(bool ok) override { stream->On(kind, ok); }
    CommandStream* const stream;
    const Kind kind;
  };

  void On(Kind kind, bool ok) {
    switch (kind) {
      case Kind::kStart:
      case Kind::kRead:
        if (kind == Kind::kRead && ok) fleet_.OnCommand(agent_, command_);
        if (ok) {
          reader_->Read(&command_, &read_tag_);
        } else {
          reader_->Finish(&status_, &finish_tag_);  // OnDone follows
        }
        break;
      case Kind::kFinish:
        fleet_.OnStreamDone(agent_, this, status_);
        delete this;
        break;
    }
  }

  Fleet& fleet_;
  SimAgent& agent_;
  grpc::ClientContext context_;
  v1::WatchCommandsRequest request_;
  v1::AgentCommand command_;
  grpc::Status status_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::AgentCommand>> reader_;
  Tag start_tag_{this, Kind::kStart}, read_tag_{this, Kind::kRead},
      finish_tag_{this, Kind::kFinish};
};

absl::StatusOr<std::unique_ptr<Fleet>> Fleet::Create(FleetOptions options, LatencyBook& book) {
  transport::ClientSecurity agent{options.tls, options.join_token, ""};
  transport::ClientSecurity job{options.tls, options.admin_token, ""};
  // The CLI needs no client certificate; the agents present theirs.
  job.tls.cert.clear();
  job.tls.key.clear();
  auto agent_credentials = transport::MakeChannelCredentials(agent);
  if (!agent_credentials.ok()) return agent_credentials.status();
  auto job_credentials = transport::MakeChannelCredentials(job);
  if (!job_credentials.ok()) return job_credentials.status();
  return std::make_unique<Fleet>(std::move(options), book, *agent_credentials, *job_credentials);
}

Fleet::Fleet(FleetOptions options, LatencyBook& book,
             std::shared_ptr<grpc::ChannelCredentials> creds,
             std::shared_ptr<grpc::ChannelCredentials> job_credentials)
    : options_(std::move(options)), book_(book) {
  flush_s_ = options_.flush_s;
  for (uint32_t c = 0; c < std::max(1u, options_.channels); ++c) {
    grpc::ChannelArguments args;
    // A distinct argument per channel: otherwise gRPC shares one connection among them.
    args.SetInt("furnace.loadgen.channel", static_cast<int>(c));
    args.SetMaxReceiveMessageSize(64 << 20);
    channels_.push_back(grpc::CreateCustomChannel(options_.address, creds, args));
    stubs_.push_back(v1::AgentService::NewStub(channels_.back()));
  }
  grpc::ChannelArguments job_args;
  job_args.SetInt("furnace.loadgen.channel", -1);
  job_args.SetMaxReceiveMessageSize(64 << 20);
  jobs_ = v1::JobService::NewStub(
      grpc::CreateCustomChannel(options_.address, std::move(job_credentials), job_args));
  for (uint32_t q = 0; q < std::max(1u, options_.queues); ++q) {
    queues_.push_back(std::make_unique<grpc::CompletionQueue>());
    threads_.emplace_back([queue = queues_.back().get()] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) static_cast<Event*>(tag)->Proceed(ok);
    });
  }
  for (uint32_t i = 0; i < options_.agents; ++i) {
    auto a = std::make_unique<SimAgent>();
    a->index = i;
    a->worker_id = absl::StrCat(options_.host_prefix, "-", i / 8, "/", i % 8);
    agents_.push_back(std::move(a));
  }
}

Fleet::~Fleet() { Stop(); }

v1::AgentService::Stub& Fleet::Stub(const SimAgent& agent) const {
  return *stubs_[agent.index % stubs_.size()];
}

grpc::CompletionQueue* Fleet::Queue(const SimAgent& agent) const {
  return queues_[agent.index % queues_.size()].get();
}

template <typename Req, typename Resp, typename Prepare, typename Done>
void Fleet::Call(const char* kind, const SimAgent& agent, Prepare prepare, const Req& request,
                 double deadline_s, Done done) {
  auto* call = new UnaryCall<Resp>;
  SetDeadline(call->context, deadline_s);
  {
    std::lock_guard<std::mutex> lock(flight_mu_);
    ++in_flight_;
  }
  const double t0 = Now();
  call->done = [this, kind, t0, done](UnaryCall<Resp>& c) {
    const bool counted_ok = done(c.status, c.response);
    book_.Record(kind, Now() - t0, counted_ok,
                 absl::StrCat(c.status.error_code(), ": ", c.status.error_message()));
    std::lock_guard<std::mutex> lock(flight_mu_);
    if (--in_flight_ == 0) flight_cv_.notify_all();
  };
  call->reader = prepare(&call->context, request, Queue(agent));
  call->reader->StartCall();
  call->reader->Finish(&call->response, &call->status, call);
}

void Fleet::Register(SimAgent& a, std::function<void()> finished) {
  v1::RegisterRequest req;
  req.set_worker_id(a.worker_id);
  req.set_host("127.0.0.1");
  req.set_slot(a.index % 8);
  req.set_device_kind("cpu");
  req.set_device_memory(80ull << 30);
  req.set_pid(static_cast<int>(100000 + a.index));
  req.set_instance_id(absl::StrCat("loadgen-", a.index));
  auto& stub = Stub(a);
  Call<v1::RegisterRequest, v1::RegisterResponse>(
      "Register", a,
      [&stub](auto* c, const auto& q, auto* cq) { return stub.PrepareAsyncRegister(c, q, cq); },
      req, options_.rpc_timeout_s,
      [this, &a, finished](const grpc::Status& s, v1::RegisterResponse& resp) {
        if (s.ok()) {
          a.session_id = resp.session_id();
          if (resp.heartbeat_interval_s() > 0) heartbeat_interval_s_ = resp.heartbeat_interval_s();
          if (resp.telemetry_flush_s() > 0) flush_s_ = resp.telemetry_flush_s();
        }
        finished();
        return s.ok();
      });
}

uint32_t Fleet::RegisterAll() {
  // A few hundred in flight, like a cluster's agents coming up over a few seconds.
  constexpr int kWindow = 256;
  std::mutex mu;
  std::condition_variable cv;
  int outstanding = 0;
  for (auto& agent : agents_) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return outstanding < kWindow; });
      ++outstanding;
    }
    Register(*agent, [&] {
      std::lock_guard<std::mutex> lock(mu);
      --outstanding;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return outstanding == 0; });
  uint32_t n = 0;
  for (const auto& a : agents_) n += a->session_id.empty() ? 0 : 1;
  return n;
}

void Fleet::OpenStreams() {
  for (auto& a : agents_) {
    if (a->session_id.empty()) continue;
    {
      std::lock_guard<std::mutex> lock(flight_mu_);
      ++in_flight_;
    }
    std::lock_guard<std::mutex> lock(a->mu);
    a->stream = new CommandStream(*this, *a, Stub(*a), Queue(*a));
  }
}

void Fleet::OnStreamDone(SimAgent& a, CommandStream* stream, const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.stream == stream) a.stream = nullptr;
  }
  // Ended by us (Silence, Stop) or a failure.
  const bool ours = a.silent || stopping_;
  if (!ours) {
    book_.Record("WatchCommands", 0, false,
                 absl::StrCat(status.error_code(), ": ", status.error_message()));
  }
  std::lock_guard<std::mutex> lock(flight_mu_);
  if (--in_flight_ == 0) flight_cv_.notify_all();
}

void Fleet::OnCommand(SimAgent& a, const v1::AgentCommand& command) {
  if (a.silent) return;
  if (command.has_start()) {
    const v1::RankTask& t = command.start();
    {
      std::lock_guard<std::mutex> lock(a.mu);
      a.has_rank = true;
      a.job_id = t.job_id();
      a.attempt = t.attempt();
      a.rank = t.rank();
      a.world = t.world_size();
      a.arrived_all = false;
    }
    world_ = t.world_size();
    ++ranks_started_;
    v1::RankReport report;
    report.set_worker_id(a.worker_id);
    report.set_job_id(t.job_id());
    report.set_attempt(t.attempt());
    report.set_rank(t.rank());
    report.set_event(v1::RANK_STARTED);
    report.set_pid(static_cast<int>(200000 + a.index));
    report.set_unix_time(
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    ReportRank(a, std::move(report), [this, &a] { Arrive(a); });
  } else if (command.has_stop()) {
    const v1::StopRank& stop = command.stop();
    {
      std::lock_guard<std::mutex> lock(a.mu);
      if (a.has_rank && a.job_id == stop.job_id() && a.attempt == stop.attempt()) {
        a.has_rank = false;
      }
    }
    ReportExit(a, stop.job_id(), stop.attempt(), stop.rank());
  }
}

void Fleet::ReportExit(SimAgent& a, const std::string& job_id, uint32_t attempt, uint32_t rank,
                       v1::ExitKind kind) {
  v1::RankReport report;
  report.set_worker_id(a.worker_id);
  report.set_job_id(job_id);
  report.set_attempt(attempt);
  report.set_rank(rank);
  report.set_event(v1::RANK_EXITED);
  report.set_exit_kind(kind);
  report.set_reason(kind == v1::EXIT_KIND_SUCCESS ? "exited with code 0" : "stopped on request");
  ReportRank(a, std::move(report), [this] { ++ranks_stopped_; });
}

void Fleet::ReportRank(SimAgent& a, v1::RankReport report, std::function<void()> on_ok) {
  auto& stub = Stub(a);
  Call<v1::RankReport, v1::Ack>(
      "ReportRank", a,
      [&stub](auto* c, const auto& q, auto* cq) { return stub.PrepareAsyncReportRank(c, q, cq); },
      report, options_.rpc_timeout_s,
      [on_ok = std::move(on_ok)](const grpc::Status& s, v1::Ack&) {
        if (s.ok()) on_ok();
        return s.ok();
      });
}

void Fleet::Arrive(SimAgent& a) {
  v1::KvSetRequest req;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    req.mutable_scope()->set_job_id(a.job_id);
    req.mutable_scope()->set_attempt(a.attempt);
    req.set_key(absl::StrCat("health/arrived/", a.rank));
  }
  req.set_value("1");
  auto& stub = Stub(a);
  Call<v1::KvSetRequest, v1::Ack>(
      "KvSet", a,
      [&stub](auto* c, const auto& q, auto* cq) { return stub.PrepareAsyncKvSet(c, q, cq); }, req,
      options_.rpc_timeout_s,
      [this, &a](const grpc::Status& s, v1::Ack&) {
        if (s.ok()) WaitPeers(a);
        return s.ok();
      });
}

void Fleet::WaitPeers(SimAgent& a) {
  if (a.silent || stopping_) return;
  v1::KvGetRequest req;
  uint32_t world = 0;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (!a.has_rank) return;
    req.mutable_scope()->set_job_id(a.job_id);
    req.mutable_scope()->set_attempt(a.attempt);
    world = a.world;
  }
  // health_check.cc: an indexed wait for every rank's arrival key, in 1 s slices; a slice that
  // ends with peers missing is an answer (complete false), and the rank asks again.
  req.set_indexed_prefix("health/arrived/");
  req.set_indexed_count(world);
  constexpr double kSliceS = 1.0;
  req.set_timeout_s(kSliceS);
  auto& stub = Stub(a);
  Call<v1::KvGetRequest, v1::KvGetResponse>(
      "KvGet", a,
      [&stub](auto* c, const auto& q, auto* cq) { return stub.PrepareAsyncKvGet(c, q, cq); }, req,
      kSliceS + options_.rpc_timeout_s,
      [this, &a, world](const grpc::Status& s, v1::KvGetResponse& resp) {
        if (s.ok() && resp.complete()) {
          {
            std::lock_guard<std::mutex> lock(a.mu);
            a.arrived_all = true;
          }
          if (++ranks_arrived_ == world) all_arrived_at_ = Now();
        } else if (s.ok()) {
          WaitPeers(a);
        }
        return s.ok();
      });
}

void Fleet::Heartbeat(SimAgent& a) {
  v1::HeartbeatRequest req;
  req.set_worker_id(a.worker_id);
  req.set_session_id(a.session_id);
  {
    std::lock_guard<std::mutex> lock(a.mu);
    a.last_heartbeat_sent = Now();
    if (a.has_rank) {
      v1::RunningRank* r = req.add_running();
      r->set_job_id(a.job_id);
      r->set_attempt(a.attempt);
      r->set_rank(a.rank);
      r->set_pid(static_cast<int>(200000 + a.index));
    }
  }
  auto& stub = Stub(a);
  // worker/agent.cc: well above the interval (3 s at least).
  const double deadline = std::max(3.0, 3 * heartbeat_interval_s_);
  Call<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      "Heartbeat", a,
      [&stub](auto* c, const auto& q, auto* cq) { return stub.PrepareAsyncHeartbeat(c, q, cq); },
      req, deadline,
      [this](const grpc::Status& s, v1::HeartbeatResponse& resp) {
        if (s.ok() && resp.reregister()) ++reregister_asks_;
        if (s.ok() && resp.telemetry_flush_s() > 0) flush_s_ = resp.telemetry_flush_s();
        if (s.ok() && resp.reconcile()) ++heartbeats_with_view_;
        return s.ok() && !resp.reregister();
      });
}

void Fleet::PushStep(SimAgent& a, uint64_t step) {
  v1::TelemetryBatch batch;
  batch.set_worker_id(a.worker_id);
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (!a.has_rank || !a.arrived_all) return;
    v1::TelemetryRecord* r = batch.add_records();
    r->set_job_id(a.job_id);
    r->set_attempt(a.attempt);
    r->set_rank(a.rank);
    r->set_step(step);
    r->set_total_steps(1000000);
    r->set_unix_time(
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    r->set_phase("running");
    v1::StepTelemetry* t = r->mutable_train();
    // A plausible step of a large run; the values only need to be the right shape and size.
    t->set_loss(3.0 + 1.0 / static_cast<double>(step));
    t->set_aux_loss(0.01);
    t->set_tokens(a.rank == 0 ? 4u << 20 : 0);
    t->set_tokens_per_second(2.0e6);
    t->set_step_seconds(options_.step_s);
    t->set_forward_backward_seconds(0.8 * options_.step_s);
    t->set_optimizer_seconds(0.05 * options_.step_s);
    t->set_sync_seconds(0.15 * options_.step_s);
    t->set_mfu(0.4);
    t->set_model_flops(1e15);
    t->set_grad_norm(1.0);
    t->set_lr(3e-4);
    for (const auto& [op, group] :
         {std::pair{v1::COLLECTIVE_OP_ALL_TO_ALL, v1::PARALLEL_GROUP_EP},
          std::pair{v1::COLLECTIVE_OP_ALL_REDUCE, v1::PARALLEL_GROUP_DP}}) {
      v1::CommTelemetry* c = t->add_comm();
      c->set_op(op);
      c->set_group(group);
      c->set_calls(8);
      c->set_bytes(64u << 20);
      c->set_seconds(0.01);
    }
  }
  ++telemetry_records_;
  auto& stub = Stub(a);
  Call<v1::TelemetryBatch, v1::TelemetryAck>(
      "PushTelemetry", a,
      [&stub](auto* c, const auto& q, auto* cq) {
        return stub.PrepareAsyncPushTelemetry(c, q, cq);
      },
      batch, options_.rpc_timeout_s,
      [](const grpc::Status& s, v1::TelemetryAck&) { return s.ok(); });
}

void Fleet::Start() {
  scheduler_ = std::thread([this] { ScheduleLoop(); });
}

void Fleet::ScheduleLoop() {
  // Agent i heart-beats at t0 + k * interval + i * interval / N; its rank's step s record leaves
  // at (all arrived) + s * step_s + i * flush / N.
  const double t0 = Now();
  const double n = static_cast<double>(agents_.size());
  uint64_t beat = 0;  // heartbeats sent in all, in schedule order
  uint64_t push = 0;  // telemetry slots passed, in schedule order
  while (!stopping_) {
    const double now = Now();
    const double interval = heartbeat_interval_s_;
    const double flush = flush_s_;
    while (true) {
      const uint64_t round = beat / agents_.size(), i = beat % agents_.size();
      const double due = t0 + round * interval + i * interval / n;
      if (due > now) break;
      SimAgent& a = *agents_[i];
      if (!a.silent && !a.session_id.empty()) {
        // How late this generator sends it: its own share of the cores, apart from the
        // controller's answer (a late send is not counted in the Heartbeat round trip).
        book_.Record("HeartbeatSendLag", Now() - due, true);
        Heartbeat(a);
      }
      ++beat;
    }
    if (const double start = all_arrived_at_; start > 0) {
      while (true) {
        const uint64_t step = push / agents_.size() + 1, i = push % agents_.size();
        if (start + step * options_.step_s + i * flush / n > now) break;
        SimAgent& a = *agents_[i];
        if (!a.silent) PushStep(a, step);
        last_step_ = step;
        ++push;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

absl::StatusOr<std::string> Fleet::Submit(const std::string& yaml) {
  v1::SubmitJobRequest req;
  req.set_yaml(yaml);
  req.set_filename("loadtest.yaml");
  v1::SubmitJobResponse resp;
  grpc::ClientContext context;
  SetDeadline(context, 60);
  const grpc::Status s = jobs_->SubmitJob(&context, req, &resp);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return resp.job_id();
}

absl::Status Fleet::Cancel(const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::CancelJobResponse resp;
  grpc::ClientContext context;
  SetDeadline(context, 60);
  const grpc::Status s = jobs_->CancelJob(&context, req, &resp);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return absl::OkStatus();
}

void Fleet::Finish() {
  for (auto& agent : agents_) {
    SimAgent& a = *agent;
    std::string job_id;
    uint32_t attempt = 0, rank = 0;
    {
      std::lock_guard<std::mutex> lock(a.mu);
      if (!a.has_rank) continue;
      a.has_rank = false;
      job_id = a.job_id;
      attempt = a.attempt;
      rank = a.rank;
    }
    ReportExit(a, job_id, attempt, rank, v1::EXIT_KIND_SUCCESS);
  }
}

absl::StatusOr<v1::JobSummary> Fleet::Summary(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::JobDetail resp;
  grpc::ClientContext context;
  SetDeadline(context, 30);
  const grpc::Status s = jobs_->GetJob(&context, req, &resp);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return resp.summary();
}

absl::StatusOr<v1::JobState> Fleet::JobState(const std::string& job_id) {
  absl::StatusOr<v1::JobSummary> summary = Summary(job_id);
  if (!summary.ok()) return summary.status();
  return summary->state();
}

absl::StatusOr<uint64_t> Fleet::JobStep(const std::string& job_id) {
  absl::StatusOr<v1::JobSummary> summary = Summary(job_id);
  if (!summary.ok()) return summary.status();
  return summary->step();
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Fleet::ListWorkers() {
  v1::ListWorkersResponse resp;
  grpc::ClientContext context;
  SetDeadline(context, 30);
  const double t0 = Now();
  const grpc::Status s = jobs_->ListWorkers(&context, v1::ListWorkersRequest(), &resp);
  book_.Record("ListWorkers", Now() - t0, s.ok(), s.error_message());
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return std::vector<v1::WorkerInfo>(resp.workers().begin(), resp.workers().end());
}

std::vector<SimAgent*> Fleet::Silence(uint32_t n) {
  std::vector<SimAgent*> out;
  // From the end: the first agents are the ones placement fills first.
  for (auto it = agents_.rbegin(); it != agents_.rend() && out.size() < n; ++it) {
    SimAgent& a = **it;
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.has_rank || a.session_id.empty()) continue;
    a.silent = true;
    if (a.stream != nullptr) a.stream->Cancel();
    out.push_back(&a);
  }
  return out;
}

void Fleet::Stop() {
  if (stopping_.exchange(true)) return;
  if (scheduler_.joinable()) scheduler_.join();
  for (auto& a : agents_) {
    std::lock_guard<std::mutex> lock(a->mu);
    if (a->stream != nullptr) a->stream->Cancel();
  }
  {
    std::unique_lock<std::mutex> lock(flight_mu_);
    flight_cv_.wait(lock, [&] { return in_flight_ == 0; });
  }
  for (auto& queue : queues_) queue->Shutdown();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

}  // namespace furnace::bench
