// A dataset seen as one stream of tokens (epoch_sampler.h cuts it into sequences): a token file,
// or a Megatron indexed dataset's sequences concatenated in file order.
//
// Tokens are checked against the vocab as they are read, not when the dataset is opened: opening
// reads headers and indexes only, so a dataset of hundreds of GB starts in the time its index
// takes, and a rank reads (and checks) only the windows it trains on. A token outside the vocab
// is then an error of the read that meets it (named by file, place and value), which the sampler
// passes on to the step that asked for it (sampler.h: IsDataError). So is a file that cannot be
// read any more (data_file.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace furnace::data {

// Implementations are immutable after opening, so any thread may read them.
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual const std::string& path() const = 0;
  virtual int64_t size() const = 0;   // tokens in the stream
  virtual int64_t vocab() const = 0;  // every token read is below it
  // out[0..n) = tokens [begin, begin + n); the caller keeps the range inside [0, size()). The
  // error of the first token outside [0, vocab()) (BadToken's) when there is one.
  absl::Status Read(int64_t begin, int64_t n, int32_t* out) const;
  // Identifies the content for DataPosition::order: kind, size and a hash of up to
  // kFingerprintTokens tokens spread over the stream (cheap; tells another file from this one, not
  // a one-token edit). Those tokens are read, and checked, as Read does; their pages are asked for
  // together first (Prefetch), so a cold disk serves them at once, not one seek after another.
  // Read once per stream (the first call; thread-safe): a dataset's training and held-out
  // samplers, and the held-out-is-training check, share it.
  absl::StatusOr<std::string> Fingerprint() const;
  static constexpr int64_t kFingerprintTokens = 1024;

 protected:
  // A hint that the token at `position` will be read soon (default: none).
  virtual void Prefetch(int64_t /*position*/) const {}
  // out[0..n) = tokens [begin, begin + n) as stored, unchecked (int64: a 64-bit or unsigned 32-bit
  // dataset can hold values no int32 can); n <= kMaxStoredRead. The file's read error when they
  // cannot be read (data_file.h: Unavailable).
  virtual absl::Status ReadStored(int64_t begin, int64_t n, int64_t* out) const = 0;
  static constexpr int64_t kMaxStoredRead = 512;
  // The error for the token at stream position `position` holding `value` (outside the vocab):
  // names the file, the token's place in it (byte offset) and the allowed range.
  virtual absl::Status BadToken(int64_t position, int64_t value) const = 0;

 private:
  absl::StatusOr<std::string> ReadFingerprint() const;
  mutable std::once_flag fingerprint_once_;
  mutable absl::StatusOr<std::string> fingerprint_;
};

}  // namespace furnace::data
