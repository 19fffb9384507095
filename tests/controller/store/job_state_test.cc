#include "controller/store/job_state.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

using v1::JobState;

const JobState kAll[] = {v1::JOB_STATE_UNSPECIFIED, v1::JOB_PENDING, v1::JOB_SCHEDULED,
                         v1::JOB_STARTING,          v1::JOB_RUNNING, v1::JOB_RECOVERING,
                         v1::JOB_SUCCEEDED,         v1::JOB_FAILED,  v1::JOB_CANCELLED};

// The whole legal set, written out once: every pair not in it must be refused.
const std::set<std::pair<JobState, JobState>> kLegal = {
    {v1::JOB_PENDING, v1::JOB_SCHEDULED},    {v1::JOB_SCHEDULED, v1::JOB_STARTING},
    {v1::JOB_STARTING, v1::JOB_RUNNING},     {v1::JOB_STARTING, v1::JOB_RECOVERING},
    {v1::JOB_RUNNING, v1::JOB_SUCCEEDED},    {v1::JOB_RUNNING, v1::JOB_RECOVERING},
    {v1::JOB_RECOVERING, v1::JOB_STARTING},  {v1::JOB_PENDING, v1::JOB_FAILED},
    {v1::JOB_PENDING, v1::JOB_CANCELLED},    {v1::JOB_SCHEDULED, v1::JOB_FAILED},
    {v1::JOB_SCHEDULED, v1::JOB_CANCELLED},  {v1::JOB_STARTING, v1::JOB_FAILED},
    {v1::JOB_STARTING, v1::JOB_CANCELLED},   {v1::JOB_RUNNING, v1::JOB_FAILED},
    {v1::JOB_RUNNING, v1::JOB_CANCELLED},    {v1::JOB_RECOVERING, v1::JOB_FAILED},
    {v1::JOB_RECOVERING, v1::JOB_CANCELLED},
};

TEST(JobStateTest, EveryLegalAndIllegalTransition) {
  int legal = 0;
  for (JobState from : kAll) {
    for (JobState to : kAll) {
      const bool expected = kLegal.count({from, to}) > 0;
      absl::Status s = CheckTransition(from, to);
      EXPECT_EQ(s.ok(), expected) << StateName(from) << " -> " << StateName(to);
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_NE(s.message().find(StateName(from)), absl::string_view::npos);
      }
      legal += s.ok();
    }
  }
  EXPECT_EQ(legal, static_cast<int>(kLegal.size()));
}

TEST(JobStateTest, FinalStates) {
  EXPECT_TRUE(IsFinal(v1::JOB_SUCCEEDED));
  EXPECT_TRUE(IsFinal(v1::JOB_FAILED));
  EXPECT_TRUE(IsFinal(v1::JOB_CANCELLED));
  EXPECT_FALSE(IsFinal(v1::JOB_RECOVERING));
  EXPECT_FALSE(IsFinal(v1::JOB_PENDING));
}

}  // namespace
}  // namespace furnace::controller
