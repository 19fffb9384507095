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
  EXPECT_EQ(
      ExitCodeForStatus(NotApplicable(absl::FailedPreconditionError("job j-1 already ended"))),
      kExitNotApplicable);
  // A submit the controller refused for the job's sake (checkpoint.dir in use): as an invalid file.
  EXPECT_EQ(ExitCodeForStatus(JobRefused(absl::FailedPreconditionError("dir in use"))), kExitUsage);
  EXPECT_TRUE(JobRefused(absl::OkStatus()).ok());
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
  // A connection that failed in its TLS handshake says so, and why (gRPC 1.51's wording).
  const auto unreachable = [&](const std::string& why) {
    return std::string(
        FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "failed to connect to all addresses; last error: UNKNOWN: "
                                    "ipv4:10.0.0.1:7070: " +
                                        why),
                       "ListJobs", addr)
            .message());
  };
  EXPECT_EQ(unreachable("Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL "
                        "routines::certificate verify failed"),
            "TLS handshake with the controller at 10.0.0.1:7070 failed: its certificate failed "
            "verification: not signed by the CA given (--tls-ca or FURNACE_TLS_CA), expired or "
            "not yet valid (Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL "
            "routines::certificate verify failed)");
  EXPECT_EQ(unreachable("Ssl handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL "
                        "routines::wrong version number"),
            "TLS handshake with the controller at 10.0.0.1:7070 failed: it does not speak TLS (a "
            "plaintext controller: drop --tls-ca and FURNACE_TLS_CA, or start it with "
            "--tls-cert/--tls-key/--tls-ca) (Ssl handshake failed: SSL_ERROR_SSL: "
            "error:0A00010B:SSL routines::wrong version number)");
  EXPECT_EQ(unreachable("Socket closed"),
            "the controller at 10.0.0.1:7070 closed the connection before answering (one that "
            "runs with TLS needs --tls-ca or FURNACE_TLS_CA) (Socket closed)");
  EXPECT_EQ(unreachable("Failed to connect to remote host: Connection refused"),
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
  for (const char* code : {"  0  ", "  1  ", "  2  ", "  3  ", "  4  ", "  5  ", "  6  "}) {
    EXPECT_NE(help.find(code), std::string::npos) << code;
  }
}

}  // namespace
}  // namespace furnace::cli
