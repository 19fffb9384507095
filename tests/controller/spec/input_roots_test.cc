// The controller's confinement of a job's files (controller/spec/input_roots.h), on real temporary
// directories, and the job text check every job file passes first (CheckJobText).
#include "controller/spec/input_roots.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "controller/spec/job_spec.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "proto/furnace/v1/job_paths.h"
#include "runtime/base/path_root.h"

namespace furnace::spec {
namespace {

namespace fs = std::filesystem;
using furnace::v1::JobSpec;

class InputRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(::testing::TempDir()) /
            ("input_roots_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    fs::create_directories(base_ / "data");
    fs::create_directories(base_ / "ckpt");
    fs::create_directories(base_ / "elsewhere");
    roots_.data = *ResolveRoot((base_ / "data").string(), "--data-root");
    roots_.checkpoint = *ResolveRoot((base_ / "ckpt").string(), "--checkpoint-root");
  }
  void TearDown() override { fs::remove_all(base_); }

  static JobSpec Parse(const std::string& yaml) {
    absl::StatusOr<JobSpec> spec = ParseJobYaml(yaml, "job.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? *spec : JobSpec();
  }

  fs::path base_;
  InputRoots roots_;
};

constexpr const char* kTokensJob = R"(name: t
kind: train
data:
  source: tokens
  path: corpus/train.tok
  validation:
    path: corpus/valid.tok
eval:
  every: 5
  batches: 1
checkpoint:
  dir: run1
)";

TEST_F(InputRootsTest, RelativePathsResolveUnderTheirRoots) {
  JobSpec spec = Parse(kTokensJob);
  ASSERT_TRUE(ConfineJobPaths(roots_, spec).ok());
  EXPECT_EQ(spec.data().path(), roots_.data + "/corpus/train.tok");
  EXPECT_EQ(spec.data().validation().path(), roots_.data + "/corpus/valid.tok");
  EXPECT_EQ(spec.checkpoint().dir(), roots_.checkpoint + "/run1");
}

TEST_F(InputRootsTest, EscapesAreRefusedNamingTheFieldAndTheRootAndChangeNothing) {
  JobSpec spec = Parse(R"(name: t
kind: train
data:
  source: tokens
  path: ../ckpt/x.tok
  tokenizer: /etc/sp.model
checkpoint:
  dir: /tmp/anywhere
)");
  const JobSpec before = spec;
  absl::Status s = ConfineJobPaths(roots_, spec);
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  const std::string msg(s.message());
  EXPECT_NE(msg.find("data.path: ../ckpt/x.tok is outside --data-root " + roots_.data), msg.npos)
      << msg;
  EXPECT_NE(msg.find("data.tokenizer: /etc/sp.model is outside --data-root"), msg.npos) << msg;
  EXPECT_NE(
      msg.find("checkpoint.dir: /tmp/anywhere is outside --checkpoint-root " + roots_.checkpoint),
      msg.npos)
      << msg;
  EXPECT_EQ(spec.SerializeAsString(), before.SerializeAsString());
}

TEST_F(InputRootsTest, ASymlinkOutOfTheRootIsRefused) {
  fs::create_symlink(base_ / "elsewhere", base_ / "ckpt" / "run1");
  JobSpec spec = Parse(kTokensJob);
  absl::Status s = ConfineJobPaths(roots_, spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checkpoint.dir: run1 is outside --checkpoint-root"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("a symlink"), std::string::npos) << s;
}

TEST_F(InputRootsTest, BlendPrefixesAreCheckedWithTheirFiles) {
  fs::create_directories(base_ / "data" / "ix");
  fs::create_symlink(base_ / "elsewhere" / "b.bin", base_ / "data" / "ix" / "b.bin");
  JobSpec spec = Parse(R"(name: t
kind: train
data:
  source: indexed
  blend:
    - {path: ix/a, weight: 1}
    - {path: ix/b, weight: 1}
)");
  absl::Status s = ConfineJobPaths(roots_, spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("data.blend[1].path: ix/b is outside --data-root"), std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("blend[0]"), std::string::npos) << s;
}

TEST_F(InputRootsTest, WithoutRootsNothingChanges) {
  JobSpec spec = Parse(kTokensJob);
  const JobSpec before = spec;
  ASSERT_TRUE(ConfineJobPaths(InputRoots{}, spec).ok());
  EXPECT_EQ(spec.SerializeAsString(), before.SerializeAsString());
  // Only one root: the other kind of field stays as written.
  ASSERT_TRUE(ConfineJobPaths(InputRoots{"", roots_.checkpoint}, spec).ok());
  EXPECT_EQ(spec.data().path(), "corpus/train.tok");
  EXPECT_EQ(spec.checkpoint().dir(), roots_.checkpoint + "/run1");
}

// Every string field of JobSpec named like a path (path, dir, tokenizer, ...) is in JobPathFields,
// so a path field added to job.proto cannot bypass the roots unnoticed.
void FillStrings(google::protobuf::Message& m, int& n, std::set<std::string>& path_values) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string name(f->name());
    const bool path_like = name == "path" || name == "dir" || name == "tokenizer" ||
                           name.find("file") != std::string::npos ||
                           name.find("path") != std::string::npos;
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      const std::string value = "v" + std::to_string(++n);
      if (f->is_repeated()) {
        r->AddString(&m, f, value);
      } else {
        r->SetString(&m, f, value);
      }
      if (path_like) path_values.insert(value);
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      FillStrings(f->is_repeated() ? *r->AddMessage(&m, f) : *r->MutableMessage(&m, f), n,
                  path_values);
    }
  }
}

TEST(JobPathFieldsTest, EveryPathLikeFieldOfTheSpecIsListed) {
  JobSpec spec;
  int n = 0;
  std::set<std::string> path_values;
  FillStrings(spec, n, path_values);
  std::set<std::string> listed;
  for (const auto& f : furnace::v1::JobPathFields(spec)) listed.insert(*f.path);
  for (const std::string& v : path_values) {
    EXPECT_TRUE(listed.count(v)) << "a path-like JobSpec field holding " << v
                                 << " is not in furnace::v1::JobPathFields";
  }
  EXPECT_GE(listed.size(), 5u);  // data.path, blend path, validation path, tokenizer, dir
}

TEST(CheckJobTextTest, RefusesNonUtf8WithTheFileAndOffset) {
  EXPECT_TRUE(CheckJobText("name: caf\xC3\xA9\n", "job.yaml").ok());
  absl::Status s = CheckJobText("name: x\nkind: \xFFtrain\n", "bad.yaml");
  ASSERT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "bad.yaml: byte 14 (0xff): not valid UTF-8; a job file is UTF-8 text");
  // ParseJobYaml checks first, so no caller can reach the YAML parser or protobuf with it.
  auto parsed = ParseJobYaml("name: x\nkind: \xFFtrain\n", "bad.yaml");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status(), s);
}

TEST(CheckJobTextTest, RefusesAFileOverTheLimitNamingIt) {
  const std::string big(kMaxJobFileBytes + 1, '#');
  absl::Status s = CheckJobText(big, "huge.yaml");
  ASSERT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("huge.yaml: the job file is 1048577 bytes; the limit is 1048576"),
            std::string::npos)
      << s;
  EXPECT_TRUE(CheckJobText(std::string(kMaxJobFileBytes, '#'), "ok.yaml").ok());
}

}  // namespace
}  // namespace furnace::spec
