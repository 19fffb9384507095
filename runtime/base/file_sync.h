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
// killed before it renames leaves it behind (as it left `<path>.tmp` before). Errors name the
// directory.
absl::StatusOr<std::FILE*> CreateTempBeside(const std::string& path, std::string* tmp_path);

// Renames `tmp_path` over `path` and fsyncs path's directory (the file's bytes must be fsynced
// already). On a failed rename, `tmp_path` is removed.
absl::Status RenameDurably(const std::string& tmp_path, const std::string& path);

// Writes `contents` to `path` through CreateTempBeside, fsync and RenameDurably: after a crash
// `path` holds its old content or the whole new one. `mode`, when given, is the file's mode
// exactly (0600 for a key), set before any byte is written. Errors name the file.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 std::optional<mode_t> mode = std::nullopt);

}  // namespace furnace
