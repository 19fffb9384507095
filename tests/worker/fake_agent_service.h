// An in-process AgentService on 127.0.0.1:0 for worker tests: a map-backed rendezvous store with
// attempt fencing and injectable UNAVAILABLE answers, registration that hands out sessions, a
// command stream fed by the test, and recorders for reports, telemetry and logs.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "furnace/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace furnace::worker::testing {

class FakeAgentService final : public furnace::v1::AgentService::Service {
 public:
  // KvSet/KvGet answer UNAVAILABLE this many times before serving.
  int unavailable_kv_calls = 0;
  // Scopes with an attempt below this are fenced (FAILED_PRECONDITION).
  uint32_t min_attempt = 0;
  // ReportRank answers UNAVAILABLE this many times before acking.
  int unavailable_reports = 0;
  double heartbeat_interval_s = 0.1;
  double telemetry_flush_s = 0;  // told to the agent at Register (0: its own interval)
  // When set, heartbeats answer with rank_view (the controller's records of the worker's ranks).
  bool reconcile = false;
  std::vector<furnace::v1::ControllerRankView> rank_view;
  // When set, a RANK_EXITED report takes its rank out of rank_view, as a controller stops listing
  // a rank whose exit it recorded. Unset, the view stays as the test left it, and an agent that
  // already reported the exit sends it again at the next heartbeat (the controller "lost" it).
  bool view_forgets_reported_exits = false;

  grpc::Status Register(grpc::ServerContext*, const furnace::v1::RegisterRequest* request,
                        furnace::v1::RegisterResponse* response) override {
    std::lock_guard<std::mutex> lock(mu);
    registrations.push_back(*request);
    response->set_session_id("session-" + std::to_string(registrations.size()));
    response->set_heartbeat_interval_s(heartbeat_interval_s);
    response->set_telemetry_flush_s(telemetry_flush_s);
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const furnace::v1::HeartbeatRequest* request,
                         furnace::v1::HeartbeatResponse* response) override {
    std::lock_guard<std::mutex> lock(mu);
    heartbeats.push_back(*request);
    if (reconcile) {
      response->set_reconcile(true);
      for (const auto& view : rank_view) *response->add_ranks() = view;
    }
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status WatchCommands(grpc::ServerContext* context, const furnace::v1::WatchCommandsRequest*,
                             grpc::ServerWriter<furnace::v1::AgentCommand>* writer) override {
    std::unique_lock<std::mutex> lock(mu);
    ++watchers;
    cv.notify_all();
    while (!context->IsCancelled() && !closing) {
      cv.wait_for(lock, std::chrono::milliseconds(20));
      while (!commands.empty()) {
        furnace::v1::AgentCommand command = commands.front();
        commands.pop_front();
        lock.unlock();
        writer->Write(command);
        lock.lock();
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status ReportRank(grpc::ServerContext*, const furnace::v1::RankReport* request,
                          furnace::v1::Ack*) override {
    std::lock_guard<std::mutex> lock(mu);
    ++report_calls;
    if (unavailable_reports > 0) {
      --unavailable_reports;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "controller restarting");
    }
    reports.push_back(*request);
    if (view_forgets_reported_exits && request->event() == furnace::v1::RANK_EXITED) {
      std::erase_if(rank_view, [&](const furnace::v1::ControllerRankView& v) {
        return v.job_id() == request->job_id() && v.attempt() == request->attempt() &&
               v.rank() == request->rank();
      });
    }
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status PushTelemetry(grpc::ServerContext*, const furnace::v1::TelemetryBatch* request,
                             furnace::v1::TelemetryAck* ack) override {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& record : request->records()) telemetry.push_back(record);
    telemetry_batches.push_back(*request);
    // Like a controller: an answer for every job asked about (nothing stored, unless `settled`
    // says otherwise).
    std::set<std::string> asked(request->unsettled_jobs().begin(), request->unsettled_jobs().end());
    for (const auto& record : request->records()) {
      if (record.has_train()) asked.insert(record.job_id());
    }
    for (const std::string& job : asked) {
      furnace::v1::SettledSteps answer;
      answer.set_job_id(job);
      for (const auto& s : settled) {
        if (s.job_id() == job) answer = s;
      }
      *ack->add_settled() = answer;
    }
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status PushLogs(grpc::ServerContext*, const furnace::v1::LogBatch* request,
                        furnace::v1::Ack*) override {
    const auto came = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu);
    if (refuse_logs != grpc::StatusCode::OK) {
      ++refused_log_pushes;
      return grpc::Status(refuse_logs, "cannot append to the job's log");
    }
    for (const auto& line : request->lines()) logs.push_back(line);
    log_pushes.push_back({came, std::chrono::steady_clock::now()});
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status KvSet(grpc::ServerContext*, const furnace::v1::KvSetRequest* request,
                     furnace::v1::Ack*) override {
    std::lock_guard<std::mutex> lock(mu);
    ++kv_calls;
    if (grpc::Status status = CheckKvLocked(request->scope()); !status.ok()) return status;
    kv[Key(request->scope(), request->key())] = request->value();
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status KvGet(grpc::ServerContext*, const furnace::v1::KvGetRequest* request,
                     furnace::v1::KvGetResponse* response) override {
    std::unique_lock<std::mutex> lock(mu);
    ++kv_calls;
    last_get_timeout_s = request->timeout_s();
    if (grpc::Status status = CheckKvLocked(request->scope()); !status.ok()) return status;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(request->timeout_s()));
    if (request->indexed_count() > 0) {  // an arrival barrier: answers what is missing
      while (true) {
        response->Clear();
        for (uint32_t i = 0; i < request->indexed_count(); ++i) {
          const std::string key = request->indexed_prefix() + std::to_string(i);
          if (kv.count(Key(request->scope(), key))) {
            response->set_present(response->present() + 1);
          } else {
            response->add_missing(i);
          }
        }
        response->set_complete(response->missing_size() == 0);
        if (response->complete() || cv.wait_until(lock, until) == std::cv_status::timeout) break;
      }
      return grpc::Status::OK;
    }
    std::string missing;
    while (true) {
      missing.clear();
      for (const auto& key : request->keys()) {
        if (kv.count(Key(request->scope(), key)) == 0) missing += " " + key;
      }
      if (missing.empty() || cv.wait_until(lock, until) == std::cv_status::timeout) break;
    }
    if (!missing.empty()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "missing keys:" + missing);
    }
    for (const auto& key : request->keys()) response->add_values(kv[Key(request->scope(), key)]);
    return grpc::Status::OK;
  }

  void Push(furnace::v1::AgentCommand command) {
    std::lock_guard<std::mutex> lock(mu);
    commands.push_back(std::move(command));
    cv.notify_all();
  }
  // Waits until `done()` (called under mu) holds, at most timeout_s.
  template <typename Pred>
  bool AwaitLocked(Pred done, double timeout_s = 10) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(timeout_s), done);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu);
    closing = true;
    cv.notify_all();
  }

