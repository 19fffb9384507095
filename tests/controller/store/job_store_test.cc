#include "controller/store/job_store.h"

#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "controller/store/sqlite_statement.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "tests/testing/test_dir.h"

namespace furnace::controller {
namespace {

std::string TempDb() {
  return (testing_util::RemovedAtExit("furnace-store-test") / "furnace.db").string();
}

v1::JobSummary Summary(const std::string& id, v1::JobState state) {
  v1::JobSummary s;
  s.set_job_id(id);
  s.set_name("x");
  s.set_state(state);
  s.set_submitted_unix(100);
  return s;
}

TEST(JobStoreTest, RoundTripAndReload) {
  const std::string path = TempDb();
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto& s = **store;
    auto seq = s.NextJobSeq();
    ASSERT_TRUE(seq.ok());
    EXPECT_EQ(*seq, 1u);
    v1::JobSpec spec;
    spec.set_name("x");
    spec.mutable_recovery()->set_max_restarts(7);
    ASSERT_TRUE(s.PutJob(Summary("x-1", v1::JOB_PENDING), spec).ok());
    v1::AttemptInfo a1, a2;
    a1.set_attempt(1);
    a1.set_state(v1::ATTEMPT_STATE_FAILED);
    a1.set_cause("rank 1 killed by signal 9");
    a1.add_ranks()->set_worker_id("w/0");
    a2.set_attempt(2);
    a2.set_state(v1::ATTEMPT_STATE_RUNNING);
    ASSERT_TRUE(s.PutAttempt("x-1", a2).ok());
    ASSERT_TRUE(s.PutAttempt("x-1", a1).ok());
    ASSERT_TRUE(s.PutSummary(Summary("x-1", v1::JOB_RUNNING)).ok());
    v1::JobEvent e;
    e.set_kind("restart");
    e.set_message("m");
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(s.AddEvent("x-1", e).ok());
    v1::WorkerInfo w;
    w.set_worker_id("w/0");
    w.set_state(v1::WORKER_STATE_READY);
    ASSERT_TRUE(s.PutWorker(w).ok());
    ASSERT_TRUE(s.KvPut("x-1", 2, "k", std::string("v\0v", 3)).ok());
    ASSERT_TRUE(s.KvPut("x-1", 1, "old", "o").ok());
    ASSERT_TRUE(s.KvDropScope("x-1", 1).ok());
    ASSERT_TRUE(s.PutLocalWorker(3, 1234).ok());
    v1::CommResult c;
    c.set_collective("allreduce");
    c.set_bytes(4096);
    c.set_busbw_gbps(1.0);
    ASSERT_TRUE(s.PutCommResult("x-1", c).ok());
    c.set_busbw_gbps(2.0);  // the latest per (collective, bytes) wins
    ASSERT_TRUE(s.PutCommResult("x-1", c).ok());
    v1::TelemetryRecord r;
    r.set_job_id("x-1");
    r.set_step(9);
    r.mutable_train()->set_loss(1.5);
    ASSERT_TRUE(s.AddTelemetry({r}).ok());
  }
  auto store = JobStore::Open(path);  // a restarted controller
  ASSERT_TRUE(store.ok());
  auto& s = **store;
  auto jobs = s.LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].summary.state(), v1::JOB_RUNNING);
  EXPECT_EQ((*jobs)[0].spec.recovery().max_restarts(), 7u);
  ASSERT_EQ((*jobs)[0].attempts.size(), 2u);
  EXPECT_EQ((*jobs)[0].attempts[0].attempt(), 1u);
  EXPECT_EQ((*jobs)[0].attempts[0].cause(), "rank 1 killed by signal 9");
  EXPECT_EQ((*jobs)[0].attempts[0].state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ((*jobs)[0].attempts[1].state(), v1::ATTEMPT_STATE_RUNNING);
  auto events = s.LoadEvents("x-1", 3);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 3u);
  EXPECT_EQ(s.LoadWorkers()->size(), 1u);
  auto kv = s.KvLoad("x-1", 2);
  ASSERT_TRUE(kv.ok());
  ASSERT_EQ(kv->size(), 1u);
  EXPECT_EQ((*kv)[0].second, std::string("v\0v", 3));
  EXPECT_TRUE(s.KvLoad("x-1", 1)->empty());
  EXPECT_EQ(s.LoadLocalWorkers()->at(0), std::make_pair(3u, 1234));
  auto comm = s.LoadCommResults("x-1");
  ASSERT_EQ(comm->size(), 1u);
  EXPECT_DOUBLE_EQ((*comm)[0].busbw_gbps(), 2.0);
  auto latest = s.LatestRecord("x-1", 0);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->step(), 9u);
  EXPECT_EQ((*latest)->train().loss(), 1.5);
  EXPECT_EQ(*s.NextJobSeq(), 2u);  // the sequence survives restarts: ids are never reused
}

