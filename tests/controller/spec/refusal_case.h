// A job YAML the spec must refuse, and the check every refusal table shares: InvalidArgument, with
// each expected substring (file:line:col, field, value, allowed values) in the message.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "controller/spec/job_spec.h"

namespace furnace::spec::testing_util {

struct RefusalCase {
  std::string label;
  std::string yaml;
  std::vector<std::string> expect;  // substrings of the error message
};

// Parses `c.yaml` as "job.yaml" and checks the refusal; returns the message ("" if accepted).
inline std::string ExpectRefused(const RefusalCase& c) {
  absl::StatusOr<furnace::v1::JobSpec> spec = ParseJobYaml(c.yaml, "job.yaml");
  if (spec.ok()) {
    ADD_FAILURE() << "accepted:\n" << c.yaml;
    return "";
  }
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  for (const std::string& want : c.expect) {
    EXPECT_NE(message.find(want), std::string::npos) << "missing: " << want << "\nin message:\n"
                                                     << message;
  }
  return message;
}

inline std::string CaseName(const ::testing::TestParamInfo<RefusalCase>& info) {
  return info.param.label;
}

}  // namespace furnace::spec::testing_util
