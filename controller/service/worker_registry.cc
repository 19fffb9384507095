#include "controller/service/worker_registry.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

std::string RandomHex(int n) {
  std::random_device rd;
  std::mt19937_64 gen(rd());
  std::string out;
  for (int i = 0; i < n; ++i) out += "0123456789abcdef"[gen() % 16];
  return out;
}

}  // namespace

WorkerRegistry::WorkerRegistry(JobStore& store, const Clock& clock)
    : store_(store), clock_(clock), instance_id_(RandomHex(8)) {}

void WorkerRegistry::Load(std::vector<v1::WorkerInfo> workers) {
  const double now = clock_.MonotonicSeconds();
  for (auto& info : workers) {
    const std::string id = info.worker_id();
    Worker& w = FindOrAdd(id);
    const double last_unix = info.last_seen_unix();
    w.info = std::move(info);
    w.seen->Set(now, last_unix);
    // Lost in a store written before lost_unix existed: its time to be forgotten starts now.
    if (w.info.state() == v1::WORKER_STATE_LOST && w.info.lost_unix() == 0) {
      w.info.set_lost_unix(clock_.UnixSeconds());
      Persist(w);  // written back, so the next restart does not start its window again
    }
    w.has_rank = false;
    w.info.clear_job_id();
    w.info.set_rank(0);
  }
}

Worker* WorkerRegistry::Find(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

Worker& WorkerRegistry::FindOrAdd(const std::string& worker_id) {
  Worker& w = workers_[worker_id];
  if (!w.seen) w.seen = MailboxOf(worker_id)->seen;
  return w;
}

v1::WorkerInfo WorkerRegistry::Info(const Worker& w) {
  v1::WorkerInfo info = w.info;
  info.set_last_seen_unix(w.seen->unix_s.load(std::memory_order_relaxed));
  return info;
}

std::shared_ptr<WorkerRegistry::Mailbox> WorkerRegistry::FindMailbox(
    const std::string& worker_id) const {
  std::shared_lock<std::shared_mutex> lock(mail_mu_);
  auto it = mail_.find(worker_id);
  return it == mail_.end() ? nullptr : it->second;
}

std::shared_ptr<WorkerRegistry::Mailbox> WorkerRegistry::MailboxOf(const std::string& worker_id) {
  if (std::shared_ptr<Mailbox> box = FindMailbox(worker_id)) return box;
  std::unique_lock<std::shared_mutex> lock(mail_mu_);
  std::shared_ptr<Mailbox>& box = mail_[worker_id];
  if (box == nullptr) {
    box = std::make_shared<Mailbox>();
    mailboxes_.fetch_add(1, std::memory_order_relaxed);
  }
  return box;
}

void WorkerRegistry::Touch(const std::string& worker_id) {
  if (const std::shared_ptr<Mailbox> box = FindMailbox(worker_id)) {
    box->seen->Set(clock_.MonotonicSeconds(), clock_.UnixSeconds());
  }
}

bool WorkerRegistry::Beat(const std::string& worker_id, const std::string& session_id,
                          Liveness::RankSilence silence) {
  const std::shared_ptr<Mailbox> box = FindMailbox(worker_id);
  if (box == nullptr) return false;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    if (box->session_id.empty() || box->session_id != session_id) return false;
  }
  const double now = clock_.MonotonicSeconds();
  box->seen->Set(now, clock_.UnixSeconds());
  silence.at = now;
  box->seen->SetSilence(std::move(silence));
  return true;
}

uint32_t WorkerRegistry::CountUsable(const std::string& device_kind) const {
  uint32_t n = 0;
  for (const auto& [id, w] : workers_) {
    if (w.info.state() != v1::WORKER_STATE_LOST && w.info.device_kind() == device_kind) ++n;
  }
  return n;
}

std::vector<WorkerSlot> WorkerRegistry::Slots() const {
  std::vector<WorkerSlot> slots;
  for (const auto& [id, w] : workers_) {
    slots.push_back(
        {id, w.info.host(), w.info.slot(), w.info.device_kind(),
         w.info.state() == v1::WORKER_STATE_READY && !w.has_rank && w.seen->in_session.load()});
  }
  return slots;
}

