#include "runtime/checkpoint/crc32.h"

#include <zlib.h>

#include <algorithm>

namespace furnace::train {

// zlib's crc32 is the same CRC (zlib/PNG polynomial, pre- and post-inverted), computed several
// bytes at a time: a 64 MB shard costs tens of milliseconds, not the hundreds a byte-wise table
// loop takes, which matters when the background checkpoint writer shares cores with training.
uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);  // crc32_z takes z_size_t
    c = crc32_z(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

}  // namespace furnace::train
