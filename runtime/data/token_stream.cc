#include "runtime/data/token_stream.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/data/counter_rng.h"

namespace furnace::data {

absl::Status TokenStream::Read(int64_t begin, int64_t n, int32_t* out) const {
  // In chunks through a buffer on the stack: a window is a few thousand tokens at most, and a
  // read allocates nothing.
  constexpr int64_t kChunk = kMaxStoredRead;
  int64_t stored[kChunk];
  const int64_t limit = vocab();
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t count = std::min(kChunk, n - done);
    RETURN_IF_ERROR(ReadStored(begin + done, count, stored));
    for (int64_t i = 0; i < count; ++i) {
      if (stored[i] < 0 || stored[i] >= limit) return BadToken(begin + done + i, stored[i]);
      out[done + i] = static_cast<int32_t>(stored[i]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TokenStream::Fingerprint() const {
  std::call_once(fingerprint_once_, [this] { fingerprint_ = ReadFingerprint(); });
  return fingerprint_;
}

absl::StatusOr<std::string> TokenStream::ReadFingerprint() const {
  const int64_t n = size();
  const int64_t samples = std::min<int64_t>(n, kFingerprintTokens);
  for (int64_t i = 0; i < samples; ++i) Prefetch(i * (n / samples));
  uint64_t h = HashKey({static_cast<uint64_t>(n), static_cast<uint64_t>(vocab())});
  for (int64_t i = 0; i < samples; ++i) {
    int32_t t = 0;
    RETURN_IF_ERROR(Read(i * (n / samples), 1, &t));
    h = HashKey({h, static_cast<uint64_t>(t)});
  }
  return absl::StrFormat("%d tokens, vocab %d, hash %016x", n, vocab(), h);
}

}  // namespace furnace::data
