// The monitoring endpoint's routing, apart from any socket: a request (method, path, query, body
// size) in, a complete response out. MonitoringServer is the thin civetweb adapter around it, so
// these rules can be tested without HTTP, and the HTTP tests only check the wiring.
//
//   GET /metrics                          handlers.metrics_text()  (Prometheus text format 0.0.4)
//   GET /api/jobs                         handlers.jobs_json()
//   GET /api/workers                      handlers.workers_json()
//   GET /api/jobs/<id>/series?since=&max= handlers.series_json(id, query): the steps after step
//                                         `since` (any attempt), or after the cursor
//       ?after_attempt=&after_step=&max=  (after_attempt, after_step) in (attempt, step) order,
//                                         evenly thinned to `max` points (1 to kMaxSeriesPoints;
//                                         kDefaultSeriesPoints when absent)
//   GET / and GET /<file>                 the dashboard's static files under web_root
//
// Anything else is 404; HEAD is answered as GET (the server leaves the body out); another method
// is 405; a body larger than max_body_bytes is
// 413; a path with "..", "." or hidden segments, a backslash or a NUL is 400. A handler's
// NotFound becomes 404, InvalidArgument 400, any other error 500 with its message.
// On a loopback listener (RouteOptions::loopback_listener) a Host header naming neither an IP
// address, localhost nor one of RouteOptions::allowed_hosts is 421: that is a web page elsewhere
// that rebound its DNS name to this machine (DNS rebinding), reading the API from the browser of
// someone on it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::controller::http {

// Points of a job's series one reply holds: the default, and the most that may be asked for.
inline constexpr uint32_t kDefaultSeriesPoints = 2000;
inline constexpr uint32_t kMaxSeriesPoints = 10000;

// A series request: since_step, or (cursor) the steps after (after_attempt, after_step).
struct SeriesQuery {
  uint64_t since_step = 0;
  bool cursor = false;
  uint32_t after_attempt = 0;
  uint64_t after_step = 0;
  uint32_t max_points = kDefaultSeriesPoints;
};

// What the server asks of its owner. Each callback may be left empty (its route then answers
// 404). civetweb's worker threads call them concurrently, so they must be thread-safe.
struct MonitoringHandlers {
  std::function<std::string()> metrics_text;
  std::function<absl::StatusOr<std::string>()> jobs_json;
  std::function<absl::StatusOr<std::string>()> workers_json;
  std::function<absl::StatusOr<std::string>(const std::string& job_id, const SeriesQuery& query)>
      series_json;
};

struct HttpRequest {
  std::string method;           // "GET", "POST", ...
  std::string path;             // URL-decoded, without the query: "/api/jobs"
  std::string query;            // raw, without '?': "since=3&max=100"
  int64_t content_length = -1;  // -1: none given
  std::string host;             // the Host header ("" when none was sent)
};

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones (Allow, Cache-Control)
};

inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

struct RouteOptions {
  std::string web_root;  // directory of the dashboard's files; empty: no dashboard
  int64_t max_body_bytes = 16 * 1024;
  bool loopback_listener = false;  // the listener is reachable from this machine only
  // DNS names a loopback listener answers besides localhost and addresses, without port and
  // lower-case: the public name of a reverse proxy in front that passes the client's Host on
  // (Caddy, Traefik, nginx with `proxy_set_header Host $host`).
  std::vector<std::string> allowed_hosts;
};

// True when the Host header `host` ("127.0.0.1:9464", "[::1]:9464", "localhost") names an IP
// address or localhost, never a DNS name.
bool IsAddressOrLocalhost(std::string_view host);
// The name of Host header `host` without its port, lower-case ("Furnace.example.com:443" ->
// "furnace.example.com").
std::string HostName(std::string_view host);

// Thread-safe: reads only its arguments (and files under web_root).
HttpResponse Route(const HttpRequest& request, const MonitoringHandlers& handlers,
                   const RouteOptions& options);

// The short reason phrase of an HTTP status ("Not Found").
const char* StatusText(int status);

}  // namespace furnace::controller::http