void WorkerRegistry::Assign(Worker& w, const std::string& job_id, uint32_t attempt, uint32_t rank) {
  w.has_rank = true;
  w.attempt = attempt;
  w.exit_owed = false;
  w.info.set_state(v1::WORKER_STATE_BUSY);
  w.info.set_job_id(job_id);
  w.info.set_rank(rank);
  Persist(w);
}

void WorkerRegistry::Free(const std::string& worker_id, const std::string& job_id, uint32_t attempt,
                          uint32_t rank) {
  Worker* w = Find(worker_id);
  if (w == nullptr || !w->has_rank || w->info.job_id() != job_id || w->attempt != attempt ||
      w->info.rank() != rank) {
    return;
  }
  w->has_rank = false;
  w->attempt = 0;
  w->info.clear_job_id();
  w->info.set_rank(0);
  if (w->info.state() == v1::WORKER_STATE_BUSY) w->info.set_state(v1::WORKER_STATE_READY);
  Persist(*w);
}

void WorkerRegistry::Forget(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() != v1::WORKER_STATE_LOST) return;
  workers_.erase(it);
  dirty_.insert(worker_id);  // no record: Flush deletes its row
  // Its mailbox too (empty: a lost worker's session ended with its commands); a call of its agent
  // that holds it finds no session, and the agent registers as a new worker.
  std::unique_lock<std::shared_mutex> lock(mail_mu_);
  if (mail_.erase(worker_id) > 0) mailboxes_.fetch_sub(1, std::memory_order_relaxed);
}

WorkerRegistry::Held WorkerRegistry::MarkLost(Worker& worker, bool left) {
  Held held;
  if (worker.info.state() == v1::WORKER_STATE_LOST) return held;
  worker.info.set_state(v1::WORKER_STATE_LOST);
  worker.info.set_lost_unix(clock_.UnixSeconds());
  worker.info.set_left(left);
  EndSession(worker.info.worker_id());
  held.has_rank = worker.has_rank;
  held.job_id = worker.info.job_id();
  held.attempt = worker.attempt;
  held.rank = worker.info.rank();
  worker.has_rank = false;
  worker.attempt = 0;
  worker.info.clear_job_id();
  Persist(worker);
  return held;
}

void WorkerRegistry::Persist(const Worker& worker) { dirty_.insert(worker.info.worker_id()); }

void WorkerRegistry::FlushNow() {
  std::mutex held_by_caller;
  std::unique_lock<std::mutex> lock(held_by_caller);
  Flush(lock);
}

void WorkerRegistry::Flush(std::unique_lock<std::mutex>& state_lock) {
  if (dirty_.empty()) return;
  std::vector<v1::WorkerInfo> copies;
  std::vector<std::string> forgotten;
  for (const auto& id : dirty_) {
    if (const Worker* w = Find(id)) {
      copies.push_back(Info(*w));
    } else {
      forgotten.push_back(id);
    }
  }
  std::set<std::string> ids = std::move(dirty_);
  dirty_.clear();
  // Copies are written in the order they were taken: a FlushNow's newer copy must not land
  // before this older one, which would then overwrite it (the id is no longer marked).
  std::unique_lock<std::mutex> order(write_order_mu_);
  state_lock.unlock();
  absl::Status s = store_.Transaction([&]() -> absl::Status {
    for (const auto& info : copies) RETURN_IF_ERROR(store_.PutWorker(info));
    for (const auto& id : forgotten) RETURN_IF_ERROR(store_.DeleteWorker(id));
    return absl::OkStatus();
  });
  order.unlock();  // before the state mutex: the lock order is state mutex, then this
  state_lock.lock();
  if (!s.ok()) {
    spdlog::error("{} worker record(s) not persisted yet: {}", ids.size(), s.ToString());
    dirty_.insert(ids.begin(), ids.end());
  }
}

