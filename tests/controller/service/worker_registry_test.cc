// WorkerRegistry's sessions and mailboxes on their own (a real job store on a temp dir, a fake
// clock): a forgotten worker leaves nothing behind, and a caller holding its mailbox when it is
// forgotten is not left with a dangling one.
#include "controller/service/worker_registry.h"

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "controller/store/job_store.h"
#include "gtest/gtest.h"
#include "runtime/base/clock.h"
#include "tests/testing/test_dir.h"

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

class WorkerRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = JobStore::Open(dir_ / "furnace.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    registry_ = std::make_unique<WorkerRegistry>(*store_, clock_);
  }
  // A worker that registered (a record and a session) and was then lost.
  void AddLost(const std::string& id) {
    Worker& w = registry_->FindOrAdd(id);
    w.info.set_worker_id(id);
    w.info.set_state(v1::WORKER_STATE_READY);
    registry_->NewSession(id, /*drop_commands=*/true);
    registry_->MarkLost(w);
  }

  testing_util::TestDir dir_;
  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
};

// Forgetting a lost worker drops its mailbox too: the fleet size that sets the agents' telemetry
// flush interval (MailboxCount) no longer counts it, and the elastic fleet's departed hosts do not
// pile up in memory. Its agent coming back gets a new mailbox and session.
TEST_F(WorkerRegistryTest, AForgottenWorkersMailboxIsDropped) {
  AddLost("h/0");
  AddLost("h/1");
  registry_->NewSession("h/2", true);
  EXPECT_EQ(registry_->MailboxCount(), 3u);
  registry_->Forget("h/2");  // not lost (no record even): nothing happens
  EXPECT_EQ(registry_->MailboxCount(), 3u);
  registry_->Forget("h/1");
  EXPECT_EQ(registry_->MailboxCount(), 2u);
  EXPECT_EQ(registry_->Find("h/1"), nullptr);
  EXPECT_FALSE(registry_->HasSession("h/1"));
  registry_->Touch("h/1");  // a late call of the forgotten agent creates nothing
  EXPECT_EQ(registry_->MailboxCount(), 2u);
  const std::string session = registry_->NewSession("h/1", true);  // it registers again
  EXPECT_EQ(registry_->MailboxCount(), 3u);
  EXPECT_TRUE(registry_->Beat("h/1", session));
  registry_->FlushNow();
}

// A command stream waiting in NextCommands holds the worker's mailbox while the worker is lost and
// forgotten: its session ends, so it returns FailedPrecondition at once (not after its 30 s wait),
// from a mailbox that is no longer in the registry but is still alive (run under ASan, a dangling
// one would show). A stream that took its commands with a wake-up is woken, and its next call is
// refused.
TEST_F(WorkerRegistryTest, AStreamHoldingAForgottenMailboxEndsCleanly) {
  Worker& w = registry_->FindOrAdd("h/0");
  w.info.set_worker_id("h/0");
  const std::string session = registry_->NewSession("h/0", true);
  bool woken = false;
  auto none = registry_->TakeCommands("h/0", session, [&] { woken = true; });
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  absl::StatusOr<std::vector<v1::AgentCommand>> waited;
  std::thread stream([&] { waited = registry_->NextCommands("h/0", session, 30); });
  // Let the stream reach its wait (either order ends the same way: a stream that has not found
  // the mailbox yet finds none).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  registry_->MarkLost(w);
  registry_->Forget("h/0");
  stream.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(waited.status())) << waited.status();
  EXPECT_TRUE(woken);
  EXPECT_FALSE(registry_->TakeCommands("h/0", session, nullptr).ok());
  EXPECT_FALSE(registry_->IsSession("h/0", session));
  EXPECT_EQ(registry_->MailboxCount(), 0u);
}

// Commands a stream could not deliver go back for the session's next stream; those of a session
// that ended meanwhile (the worker was lost, and its queue dropped) do not come back when the same
// agent registers again: they would start ranks of an attempt that is over.
TEST_F(WorkerRegistryTest, UndeliveredCommandsComeBackOnlyToTheirSession) {
  Worker& w = registry_->FindOrAdd("h/0");
  w.info.set_worker_id("h/0");
  const std::string first = registry_->NewSession("h/0", true);
  v1::AgentCommand start;
  start.mutable_start()->set_job_id("j");
  registry_->Enqueue("h/0", start);
  auto taken = registry_->TakeCommands("h/0", first, nullptr);
  ASSERT_TRUE(taken.ok());
  ASSERT_EQ(taken->size(), 1u);
  registry_->Requeue("h/0", first, *taken);  // the stream broke: the same session gets it again
  auto again = registry_->TakeCommands("h/0", first, nullptr);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 1u);

  registry_->MarkLost(w);                    // the session ends with its queue
  registry_->Requeue("h/0", first, *again);  // the broken stream finds out only now
  const std::string second = registry_->NewSession("h/0", /*drop_commands=*/false);
  auto after = registry_->TakeCommands("h/0", second, nullptr);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->empty());
}

}  // namespace
}  // namespace furnace::controller
