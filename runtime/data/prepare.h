// Text into a token file with any Tokenizer (`furnace data prepare`): plain text files, one
// document each, or JSON Lines, one document per line with its text in a named field. Documents
// are separated by the tokenizer's end-of-document id (after each one; none when it has none).
//
// Streams: plain text is read in 1 MiB blocks and encoded a block at a time, cut after a newline
// (or, in a line longer than a block, between two UTF-8 characters), so memory is bounded
// whatever the file's size; each block is encoded as the first, a middle or the last part of its
// document (tokenizer.h: TextPart), so a SentencePiece model with a dummy prefix (Llama's) gives
// the ids of the whole document, not a spurious "▁" every MiB (a line longer than a block is cut
// inside, where a piece spanning the cut differs). A JSON Lines file is read a line at a time.
// Tokens go through TokenFileWriter (a temporary file renamed into place by Finish), so a failed
// run leaves no output file and an older one under the same name is kept until a new one is
// complete. The file records the tokenizer's identity (version 2 header, token_file.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/tokenizer.h"

namespace furnace::data {

struct PrepareOptions {
  std::vector<std::string> inputs = {};  // read in order
  std::string jsonl_field = {};          // empty: plain text files; else JSON Lines with this field
  std::string output = {};               // the token file to write
};

struct PrepareStats {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t vocab = 0;
  int64_t input_bytes = 0;
  std::string identity;  // the tokenizer's, as recorded in the file
};

// Called after each block or line with the input bytes read so far and the total.
using PrepareProgress = std::function<void(int64_t bytes_done, int64_t bytes_total)>;

// Errors name the file (and for JSON Lines the line): no inputs, or no output (INVALID_ARGUMENT);
// an input that cannot be read (NOT_FOUND) or is empty, or a JSON Lines file with no document
// (INVALID_ARGUMENT); a line that is not a JSON object with a string field `jsonl_field`
// (INVALID_ARGUMENT); plain text that is not UTF-8, with any tokenizer but the byte tokenizer
// (INVALID_ARGUMENT naming the file and the byte offset); text the tokenizer refuses (its error,
// naming the file, and for JSON Lines the line); an output that cannot be written (INTERNAL). Every
// input is checked for existence and size before anything is written.
absl::StatusOr<PrepareStats> PrepareTokenFile(const Tokenizer& tokenizer,
                                              const PrepareOptions& options,
                                              const PrepareProgress& progress = nullptr);

}  // namespace furnace::data
