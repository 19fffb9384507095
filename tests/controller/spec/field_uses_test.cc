// Accepted means implemented: every leaf field of furnace.v1.JobSpec (found by walking the proto
// descriptor, so a new field cannot be forgotten) is listed in controller/spec/field_uses.h, and
// what the table says holds: a used field is read by code under worker/, controller/ (outside the
// spec parser) or runtime/; a refused one is refused at submit with a message naming it.
#include "controller/spec/field_uses.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "controller/spec/job_spec.h"
#include "furnace/v1/job.pb.h"
#include "google/protobuf/descriptor.h"

namespace furnace::spec {
namespace {

namespace fs = std::filesystem;

// Leaf paths ("moe.spikes.seed") of `message`, depth first.
void CollectLeaves(const google::protobuf::Descriptor* message, const std::string& prefix,
                   std::vector<std::string>* out) {
  for (int i = 0; i < message->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = message->field(i);
    const std::string path = prefix.empty() ? f->name() : prefix + "." + f->name();
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      CollectLeaves(f->message_type(), path, out);
    } else {
      out->push_back(path);
    }
  }
}

std::vector<std::string> JobSpecLeaves() {
  std::vector<std::string> leaves;
  CollectLeaves(furnace::v1::JobSpec::descriptor(), "", &leaves);
  return leaves;
}

// Every hand-written C++ file under worker/, controller/ and runtime/, except the spec parser
// (validating a field is not using it) and generated protobuf code.
const std::map<std::string, std::string>& Sources() {
  static const auto* sources = [] {
    auto* out = new std::map<std::string, std::string>;
    const fs::path root(FURNACE_SOURCE_DIR);
    for (const char* dir : {"worker", "controller", "runtime"}) {
      for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
        const fs::path& p = entry.path();
        if (!entry.is_regular_file()) continue;
        if (p.extension() != ".cc" && p.extension() != ".h") continue;
        const std::string rel = fs::relative(p, root).string();
        if (rel.rfind("controller/spec/", 0) == 0) continue;
        if (rel.find(".pb.") != std::string::npos) continue;
        std::ifstream in(p);
        std::stringstream text;
        text << in.rdbuf();
        (*out)[rel] = text.str();
      }
    }
    return out;
  }();
  return *sources;
}

// A train job that sets only `path` to `value` (nested sections, two spaces per level).
std::string JobSetting(std::string_view path, std::string_view value) {
  std::string yaml = "name: fields\nkind: train\n";
  const std::vector<std::string> keys = absl::StrSplit(std::string(path), '.');
  for (size_t i = 0; i < keys.size(); ++i) {
    yaml += std::string(2 * i, ' ') + keys[i] + ":";
    yaml += i + 1 == keys.size() ? " " + std::string(value) + "\n" : "\n";
  }
  return yaml;
}

TEST(FieldUsesTest, EveryFieldIsListedOnce) {
  std::set<std::string> listed;
  for (const JobSpecField& f : kJobSpecFields) {
    EXPECT_TRUE(listed.insert(std::string(f.path)).second) << "listed twice: " << f.path;
  }
  std::set<std::string> leaves;
  for (const std::string& path : JobSpecLeaves()) {
    leaves.insert(path);
    EXPECT_TRUE(listed.count(path) == 1)
        << "furnace.v1.JobSpec field " << path
        << " is not in controller/spec/field_uses.h: say whether the worker, controller or "
           "runtime reads it, or refuse any value but its default at submit";
  }
  for (const std::string& path : listed) {
    EXPECT_TRUE(leaves.count(path) == 1)
        << path << " in controller/spec/field_uses.h is not a field of furnace.v1.JobSpec";
  }
}

TEST(FieldUsesTest, UsedFieldsAreReadOutsideTheParser) {
  ASSERT_FALSE(Sources().empty()) << "no sources under " << FURNACE_SOURCE_DIR;
  for (const JobSpecField& f : kJobSpecFields) {
    if (f.use != FieldUse::kUsed) continue;
    bool found = false;
    for (const auto& [file, text] : Sources()) {
      if (text.find(f.evidence) != std::string::npos) {
        found = true;
        break;
      }
    }
    EXPECT_TRUE(found) << f.path << " is listed as used, but '" << f.evidence
                       << "' occurs nowhere under worker/, controller/ (outside controller/spec) "
                          "or runtime/: refuse the field unless default, or update the evidence";
  }
}

TEST(FieldUsesTest, TheBaseJobIsAccepted) {
  absl::StatusOr<furnace::v1::JobSpec> spec =
      ParseJobYaml("name: fields\nkind: train\n", "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST(FieldUsesTest, RefusedFieldsAreRefusedByName) {
  for (const JobSpecField& f : kJobSpecFields) {
    if (f.use == FieldUse::kUsed && f.refused.empty()) continue;
    const std::string_view value = f.use == FieldUse::kUsed ? f.refused : f.evidence;
    const std::string yaml = JobSetting(f.path, value);
    absl::StatusOr<furnace::v1::JobSpec> spec = ParseJobYaml(yaml, "job.yaml");
    if (spec.ok()) {
      ADD_FAILURE() << f.path << ": " << value << " was accepted:\n" << yaml;
      continue;
    }
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    const std::string message(spec.status().message());
    EXPECT_NE(message.find(std::string(f.path) + ": "), std::string::npos)
        << "the refusal does not name " << f.path << ":\n"
        << message;
    EXPECT_NE(message.find(std::string(value)), std::string::npos)
        << "the refusal does not show the value " << value << ":\n"
        << message;
  }
}

}  // namespace
}  // namespace furnace::spec
