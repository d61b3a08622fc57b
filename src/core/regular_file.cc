#include "core/regular_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace oases {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string describe_bytes(std::uint64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const double mib = static_cast<double>(bytes) / kMiB;
  if (mib >= 1024.0 * 1024.0) return fmt::format("{:.1f} TiB ({} bytes)", mib / (1024.0 * 1024.0), bytes);
  if (mib >= 1024.0) return fmt::format("{:.1f} GiB ({} bytes)", mib / 1024.0, bytes);
  return fmt::format("{:.1f} MiB ({} bytes)", mib, bytes);
}

void check_path_has_no_nul(const std::string& path, std::string_view setting) {
  const auto nul = path.find('\0');
  OASES_CHECK(nul == std::string::npos,
              "{} holds a NUL byte at character {} (it reads '{}' before it); a path or setting "
              "cannot contain NUL",
              setting, nul, path.substr(0, nul));
}

std::optional<std::string> file_kind(const std::string& path) {
  struct stat st {};
  if (path.find('\0') != std::string::npos || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  return kind_of(st.st_mode);
}

ReadableFile ReadableFile::open(const std::string& path, std::string_view what,
                                std::uint64_t max_bytes) {
  OASES_CHECK(!path.empty(), "the {} path is empty; name a file", what);
  check_path_has_no_nul(path, fmt::format("the {} path", what));
  ReadableFile file;
  file.path_ = path;
  file.what_ = std::string(what);
  file.max_bytes_ = max_bytes;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  do {
    file.fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  } while (file.fd_ < 0 && errno == EINTR);
  if (file.fd_ < 0) {
    const int err = errno;
    OASES_CHECK(err != ENOENT, "{} '{}' does not exist", what, path);
    OASES_FAIL("cannot open {} '{}': {}", what, path, std::strerror(err));
  }
  struct stat st {};
  OASES_CHECK(::fstat(file.fd_, &st) == 0, "cannot read the status of {} '{}': {}", what, path,
              std::strerror(errno));
  OASES_CHECK(S_ISREG(st.st_mode), "{} '{}' is {}, not a regular file; name a file", what, path,
              kind_of(st.st_mode));
  file.size_ = static_cast<std::uint64_t>(st.st_size);
  OASES_CHECK(file.size_ <= max_bytes, "{} '{}' is {}, more than the {} such a file may hold",
              what, path, describe_bytes(file.size_), describe_bytes(max_bytes));
  const int flags = ::fcntl(file.fd_, F_GETFL);
  if (flags >= 0) (void)::fcntl(file.fd_, F_SETFL, flags & ~O_NONBLOCK);
  return file;
}

ReadableFile::ReadableFile(ReadableFile&& other) noexcept
    : path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      max_bytes_(other.max_bytes_) {}

ReadableFile& ReadableFile::operator=(ReadableFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    max_bytes_ = other.max_bytes_;
  }
  return *this;
}

ReadableFile::~ReadableFile() {
  if (fd_ >= 0) ::close(fd_);
}

int ReadableFile::release() { return std::exchange(fd_, -1); }

std::string ReadableFile::read_all() {
  OASES_ASSERT(fd_ >= 0, "read_all of '{}' after release", path_);
  std::string text;
  text.reserve(static_cast<std::size_t>(size_));
  char block[1 << 16];
  std::uint64_t offset = 0;
  while (true) {
    const ssize_t n = ::pread(fd_, block, sizeof(block), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    OASES_CHECK(n >= 0, "cannot read {} '{}' at byte {}: {}", what_, path_, offset,
                std::strerror(errno));
    if (n == 0) break;
    offset += static_cast<std::uint64_t>(n);
    OASES_CHECK(offset <= max_bytes_, "{} '{}' grew past {} while it was read", what_, path_,
                describe_bytes(max_bytes_));
    text.append(block, static_cast<std::size_t>(n));
  }
  return text;
}

std::string read_regular_file(const std::string& path, std::string_view what,
                              std::uint64_t max_bytes) {
  return ReadableFile::open(path, what, max_bytes).read_all();
}

void check_regular_file(const std::string& path, std::string_view what, std::uint64_t max_bytes) {
  (void)ReadableFile::open(path, what, max_bytes);
}

}  // namespace oases
