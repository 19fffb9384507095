#include "controller/http/routes.h"

#include <arpa/inet.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "controller/http/static_files.h"
#include "runtime/base/log_text.h"

namespace furnace::controller::http {

namespace {

constexpr char kJsonType[] = "application/json; charset=utf-8";
constexpr char kTextType[] = "text/plain; charset=utf-8";

HttpResponse Text(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.content_type = kTextType;
  r.body = std::move(body) + "\n";
  return r;
}

int StatusFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    default:
      return 500;
  }
}

HttpResponse FromResult(absl::StatusOr<std::string> result, const char* content_type) {
  if (!result.ok()) return Text(StatusFor(result.status()), std::string(result.status().message()));
  HttpResponse r;
  r.content_type = content_type;
  r.body = std::move(*result);
  r.headers.emplace_back("Cache-Control", "no-store");
  return r;
}

// %XX and '+' decoding of one query value; nullopt if malformed.
std::optional<std::string> QueryDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%') {
      int v = 0;
      if (i + 2 >= s.size() || !absl::ascii_isxdigit(s[i + 1]) || !absl::ascii_isxdigit(s[i + 2]) ||
          !absl::SimpleHexAtoi(s.substr(i + 1, 2), &v)) {
        return std::nullopt;
      }
      out += static_cast<char>(v);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The value of `key` in a query string ("" if absent); nullopt if it is malformed.
std::optional<std::string> QueryParam(absl::string_view query, absl::string_view key) {
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.first == key) return QueryDecode(kv.second);
  }
  return std::string();
}

// The unsigned number `key` of `query` into *out, left as it is when absent (*given false). False
// when the query is malformed or the value is no unsigned number that fits.
template <typename T>
bool UnsignedParam(absl::string_view query, absl::string_view key, T* out, bool* given) {
  const std::optional<std::string> text = QueryParam(query, key);
  if (!text) return false;
  *given = !text->empty();
  return !*given || absl::SimpleAtoi(*text, out);
}

// The first parameter of `query` that is not one of `allowed`, or given twice, said as a 400
// naming it and the allowed ones; nullopt when there is none (a misspelt one would be ignored and
// the reply look like an answer to what was meant).
std::optional<HttpResponse> UnknownOrRepeatedParam(
    absl::string_view query, std::initializer_list<absl::string_view> allowed) {
  std::set<std::string> seen;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const absl::string_view key = pair.substr(0, pair.find('='));
    const std::string shown = QueryDecode(key).value_or(std::string(key));
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return Text(400, absl::StrCat("unknown parameter '", EscapeForLog(shown),
                                    "' (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
    if (!seen.insert(shown).second) return Text(400, absl::StrCat(shown, ": given twice"));
  }
  return std::nullopt;
}

HttpResponse Series(const std::string& job_id, const HttpRequest& request,
                    const MonitoringHandlers& handlers) {
  if (!handlers.series_json) return Text(404, "not found");
  if (auto refused =
          UnknownOrRepeatedParam(request.query, {"since", "after_attempt", "after_step", "max"})) {
    return *refused;
  }
  SeriesQuery q;
  bool since = false, attempt = false, step = false;
  if (!UnsignedParam(request.query, "since", &q.since_step, &since)) {
    return Text(400, "since: expected a step number (unsigned integer)");
  }
  if (!UnsignedParam(request.query, "after_attempt", &q.after_attempt, &attempt)) {
    return Text(400, "after_attempt: expected an attempt number (unsigned integer)");
  }
  if (!UnsignedParam(request.query, "after_step", &q.after_step, &step)) {
    return Text(400, "after_step: expected a step number (unsigned integer)");
  }
  if (step && !attempt) {
    // (Attempts count from 1: (0, N) would be before every step, and the whole series come back.)
    return Text(400,
                "after_step: needs after_attempt (the cursor is the attempt and step of the last "
                "point of the page before)");
  }
  q.cursor = attempt || step;
  if (q.cursor && since) {
    return Text(400, "since or the cursor (after_attempt, after_step), not both");
  }
  // Bounded: a job's whole history (hundreds of thousands of steps, KBs each with its experts'
  // loads) in one reply could take the controller's memory.
  bool max_given = false;
  if (!UnsignedParam(request.query, "max", &q.max_points, &max_given) ||
      (max_given && (q.max_points < 1 || q.max_points > kMaxSeriesPoints))) {
    return Text(400, absl::StrCat("max: expected a number of points from 1 to ", kMaxSeriesPoints,
                                  " (default ", kDefaultSeriesPoints, ")"));
  }
  return FromResult(handlers.series_json(job_id, q), kJsonType);
}

}  // namespace

