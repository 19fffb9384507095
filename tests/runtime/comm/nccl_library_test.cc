// The NCCL forwarding functions against the libnccl the build found: every entry point Furnace
// calls is there, and calls reach it (no GPU needed for these). Labelled unit.
#include "runtime/comm/nccl_library.h"

#include <nccl.h>

#include <string>

#include "gtest/gtest.h"

namespace furnace::comm {
namespace {

TEST(NcclLibraryTest, TheInstalledNcclHasEveryEntryPoint) {
  const absl::Status status = LoadNccl();
  if (!status.ok() && status.message().rfind("cannot load", 0) == 0) {
    GTEST_SKIP() << "no libnccl on this host (the programs still run without NCCL): " << status;
  }
  ASSERT_TRUE(status.ok()) << status;
  const std::string text = ncclGetErrorString(ncclInvalidArgument);
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.find("cannot load"), std::string::npos) << text;
  // A call the library answers itself: a null argument is refused, not forwarded to a crash.
  EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
}

}  // namespace
}  // namespace furnace::comm