  std::mutex mu;
  std::condition_variable cv;
  bool closing = false;
  int watchers = 0;
  int kv_calls = 0;
  int report_calls = 0;
  double last_get_timeout_s = 0;
  std::map<std::string, std::string> kv;
  std::deque<furnace::v1::AgentCommand> commands;
  std::vector<furnace::v1::RegisterRequest> registrations;
  std::vector<furnace::v1::HeartbeatRequest> heartbeats;
  std::vector<furnace::v1::RankReport> reports;
  std::vector<furnace::v1::TelemetryRecord> telemetry;
  std::vector<furnace::v1::TelemetryBatch> telemetry_batches;
  // How far the jobs' steps are stored, as PushTelemetry answers for the jobs asked about.
  std::vector<furnace::v1::SettledSteps> settled;
  std::vector<furnace::v1::LogLine> logs;
  // When each accepted PushLogs came, and when it was answered.
  struct LogPush {
    std::chrono::steady_clock::time_point came, answered;
  };
  std::vector<LogPush> log_pushes;
  grpc::StatusCode refuse_logs = grpc::StatusCode::OK;  // not OK: every PushLogs fails so
  int refused_log_pushes = 0;

 private:
  static std::string Key(const furnace::v1::KvScope& scope, const std::string& key) {
    return scope.job_id() + "/" + std::to_string(scope.attempt()) + "/" + key;
  }
  grpc::Status CheckKvLocked(const furnace::v1::KvScope& scope) {
    if (unavailable_kv_calls > 0) {
      --unavailable_kv_calls;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "controller restarting");
    }
    if (scope.attempt() < min_attempt) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "attempt is over");
    }
    return grpc::Status::OK;
  }
};

// Owns a server running a FakeAgentService.
class FakeController {
 public:
  // port 0: any free port.
  explicit FakeController(int port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service);
    server_ = builder.BuildAndStart();
  }
  ~FakeController() {
    service.Close();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::shared_ptr<furnace::v1::AgentService::Stub> NewStub() const {
    return furnace::v1::AgentService::NewStub(
        grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
  }

  FakeAgentService service;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace furnace::worker::testing
