// A dataset seen as one stream of tokens (epoch_sampler.h cuts it into sequences): a token file,
// or a Megatron indexed dataset's sequences concatenated in file order.
#pragma once

#include <cstdint>
#include <string>

namespace furnace::data {

// Implementations are immutable after opening, so any thread may read them.
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual const std::string& path() const = 0;
  virtual int64_t size() const = 0;   // tokens in the stream
  virtual int64_t vocab() const = 0;  // every token is below it
  // out[0..n) = tokens [begin, begin + n); the caller keeps the range inside [0, size()).
  virtual void Read(int64_t begin, int64_t n, int32_t* out) const = 0;
  // Identifies the content for DataPosition::order: kind, size and a hash of up to 1024 tokens
  // spread over the stream (cheap; tells another file from this one, not a one-token edit).
  std::string Fingerprint() const;
};

}  // namespace furnace::data
