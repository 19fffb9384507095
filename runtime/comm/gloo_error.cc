#include "runtime/comm/gloo_error.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"

namespace furnace::comm {
namespace {

bool SaysTimedOut(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout");
}

}  // namespace

absl::Status StatusFromException(std::exception_ptr error, absl::string_view what) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::IoException& e) {
    std::string message = absl::StrCat(what, ": ", e.what());
    return SaysTimedOut(e.what()) ? absl::DeadlineExceededError(message)
                                  : absl::UnavailableError(message);
  } catch (const gloo::EnforceNotMet& e) {
    // Gloo's tcp transport reports some peer failures via GLOO_ENFORCE.
    std::string message = absl::StrCat(what, ": ", e.what());
    return SaysTimedOut(e.what()) ? absl::DeadlineExceededError(message)
                                  : absl::InternalError(message);
  } catch (const gloo::Exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
}

}  // namespace furnace::comm
