#include "controller/service/grpc_services.h"

#include <atomic>
#include <chrono>
#include <string>

#include "controller/service/caller_identity.h"
#include "runtime/base/utf8.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  // yaml and filename are bytes on the wire: checked here (and in ParseJobYaml) before any of it
  // goes into a protobuf string. A file name that is not UTF-8 is shown with '?' for its bad bytes.
  const std::string filename =
      req->filename().empty() ? "<job>" : SanitizeUtf8(req->filename(), 1024);
  auto id = c_.SubmitAs(CallerIdentity(*ctx), req->yaml(), filename);
  if (!id.ok()) return ToGrpc(id.status());
  resp->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* resp) {
  for (auto& j : c_.ListJobs()) *resp->add_jobs() = std::move(j);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                                    v1::JobDetail* resp) {
  auto detail = c_.GetJob(req->job_id());
  if (!detail.ok()) return ToGrpc(detail.status());
  *resp = std::move(*detail);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                       v1::CancelJobResponse* resp) {
  auto job = c_.CancelAs(CallerIdentity(*ctx), req->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  *resp->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* resp) {
  for (auto& w : c_.ListWorkers()) *resp->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetLogs(grpc::ServerContext*, const v1::GetLogsRequest* req,
                                     v1::GetLogsResponse* resp) {
  auto logs = c_.GetLogs(*req);
  if (!logs.ok()) return ToGrpc(logs.status());
  *resp = std::move(*logs);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobSeries(grpc::ServerContext*, const v1::GetJobSeriesRequest* req,
                                          v1::JobSeries* resp) {
  auto series = c_.GetJobSeries(*req);
  if (!series.ok()) return ToGrpc(series.status());
  *resp = std::move(*series);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListAuditEvents(grpc::ServerContext*,
                                             const v1::ListAuditEventsRequest* req,
                                             v1::ListAuditEventsResponse* resp) {
  auto events = c_.ListAuditEvents(*req);
  if (!events.ok()) return ToGrpc(events.status());
  *resp = std::move(*events);
  return grpc::Status::OK;
}

namespace {

grpc::Status Overloaded(const HandlerPool& pool) {
  // Said in the log at most every 10 s (a flood of refusals must not flood the log too).
  static std::atomic<int64_t> last_said{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (int64_t said = last_said.load();
      now - said >= 10 && last_said.compare_exchange_strong(said, now)) {
    spdlog::warn("overloaded: {} agent calls queued; refusing more with UNAVAILABLE ({} so far)",
                 pool.queued(), pool.refused());
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "controller overloaded; retry");
}

// Runs `start` on the pool; it finishes the call (directly or from a callback). A full pool
// answers UNAVAILABLE at once.
template <typename Start>
grpc::ServerUnaryReactor* Queue(grpc::CallbackServerContext* ctx, HandlerPool& pool, Start start) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!pool.TryPost([reactor, start = std::move(start)]() mutable { start(reactor); })) {
    reactor->Finish(Overloaded(pool));
  }
  return reactor;
}

// Runs `body` on the pool; it returns the call's status (and fills the response).
template <typename Body>
grpc::ServerUnaryReactor* OnPool(grpc::CallbackServerContext* ctx, HandlerPool& pool, Body body) {
  return Queue(ctx, pool, [body = std::move(body)](grpc::ServerUnaryReactor* reactor) mutable {
    reactor->Finish(body());
  });
}

}  // namespace

grpc::ServerUnaryReactor* AgentServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                     const v1::RegisterRequest* req,
                                                     v1::RegisterResponse* resp) {
  return OnPool(ctx, pool_, [this, req, resp] {
    auto r = c_.Register(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* AgentServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                      const v1::HeartbeatRequest* req,
                                                      v1::HeartbeatResponse* resp) {
  *resp = c_.TryHeartbeat(*req);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

// One agent's command stream: writes the worker's queued commands one at a time and, when there
// are none, leaves a wake-up with the registry instead of holding a thread. Ends when the session
// is stale (FAILED_PRECONDITION: register again), the agent goes away or a write fails (what it
// did not get is put back for its next stream).
//
// Threading: gRPC calls OnWriteDone/OnCancel/OnDone on its threads and the registry calls the
// wake-up on the thread that queued a command; all of them take the shared state's mutex, which
// outlives the reactor, so a wake-up that comes after the stream ended finds it gone and does
// nothing. Lock order: this mutex, then the registry's.
class CommandWriter : public grpc::ServerWriteReactor<v1::AgentCommand> {
 public:
  CommandWriter(Controller& c, const v1::WatchCommandsRequest& req)
      : c_(c),
        worker_id_(req.worker_id()),
        session_id_(req.session_id()),
        shared_(std::make_shared<Shared>()) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->writer = this;
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    writing_ = false;
    if (!ok) {
      // The agent went away mid-delivery: keep what it did not get for its next stream.
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "command stream closed"));
      return;
    }
    pending_.erase(pending_.begin());
    PumpLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->writer = nullptr;
    }
    delete this;
  }

 private:
  struct Shared {
    std::mutex mu;
    CommandWriter* writer = nullptr;  // null once the stream is done
  };

  void PumpLocked() {
    if (finished_ || writing_) return;
    if (pending_.empty()) {
      std::weak_ptr<Shared> weak = shared_;
      auto commands = c_.TakeCommands(worker_id_, session_id_, [weak] {
        if (auto shared = weak.lock()) {
          std::lock_guard<std::mutex> lock(shared->mu);
          if (shared->writer != nullptr) shared->writer->PumpLocked();
        }
      });
      if (!commands.ok()) {
        FinishLocked(ToGrpc(commands.status()));
        return;
      }
      if (commands->empty()) return;  // woken when there are some
      pending_ = std::move(*commands);
    }
    writing_ = true;
    StartWrite(&pending_.front());
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    // Whatever was not confirmed written goes back for the agent's next stream.
    if (!pending_.empty()) c_.Requeue(worker_id_, std::move(pending_));
    pending_.clear();
    Finish(status);
  }

  Controller& c_;
  const std::string worker_id_, session_id_;
  const std::shared_ptr<Shared> shared_;
  std::vector<v1::AgentCommand> pending_;  // taken, not yet confirmed written; guarded by mu
  bool writing_ = false;                   // a StartWrite is outstanding; guarded by mu
  bool finished_ = false;                  // guarded by mu
};

}  // namespace

grpc::ServerWriteReactor<v1::AgentCommand>* AgentServiceImpl::WatchCommands(
    grpc::CallbackServerContext*, const v1::WatchCommandsRequest* req) {
  return new CommandWriter(c_, *req);
}

grpc::ServerUnaryReactor* AgentServiceImpl::ReportRank(grpc::CallbackServerContext* ctx,
                                                       const v1::RankReport* req, v1::Ack*) {
  return OnPool(ctx, pool_, [this, req] { return ToGrpc(c_.ReportRank(*req)); });
}

grpc::ServerUnaryReactor* AgentServiceImpl::PushTelemetry(grpc::CallbackServerContext* ctx,
                                                          const v1::TelemetryBatch* req, v1::Ack*) {
  return Queue(ctx, pool_, [this, req](grpc::ServerUnaryReactor* reactor) {
    c_.PushTelemetry(*req, [reactor](absl::Status s) { reactor->Finish(ToGrpc(s)); });
  });
}

grpc::ServerUnaryReactor* AgentServiceImpl::PushLogs(grpc::CallbackServerContext* ctx,
                                                     const v1::LogBatch* req, v1::Ack*) {
  return OnPool(ctx, pool_, [this, req] { return ToGrpc(c_.PushLogs(*req)); });
}

// The rendezvous needs no state mutex (its scopes fence by themselves): KvSet and KvGet run on
// gRPC's thread and finish from their callbacks.
grpc::ServerUnaryReactor* AgentServiceImpl::KvSet(grpc::CallbackServerContext* ctx,
                                                  const v1::KvSetRequest* req, v1::Ack*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  c_.KvSet(*req, [reactor](absl::Status s) { reactor->Finish(ToGrpc(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* AgentServiceImpl::KvGet(grpc::CallbackServerContext* ctx,
                                                  const v1::KvGetRequest* req,
                                                  v1::KvGetResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  c_.KvGet(*req, [reactor, resp](absl::StatusOr<v1::KvGetResponse> r) {
    if (!r.ok()) return reactor->Finish(ToGrpc(r.status()));
    *resp = std::move(*r);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace furnace::controller
