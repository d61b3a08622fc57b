// CRC-32 (the zlib/PNG polynomial, through zlib) of bytes and of files: the checksums that
// checkpoint markers and token shards carry, so that a damaged or altered file is rejected on
// reading instead of being trained on. Not a defence against deliberate tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace oases {

// CRC-32 of `size` bytes, continuing from `crc` (0 for a fresh checksum).
std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc = 0);

struct FileChecksum {
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;
};

// Size and CRC-32 of a whole file; UserError naming the file when it cannot be read or is not
// a regular file (a FIFO or a device, which would never end).
FileChecksum file_checksum(const std::string& path);

}  // namespace oases
