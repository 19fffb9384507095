// Counter-based random numbers: every draw is a pure function of a key and a counter, so a
// sampler can produce the batch of (seed, step, rank, micro-batch, sequence) without carrying
// generator state, and a resumed run draws exactly what an uninterrupted one would.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace furnace::data {

// The splitmix64 finaliser: a bijective 64-bit mix.
inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Hashes a list of words into one key (order matters).
inline uint64_t HashKey(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x243F6A8885A308D3ull;
  for (uint64_t w : words) h = SplitMix64(h ^ SplitMix64(w));
  return h;
}

// A stream of draws keyed by `key`: draw i is SplitMix64(key + i * golden), i.e. splitmix64.
// Copyable value type; not thread-safe (one stream per thread).
class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : state_(key) {}
  uint64_t NextU64() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double NextDouble() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n) (Lemire's multiply-shift; bias below 2^-64 * n).
  uint64_t NextBelow(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(NextU64()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace furnace::data
