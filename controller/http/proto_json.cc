#include "controller/http/proto_json.h"

#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"

namespace furnace::controller::http {

namespace {

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(m, &out, options);
  if (!status.ok()) {
    return absl::InternalError("cannot print " + m.GetTypeName() +
                               " as JSON: " + std::string(status.message()));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> JobsJson(const furnace::v1::ListJobsResponse& jobs) {
  return ToJson(jobs);
}

absl::StatusOr<std::string> SeriesJson(const furnace::v1::JobSeries& series) {
  return ToJson(series);
}

}  // namespace furnace::controller::http
