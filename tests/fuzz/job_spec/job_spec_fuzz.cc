// The job YAML parser and validator (controller/spec) on arbitrary bytes. Beyond not crashing:
//  - a refusal is InvalidArgument and every line of it names the file (FILE:LINE:COL: ..., or
//    the count of the problems not listed, FILE: ... and N more), as job_spec.h promises;
//  - an accepted spec survives the wire: it serializes, parses back and serializes to the same
//    bytes (the CLI and the controller exchange it as a protobuf), and its world size is >= 1;
//  - parsing is deterministic: the same text gives the same spec or the same message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "controller/spec/job_spec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kFile = "fuzz.yaml";
  const absl::StatusOr<furnace::v1::JobSpec> spec = furnace::spec::ParseJobYaml(text, kFile);
  const absl::StatusOr<furnace::v1::JobSpec> again = furnace::spec::ParseJobYaml(text, kFile);
  FUZZ_CHECK(spec.ok() == again.ok(), "two parses of one text disagree");
  if (!spec.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(spec.status()), "refusal with code %s",
               std::string(absl::StatusCodeToString(spec.status().code())).c_str());
    const std::string message(spec.status().message());
    FUZZ_CHECK(message == std::string(again.status().message()),
               "two parses give different messages");
    size_t begin = 0;
    while (begin < message.size()) {
      size_t end = message.find('\n', begin);
      if (end == std::string::npos) end = message.size();
      const std::string line = message.substr(begin, end - begin);
      FUZZ_CHECK(line.rfind("fuzz.yaml:", 0) == 0, "a problem line does not name the file: %s",
                 line.c_str());
      begin = end + 1;
    }
    return 0;
  }
  FUZZ_CHECK(furnace::spec::WorldSize(*spec) >= 1, "accepted spec with world size 0");
  std::string wire;
  FUZZ_CHECK(spec->SerializeToString(&wire), "accepted spec does not serialize");
  furnace::v1::JobSpec back;
  FUZZ_CHECK(back.ParseFromString(wire), "accepted spec does not parse back from its wire form");
  std::string wire_again;
  FUZZ_CHECK(back.SerializeToString(&wire_again) && wire_again == wire,
             "accepted spec changes on a wire round trip");
  std::string wire_second;
  FUZZ_CHECK(again->SerializeToString(&wire_second) && wire_second == wire,
             "two parses of one text give different specs");
  return 0;
}
