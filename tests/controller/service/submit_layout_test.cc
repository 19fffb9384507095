// Submit refuses a parallel layout before anything starts: one the spec rejects (file:line:col,
// field, value, allowed) and one needing more ranks than the controller has workers. A refused
// job leaves no trace: no job, no command to any worker.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "controller/service/controller.h"
#include "gtest/gtest.h"
#include "tests/controller/service/controller_on_temp_dir.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;

class SubmitLayoutTest : public ControllerOnTempDir {
 protected:
  void SetUp() override { StartController("furnace-submit-layout"); }

  void Register(int slot) {
    v1::RegisterRequest r;
    r.set_instance_id("i0");
    r.set_worker_id("h/" + std::to_string(slot));
    r.set_host("127.0.0.1");
    r.set_slot(slot);
    r.set_device_kind("cpu");
    r.set_pid(100 + slot);
    auto resp = c_->Register(r);
    ASSERT_TRUE(resp.ok()) << resp.status();
    sessions_[slot] = resp->session_id();
  }

  void ExpectNoTrace(int workers) {
    EXPECT_TRUE(c_->ListJobs().empty());
    for (int s = 0; s < workers; ++s) {
      auto cmds = c_->NextCommands("h/" + std::to_string(s), sessions_[s], 0.0);
      ASSERT_TRUE(cmds.ok()) << cmds.status();
      EXPECT_TRUE(cmds->empty()) << "worker " << s;
    }
  }

  std::map<int, std::string> sessions_;
};

TEST_F(SubmitLayoutTest, TrainWorldLargerThanTheWorkersIsRefused) {
  Register(0);
  Register(1);
  auto id = c_->Submit("name: t\nkind: train\nparallel: {dp: 2, tp: 2}\n", "train.yaml");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.status().message(),
            "train.yaml: resources.workers: the job needs 4 ranks (pp*dp*tp = 1*2*2) but this "
            "controller has 2 cpu workers; allowed: at most 2");
  ExpectNoTrace(2);
}

TEST_F(SubmitLayoutTest, CommcheckWorldLargerThanTheWorkersIsRefused) {
  Register(0);
  Register(1);
  Register(2);
  auto id = c_->Submit("name: c\nkind: commcheck\nparallel: {pp: 2, dp: 2, tp: 2}\n", "check.yaml");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("needs 8 ranks (pp*dp*tp = 2*2*2) but this controller has "
                                       "3 cpu workers; allowed: at most 3"),
            std::string::npos)
      << id.status();
  ExpectNoTrace(3);
}

TEST_F(SubmitLayoutTest, BadLayoutIsRefusedByTheSpecFirst) {
  Register(0);
  Register(1);
  // ep * esp = 4 does not divide dp * tp = 2: refused with the position, before capacity.
  auto id = c_->Submit("name: t\nkind: train\nparallel:\n  dp: 2\n  ep: 4\nmoe: {experts: 8}\n",
                       "bad.yaml");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find(
                "bad.yaml:5:7: parallel.ep: inconsistent sizes: ep * esp must divide dp * tp"),
            std::string::npos)
      << id.status();
  ExpectNoTrace(2);
}

}  // namespace
}  // namespace furnace::controller
