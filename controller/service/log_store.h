// LogStore: the rank logs of every job, one append-only text file per job
// (<state_dir>/logs/jobs/<job>.log), each line stored as "<attempt> <rank> <text>".
//
// What it owns: those files; nothing else writes or reads them.
// Threading: thread-safe, and independent of the controller's state lock (callers check that the
// job exists under that lock, then append or read here without it, so a slow disk delays only
// other log appends). Appends are serialised by the store's own mutex; reads take no lock and
// return complete lines only (a partial last line waits for the next read).
// Errors: Append returns Internal naming the file it could not write (the agent re-sends the
// batch); reading a job that has no file yet returns no lines.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"

namespace furnace::controller {

inline constexpr size_t kMaxLogPageLines = 5000;
inline constexpr size_t kMaxLogPageBytes = size_t{1} << 20;

class LogStore {
 public:
  // `dir` exists (the controller creates it at start).
  explicit LogStore(std::string dir);

  // Appends `text_by_job` (job id -> complete lines as made by Format) to each job's file.
  absl::Status Append(const std::map<std::string, std::string>& text_by_job);
  // One line in the stored format; newlines inside the text become spaces.
  static std::string Format(const furnace::v1::LogLine& line);

  // The lines of req.job_id() from req.offset() on (a byte position where a line starts: 0, or
  // an earlier answer's next_offset), filtered by rank and attempt: a page of at most
  // kMaxLogPageLines lines and kMaxLogPageBytes bytes of text (one longer line comes alone), so a
  // page stays far below a gRPC message's limit. next_offset is where the next read continues
  // (the first line not returned, filtered lines skipped); a read seeks there, so it costs one
  // page however long the log. job_done is left for the caller to set. InvalidArgument for an
  // offset inside a line.
  absl::StatusOr<furnace::v1::GetLogsResponse> Read(const furnace::v1::GetLogsRequest& req) const;
  // Removes the job's log file (a forgotten job's); OK when there is none.
  absl::Status Remove(const std::string& job_id);

 private:
  std::string Path(const std::string& job_id) const;

  const std::string dir_;
  std::mutex append_mu_;  // one appender at a time, so batches never interleave inside a line
};

}  // namespace furnace::controller
