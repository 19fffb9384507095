// Crash-safe file replacement, for every writer of a file a later run reads (checkpoints and
// exports through train::DurableWriter, token files, tokenizer models, reports, the MoE cost
// profile cache): the bytes go to a temporary file beside the target, are
// fsynced, the file is renamed over the target, and the directory is fsynced, so after a crash
// the target holds either its old content or the whole new one.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace furnace {

// fsyncs a directory so that renames and creations inside it survive a crash ("" is ".").
absl::Status SyncDirectory(const std::string& dir);

// A new file `<path>.tmp.XXXXXX` beside `path`, created exclusively (mkstemp: two writers of one
// target never share a temporary file, and no file of that name is overwritten), with the mode a
// plain create gives (0666 less the umask), opened for writing; its name in *tmp_path. A writer
// killed before it renames leaves it behind (as it left `<path>.tmp` before), unless the program
// installed RemoveTempFilesOnSignal and the signal is one of those. Errors name the directory.
absl::StatusOr<std::FILE*> CreateTempBeside(const std::string& path, std::string* tmp_path);

// Renames `tmp_path` over `path` and fsyncs path's directory (the file's bytes must be fsynced
// already). On a failed rename, `tmp_path` is removed.
absl::Status RenameDurably(const std::string& tmp_path, const std::string& path);

// Removes a temporary file of CreateTempBeside that will not be renamed (a writer that failed or
// was abandoned).
void RemoveTemp(const std::string& tmp_path);

// Installs handlers of SIGINT, SIGTERM and SIGHUP that remove the temporary files of
// CreateTempBeside not yet renamed or removed, then end the program by the same signal (its
// default action): a `furnace data prepare` of hundreds of GB interrupted by Ctrl-C left its
// half-written output behind. For command-line programs; a daemon handles its signals itself.
// A signal the program was started ignoring (nohup) stays ignored. Up to 64 files at once are
// known (more are left behind as before).
void RemoveTempFilesOnSignal();

// Writes `contents` to `path` through CreateTempBeside, fsync and RenameDurably: after a crash
// `path` holds its old content or the whole new one. `mode`, when given, is the file's mode
// exactly (0600 for a key), set before any byte is written. Errors name the file.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 std::optional<mode_t> mode = std::nullopt);

}  // namespace furnace
