#include "core/atomic_file.h"

#include "core/error.h"
#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

namespace oases {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Best effort by design: the rename has already happened, so the new file is in place; some
// file systems (and containers' overlay mounts) refuse fsync on a directory, and reporting
// that as a failure would wrongly tell the user the write did not happen.
void fsync_directory_of(const std::string& path) {
  const int dir_fd = ::open(parent_directory(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return;
  (void)::fsync(dir_fd);
  ::close(dir_fd);
}

// What a failed write leaves behind, for its message.
std::string untouched(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec)
             ? "the previous '" + path + "' is unchanged"
             : "nothing was written under '" + path + "'";
}

void fsync_fd(int fd, const std::string& path) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    OASES_FAIL("cannot flush '{}' to disk: {}", path, errno_text(errno));
  }
}

void rename_over(const std::string& tmp_path, const std::string& final_path) {
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    OASES_FAIL("cannot rename '{}' to '{}': {} ({})", tmp_path, final_path, errno_text(err),
               untouched(final_path));
  }
  fsync_directory_of(final_path);
}

// Creates a temporary file beside `path` under a name no one else uses: O_EXCL fails on any
// existing entry, so a symlink planted under a guessable name cannot redirect the write, and
// two writers of one path never share a temporary. Returns the descriptor and fills `tmp_path`.
int create_temporary_beside(const std::string& path, std::string& tmp_path) {
  std::random_device entropy;
  constexpr int kAttempts = 64;
  int err = 0;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    tmp_path = fmt::format("{}.{:08x}.tmp", path, entropy());
    const int fd = ::open(tmp_path.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    err = errno;
    if (err != EEXIST && err != EINTR) break;
  }
  OASES_FAIL(
      "cannot create a temporary file beside '{}' (as '{}'): {}; check that directory '{}' "
      "exists and is writable",
      path, tmp_path, errno_text(err), parent_directory(path));
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  OASES_CHECK(!path_.empty(), "cannot write a file with an empty path");
  check_path_has_no_nul(path_, "the path of a file to write");
  std::error_code ec;
  OASES_CHECK(!std::filesystem::is_directory(path_, ec),
              "cannot write '{}': it is a directory; name a file inside it instead", path_);
  fd_ = create_temporary_beside(path_, tmp_path_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, std::size_t size) {
  OASES_ASSERT(!committed_ && fd_ >= 0, "write to '{}' after commit", path_);
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, bytes, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      OASES_FAIL("cannot write '{}' after {} bytes: {} ({})", tmp_path_, bytes_written_,
                 errno_text(err), untouched(path_));
    }
    bytes += n;
    size -= static_cast<std::size_t>(n);
    bytes_written_ += static_cast<std::size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  OASES_ASSERT(!committed_ && fd_ >= 0, "'{}' committed twice", path_);
  fsync_fd(fd_, tmp_path_);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    OASES_FAIL("cannot close '{}': {} ({})", tmp_path_, errno_text(err), untouched(path_));
  }
  rename_over(tmp_path_, path_);
  committed_ = true;
}

void fsync_directory(const std::string& dir) {
  fsync_directory_of((std::filesystem::path(dir) / ".").string());
}

void fsync_and_rename(const std::string& tmp_path, const std::string& final_path) {
  const int fd = ::open(tmp_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    OASES_FAIL("cannot open '{}' to publish it as '{}': {}", tmp_path, final_path, errno_text(err));
  }
  try {
    fsync_fd(fd, tmp_path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  rename_over(tmp_path, final_path);
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFileWriter writer(path);
  writer.write(contents);
  writer.commit();
}

}  // namespace oases
