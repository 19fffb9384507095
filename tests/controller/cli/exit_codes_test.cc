#include "controller/cli/exit_codes.h"

#include "controller/cli/client.h"
#include "gtest/gtest.h"

namespace furnace::cli {
namespace {

TEST(ExitCodesTest, FromStatus) {
  EXPECT_EQ(ExitCodeForStatus(absl::OkStatus()), kExitOk);
  EXPECT_EQ(ExitCodeForStatus(absl::InvalidArgumentError("bad")), kExitUsage);
  EXPECT_EQ(ExitCodeForStatus(absl::NotFoundError("no job")), kExitJobNotFound);
  EXPECT_EQ(ExitCodeForStatus(absl::UnavailableError("down")), kExitRpcError);
  EXPECT_EQ(ExitCodeForStatus(absl::DeadlineExceededError("slow")), kExitRpcError);
  EXPECT_EQ(ExitCodeForStatus(absl::InternalError("bug")), kExitRpcError);
  EXPECT_EQ(ExitCodeForStatus(absl::FailedPreconditionError("done")), kExitRpcError);
}

TEST(ExitCodesTest, LocalErrorsKeepCodeAndMessageButExit5) {
  const absl::Status s = LocalError(absl::NotFoundError("checkpoint: no committed checkpoint"));
  EXPECT_TRUE(absl::IsNotFound(s));
  EXPECT_EQ(s.message(), "checkpoint: no committed checkpoint");
  EXPECT_EQ(ExitCodeForStatus(s), kExitLocalError);
  EXPECT_EQ(ExitCodeForStatus(LocalError(absl::DataLossError("crc"))), kExitLocalError);
  EXPECT_TRUE(LocalError(absl::OkStatus()).ok());
  EXPECT_EQ(ExitCodeForStatus(LocalError(absl::OkStatus())), kExitOk);
}

TEST(ExitCodesTest, FromGrpcCodes) {
  const std::string addr = "127.0.0.1:7070";
  struct Case {
    grpc::StatusCode code;
    int exit;
  };
  for (const Case& c :
       {Case{grpc::StatusCode::INVALID_ARGUMENT, 2}, Case{grpc::StatusCode::NOT_FOUND, 4},
        Case{grpc::StatusCode::UNAVAILABLE, 3}, Case{grpc::StatusCode::DEADLINE_EXCEEDED, 3},
        Case{grpc::StatusCode::INTERNAL, 3}, Case{grpc::StatusCode::PERMISSION_DENIED, 3}}) {
    const absl::Status s = FromGrpcStatus(grpc::Status(c.code, "msg"), "GetJob", addr);
    EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(c.code));
    EXPECT_EQ(ExitCodeForStatus(s), c.exit) << s;
  }
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "GetJob", addr).ok());
}

TEST(ExitCodesTest, GrpcMessages) {
  const std::string addr = "10.0.0.1:7070";
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused"), "ListJobs", addr)
                .message(),
            "cannot reach the controller at 10.0.0.1:7070 (is furnace-controller running? pass "
            "--controller)");
  // The controller's validation report reaches the user unchanged.
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                        "job.yaml:3: parallel.dp: 0 is not allowed"),
                           "SubmitJob", addr)
                .message(),
            "job.yaml:3: parallel.dp: 0 is not allowed");
  EXPECT_EQ(
      FromGrpcStatus(grpc::Status(grpc::StatusCode::INTERNAL, "boom"), "GetJob", addr).message(),
      "GetJob failed: boom");
}

TEST(ExitCodesTest, FromJobState) {
  EXPECT_EQ(ExitCodeForState(v1::JOB_SUCCEEDED), kExitOk);
  EXPECT_EQ(ExitCodeForState(v1::JOB_FAILED), kExitJobFailed);
  EXPECT_EQ(ExitCodeForState(v1::JOB_CANCELLED), kExitJobFailed);
  EXPECT_TRUE(IsFinalState(v1::JOB_SUCCEEDED));
  EXPECT_TRUE(IsFinalState(v1::JOB_FAILED));
  EXPECT_TRUE(IsFinalState(v1::JOB_CANCELLED));
  for (auto s : {v1::JOB_STATE_UNSPECIFIED, v1::JOB_PENDING, v1::JOB_SCHEDULED, v1::JOB_STARTING,
                 v1::JOB_RUNNING, v1::JOB_RECOVERING}) {
    EXPECT_FALSE(IsFinalState(s)) << StateName(s);
  }
}

TEST(ExitCodesTest, StateNames) {
  EXPECT_EQ(StateName(v1::JOB_RUNNING), "RUNNING");
  EXPECT_EQ(StateName(v1::JOB_RECOVERING), "RECOVERING");
  EXPECT_EQ(StateName(v1::JOB_STATE_UNSPECIFIED), "UNKNOWN");
  EXPECT_EQ(StateName(static_cast<v1::JobState>(99)), "UNKNOWN");
}

TEST(ExitCodesTest, HelpListsEveryCode) {
  const std::string help = ExitCodeHelp();
  for (const char* code : {"  0  ", "  1  ", "  2  ", "  3  ", "  4  ", "  5  "}) {
    EXPECT_NE(help.find(code), std::string::npos) << code;
  }
}

}  // namespace
}  // namespace furnace::cli
