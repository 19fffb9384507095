#include "controller/service/agent_server.h"

#include <chrono>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "controller/service/caller_identity.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {

namespace v1 = furnace::v1;

namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

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

// What a completion queue's tag points to.
class Event {
 public:
  virtual ~Event() = default;
  virtual void Proceed(bool ok) = 0;
};

// A worker's call must be about the worker its credentials name (CallerWorker: the worker id it
// sent, which auth_processor.h holds to a host's own certificate): no worker registers, reports or
// pushes as another. A caller that names no worker (a plaintext server, or a client sharing its
// channel among many agents with the fleet's certificate, which may act as any worker anyway) has
// nothing to hold it to. Rendezvous calls name no worker in the request: the rendezvous holds the
// caller to the workers of the scope's attempt (Rendezvous::CheckCaller).
grpc::Status CheckCaller(const grpc::ServerContext& context, const std::string& worker_id) {
  const std::string caller = CallerWorker(context);
  if (caller.empty() || caller == worker_id) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat("the call is for worker `", worker_id,
                                   "` but comes with the credentials of agent:", caller));
}

// One unary call of a method: requested on a queue; when it arrives, the next one is requested
// and `handle` runs, which must call Reply exactly once (from any thread); the call is deleted
// when its Finish completes.
template <typename Req, typename Resp>
class Unary final : public Event {
 public:
  using Request = void (v1::AgentService::AsyncService::*)(grpc::ServerContext*, Req*,
                                                           grpc::ServerAsyncResponseWriter<Resp>*,
                                                           grpc::CompletionQueue*,
                                                           grpc::ServerCompletionQueue*, void*);
  using Handle = std::function<void(Unary*)>;

  static void Post(AgentServer& server, grpc::ServerCompletionQueue* queue, Request request,
                   Handle handle) {
    auto* call = new Unary(server, queue, request, std::move(handle));
    server.Enter();
    (server.service().*request)(&call->context_, &call->request_, &call->writer_, queue, queue,
                                call);
  }

  void Proceed(bool ok) override {
    if (finishing_) {
      delete this;  // Finish completed (or failed: the client went away)
      return;
    }
    if (!ok) {  // the server shuts down: no call came
      server_.Leave();
      delete this;
      return;
    }
    if (!server_.stopping()) Post(server_, queue_, request_fn_, handle_);
    if constexpr (requires(const Req& r) { r.worker_id(); }) {
      if (grpc::Status caller = CheckCaller(context_, request_.worker_id()); !caller.ok()) {
        return Reply(caller);
      }
    }
    handle_(this);
  }

  const Req& request() const { return request_; }
  const grpc::ServerContext& context() const { return context_; }
  Resp& response() { return response_; }
  AgentServer& server() { return server_; }

  void Reply(const grpc::Status& status) {
    AgentServer& server = server_;  // `this` may be gone once Finish is started
    finishing_ = true;
    if (status.ok()) {
      writer_.Finish(response_, status, this);
    } else {
      writer_.FinishWithError(status, this);
    }
    server.Leave();
  }

 private:
  Unary(AgentServer& server, grpc::ServerCompletionQueue* queue, Request request, Handle handle)
      : server_(server), queue_(queue), request_fn_(request), handle_(std::move(handle)) {}

  AgentServer& server_;
  grpc::ServerCompletionQueue* const queue_;
  const Request request_fn_;
  const Handle handle_;
  grpc::ServerContext context_;
  Req request_;
  Resp response_;
  grpc::ServerAsyncResponseWriter<Resp> writer_{&context_};
  bool finishing_ = false;  // set before Finish is started; read on the queue's thread after
};

// Runs the call's body on the pool (a full pool refuses it at once).
template <typename Call, typename Body>
void OnPool(Call* call, Body body) {
  HandlerPool& pool = call->server().pool();
  if (!pool.TryPost([call, body = std::move(body)]() mutable { body(call); })) {
    call->Reply(Overloaded(pool));
  }
}

// One agent's command stream: writes the worker's queued commands one at a time and, when there
// are none, leaves a wake-up with the registry instead of holding a thread. Ends when the session
// is stale (FAILED_PRECONDITION: register again), the agent goes away or a write fails (what it did
// not get is put back for its next stream).
//
// Events: the request, each write's completion, Finish's, and the call's end (AsyncNotifyWhenDone,
// which also tells a cancelled call). The stream is deleted once Finish has completed and the call
// has ended. Threading: the queue's thread delivers the events and the registry calls the wake-up
// on the thread that queued a command; all take the shared state's mutex, which outlives the
// stream, so a wake-up after the stream is gone finds it gone. Lock order: this mutex, then the
// registry's.
class CommandStream {
 public:
  static void Post(AgentServer& server, grpc::ServerCompletionQueue* queue) {
    auto* stream = new CommandStream(server, queue);
    server.Enter();
    stream->context_.AsyncNotifyWhenDone(&stream->done_tag_);
    server.service().RequestWatchCommands(&stream->context_, &stream->request_, &stream->writer_,
                                          queue, queue, &stream->request_tag_);
  }

