// Why a file could not be read, as the status a caller decides on: the path's fault (NotFound,
// InvalidArgument: bad input, not retried), or no fault of the file's bytes (Unavailable: EIO,
// ESTALE, EACCES from a network file system or a mount or permission change, EMFILE, ENOMEM; a
// restart reads it again, so it is never counted as damage or bad data). One vocabulary for the
// checkpoints, the data files and the tokenizer models.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace furnace {

// Unavailable: `failure` (what failed and why), not the file's bytes' fault.
absl::Status UnreadableFileError(absl::string_view failure);
// The same for `what` that could not be read, by `error` (an errno).
absl::Status UnreadableFileError(absl::string_view what, int error);

// A file that could not be opened, by `error` (an errno; `what` names the kind of file and may be
// empty): NotFound when the path names no file (ENOENT, ENOTDIR, ENAMETOOLONG, ELOOP: the job's
// to fix); otherwise UnreadableFileError.
absl::Status CannotOpenError(const std::string& what, const std::string& path, int error);

// The size of open file `fd` (at `path`) when it is a regular file; InvalidArgument (the path's
// fault) when it is a directory, a device or a pipe, which open but do not read as data;
// UnreadableFileError when fstat fails.
absl::StatusOr<int64_t> RegularFileSize(int fd, const std::string& what, const std::string& path);

// Opens `path` for reading (O_CLOEXEC) when it is a regular file: a FIFO is opened without
// waiting for a writer (O_NONBLOCK, cleared once the file is known to be regular), so a pipe
// where a file should be is refused at once instead of blocking until the watchdog ends the
// rank. The descriptor, or CannotOpenError / RegularFileSize's errors (the caller closes it).
absl::StatusOr<int> OpenRegularFile(const std::string& what, const std::string& path);

}  // namespace furnace
