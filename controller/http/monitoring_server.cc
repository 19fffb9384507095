#include "controller/http/monitoring_server.h"

#include <malloc.h>

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "CivetServer.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "civetweb.h"
#include "runtime/base/status.h"
#include "spdlog/spdlog.h"
#include "transport/listen_address.h"

namespace furnace::controller::http {

namespace {

// An answer at least this large is followed by malloc_trim (Handle).
constexpr size_t kTrimAfterBytes = size_t{1} << 20;

// civetweb's messages on this thread since Start began: Start says them when civetweb cannot
// listen (it logs why, e.g. the address in use, and throws "null context when constructing
// CivetServer").
thread_local std::string civet_messages;

// civetweb's own messages (bad requests, socket errors) go to our log, not stderr.
int LogMessage(const mg_connection*, const char* message) {
  spdlog::debug("monitoring http: {}", message);
  if (civet_messages.size() < 4096) {
    civet_messages += (civet_messages.empty() ? "" : "; ") + std::string(message);
  }
  return 1;
}

// The port of host:port, if it reads as one (0-65535).
std::optional<int> ListenPort(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return std::nullopt;
  }
  return port;
}

// The response; for a HEAD request its headers only (Content-Length still the body's).
void Send(mg_connection* conn, const HttpResponse& r, bool head_only) {
  std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + StatusText(r.status) +
                     "\r\nContent-Type: " + r.content_type +
                     "\r\nContent-Length: " + std::to_string(r.body.size()) +
                     "\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n";
  for (const auto& [name, value] : r.headers) head += name + ": " + value + "\r\n";
  head += "\r\n";
  mg_write(conn, head.data(), head.size());
  if (!head_only && !r.body.empty()) mg_write(conn, r.body.data(), r.body.size());
}

}  // namespace

MonitoringServer::MonitoringServer(MonitoringOptions options, MonitoringHandlers handlers)
    : options_(std::move(options)), handlers_(std::move(handlers)) {
  route_options_.web_root = options_.web_root;
  route_options_.max_body_bytes = options_.max_request_bytes;
  route_options_.loopback_listener = transport::IsLoopbackAddress(options_.listen);
  for (const std::string& host : options_.allowed_hosts) {
    route_options_.allowed_hosts.push_back(HostName(host));
  }
}

absl::Status MonitoringServer::CheckListen(const std::string& listen) {
  if (ListenPort(listen)) return absl::OkStatus();
  return absl::InvalidArgumentError("monitoring address '" + listen +
                                    "': expected host:port with a port from 0 to 65535 (0: any "
                                    "free one), e.g. 127.0.0.1:9464");
}

absl::StatusOr<std::unique_ptr<MonitoringServer>> MonitoringServer::Start(
    MonitoringOptions options, MonitoringHandlers handlers) {
  RETURN_IF_ERROR(CheckListen(options.listen));
  const size_t colon = options.listen.rfind(':');
  if (options.threads < 1 || options.max_request_bytes < 1024) {
    return absl::InvalidArgumentError("monitoring server: threads >= 1, max_request_bytes >= 1024");
  }
  std::unique_ptr<MonitoringServer> self(
      new MonitoringServer(std::move(options), std::move(handlers)));
  self->host_ = self->options_.listen.substr(0, colon);

  const std::vector<std::string> civet_options = {
      "listening_ports",
      self->options_.listen,
      "num_threads",
      std::to_string(self->options_.threads),
      // civetweb's buffer gets headroom so that our own check (Handle) decides at the limit with a
      // clear answer; beyond twice the limit civetweb refuses on its own.
      "max_request_size",
      std::to_string(2 * self->options_.max_request_bytes),
      "request_timeout_ms",
      "10000",
      "enable_keep_alive",
      "no",
      "decode_url",
      "yes",
  };
  CivetCallbacks callbacks;
  callbacks.log_message = LogMessage;
  civet_messages.clear();
  try {
    self->server_ = std::make_unique<CivetServer>(civet_options, &callbacks);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        "monitoring server cannot listen on " + self->options_.listen + ": " +
        (civet_messages.empty() ? std::string("address in use or not valid (") + e.what() + ")"
                                : civet_messages));
  }
  // CivetServer hands out its context as const; registering a handler on it is its intended use.
  mg_context* ctx = const_cast<mg_context*>(self->server_->getContext());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(ctx, 4, ports);
  if (n < 1 || ports[0].port <= 0) {
    return absl::UnavailableError("monitoring server on " + self->options_.listen +
                                  ": no listening port");
  }
  self->port_ = ports[0].port;
  // "/**" matches every path; routing is ours (routes.h).
  mg_set_request_handler(ctx, "/**", &MonitoringServer::HandleRequest, self.get());
  return self;
}

MonitoringServer::~MonitoringServer() {
  if (server_) server_->close();
}

std::string MonitoringServer::address() const { return host_ + ":" + std::to_string(port_); }

int MonitoringServer::HandleRequest(mg_connection* conn, void* self) {
  return static_cast<MonitoringServer*>(self)->Handle(conn);
}

int MonitoringServer::Handle(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  HttpResponse response;
  try {
    int64_t header_bytes =
        std::char_traits<char>::length(info->request_uri ? info->request_uri : "");
    for (int i = 0; i < info->num_headers; ++i) {
      header_bytes += std::char_traits<char>::length(info->http_headers[i].name) +
                      std::char_traits<char>::length(info->http_headers[i].value) + 4;
    }
    if (header_bytes > options_.max_request_bytes) {
      response.status = 431;
      response.content_type = "text/plain; charset=utf-8";
      response.body = "request headers too large\n";
    } else {
      HttpRequest request;
      request.method = info->request_method ? info->request_method : "";
      // The raw (decoded, not dot-cleaned) path: routes.h refuses "..", it must see it.
      const char* path = info->local_uri_raw ? info->local_uri_raw : info->local_uri;
      request.path = path ? path : "";
      request.query = info->query_string ? info->query_string : "";
      request.content_length = info->content_length;
      const char* host = mg_get_header(conn, "Host");
      request.host = host ? host : "";
      response = Route(request, handlers_, route_options_);
    }
  } catch (const std::exception& e) {
    response = HttpResponse{500, "text/plain; charset=utf-8", std::string(e.what()) + "\n", {}};
  } catch (...) {
    response = HttpResponse{500, "text/plain; charset=utf-8", "internal error\n", {}};
  }
  const bool head_only = info != nullptr && info->request_method != nullptr &&
                         std::string_view(info->request_method) == "HEAD";
  Send(conn, response, head_only);
  const int status = response.status;
  if (response.body.size() >= kTrimAfterBytes) {
    // A large answer (a long job's step series) leaves its peak in this thread's malloc arena,
    // resident for good: each of the server's threads kept its own, ~4x the largest answer
    // (hundreds of MB after a few series of a long job). Handed back to the system here.
    std::string().swap(response.body);
    malloc_trim(0);
  }
  return status;
}

}  // namespace furnace::controller::http