 private:
  enum class Kind { kRequest, kWrite, kFinish, kDone };
  struct Tag final : Event {
    Tag(CommandStream* s, Kind k) : stream(s), kind(k) {}
    void Proceed(bool ok) override { stream->On(kind, ok); }
    CommandStream* const stream;
    const Kind kind;
  };
  struct Shared {
    std::mutex mu;
    CommandStream* stream = nullptr;  // null once the stream is gone
  };

  CommandStream(AgentServer& server, grpc::ServerCompletionQueue* queue)
      : server_(server), queue_(queue), shared_(std::make_shared<Shared>()) {
    shared_->stream = this;
  }

  void On(Kind kind, bool ok) {
    if (kind == Kind::kRequest && !ok) {
      // The server shuts down before an agent came: the call never started, so its end is never
      // told either.
      server_.Leave();
      delete this;
      return;
    }
    bool gone = false;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      switch (kind) {
        case Kind::kRequest:
          if (!server_.stopping()) Post(server_, queue_);
          worker_id_ = request_.worker_id();
          session_id_ = request_.session_id();
          if (grpc::Status caller = CheckCaller(context_, worker_id_); !caller.ok()) {
            EndLocked(caller);
            break;
          }
          PumpLocked();
          break;
        case Kind::kWrite:
          writing_ = false;
          if (!ok) {
            // The agent went away mid-delivery: what it did not get is kept for its next stream.
            // The call may have ended already (its end came while this write was out), in which
            // case EndLocked does nothing and the Finish it put off waits for this.
            EndLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "command stream closed"));
            FinishIfIdleLocked();
          } else {
            pending_.erase(pending_.begin());  // delivered
            if (ended_) {
              FinishIfIdleLocked();
            } else {
              PumpLocked();
            }
          }
          break;
        case Kind::kFinish:
          finish_done_ = true;
          break;
        case Kind::kDone:
          call_done_ = true;
          EndLocked(grpc::Status::CANCELLED);  // nothing if it ended already
          break;
      }
      if (finish_done_ && call_done_) {
        shared_->stream = nullptr;
        gone = true;
      }
    }
    if (gone) delete this;
  }

  void PumpLocked() {
    if (ended_ || writing_) return;
    if (pending_.empty()) {
      std::weak_ptr<Shared> weak = shared_;
      auto commands = server_.controller().TakeCommands(worker_id_, session_id_, [weak] {
        if (auto shared = weak.lock()) {
          std::lock_guard<std::mutex> lock(shared->mu);
          if (shared->stream != nullptr) shared->stream->PumpLocked();
        }
      });
      if (!commands.ok()) {
        EndLocked(ToGrpc(commands.status()));
        return;
      }
      if (commands->empty()) return;  // woken when there are some
      pending_ = std::move(*commands);
    }
    writing_ = true;
    writer_.Write(pending_.front(), &write_tag_);
  }

  // The stream ends with `status` (the first one decided); Finish once no write is outstanding
  // (one operation at a time).
  void EndLocked(const grpc::Status& status) {
    if (ended_) return;
    ended_ = true;
    status_ = status;
    FinishIfIdleLocked();
  }

  void FinishIfIdleLocked() {
    if (finish_started_ || writing_) return;
    // Whatever was not confirmed delivered goes back, in order, for the agent's next stream.
    if (!pending_.empty()) {
      server_.controller().Requeue(worker_id_, session_id_, std::move(pending_));
    }
    pending_.clear();
    finish_started_ = true;
    writer_.Finish(status_, &finish_tag_);
    server_.Leave();
  }

  AgentServer& server_;
  grpc::ServerCompletionQueue* const queue_;
  const std::shared_ptr<Shared> shared_;
  grpc::ServerContext context_;
  v1::WatchCommandsRequest request_;
  grpc::ServerAsyncWriter<v1::AgentCommand> writer_{&context_};
  Tag request_tag_{this, Kind::kRequest}, write_tag_{this, Kind::kWrite},
      finish_tag_{this, Kind::kFinish}, done_tag_{this, Kind::kDone};
  // Guarded by shared_->mu from the request on.
  std::string worker_id_, session_id_;
  std::vector<v1::AgentCommand> pending_;  // taken, not yet confirmed written
  grpc::Status status_;                    // how it ends, once ended_
  bool writing_ = false;                   // a Write is outstanding
  bool ended_ = false;           // the end is decided; Finish once no write is outstanding
  bool finish_started_ = false;  // Finish is outstanding or done
  bool finish_done_ = false;
  bool call_done_ = false;  // AsyncNotifyWhenDone told the call is over
};