TEST(JobStoreTest, TransactionRollsBack) {
  auto store = JobStore::Open(TempDb());
  ASSERT_TRUE(store.ok());
  auto& s = **store;
  absl::Status st = s.Transaction([&]() -> absl::Status {
    EXPECT_TRUE(s.PutJob(Summary("y-1", v1::JOB_PENDING), v1::JobSpec()).ok());
    return absl::InternalError("boom");
  });
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(s.LoadJobs()->empty());
  EXPECT_EQ(s.PutSummary(Summary("nope", v1::JOB_RUNNING)).code(), absl::StatusCode::kNotFound);
}

// Job "j": attempt 1's steps 1-50, then attempt 2's 41-90 (it resumed from step 40). Returns
// their (attempt, step) in the order written.
std::vector<std::pair<uint32_t, uint64_t>> PutTwoAttempts(JobStore& s) {
  std::vector<std::pair<uint32_t, uint64_t>> written;
  for (uint32_t attempt : {1u, 2u}) {
    for (uint64_t step = 1; step <= 50; ++step) {
      v1::StepRecord r;
      r.set_attempt(attempt);
      r.set_step(attempt == 1 ? step : step + 40);
      EXPECT_TRUE(s.PutStep("j", r).ok());
      written.emplace_back(r.attempt(), r.step());
    }
  }
  return written;
}

// Pages through every step of a job in (attempt, step) order, across an attempt that went back to
// an earlier step (a since_step cursor would skip attempt 2's steps 41-50): every step once, and
// `more` false only on the last page.
TEST(JobStoreTest, StepPagesCoverEveryStepOnceAcrossAttempts) {
  auto store = JobStore::Open(TempDb());
  ASSERT_TRUE(store.ok());
  auto& s = **store;
  const std::vector<std::pair<uint32_t, uint64_t>> want = PutTwoAttempts(s);
  v1::StepRecord other;  // another job's steps are not in its pages
  other.set_attempt(1);
  other.set_step(7);
  ASSERT_TRUE(s.PutStep("k", other).ok());
  for (uint32_t limit : {1u, 7u, 50u, 100u, 1000u}) {
    std::vector<std::pair<uint32_t, uint64_t>> got;
    uint32_t attempt = 0;
    uint64_t step = 0;
    int pages = 0;
    for (bool more = true; more; ++pages) {
      auto page = s.LoadStepPage("j", attempt, step, limit, &more);
      ASSERT_TRUE(page.ok()) << page.status();
      ASSERT_LE(page->size(), limit);
      if (more) {
        ASSERT_EQ(page->size(), limit);
      }
      for (const auto& r : *page) got.emplace_back(r.attempt(), r.step());
      if (!page->empty()) {
        attempt = page->back().attempt();
        step = page->back().step();
      }
    }
    EXPECT_EQ(got, want) << "limit " << limit;
    EXPECT_EQ(pages, static_cast<int>((want.size() + limit - 1) / limit)) << "limit " << limit;
  }
}