std::string WorkerRegistry::NewSession(const std::string& worker_id, bool drop_commands) {
  const std::shared_ptr<Mailbox> box = MailboxOf(worker_id);
  Wake wake;
  std::string session = absl::StrCat(instance_id_, "-", ++session_counter_);
  {
    std::lock_guard<std::mutex> lock(box->mu);
    box->session_id = session;
    box->seen->in_session = true;
    if (drop_commands) box->commands.clear();
    box->cv.notify_all();  // an older command stream of this worker ends
    wake = std::move(box->wake);
    box->wake = nullptr;
  }
  CallWake(std::move(wake));
  return session;
}

void WorkerRegistry::EndSession(const std::string& worker_id) {
  const std::shared_ptr<Mailbox> box = FindMailbox(worker_id);
  if (box == nullptr) return;
  Wake wake;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    box->session_id.clear();
    box->seen->in_session = false;
    box->commands.clear();
    box->cv.notify_all();
    wake = std::move(box->wake);
    box->wake = nullptr;
  }
  CallWake(std::move(wake));
}

bool WorkerRegistry::HasSession(const std::string& worker_id) const {
  const std::shared_ptr<Mailbox> box = FindMailbox(worker_id);
  if (box == nullptr) return false;
  std::lock_guard<std::mutex> lock(box->mu);
  return !box->session_id.empty();
}

bool WorkerRegistry::IsSession(const std::string& worker_id, const std::string& session_id) const {
  const std::shared_ptr<Mailbox> box = FindMailbox(worker_id);
  if (box == nullptr) return false;
  std::lock_guard<std::mutex> lock(box->mu);
  return !box->session_id.empty() && box->session_id == session_id;
}

void WorkerRegistry::Enqueue(const std::string& worker_id, v1::AgentCommand command) {
  const std::shared_ptr<Mailbox> box = MailboxOf(worker_id);
  Wake wake;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    box->commands.push_back(std::move(command));
    box->cv.notify_all();
    wake = std::move(box->wake);
    box->wake = nullptr;
  }
  CallWake(std::move(wake));
}

absl::StatusOr<std::vector<v1::AgentCommand>> WorkerRegistry::TakeCommands(
    const std::string& worker_id, const std::string& session_id, Wake wake) {
  const std::shared_ptr<Mailbox> box = FindMailbox(worker_id);
  if (box == nullptr) return absl::FailedPreconditionError("stale worker session: register again");
  std::lock_guard<std::mutex> lock(box->mu);
  if (box->session_id != session_id) {
    return absl::FailedPreconditionError("stale worker session: register again");
  }
  std::vector<v1::AgentCommand> out(box->commands.begin(), box->commands.end());
  box->commands.clear();
  box->wake = out.empty() ? std::move(wake) : nullptr;
  return out;
}

absl::StatusOr<std::vector<v1::AgentCommand>> WorkerRegistry::NextCommands(
    const std::string& worker_id, const std::string& session_id, double wait_s) {
  const std::shared_ptr<Mailbox> box = FindMailbox(worker_id);
  if (box == nullptr) return absl::FailedPreconditionError("stale worker session: register again");
  std::unique_lock<std::mutex> lock(box->mu);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(wait_s));
  while (true) {
    if (box->session_id != session_id) {
      return absl::FailedPreconditionError("stale worker session: register again");
    }
    if (!box->commands.empty()) {
      std::vector<v1::AgentCommand> out(box->commands.begin(), box->commands.end());
      box->commands.clear();
      return out;
    }
    if (box->cv.wait_until(lock, deadline) == std::cv_status::timeout) {
      return std::vector<v1::AgentCommand>();
    }
  }
}

void WorkerRegistry::Requeue(const std::string& worker_id, const std::string& session_id,
                             std::vector<v1::AgentCommand> commands) {
  const std::shared_ptr<Mailbox> box = FindMailbox(worker_id);
  if (box == nullptr) return;
  Wake wake;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    // Commands of a session that has ended since (the worker was lost, or its agent registered
    // anew) were dropped with it: put back, they would start ranks of an attempt that is over.
    if (box->session_id.empty() || box->session_id != session_id) return;
    for (auto c = commands.rbegin(); c != commands.rend(); ++c) {
      box->commands.push_front(std::move(*c));
    }
    wake = std::move(box->wake);
    box->wake = nullptr;
  }
  CallWake(std::move(wake));
}

}  // namespace furnace::controller
