#include "core/checksum.h"

#include "core/error.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

namespace oases {

std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc) {
  const auto* bytes = static_cast<const Bytef*>(data);
  uLong value = crc;
  // zlib takes at most uInt bytes a call.
  constexpr std::size_t kMaxCall = std::numeric_limits<uInt>::max();
  while (size > 0) {
    const std::size_t part = std::min(size, kMaxCall);
    value = ::crc32(value, bytes, static_cast<uInt>(part));
    bytes += part;
    size -= part;
  }
  return static_cast<std::uint32_t>(value);
}

FileChecksum file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OASES_CHECK(in.good(), "cannot read '{}': {}", path, std::strerror(errno));
  FileChecksum sum;
  std::vector<char> block(std::size_t{1} << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    sum.crc32 = crc32(block.data(), got, sum.crc32);
    sum.bytes += got;
  }
  OASES_CHECK(in.eof() && !in.bad(), "reading '{}' failed: {}", path, std::strerror(errno));
  return sum;
}

}  // namespace oases
