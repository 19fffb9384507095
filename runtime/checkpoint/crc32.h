// CRC-32 (IEEE 802.3, the zlib/PNG polynomial), incremental: Crc32(Crc32(0, a), b) = Crc32(0, ab).
// Checkpoint manifests record it per shard so a flipped byte or a torn write is caught on load.
#pragma once

#include <cstddef>
#include <cstdint>

namespace furnace::train {

uint32_t Crc32(uint32_t crc, const void* data, size_t n);

}  // namespace furnace::train