// A dashboard's thinned view reads only the points it returns: evenly spaced over (attempt, step)
// order, the first and the newest included, whatever since_step cut.
TEST(JobStoreTest, ThinnedStepsAreEvenlySpacedWithTheNewest) {
  auto store = JobStore::Open(TempDb());
  ASSERT_TRUE(store.ok());
  auto& s = **store;
  PutTwoAttempts(s);
  auto all = s.LoadSteps("j");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 100u);
  auto thin = s.LoadSteps("j", 0, 5);
  ASSERT_TRUE(thin.ok());
  ASSERT_EQ(thin->size(), 5u);
  // Indices 0, 24, 49, 74, 99 of the (attempt, step) order.
  const std::vector<std::pair<uint32_t, uint64_t>> want = {
      {1, 1}, {1, 25}, {1, 50}, {2, 65}, {2, 90}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*thin)[i].attempt(), want[i].first) << i;
    EXPECT_EQ((*thin)[i].step(), want[i].second) << i;
  }
  auto newest = s.LoadSteps("j", 0, 1);
  ASSERT_TRUE(newest.ok() && newest->size() == 1u);
  EXPECT_EQ((*newest)[0].step(), 90u);
  // Fewer steps than asked for: all of them.
  auto tail = s.LoadSteps("j", 85, 10);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->size(), 5u);
  // Unthinned, more than max_steps: refused (GetJobSeries asks for paging), not a huge reply.
  EXPECT_EQ(s.LoadSteps("j", 0, 0, 100)->size(), 100u);
  auto over = s.LoadSteps("j", 0, 0, 99);
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_NE(over.status().message().find("more than 99 steps after step 0"),
            absl::string_view::npos)
      << over.status();
  EXPECT_EQ(s.LoadSteps("j", 85, 0, 5)->size(), 5u);
  EXPECT_EQ(s.LoadSteps("j", 0, 5, 4)->size(), 5u);  // thinned: max_steps does not apply
  // After a cursor: a later attempt's steps that redo earlier step numbers come back, an earlier
  // attempt's abandoned tail does not (since_step 45 would give attempt 1's 46..50 too).
  const StepCursor at_1_45{.attempt = 1, .step = 45}, at_2_45{.attempt = 2, .step = 45};
  EXPECT_EQ(s.LoadSteps("j", 0, 0, 0, &at_1_45)->size(), 5u + 50u);
  EXPECT_EQ(s.LoadSteps("j", 45, 0)->size(), 5u + 45u);
  auto current = s.LoadSteps("j", 0, 0, 0, &at_2_45);
  ASSERT_TRUE(current.ok());
  ASSERT_EQ(current->size(), 45u);
  EXPECT_EQ(current->front().attempt(), 2u);
  EXPECT_EQ(current->front().step(), 46u);
  auto thin_after = s.LoadSteps("j", 0, 3, 0, &at_1_45);  // thinned over the same 55
  ASSERT_TRUE(thin_after.ok());
  ASSERT_EQ(thin_after->size(), 3u);
  EXPECT_EQ((*thin_after)[0].step(), 46u);
  EXPECT_EQ((*thin_after)[2].step(), 90u);
  // ForEachStep visits each one once, in the same order.
  std::vector<uint64_t> seen;
  ASSERT_TRUE(s.ForEachStep("j", [&](const v1::StepRecord& r) { seen.push_back(r.step()); }).ok());
  ASSERT_EQ(seen.size(), 100u);
  EXPECT_EQ(seen.front(), 1u);
  EXPECT_EQ(seen.back(), 90u);
  EXPECT_TRUE(s.ForEachStep("other", [&](const v1::StepRecord&) { ADD_FAILURE(); }).ok());
}