const char* StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 421:
      return "Misdirected Request";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    default:
      return "Unknown";
  }
}

std::string HostName(std::string_view host) {
  if (!host.starts_with('[')) {
    const size_t colon = host.rfind(':');
    if (colon != std::string_view::npos) host = host.substr(0, colon);
  }
  return absl::AsciiStrToLower(absl::string_view(host.data(), host.size()));
}

bool IsAddressOrLocalhost(std::string_view host) {
  if (host.starts_with('[')) {  // [v6] or [v6]:port
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    const std::string v6(host.substr(1, close - 1));
    in6_addr a6{};
    return inet_pton(AF_INET6, v6.c_str(), &a6) == 1;
  }
  const std::string name = HostName(host);
  in_addr a4{};
  return name == "localhost" || inet_pton(AF_INET, name.c_str(), &a4) == 1;
}

HttpResponse Route(const HttpRequest& request, const MonitoringHandlers& handlers,
                   const RouteOptions& options) {
  if (request.content_length > options.max_body_bytes) {
    return Text(
        413, "request body too large (limit " + std::to_string(options.max_body_bytes) + " bytes)");
  }
  if (options.loopback_listener && !request.host.empty() && !IsAddressOrLocalhost(request.host) &&
      !absl::c_linear_search(options.allowed_hosts, HostName(request.host))) {
    return Text(421,
                "this listener is on loopback and answers a Host of localhost or an IP address "
                "only, not '" +
                    request.host +
                    "' (a name that resolves here is DNS rebinding; a reverse proxy that passes "
                    "its clients' Host on: furnace-controller --metrics-allowed-host NAME)");
  }
  // HEAD is GET without the body (RFC 9110; uptime checks and `curl -I` use it): routed as GET,
  // the server sends the headers only.
  if (request.method != "GET" && request.method != "HEAD") {
    HttpResponse r = Text(405, "method not allowed: only GET and HEAD are served here");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  const std::string& path = request.path;
  if (path == "/metrics") {
    if (!handlers.metrics_text) return Text(404, "not found");
    HttpResponse r;
    r.content_type = kMetricsContentType;
    r.body = handlers.metrics_text();
    r.headers.emplace_back("Cache-Control", "no-store");
    return r;
  }
  if (path == "/api/jobs") {
    if (!handlers.jobs_json) return Text(404, "not found");
    return FromResult(handlers.jobs_json(), kJsonType);
  }
  if (path == "/api/workers") {
    if (!handlers.workers_json) return Text(404, "not found");
    return FromResult(handlers.workers_json(), kJsonType);
  }
  constexpr absl::string_view kJobs = "/api/jobs/";
  constexpr absl::string_view kSeries = "/series";
  if (absl::StartsWith(path, kJobs) && absl::EndsWith(path, kSeries) &&
      path.size() > kJobs.size() + kSeries.size()) {
    const std::string id = path.substr(kJobs.size(), path.size() - kJobs.size() - kSeries.size());
    if (id.find('/') == std::string::npos) return Series(id, request, handlers);
  }
  if (absl::StartsWith(path, "/api/")) return Text(404, "not found");
  if (options.web_root.empty()) return Text(404, "not found (no dashboard installed)");
  absl::StatusOr<StaticFile> file = ReadStaticFile(options.web_root, path);
  if (!file.ok()) return Text(StatusFor(file.status()), std::string(file.status().message()));
  HttpResponse r;
  r.content_type = std::move(file->content_type);
  r.body = std::move(file->body);
  r.headers.emplace_back("Cache-Control", "no-cache");
  return r;
}

}  // namespace furnace::controller::http
