#include "controller/service/grpc_services.h"

#include <string>

#include "controller/service/caller_identity.h"

namespace furnace::controller {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  // yaml and filename are bytes on the wire: the yaml is checked in ParseJobYaml before any of it
  // goes into a protobuf string; SubmitAs keeps only the file name's printable base name.
  std::vector<std::string> defaults;
  auto id = c_.SubmitAs(CallerIdentity(*ctx), req->yaml(), req->filename(), &defaults);
  if (!id.ok()) return ToGrpc(id.status());
  resp->set_job_id(*id);
  for (std::string& d : defaults) resp->add_defaults(std::move(d));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CheckJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) {
  auto checked = c_.CheckSubmitAs(CallerIdentity(*ctx), req->yaml(), req->filename());
  if (!checked.ok()) return ToGrpc(checked.status());
  *resp = std::move(*checked);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* resp) {
  for (auto& j : c_.ListJobs()) *resp->add_jobs() = std::move(j);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                                    v1::JobDetail* resp) {
  auto detail = c_.GetJob(req->job_id());
  if (!detail.ok()) return ToGrpc(detail.status());
  *resp = std::move(*detail);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                       v1::CancelJobResponse* resp) {
  auto job = c_.CancelAs(CallerIdentity(*ctx), req->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  *resp->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* resp) {
  for (auto& w : c_.ListWorkers()) *resp->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetLogs(grpc::ServerContext*, const v1::GetLogsRequest* req,
                                     v1::GetLogsResponse* resp) {
  auto logs = c_.GetLogs(*req);
  if (!logs.ok()) return ToGrpc(logs.status());
  *resp = std::move(*logs);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobSeries(grpc::ServerContext*, const v1::GetJobSeriesRequest* req,
                                          v1::JobSeries* resp) {
  auto series = c_.GetJobSeries(*req);
  if (!series.ok()) return ToGrpc(series.status());
  *resp = std::move(*series);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListAuditEvents(grpc::ServerContext*,
                                             const v1::ListAuditEventsRequest* req,
                                             v1::ListAuditEventsResponse* resp) {
  auto events = c_.ListAuditEvents(*req);
  if (!events.ok()) return ToGrpc(events.status());
  *resp = std::move(*events);
  return grpc::Status::OK;
}

}  // namespace furnace::controller