// Asks for the first calls of every method on `queue`: a few of each waiting, so a burst (thousands
// of agents opening their streams, a job start's reports) is matched without waiting for each call
// to ask for the next.
constexpr int kWaitingPerMethod = 4;

void PostAll(AgentServer& s, grpc::ServerCompletionQueue* queue) {
  using Service = v1::AgentService::AsyncService;
  Controller& c = s.controller();
  using RegisterCall = Unary<v1::RegisterRequest, v1::RegisterResponse>;
  RegisterCall::Post(s, queue, &Service::RequestRegister, [&c](RegisterCall* call) {
    OnPool(call, [&c](RegisterCall* call) {
      auto r = c.Register(call->request());
      if (!r.ok()) return call->Reply(ToGrpc(r.status()));
      call->response() = std::move(*r);
      call->Reply(grpc::Status::OK);
    });
  });
  using HeartbeatCall = Unary<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  HeartbeatCall::Post(s, queue, &Service::RequestHeartbeat, [&c](HeartbeatCall* call) {
    call->response() = c.TryHeartbeat(call->request());
    call->Reply(grpc::Status::OK);
  });
  using ReportCall = Unary<v1::RankReport, v1::Ack>;
  ReportCall::Post(s, queue, &Service::RequestReportRank, [&c](ReportCall* call) {
    OnPool(call, [&c](ReportCall* call) {
      c.ReportRank(call->request(), [call](absl::Status s) { call->Reply(ToGrpc(s)); });
    });
  });
  using TelemetryCall = Unary<v1::TelemetryBatch, v1::TelemetryAck>;
  TelemetryCall::Post(s, queue, &Service::RequestPushTelemetry, [&c](TelemetryCall* call) {
    OnPool(call, [&c](TelemetryCall* call) {
      c.PushTelemetry(
          call->request(), [call](absl::Status st) { call->Reply(ToGrpc(st)); }, &call->response());
    });
  });
  using LogsCall = Unary<v1::LogBatch, v1::Ack>;
  LogsCall::Post(s, queue, &Service::RequestPushLogs, [&c](LogsCall* call) {
    OnPool(call, [&c](LogsCall* call) { call->Reply(ToGrpc(c.PushLogs(call->request()))); });
  });
  using KvSetCall = Unary<v1::KvSetRequest, v1::Ack>;
  KvSetCall::Post(s, queue, &Service::RequestKvSet, [&c](KvSetCall* call) {
    c.KvSet(
        call->request(), [call](absl::Status st) { call->Reply(ToGrpc(st)); },
        CallerWorker(call->context()));
  });
  using KvGetCall = Unary<v1::KvGetRequest, v1::KvGetResponse>;
  KvGetCall::Post(s, queue, &Service::RequestKvGet, [&c](KvGetCall* call) {
    c.KvGet(
        call->request(),
        [call](absl::StatusOr<v1::KvGetResponse> r) {
          if (!r.ok()) return call->Reply(ToGrpc(r.status()));
          call->response() = std::move(*r);
          call->Reply(grpc::Status::OK);
        },
        CallerWorker(call->context()));
  });
  CommandStream::Post(s, queue);
}

void PostMany(AgentServer& s, grpc::ServerCompletionQueue* queue) {
  for (int i = 0; i < kWaitingPerMethod; ++i) PostAll(s, queue);
}

}  // namespace

AgentServer::AgentServer(Controller& controller, grpc::ServerBuilder& builder, size_t queues)
    : c_(controller), pool_(kHandlerThreads, kMaxQueuedCalls) {
  builder.RegisterService(&service_);
  for (size_t i = 0; i < std::max<size_t>(1, queues); ++i) {
    queues_.push_back(builder.AddCompletionQueue());
  }
}

AgentServer::~AgentServer() {
  if (started_ && !threads_.empty()) {
    spdlog::error("AgentServer destroyed without Stop");
    std::terminate();
  }
}

void AgentServer::Start() {
  started_ = true;
  for (auto& queue : queues_) {
    PostMany(*this, queue.get());
    threads_.emplace_back([q = queue.get()] {
      void* tag = nullptr;
      bool ok = false;
      while (q->Next(&tag, &ok)) static_cast<Event*>(tag)->Proceed(ok);
    });
  }
}

void AgentServer::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  ++calls_;
}

void AgentServer::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--calls_ == 0) idle_.notify_all();
}

void AgentServer::Stop(grpc::Server& server, std::chrono::system_clock::time_point deadline) {
  stopping_ = true;
  server.Shutdown(deadline);
  {
    // Calls handed to the Controller still get their answer (a waiting KvGet is ended by
    // Controller::Shutdown; a group commit ends by itself).
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return calls_ == 0; });
  }
  for (auto& queue : queues_) queue->Shutdown();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

}  // namespace furnace::controller
