#include "controller/cli/watch_view.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "controller/cli/train_view.h"

namespace furnace::cli {
namespace {

constexpr int kBarWidth = 30;

std::string Restarts(uint32_t n) { return absl::StrCat(n, n == 1 ? " restart" : " restarts"); }

// Seconds since submission; a finished job stops its clock at its last update.
double Elapsed(const v1::JobSummary& s, double now_unix) {
  if (s.submitted_unix() <= 0) return -1;
  const double end = IsFinalState(s.state()) && s.updated_unix() > 0 ? s.updated_unix() : now_unix;
  return end - s.submitted_unix();
}

std::string EventText(const v1::JobEvent& e) {
  return absl::StrCat(FormatClock(e.unix_time()), " ", e.kind(), ": ", OneLine(e.message()));
}

std::string StatusLine(const v1::JobSummary& s) {
  std::string line =
      absl::StrCat(StateName(s.state()), "  attempt ", s.attempt(), "  ", Restarts(s.restarts()),
                   "  step ", FormatProgress(s.step(), s.total_steps()));
  if (s.total_steps() > 0) {
    absl::StrAppend(&line, absl::StrFormat(" (%d%%)", std::min(s.step(), s.total_steps()) * 100 /
                                                          s.total_steps()));
  }
  // (The restart event printed the past cause when it happened.)
  if (!s.cause().empty() && !CauseIsPast(s)) {
    absl::StrAppend(&line, "  cause: ", OneLine(s.cause()));
  }
  return line;
}

using EventKey = std::tuple<double, std::string, std::string>;
EventKey KeyOf(const v1::JobEvent& e) { return {e.unix_time(), e.kind(), e.message()}; }

}  // namespace

std::vector<std::string> WatchFrame(const v1::JobDetail& job, double now_unix, int width,
                                    double observed_steps_per_second) {
  const v1::JobSummary& s = job.summary();
  const std::optional<TrainMetrics> train = TrainMetricsOf(job);
  std::vector<std::string> lines;
  std::string head = absl::StrCat("job ", s.job_id());
  if (!s.name().empty()) absl::StrAppend(&head, " ", s.name());
  if (!s.kind().empty()) absl::StrAppend(&head, " (", s.kind(), ")");
  absl::StrAppend(&head, "  ", StateName(s.state()), "  attempt ", s.attempt(), "  ",
                  Restarts(s.restarts()));
  lines.push_back(head);
  std::string progress = absl::StrCat(ProgressBar(s.step(), s.total_steps(), kBarWidth), "  step ",
                                      FormatProgress(s.step(), s.total_steps()), "  elapsed ",
                                      FormatDuration(Elapsed(s, now_unix)));
  if (train && !IsFinalState(s.state())) {
    if (s.total_steps() > 0 && s.step() >= s.total_steps()) {
      // Every step is trained; the ranks still write the last checkpoint, evaluate and exit.
      absl::StrAppend(&progress, "  finishing");
    } else {
      const std::optional<double> eta = EstimateEtaSeconds(s, train, observed_steps_per_second);
      absl::StrAppend(&progress, "  ETA ", eta ? FormatDuration(*eta) : "-");
    }
  }
  lines.push_back(progress);
  if (train) {
    for (auto& line : TrainWatchLines(*train)) lines.push_back(std::move(line));
  }
  if (!s.cause().empty()) {
    lines.push_back(
        absl::StrCat(CauseIsPast(s) ? "restarted after: " : "cause: ", OneLine(s.cause())));
  }
  lines.push_back(job.events().empty()
                      ? std::string("last event: -")
                      : absl::StrCat("last event: ", EventText(*job.events().rbegin())));
  // The largest size per collective is the figure of merit of a sweep.
  std::map<std::string, const v1::CommResult*> largest;
  for (const auto& r : job.comm()) {
    auto& slot = largest[r.collective()];
    if (slot == nullptr || r.bytes() >= slot->bytes()) slot = &r;
  }
  if (!largest.empty()) {
    Table table({"COLLECTIVE", "SIZE", "ALGBW GB/s", "BUSBW GB/s", "VERIFIED"});
    for (size_t c = 1; c <= 3; ++c) table.SetRightAligned(c);
    for (const auto& [name, r] : largest) {
      table.AddRow({name, FormatBytes(r->bytes()), FormatGbps(r->algbw_gbps()),
                    FormatGbps(r->busbw_gbps()), r->verified() ? "yes" : "NO"});
    }
    std::string rendered = table.Render();
    size_t start = 0;
    while (start < rendered.size()) {
      const size_t end = rendered.find('\n', start);
      lines.push_back(rendered.substr(start, end - start));
      start = end + 1;
    }
  }
  if (width > 0) {
    for (auto& line : lines) line = Truncate(line, static_cast<size_t>(width));
  }
  return lines;
}

std::string RedrawFrame(int previous_lines, const std::vector<std::string>& lines) {
  std::string out;
  if (previous_lines > 0) absl::StrAppend(&out, "\x1b[", previous_lines, "A");
  for (const auto& line : lines) absl::StrAppend(&out, "\r\x1b[2K", line, "\n");
  const int leftover = previous_lines - static_cast<int>(lines.size());
  if (leftover > 0) {
    for (int i = 0; i < leftover; ++i) out += "\r\x1b[2K\n";
    absl::StrAppend(&out, "\x1b[", leftover, "A");
  }
  return out;
}

std::vector<std::string> PlainWatchLines(const v1::JobDetail* previous,
                                         const v1::JobDetail& current) {
  // The new events first, then the status they led to: one poll can see a job start, run and end,
  // and its lines then read in the order it happened.
  std::vector<std::string> lines;
  // The controller may send only the latest events, so "new" means not in the previous reply
  // and not older than its newest event.
  std::set<EventKey> seen;
  double newest = -1;
  if (previous != nullptr) {
    for (const auto& e : previous->events()) {
      seen.insert(KeyOf(e));
      newest = std::max(newest, e.unix_time());
    }
  }
  for (const auto& e : current.events()) {
    if (e.unix_time() < newest || seen.count(KeyOf(e)) > 0) continue;
    lines.push_back(absl::StrCat(EventText(e)));
  }
  const v1::JobSummary& s = current.summary();
  const bool changed = previous == nullptr || previous->summary().state() != s.state() ||
                       previous->summary().attempt() != s.attempt() ||
                       previous->summary().step() != s.step() ||
                       previous->summary().total_steps() != s.total_steps();
  if (changed) {
    const double t = s.updated_unix() > 0 ? s.updated_unix() : s.submitted_unix();
    std::string line = absl::StrCat(FormatClock(t), " job ", s.job_id(), " ", StatusLine(s));
    if (auto train = TrainMetricsOf(current)) line += TrainPlainSuffix(*train);
    lines.push_back(std::move(line));
  }
  return lines;
}

std::string WatchSummary(const v1::JobDetail& job, double now_unix) {
  const v1::JobSummary& s = job.summary();
  std::string line = absl::StrCat("job ", s.job_id(), " ", StateName(s.state()), " after ",
                                  FormatDuration(Elapsed(s, now_unix)), " (attempt ", s.attempt(),
                                  ", ", Restarts(s.restarts()), ")");
  absl::StrAppend(&line, ", step ", FormatProgress(s.step(), s.total_steps()));
  if (auto train = TrainMetricsOf(job); train && train->loss) {
    absl::StrAppend(&line, ", loss ", absl::StrFormat("%.4f", *train->loss));
  }
  if (!s.cause().empty()) absl::StrAppend(&line, ": ", OneLine(s.cause()));
  return line;
}

void StepRate::Observe(double monotonic_s, uint32_t attempt, uint64_t step) {
  if (attempt != attempt_ || (!samples_.empty() && step < samples_.back().step)) samples_.clear();
  attempt_ = attempt;
  samples_.push_back({monotonic_s, step});
  while (samples_.size() > 2 && monotonic_s - samples_.front().t > window_s_) {
    samples_.erase(samples_.begin());
  }
}

double StepRate::steps_per_second() const {
  if (samples_.size() < 2) return 0;
  const Sample& first = samples_.front();
  const Sample& last = samples_.back();
  if (last.step <= first.step || last.t <= first.t) return 0;
  return static_cast<double>(last.step - first.step) / (last.t - first.t);
}

}  // namespace furnace::cli
