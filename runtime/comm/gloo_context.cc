#include "runtime/comm/gloo_context.h"

#include <signal.h>

#include <chrono>
#include <mutex>

#include "absl/strings/str_format.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "runtime/comm/gloo_error.h"
#include "runtime/comm/gloo_store.h"

namespace furnace::comm {
namespace {

// Gloo's tcp transport writes with plain send/writev, so a write to a peer that just died raises
// SIGPIPE, whose default action kills the whole process. Ignore it (the write then fails with
// EPIPE, which Gloo turns into an IoException) unless the program already installed a handler.
void IgnoreSigpipeUnlessHandled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

}  // namespace

absl::StatusOr<std::shared_ptr<gloo::Context>> ConnectGloo(KvStore& store,
                                                           const GlooOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ConnectGloo: rank %d is not in a world of size %d", options.rank, options.size));
  }
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ConnectGloo: timeout_s must be > 0, got %g", options.timeout_s));
  }
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(options.timeout_s));

  IgnoreSigpipeUnlessHandled();
  std::shared_ptr<gloo::rendezvous::Context> context;
  absl::Status status = GuardGloo(
      absl::StrFormat("gloo rendezvous (rank %d of %d, host %s)", options.rank, options.size,
                      options.host),
      [&] {
        gloo::transport::tcp::attr attr;
        attr.hostname = options.host;
        std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
        context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
        context->setTimeout(timeout);
        GlooStore gloo_store(store, timeout, options.on_wait_tick);
        context->connectFullMesh(gloo_store, device);
      });
  if (!status.ok()) return status;
  return std::shared_ptr<gloo::Context>(std::move(context));
}

}  // namespace furnace::comm
