// The boundary between Gloo, which reports failure by throwing, and the rest of Furnace, which
// uses absl::Status. Every call into Gloo from this module goes through GuardGloo so that no
// exception leaves the module.
//
// Mapping: a Gloo timeout (an IoException whose message says it timed out, including the
// rendezvous store's own timeout) -> DeadlineExceeded; any other gloo::IoException (peer closed
// the connection, socket error) -> Unavailable; gloo::EnforceNotMet and other gloo::Exception ->
// Internal; any other std::exception -> Internal. The status message carries Gloo's message.
#pragma once

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace furnace::comm {

// Converts the exception currently held in `error` into a Status; `what` names the operation.
absl::Status StatusFromException(std::exception_ptr error, absl::string_view what);

// Runs `fn` (which may throw) and returns OK or the Status of what it threw.
template <typename Fn>
absl::Status GuardGloo(absl::string_view what, Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return absl::OkStatus();
  } catch (...) {
    return StatusFromException(std::current_exception(), what);
  }
}

}  // namespace furnace::comm
