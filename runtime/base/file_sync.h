// Crash-safe file replacement, for every writer of a file a later run reads (checkpoints and
// exports through train::DurableWriter, token files, tokenizer models, reports, the MoE cost
// profile cache): the bytes go to a temporary file beside the target, are
// fsynced, the file is renamed over the target, and the directory is fsynced, so after a crash
// the target holds either its old content or the whole new one.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

}  // namespace furnace
