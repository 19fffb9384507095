#include "controller/service/log_store.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace furnace::controller {

namespace v1 = furnace::v1;

LogStore::LogStore(std::string dir) : dir_(std::move(dir)) {}

std::string LogStore::Path(const std::string& job_id) const {
  return (std::filesystem::path(dir_) / (job_id + ".log")).string();
}

absl::Status LogStore::Remove(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(append_mu_);
  std::error_code ec;
  std::filesystem::remove(Path(job_id), ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot remove ", Path(job_id), ": ", ec.message()));
  return absl::OkStatus();
}

std::string LogStore::Format(const v1::LogLine& line) {
  std::string text = line.text();
  std::replace(text.begin(), text.end(), '\n', ' ');
  return absl::StrCat(line.attempt(), " ", line.rank(), " ", text, "\n");
}

absl::Status LogStore::Append(const std::map<std::string, std::string>& text_by_job) {
  std::lock_guard<std::mutex> lock(append_mu_);
  for (const auto& [job_id, text] : text_by_job) {
    std::ofstream out(Path(job_id), std::ios::app);
    out << text;
    if (!out) return absl::InternalError(absl::StrCat("cannot append to ", Path(job_id)));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::GetLogsResponse> LogStore::Read(const v1::GetLogsRequest& req) const {
  v1::GetLogsResponse resp;
  resp.set_next_offset(req.offset());
  std::ifstream in(Path(req.job_id()), std::ios::binary);
  if (!in) return resp;  // no line yet
  // The offset is a byte position where a line starts (0, or an earlier answer's next_offset):
  // reading seeks there, so following a long log costs a page, not the whole file, per poll.
  if (req.offset() > 0) {
    char before = 0;
    in.seekg(static_cast<std::streamoff>(req.offset() - 1));
    if (!in.get(before) || before != '\n') {
      return absl::InvalidArgumentError(
          absl::StrCat("offset ", req.offset(), " is not where a line of job ", req.job_id(),
                       "'s log starts: pass 0, or the next_offset of an earlier answer"));
    }
  }
  uint64_t at = req.offset();  // where `line` starts
  std::string line;
  size_t bytes = 0;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a partial last line: wait until it is complete
    // A full page ends before this line, which the next read starts with.
    if (static_cast<size_t>(resp.lines_size()) >= kMaxLogPageLines ||
        (resp.lines_size() > 0 && bytes + line.size() > kMaxLogPageBytes)) {
      break;
    }
    at += line.size() + 1;
    resp.set_next_offset(at);
    // Stored as "<attempt> <rank> <text>".
    unsigned attempt = 0, rank = 0;
    int consumed = 0;
    if (sscanf(line.c_str(), "%u %u %n", &attempt, &rank, &consumed) < 2) continue;
    if (req.rank() >= 0 && static_cast<unsigned>(req.rank()) != rank) continue;
    if (req.attempt() > 0 && static_cast<unsigned>(req.attempt()) != attempt) continue;
    resp.add_lines(absl::StrCat("[attempt ", attempt, " rank ", rank, "] ", line.substr(consumed)));
    bytes += line.size();
  }
  return resp;
}

}  // namespace furnace::controller
