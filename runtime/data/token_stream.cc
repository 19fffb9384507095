#include "runtime/data/token_stream.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/data/counter_rng.h"

namespace furnace::data {

std::string TokenStream::Fingerprint() const {
  const int64_t n = size();
  const int64_t samples = std::min<int64_t>(n, 1024);
  uint64_t h = HashKey({static_cast<uint64_t>(n), static_cast<uint64_t>(vocab())});
  for (int64_t i = 0; i < samples; ++i) {
    int32_t t = 0;
    Read(i * (n / samples), 1, &t);
    h = HashKey({h, static_cast<uint64_t>(t)});
  }
  return absl::StrFormat("%d tokens, vocab %d, hash %016x", n, vocab(), h);
}

}  // namespace furnace::data
