#include "runtime/base/path_root.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace furnace {
namespace {

namespace fs = std::filesystem;

// A root with data inside and a directory beside it, in a fresh temporary directory.
class PathRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(::testing::TempDir()) /
            ("path_root_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    fs::create_directories(base_ / "root" / "data");
    fs::create_directories(base_ / "outside");
    std::ofstream(base_ / "root" / "data" / "train.tok") << "x";
    std::ofstream(base_ / "outside" / "secret") << "x";
    auto root = ResolveRoot((base_ / "root").string(), "--data-root");
    ASSERT_TRUE(root.ok()) << root.status();
    root_ = *root;
  }
  void TearDown() override { fs::remove_all(base_); }

  absl::StatusOr<std::string> Confine(const std::string& path,
                                      const std::vector<std::string>& files = {}) {
    return ConfinePath(root_, path, "data.path", "--data-root", files);
  }

  fs::path base_;
  std::string root_;
};

TEST_F(PathRootTest, RelativePathsAreJoinedToTheRoot) {
  auto p = Confine("data/train.tok");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, root_ + "/data/train.tok");
  // Not there yet (a checkpoint directory to be made): fine, resolved all the same.
  p = Confine("ckpt/run1");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, root_ + "/ckpt/run1");
  // `..` that stays inside is fine.
  p = Confine("data/../data/train.tok");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, root_ + "/data/train.tok");
}

TEST_F(PathRootTest, AbsolutePathsInsideTheRootAreKept) {
  auto p = Confine(root_ + "/data/train.tok");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, root_ + "/data/train.tok");
}

TEST_F(PathRootTest, DotDotEscapesAreRefusedNamingFieldAndRoot) {
  auto p = Confine("../outside/secret");
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
  const std::string msg(p.status().message());
  EXPECT_NE(msg.find("data.path: ../outside/secret is outside --data-root " + root_), msg.npos)
      << msg;
  EXPECT_NE(msg.find("`..`"), msg.npos) << msg;
  EXPECT_NE(msg.find("allowed: paths under " + root_), msg.npos) << msg;
}

TEST_F(PathRootTest, AbsolutePathsElsewhereAreRefused) {
  for (const std::string& path : std::vector<std::string>{
           "/etc/passwd", (base_ / "outside" / "secret").string(), root_ + "-sibling/x"}) {
    auto p = Confine(path);
    ASSERT_FALSE(p.ok()) << path;
    EXPECT_NE(p.status().message().find("an absolute path elsewhere"), std::string::npos)
        << p.status();
  }
}

TEST_F(PathRootTest, SymlinksLeadingOutsideAreRefused) {
  fs::create_symlink(base_ / "outside", base_ / "root" / "link");
  auto p = Confine("link/secret");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("a symlink"), std::string::npos) << p.status();
  // A path below the link that does not exist yet is caught too (the existing part resolves).
  EXPECT_FALSE(Confine("link/new/dir").ok());
  // A dangling symlink is followed all the same: writing through it would land outside.
  fs::create_symlink(base_ / "outside" / "not-yet", base_ / "root" / "dangling");
  auto dangling = Confine("dangling/ckpt");
  ASSERT_FALSE(dangling.ok());
  EXPECT_NE(dangling.status().message().find("resolves to " + fs::canonical(base_).string() +
                                             "/outside/not-yet/ckpt"),
            std::string::npos)
      << dangling.status();
  // A symlink that stays inside is fine and resolves to its target.
  fs::create_symlink(base_ / "root" / "data", base_ / "root" / "alias");
  auto inside = Confine("alias/train.tok");
  ASSERT_TRUE(inside.ok()) << inside.status();
  EXPECT_EQ(*inside, root_ + "/data/train.tok");
}

TEST_F(PathRootTest, TheFilesOfAPrefixAreCheckedToo) {
  // An indexed dataset: the prefix itself is no file; its .bin leads outside.
  std::ofstream(base_ / "root" / "data" / "corpus.idx") << "x";
  fs::create_symlink(base_ / "outside" / "secret", base_ / "root" / "data" / "corpus.bin");
  EXPECT_TRUE(Confine("data/corpus").ok());
  auto p = Confine("data/corpus", {".bin", ".idx"});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("corpus.bin resolves to"), std::string::npos) << p.status();
}

TEST_F(PathRootTest, ConfineFieldsRewritesEachUnderItsRootAndReportsAll) {
  struct Field {
    std::string field;
    bool checkpoint;
    std::string* path;
    std::vector<std::string> files;
  };
  std::string data = "data/train.tok", ckpt = "../escape", other = "/etc/x";
  std::vector<Field> fields = {{"data.path", false, &data, {}},
                               {"checkpoint.dir", true, &ckpt, {}},
                               {"data.validation.path", false, &other, {}}};
  absl::Status s = ConfineFields(root_, root_, fields);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(data, root_ + "/data/train.tok");
  EXPECT_NE(s.message().find("checkpoint.dir: ../escape is outside --checkpoint-root"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("data.validation.path: /etc/x is outside --data-root"),
            std::string::npos)
      << s;
  // An empty root leaves its fields alone.
  std::string free = "/anywhere/at/all";
  std::vector<Field> unconfined = {{"checkpoint.dir", true, &free, {}}};
  EXPECT_TRUE(ConfineFields(root_, "", unconfined).ok());
  EXPECT_EQ(free, "/anywhere/at/all");
}

TEST(ResolveRootTest, MakesTheRootAbsoluteAndReal) {
  auto r = ResolveRoot(".", "--data-root");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, fs::canonical(fs::current_path()).string());
  EXPECT_FALSE(ResolveRoot("", "--data-root").ok());
}

// A daemon's root must exist (the controller started with a missing one and its local workers,
// refusing it, restarted forever).
TEST(ResolveRootTest, ADaemonsRootMustBeAnExistingDirectory) {
  EXPECT_TRUE(ResolveDaemonRoot(".", "--data-root").ok());
  const auto missing = ResolveDaemonRoot("/nonexistent/furnace-root", "--checkpoint-root");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "--checkpoint-root /nonexistent/furnace-root: not a directory (allowed: an existing "
            "directory)");
}

}  // namespace
}  // namespace furnace
