#include "controller/spec/job_spec.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/spec/cross_checks.h"
#include "controller/spec/diagnostics.h"
#include "controller/spec/sections.h"
#include "controller/spec/yaml_reader.h"
#include "runtime/base/utf8.h"

namespace furnace::spec {
namespace {

bool IsValidName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '_' && c != '-'))) return false;
  }
  return true;
}

void ReadDocument(const YAML::Node& doc, Diagnostics* diag, furnace::v1::JobSpec* spec) {
  MapReader root(doc, "", PositionOf(doc.Mark()), diag);

  std::optional<std::string> name = root.String("name");
  if (!name) {
    if (!diag->Failed("name")) {
      root.Report("name", Problem{"required field is missing", "",
                                  "a name matching [a-z0-9][a-z0-9_-]{0,62}"});
    }
  } else if (!IsValidName(*name)) {
    root.Report("name", Problem{"invalid job name", absl::StrCat("'", *name, "'"),
                                "lowercase letters, digits, '_' and '-', starting with a letter "
                                "or digit, at most 63 characters ([a-z0-9][a-z0-9_-]{0,62})"});
  } else {
    spec->set_name(*name);
  }
  std::optional<std::string> kind = root.Enum("kind", {"commcheck", "train"});
  if (!kind && !diag->Failed("kind")) {
    root.Report("kind", Problem{"required field is missing", "", "commcheck, train"});
  }
  spec->set_kind(kind.value_or(""));

  MapReader model = root.Section("model");
  ReadModel(model, spec->mutable_model());
  MapReader parallel = root.Section("parallel");
  ReadParallel(parallel, spec->mutable_parallel());
  MapReader moe = root.Section("moe");
  ReadMoe(moe, spec->mutable_moe());
  MapReader memory = root.Section("memory");
  ReadMemory(memory, spec->mutable_memory());
  MapReader train = root.Section("train");
  ReadTrain(train, spec->mutable_train());
  MapReader data = root.Section("data");
  ReadData(data, spec->mutable_data());
  MapReader checkpoint = root.Section("checkpoint");
  ReadCheckpoint(checkpoint, spec->mutable_checkpoint());
  MapReader eval = root.Section("eval");
  ReadEval(eval, spec->mutable_eval());
  MapReader recovery = root.Section("recovery");
  ReadRecovery(recovery, spec->mutable_recovery());
  ResolveShrink(spec->parallel(), spec->mutable_recovery());
  MapReader resources = root.Section("resources");
  ReadResources(resources, spec->mutable_resources());
  MapReader commcheck = root.Section("commcheck");
  ReadCommcheck(commcheck, spec->mutable_commcheck());
  MapReader fault = root.Section("fault");
  ReadFault(fault, spec->mutable_fault());
  root.ReportUnknownKeys();

  if (!diag->Present("resources.workers")) spec->mutable_resources()->set_workers(WorldSize(*spec));
  CheckCrossFields(*spec, diag);
}

// The first node event of one document: where it is and whether the document was only a null.
class FirstNode : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark, true); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark, false); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Node(mark, false);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Node(mark, false);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Node(mark, false);
  }
  void OnMapEnd() override {}

  bool only_null() const { return nodes_ == 1 && first_null_; }
  const YAML::Mark& mark() const { return mark_; }

 private:
  void Node(const YAML::Mark& mark, bool null) {
    if (nodes_++ == 0) {
      mark_ = mark;
      first_null_ = null;
    }
  }
  int nodes_ = 0;
  bool first_null_ = false;
  YAML::Mark mark_;
};

// Where a second document starts, if the stream has one. Not YAML::LoadAll: on some malformed
// streams (a lone ',') yaml-cpp 0.7's parser returns a null document without consuming the token
// it stopped at, and LoadAll appends null documents forever, until memory runs out (yaml-cpp issue
// 1040, fixed upstream after 0.7; found by tests/fuzz). Here at most two documents are read, and
// a second one that is only a null does not count (upstream's fix stops at it too).
std::optional<YAML::Mark> SecondDocument(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  FirstNode first, second;
  if (!parser.HandleNextDocument(first)) return std::nullopt;
  if (!parser.HandleNextDocument(second) || second.only_null()) return std::nullopt;
  return second.mark();
}

// The first character of `text` that is not blank, a comment or a document marker; unknown
// Position when there is none (the file is empty).
Position FirstContent(const std::string& text) {
  std::istringstream in(text);
  int line = 0;
  for (std::string l; std::getline(in, l); ++line) {
    const size_t col = l.find_first_not_of(" \t\r");
    if (col == std::string::npos || l[col] == '#' || l.rfind("---", 0) == 0 ||
        l.rfind("...", 0) == 0) {
      continue;
    }
    return Position{line, static_cast<int>(col), true};
  }
  return Position{};
}

}  // namespace

absl::Status CheckJobText(std::string_view text, std::string_view filename) {
  if (text.size() > kMaxJobFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(filename), ": the job file is ",
                                                   text.size(), " bytes; the limit is ",
                                                   kMaxJobFileBytes, " bytes (1 MiB)"));
  }
  if (std::optional<size_t> bad = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: byte %d (0x%02x): not valid UTF-8; a job file is UTF-8 text", filename,
                        *bad, static_cast<unsigned>(static_cast<unsigned char>(text[*bad]))));
  }
  return absl::OkStatus();
}

absl::StatusOr<furnace::v1::JobSpec> ParseJobYaml(std::string_view yaml_text,
                                                  std::string_view filename) {
  if (absl::Status checked = CheckJobText(yaml_text, filename); !checked.ok()) return checked;
  Diagnostics diag{std::string(filename)};
  furnace::v1::JobSpec spec;
  try {
    const std::string text(yaml_text);
    const YAML::Node root = YAML::Load(text);
    const std::optional<YAML::Mark> second = SecondDocument(text);
    if (const Position content = FirstContent(text); root.IsNull() && content.known) {
      diag.AddRaw(content,
                  "malformed YAML: no document could be read from here on; expected a mapping "
                  "with at least 'name' and 'kind'");
    } else if (root.IsNull()) {
      diag.AddRaw(Position{0, 0, true},
                  "the job file is empty; expected a mapping with at least 'name' and 'kind'");
    } else if (second.has_value()) {
      diag.AddRaw(PositionOf(*second),
                  "a job file holds one YAML document; found a second one (remove the '---')");
    } else if (!root.IsMap()) {
      diag.AddRaw(PositionOf(root.Mark()),
                  absl::StrCat("top level: expected a mapping with at least 'name' and 'kind', "
                               "got ",
                               DescribeNode(root)));
    } else {
      ReadDocument(root, &diag, &spec);
    }
  } catch (const YAML::ParserException& e) {
    diag.AddRaw(PositionOf(e.mark), absl::StrCat("malformed YAML: ", e.msg));
  } catch (const YAML::Exception& e) {
    diag.AddRaw(PositionOf(e.mark), absl::StrCat("invalid YAML: ", e.msg));
  }
  if (absl::Status status = diag.ToStatus(); !status.ok()) return status;
  return spec;
}

absl::StatusOr<furnace::v1::JobSpec> LoadJobFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("job file ", path, " is a directory"));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot open job file ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::InternalError(why);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read job file ", path));
  return ParseJobYaml(text.str(), path);
}

uint32_t WorldSize(const furnace::v1::JobSpec& spec) {
  const auto& p = spec.parallel();
  const uint64_t world = uint64_t{p.pp()} * p.dp() * p.tp();
  return world > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(world);
}

}  // namespace furnace::spec
