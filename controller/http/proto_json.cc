#include "controller/http/proto_json.h"

#include <google/protobuf/util/json_util.h>

#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "runtime/base/status.h"

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

absl::StatusOr<std::string> WorkersJson(const furnace::v1::ListWorkersResponse& workers,
                                        double now_unix) {
  const absl::StatusOr<std::string> json = ToJson(workers);
  if (!json.ok()) return json.status();
  absl::string_view fields = *json;
  if (!absl::ConsumePrefix(&fields, "{")) {
    return absl::InternalError("workers JSON is not an object");
  }
  return absl::StrCat("{\"now_unix\":", absl::StrFormat("%.3f", now_unix), fields == "}" ? "" : ",",
                      fields);
}

absl::StatusOr<std::string> SeriesJson(const furnace::v1::JobSeries& series) {
  // Printed a step at a time into the envelope's empty "steps" array, the same text as the whole
  // message printed at once: protobuf's printer holds intermediate forms of everything it prints,
  // ~20x the text for a long series (hundreds of MB for a few MB of JSON).
  furnace::v1::JobSeries envelope = series;
  envelope.clear_steps();
  ASSIGN_OR_RETURN(std::string out, ToJson(envelope));
  constexpr std::string_view kEmpty = "\"steps\":[]";
  const size_t at = out.find(kEmpty);
  if (at == std::string::npos) return absl::InternalError("JobSeries JSON without its steps");
  std::string steps;
  for (const furnace::v1::StepRecord& step : series.steps()) {
    ASSIGN_OR_RETURN(std::string one, ToJson(step));
    steps += steps.empty() ? "" : ",";
    steps += one;
  }
  out.insert(at + kEmpty.size() - 1, steps);
  return out;
}

}  // namespace furnace::controller::http
