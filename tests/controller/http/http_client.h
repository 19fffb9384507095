// A tiny blocking HTTP/1.1 client for the tests: one request per connection, raw bytes out, the
// whole answer (read until the server closes) parsed into status, headers and body.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace furnace::controller::http::testing {

struct RawResponse {
  int status = 0;                              // 0: no status line came back
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string raw;
};

// Sends `request` as is to 127.0.0.1:port and reads until EOF (5 s timeout).
inline RawResponse SendRaw(int port, const std::string& request) {
  RawResponse out;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return out;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return out;
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may refuse before reading everything
    sent += static_cast<size_t>(n);
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.raw.append(buf, static_cast<size_t>(n));
  }
  close(fd);

  const size_t head_end = out.raw.find("\r\n\r\n");
  if (out.raw.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) return out;
  const size_t sp = out.raw.find(' ');
  if (!absl::SimpleAtoi(out.raw.substr(sp + 1, 3), &out.status)) out.status = 0;
  size_t line = out.raw.find("\r\n") + 2;
  while (line < head_end) {
    const size_t eol = out.raw.find("\r\n", line);
    const std::string h = out.raw.substr(line, eol - line);
    const size_t colon = h.find(':');
    if (colon != std::string::npos) {
      out.headers[absl::AsciiStrToLower(h.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(h.substr(colon + 1)));
    }
    line = eol + 2;
  }
  out.body = out.raw.substr(head_end + 4);
  return out;
}

inline RawResponse Get(int port, const std::string& target, const std::string& method = "GET") {
  return SendRaw(port, method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

}  // namespace furnace::controller::http::testing
