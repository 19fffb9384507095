// Connecting a rank to its peers with Gloo over TCP.
//
// ConnectGloo creates a TCP device bound to `host` (ephemeral port), publishes its address through
// the KvStore and connects a full mesh. Rendezvous keys are Gloo's own ("rank_<r>"-style, fixed per
// rank), so one KvStore namespace serves one job attempt: a caller that reconnects must hand in a
// fresh (or freshly prefixed) store.
//
// Process-wide side effect: the first call sets SIGPIPE to SIG_IGN if it still has its default
// action, because Gloo writes to sockets without MSG_NOSIGNAL and a peer that dies would otherwise
// kill this process instead of failing the collective.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gloo/context.h"
#include "runtime/comm/kv_store.h"

namespace furnace::comm {

struct GlooOptions {
  int rank;
  int size;
  std::string host = "127.0.0.1";
  // Bounds rendezvous (waiting for peers' keys and connecting) and becomes the context's
  // default timeout for every collective later run on it.
  double timeout_s = 30;
  // A GlooCommunicator's timeout for every collective, when it should differ from the
  // rendezvous' (a health check connects within the start timeout and holds each collective to
  // its own bound); 0: timeout_s. ConnectGloo ignores it.
  double op_timeout_s = 0;
  // Called at least once per second while rendezvous waits on the store; may be empty.
  std::function<void()> on_wait_tick;
};

// Errors: InvalidArgument for a bad rank/size/timeout; DeadlineExceeded when peers did not show up
// within timeout_s; Unavailable for network or store failures (the message is Gloo's).
// Blocks the calling thread for up to about timeout_s.
absl::StatusOr<std::shared_ptr<gloo::Context>> ConnectGloo(KvStore& store,
                                                           const GlooOptions& options);

}  // namespace furnace::comm
