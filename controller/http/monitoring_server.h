// MonitoringServer: the controller's HTTP endpoint for Prometheus (/metrics) and the dashboard
// (/api/jobs, /api/jobs/<id>/series, the page itself). It knows nothing of the controller: its
// owner hands it callbacks (MonitoringHandlers, routes.h) that render the answers.
//
// Ownership: owns one CivetServer listening on `listen` and a copy of the handlers; what they
// capture (the controller) must outlive the server.
// Threads: civetweb's worker threads (`threads` of them) call the handlers concurrently, at any
// time between Start() returning and the destructor returning. Start() and the destructor are
// called from one thread. The destructor stops the server and waits for requests in flight; it
// takes about 2 s once a request has been served (civetweb's shutdown; see deps-feasibility.md
// section 6 item 13).
// Errors: Start() returns InvalidArgument for a malformed `listen` and Unavailable when it cannot
// listen (address in use, not local). Request errors are answered in HTTP (routes.h), never
// thrown: a handler that throws is answered 500.
// Limits: a request whose line and headers exceed max_request_bytes is refused: by our own check
// (431), or beyond twice the limit by civetweb itself (400). A body larger than that is answered
// 413 before any handler runs (civetweb drains what the client sends of it, for at most
// request_timeout_ms = 10 s).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/http/routes.h"

class CivetServer;
struct mg_connection;

namespace furnace::controller::http {

struct MonitoringOptions {
  std::string listen = "127.0.0.1:9464";  // host:port; port 0 picks a free one (see port())
  std::string web_root;                   // dashboard files; empty: no dashboard (see
                                          // DefaultWebRoot() in static_files.h)
  int64_t max_request_bytes = 16 * 1024;  // request line + headers, and body
  int threads = 4;                        // civetweb worker threads
  // DNS names a loopback listener answers besides localhost (RouteOptions::allowed_hosts).
  std::vector<std::string> allowed_hosts;
};

class MonitoringServer {
 public:
  // Whether `listen` reads as host:port (port 0-65535, 0: any free one): InvalidArgument saying
  // what is expected otherwise (Start checks it too; a daemon checks it with its other flags).
  static absl::Status CheckListen(const std::string& listen);
  static absl::StatusOr<std::unique_ptr<MonitoringServer>> Start(MonitoringOptions options,
                                                                 MonitoringHandlers handlers);
  ~MonitoringServer();
  MonitoringServer(const MonitoringServer&) = delete;
  MonitoringServer& operator=(const MonitoringServer&) = delete;

  int port() const { return port_; }  // the real port, also when `listen` asked for 0
  std::string address() const;        // "host:port" with the real port

 private:
  MonitoringServer(MonitoringOptions options, MonitoringHandlers handlers);
  static int HandleRequest(mg_connection* conn, void* self);
  int Handle(mg_connection* conn);

  MonitoringOptions options_;
  MonitoringHandlers handlers_;
  RouteOptions route_options_;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<CivetServer> server_;
};

}  // namespace furnace::controller::http
