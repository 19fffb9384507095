// SourceAddressToward: the address the agent advertises to its ranks' peers when --host is not
// given (worker/main.cc). Loopback only here: the route toward 127.0.0.1 leaves from 127.0.0.1,
// whatever the spelling of the controller's address.
#include "worker/controller_channel.h"

#include "gtest/gtest.h"

namespace furnace::worker {
namespace {

TEST(SourceAddressTowardTest, TheRouteTowardLoopbackLeavesFromLoopback) {
  for (const char* address : {"127.0.0.1:7070", "127.0.0.1", "ipv4:127.0.0.1:7070",
                              "dns:///127.0.0.1:7070", "localhost:7070"}) {
    absl::StatusOr<std::string> source = SourceAddressToward(address);
    ASSERT_TRUE(source.ok()) << address << ": " << source.status();
    EXPECT_TRUE(*source == "127.0.0.1" || *source == "::1") << address << " -> " << *source;
  }
}

TEST(SourceAddressTowardTest, ANameThatDoesNotResolveIsUnavailable) {
  // .invalid never resolves (RFC 6761).
  absl::StatusOr<std::string> source = SourceAddressToward("furnace-head.invalid:7070");
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(source.status().message().find("furnace-head.invalid"), std::string::npos)
      << source.status();
  EXPECT_EQ(SourceAddressToward("[::1:7070").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace furnace::worker
