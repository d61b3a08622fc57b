#include "core/checksum.h"

#include "core/error.h"
#include "core/regular_file.h"

#include <unistd.h>

#include <zlib.h>

#include <cerrno>
#include <cstring>
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
  const ReadableFile file = ReadableFile::open(path, "file");
  FileChecksum sum;
  std::vector<char> block(std::size_t{1} << 20);
  while (true) {
    const ssize_t n = ::read(file.fd(), block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    OASES_CHECK(n >= 0, "reading '{}' failed after {} bytes: {}", path, sum.bytes,
                std::strerror(errno));
    if (n == 0) break;
    const auto got = static_cast<std::size_t>(n);
    sum.crc32 = crc32(block.data(), got, sum.crc32);
    sum.bytes += got;
  }
  return sum;
}

}  // namespace oases