// A COMMIT that fails can leave its transaction open (a deferred constraint here; SQLITE_FULL,
// SQLITE_IOERR or SQLITE_BUSY on a real disk). It is rolled back: the failed body's writes are
// gone, the next write commits on its own, and the next transaction begins (it failed with
// "cannot start a transaction within a transaction", and every write after the failure ran inside
// the dangling transaction, reported done and never committed).
TEST(JobStoreTest, AFailedCommitLeavesNoTransactionOpen) {
  const std::string path = TempDb();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_TRUE(ExecSql(db,
                      "PRAGMA foreign_keys = ON; CREATE TABLE parent (id INTEGER PRIMARY KEY); "
                      "CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES "
                      "parent(id) DEFERRABLE INITIALLY DEFERRED); CREATE TABLE log (v INTEGER);")
                  .ok());
  const absl::Status failed = RunTransaction(db, [&] {
    return ExecSql(db, "INSERT INTO log VALUES (1); INSERT INTO child VALUES (1, 99);");
  });
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.ToString().find("FOREIGN KEY"), std::string::npos) << failed;
  EXPECT_EQ(sqlite3_get_autocommit(db), 1) << "the failed transaction is still open";
  ASSERT_TRUE(ExecSql(db, "INSERT INTO log VALUES (2)").ok());
  const absl::Status next =
      RunTransaction(db, [&] { return ExecSql(db, "INSERT INTO log VALUES (3)"); });
  EXPECT_TRUE(next.ok()) << next;
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  // Every write that was reported done is there, and none of the failed transaction's.
  sqlite3* reopened = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &reopened), SQLITE_OK);
  {
    Statement q(reopened, "SELECT group_concat(v) FROM (SELECT v FROM log ORDER BY v)");
    ASSERT_TRUE(*q.Step());
    EXPECT_EQ(q.Blob(0), "2,3");
  }  // finalized before the close (sqlite3_close refuses a connection with a live statement)
  EXPECT_EQ(sqlite3_close(reopened), SQLITE_OK);
}

// A long read of a job's steps (a dashboard's, `furnace report`'s) does not hold up writes: it
// reads a snapshot on a connection of its own while the writer commits (it held the one
// connection's mutex, and with it every job transition and telemetry commit, until it was done).
TEST(JobStoreTest, ALongReadOfStepsDoesNotHoldUpWrites) {
  auto store = JobStore::Open(TempDb());
  ASSERT_TRUE(store.ok()) << store.status();
  JobStore& s = **store;
  ASSERT_TRUE(s.PutJob(Summary("x-1", v1::JOB_RUNNING), v1::JobSpec()).ok());
  for (uint64_t step = 1; step <= 3; ++step) {
    v1::StepRecord r;
    r.set_attempt(1);
    r.set_step(step);
    ASSERT_TRUE(s.PutStep("x-1", r).ok());
  }
  int seen = 0;
  std::promise<absl::Status> written;
  std::future<absl::Status> write = written.get_future();
  std::thread writer;
  const absl::Status read = s.ForEachStep("x-1", [&](const v1::StepRecord&) {
    if (++seen != 2) return;
    // Midway through the read: another thread's transition and step commit.
    writer = std::thread([&] {
      written.set_value(s.Transaction([&]() -> absl::Status {
        RETURN_IF_ERROR(s.PutSummary(Summary("x-1", v1::JOB_SUCCEEDED)));
        v1::StepRecord r;
        r.set_attempt(1);
        r.set_step(4);
        return s.PutStep("x-1", r);
      }));
    });
    EXPECT_EQ(write.wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "the write waited for the read";
  });
  writer.join();
  EXPECT_TRUE(write.get().ok());
  EXPECT_TRUE(read.ok()) << read;
  EXPECT_EQ(seen, 3);  // the snapshot the read began with
  auto steps = s.LoadSteps("x-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(steps->size(), 4u);
}

}  // namespace
}  // namespace furnace::controller
