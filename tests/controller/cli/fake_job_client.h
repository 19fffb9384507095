// A JobClient that answers from scripts, for the command tests: no sockets.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "controller/cli/client.h"

namespace furnace::cli::testing {

// Answers GetJob from a script (the last answer repeats), GetLogs from pages and GetJobSeries
// with `series`.
class FakeJobClient : public JobClient {
 public:
  std::deque<absl::StatusOr<v1::JobDetail>> get_job;
  std::deque<absl::StatusOr<v1::GetLogsResponse>> logs;
  std::vector<v1::GetLogsRequest> log_requests;
  absl::Status submit_error;
  v1::SubmitJobRequest submitted;
  absl::StatusOr<v1::JobSeries> series = v1::JobSeries();
  std::vector<v1::GetJobSeriesRequest> series_requests;
  int get_job_calls = 0;
  std::vector<std::string> get_job_ids;
  int submit_calls = 0;
  absl::StatusOr<v1::ListAuditEventsResponse> audit = v1::ListAuditEventsResponse();
  std::vector<v1::ListAuditEventsRequest> audit_requests;

  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request) override {
    ++submit_calls;
    submitted = request;
    if (!submit_error.ok()) return submit_error;
    v1::SubmitJobResponse response;
    response.set_job_id("j-1");
    for (const std::string& d : submit_defaults) response.add_defaults(d);
    return response;
  }
  absl::StatusOr<v1::SubmitJobResponse> CheckJob(const v1::SubmitJobRequest& request) override {
    ++check_calls;
    checked = request;
    if (!submit_error.ok()) return submit_error;
    v1::SubmitJobResponse response;
    *response.mutable_spec() = checked_spec;
    for (const std::string& d : submit_defaults) response.add_defaults(d);
    return response;
  }
  std::vector<std::string> submit_defaults;  // SubmitJobResponse.defaults
  v1::SubmitJobRequest checked;              // what CheckJob was sent
  int check_calls = 0;
  v1::JobSpec checked_spec;   // CheckJob's SubmitJobResponse.spec
  v1::ListJobsResponse jobs;  // what ListJobs answers
  absl::StatusOr<v1::ListJobsResponse> ListJobs() override { return jobs; }
  absl::StatusOr<v1::JobDetail> GetJob(const std::string& job_id) override {
    ++get_job_calls;
    get_job_ids.push_back(job_id);
    if (get_job.empty()) return absl::UnavailableError("no GetJob answer scripted");
    auto next = get_job.front();
    if (get_job.size() > 1) get_job.pop_front();
    return next;
  }
  absl::Status cancel_status;                         // not OK: CancelJob answers it
  std::map<std::string, absl::Status> cancel_errors;  // per job id, before cancel_status
  absl::StatusOr<v1::CancelJobResponse> CancelJob(const std::string& job_id) override {
    if (auto it = cancel_errors.find(job_id); it != cancel_errors.end()) return it->second;
    if (!cancel_status.ok()) return cancel_status;
    v1::CancelJobResponse response;
    response.mutable_job()->set_job_id(job_id);
    response.mutable_job()->set_state(v1::JOB_CANCELLED);
    return response;
  }
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() override {
    return v1::ListWorkersResponse();
  }
  absl::StatusOr<v1::GetLogsResponse> GetLogs(const v1::GetLogsRequest& request) override {
    log_requests.push_back(request);
    auto next = logs.front();
    if (logs.size() > 1) logs.pop_front();
    return next;
  }
  // Paged as the controller pages (GetJobSeriesRequest.page_size): the steps of `series` after
  // the cursor, in their order.
  absl::StatusOr<v1::JobSeries> GetJobSeries(const v1::GetJobSeriesRequest& request) override {
    series_requests.push_back(request);
    if (request.page_size() == 0 || !series.ok()) return series;
    v1::JobSeries page = *series;
    page.clear_steps();
    for (const v1::StepRecord& step : series->steps()) {
      if (std::make_pair(step.attempt(), step.step()) <=
          std::make_pair(request.after_attempt(), request.after_step())) {
        continue;
      }
      if (page.steps_size() == static_cast<int>(request.page_size())) {
        page.set_more(true);
        break;
      }
      *page.add_steps() = step;
    }
    return page;
  }
  absl::StatusOr<v1::ListAuditEventsResponse> ListAuditEvents(
      const v1::ListAuditEventsRequest& request) override {
    audit_requests.push_back(request);
    return audit;
  }
};

}  // namespace furnace::cli::testing
