#include "runtime/data/training_sentences.h"

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/utf8.h"

namespace furnace::data {
namespace {

constexpr size_t kReadBytes = 1 << 16;

// Where the first piece of `text` (longer than `limit`) ends: CutLongLine's rule.
size_t FirstCut(absl::string_view text, size_t limit) {
  const absl::string_view room = text.substr(0, limit + 1);
  const size_t space = room.rfind(' ');
  if (space != absl::string_view::npos && space > 0) return space;
  for (size_t i = room.size() - 1; i > 0; --i) {
    if ((static_cast<unsigned char>(room[i]) & 0xC0) != 0x80) return i;
  }
  return limit;
}

}  // namespace

std::vector<absl::string_view> CutLongLine(absl::string_view line, size_t limit) {
  std::vector<absl::string_view> pieces;
  while (line.size() > limit) {
    const size_t cut = FirstCut(line, limit);
    pieces.push_back(line.substr(0, cut));
    line.remove_prefix(cut);
  }
  if (!line.empty()) pieces.push_back(line);
  return pieces;
}

TrainingSentences::TrainingSentences(std::vector<std::string> inputs, size_t limit)
    : inputs_(std::move(inputs)), limit_(limit) {}

bool TrainingSentences::Next(std::string* sentence) {
  if (!error_.empty()) return false;
  if (!NextPiece(sentence)) return false;
  if (const std::optional<size_t> bad = FirstInvalidUtf8(*sentence); bad.has_value()) {
    error_ = absl::StrCat("input ", inputs_[next_input_ - 1], ": not UTF-8 at byte ",
                          piece_start_ + static_cast<int64_t>(*bad),
                          " (a SentencePiece model reads UTF-8 text; convert the file, e.g. iconv "
                          "-f latin1 -t utf-8, or train on token files made with --tokenizer byte, "
                          "which takes any bytes)");
    invalid_input_ = true;
    return false;
  }
  return true;
}

bool TrainingSentences::NextPiece(std::string* sentence) {
  while (true) {
    const absl::string_view rest = absl::string_view(buffer_).substr(pos_);
    size_t end = rest.substr(0, limit_ + 1).find('\n');  // within the limit, if there
    size_t newline = 1;
    if (end == absl::string_view::npos && rest.size() <= limit_) {
      if (open_) {
        if (!Fill()) return false;
        continue;
      }
      if (rest.empty()) {
        if (!Fill()) return false;  // the next file
        continue;
      }
      end = rest.size();  // the file's last line, without a newline
      newline = 0;
    }
    if (end != absl::string_view::npos) {
      piece_start_ = buffer_offset_ + static_cast<int64_t>(pos_);
      pos_ += end + newline;
      const bool last_piece = std::exchange(in_long_line_, false);
      if (end == 0) continue;
      if (last_piece) ++long_line_pieces_;
      sentence->assign(rest.data(), end);
      return true;
    }
    // A line longer than the limit: its next piece.
    const size_t cut = FirstCut(rest, limit_);
    if (!std::exchange(in_long_line_, true)) ++long_lines_;
    ++long_line_pieces_;
    piece_start_ = buffer_offset_ + static_cast<int64_t>(pos_);
    sentence->assign(rest.data(), cut);
    pos_ += cut;
    return true;
  }
}

bool TrainingSentences::Fill() {
  buffer_.erase(0, pos_);
  buffer_offset_ += static_cast<int64_t>(pos_);
  pos_ = 0;
  if (!open_) {
    if (next_input_ == inputs_.size()) return false;
    const std::string& input = inputs_[next_input_++];
    in_.close();
    in_.clear();
    in_.open(input, std::ios::binary);
    if (!in_) {
      error_ = absl::StrCat("input ", input, ": cannot read: ", std::strerror(errno));
      return false;
    }
    open_ = true;
    buffer_offset_ = 0;
    return true;
  }
  const size_t had = buffer_.size();
  buffer_.resize(had + kReadBytes);
  in_.read(buffer_.data() + had, static_cast<std::streamsize>(kReadBytes));
  buffer_.resize(had + static_cast<size_t>(in_.gcount()));
  if (in_.bad()) {
    error_ = absl::StrCat("input ", inputs_[next_input_ - 1], ": read error");
    return false;
  }
  if (in_.eof()) open_ = false;
  return true;
}

}  // namespace furnace::data
