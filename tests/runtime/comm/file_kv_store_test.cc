#include "runtime/comm/file_kv_store.h"

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FileKvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "furnace_file_kv_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    dir_ = root_ + "/store";  // created by the first Set
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  std::string root_;
  std::string dir_;
};

TEST_F(FileKvStoreTest, SetThenGetRoundTripsBinaryValuesInKeyOrder) {
  FileKvStore store(dir_);
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(store.Set("tp/0/rank_1", binary).ok());
  ASSERT_TRUE(store.Set("", "empty key").ok());
  ASSERT_TRUE(store.Set("x", "").ok());
  absl::StatusOr<std::vector<std::string>> values = store.Get({"x", "tp/0/rank_1", ""}, 0);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("", binary, "empty key"));
}

TEST_F(FileKvStoreTest, EscapedKeysDoNotCollide) {
  FileKvStore store(dir_);
  ASSERT_TRUE(store.Set("a/b", "slash").ok());
  ASSERT_TRUE(store.Set("a%2Fb", "percent").ok());
  ASSERT_TRUE(store.Set("a.b", "dot").ok());
  EXPECT_THAT(*store.Get({"a/b", "a%2Fb", "a.b"}, 0), ElementsAre("slash", "percent", "dot"));
}

// A key whose file name is at the longest allowed (240) is stored; one longer is refused as
// InvalidArgument (the tmp file's name once carried the key too, and passed NAME_MAX from about
// the 100th write of a process).
TEST_F(FileKvStoreTest, KeysUpToTheLongestFileNameAreStored) {
  FileKvStore store(dir_);
  const std::string longest(240, 'k');
  for (int i = 0; i < 120; ++i) ASSERT_TRUE(store.Set(longest, std::to_string(i)).ok()) << i;
  EXPECT_THAT(*store.Get({longest}, 0), ElementsAre("119"));
  EXPECT_TRUE(absl::IsInvalidArgument(store.Set(std::string(241, 'k'), "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(store.Set(std::string(81, '/'), "x")));  // 243 escaped
}

TEST_F(FileKvStoreTest, SetOverwritesAndLeavesNoTemporaryFiles) {
  FileKvStore store(dir_);
  ASSERT_TRUE(store.Set("k", "1").ok());
  ASSERT_TRUE(store.Set("k", "22").ok());
  EXPECT_THAT(*store.Get({"k"}, 0), ElementsAre("22"));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().rfind(".tmp", 0), std::string::npos);
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(FileKvStoreTest, GetWaitsForAKeyWrittenLater) {
  FileKvStore reader(dir_);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    FileKvStore other(dir_);  // a second handle on the same directory, as another process has
    ASSERT_TRUE(other.Set("late", "v").ok());
  });
  absl::StatusOr<std::vector<std::string>> values = reader.Get({"late"}, 10);
  writer.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("v"));
}

TEST_F(FileKvStoreTest, GetTimesOutNamingTheMissingKeys) {
  FileKvStore store(dir_);
  ASSERT_TRUE(store.Set("here", "1").ok());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::string>> values = store.Get({"here", "gone"}, 0.2);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(absl::IsDeadlineExceeded(values.status())) << values.status();
  EXPECT_THAT(values.status().message(), HasSubstr("gone"));
  EXPECT_THAT(values.status().message(), ::testing::Not(HasSubstr("here,")));
  EXPECT_THAT(values.status().message(), HasSubstr("after 0.200 s"));  // the timeout it was given
  EXPECT_GE(seconds, 0.19);                                            // not before it
  EXPECT_TRUE(absl::IsDeadlineExceeded(store.Get({"gone"}, 0).status()));
}

TEST_F(FileKvStoreTest, SetFailsWhereTheDirectoryCannotBeCreated) {
  const std::string file = root_ + "/plain_file";
  FileKvStore blocker(root_);
  ASSERT_TRUE(blocker.Set("plain_file", "x").ok());
  FileKvStore store(file + "/sub");
  EXPECT_TRUE(absl::IsUnavailable(store.Set("k", "v"))) << store.Set("k", "v");
}

}  // namespace
}  // namespace furnace::comm
