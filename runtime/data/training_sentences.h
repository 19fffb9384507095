// The sentences a SentencePiece vocabulary is trained on: the lines of its input files, read a
// block at a time. SentencePiece skips a sentence longer than its max_sentence_length, and says
// so only in the log that Furnace switches off (sentencepiece_bridge.h), so a file of long lines
// (a document a line, JSON dumped as text) would train on nothing of them. A line longer than
// the limit is cut here into pieces under it instead, where a subword piece ends anyway: before
// a space (pieces never span one), or, in a line without one (Chinese, Japanese), between two
// UTF-8 characters, and the pieces are counted so the caller can say what was done.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "runtime/data/sentencepiece_bridge.h"

namespace furnace::data {

// The longest sentence handed to SentencePiece, in bytes (its own default max_sentence_length).
inline constexpr size_t kMaxTrainingSentenceBytes = 4192;

// `line` cut into pieces of at most `limit` bytes (limit > 0) that together are the line: each
// cut is before the last space of the piece's room (not at its start), else before the last
// UTF-8 lead byte, else (no character boundary there: not UTF-8) at the limit.
std::vector<absl::string_view> CutLongLine(absl::string_view line, size_t limit);

// The non-empty lines of `inputs`, in order, without their newline ("\r" stays, as SentencePiece
// reads them); a line longer than `limit` comes as CutLongLine's pieces. Memory: a block of the
// file and the current line's tail, whatever the lines' length. Not thread-safe.
class TrainingSentences final : public spm::SentenceSource {
 public:
  explicit TrainingSentences(std::vector<std::string> inputs,
                             size_t limit = kMaxTrainingSentenceBytes);

  bool Next(std::string* sentence) override;
  // "input FILE: cannot read: ..." once a file could not be opened or read, or "input FILE: not
  // UTF-8 at byte N ..." once a line is not UTF-8 (SentencePiece reads text as UTF-8: it would
  // learn pieces of whatever it makes of the bytes, which `furnace data prepare` then refuses);
  // empty otherwise. Next returns false from then on.
  std::string error() const override { return error_; }
  bool invalid_input() const { return invalid_input_; }  // the error is the text's, not the disk's

  int64_t long_lines() const { return long_lines_; }              // lines longer than the limit
  int64_t long_line_pieces() const { return long_line_pieces_; }  // the pieces they became

 private:
  // The next line or piece of one (Next without the UTF-8 check).
  bool NextPiece(std::string* sentence);
  // Reads a block of the current file into buffer_, or opens the next file once it is read
  // through; false at the end of the last file or on an error (error_).
  bool Fill();

  std::vector<std::string> inputs_;
  size_t limit_;
  size_t next_input_ = 0;
  std::ifstream in_;
  bool open_ = false;   // in_ holds inputs_[next_input_ - 1], not read to its end
  std::string buffer_;  // read, not handed out yet: from pos_
  size_t pos_ = 0;
  int64_t buffer_offset_ = 0;  // where buffer_[0] is in the current file
  int64_t piece_start_ = 0;    // where the piece NextPiece returned starts in it
  bool in_long_line_ = false;  // the current line has been cut already
  int64_t long_lines_ = 0;
  int64_t long_line_pieces_ = 0;
  std::string error_;
  bool invalid_input_ = false;
};

}  // namespace furnace::data
