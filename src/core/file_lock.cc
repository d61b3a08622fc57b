#include "core/file_lock.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>

namespace oases {
namespace {

std::string read_holder(int fd) {
  char text[512] = {};
  const ssize_t got = ::pread(fd, text, sizeof(text) - 1, 0);
  if (got <= 0) return {};
  std::string line(text, static_cast<std::size_t>(got));
  if (const auto end = line.find('\n'); end != std::string::npos) line.resize(end);
  return line;
}

void write_holder(int fd, const std::string& line) {
  const std::string text = line + "\n";
  // Best effort: the lock is what matters; the line only helps whoever finds it taken.
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, text.data(), text.size(), 0);
}

}  // namespace

std::string this_process_holder_line() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char since[32];
  std::strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string("host ") + host + " pid " + std::to_string(::getpid()) + " since " + since;
}

std::optional<FileLock> FileLock::try_take(const std::string& path, const std::string& what,
                                           std::string* holder) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    const int err = errno;
    OASES_FAIL("{}: cannot create the lock file '{}': {}; the folder must exist and be "
               "writable",
               what, path, std::strerror(err));
  }
  struct stat info{};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    OASES_FAIL("{}: the lock file '{}' is not a regular file; remove it", what, path);
  }
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EWOULDBLOCK) {
      // The holder writes its line right after taking the lock; a run started at the same
      // moment can look in between, so give it a moment to say who it is.
      if (holder) {
        *holder = read_holder(fd);
        for (int attempt = 0; holder->empty() && attempt < 50; ++attempt) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          *holder = read_holder(fd);
        }
      }
      ::close(fd);
      return std::nullopt;
    }
    ::close(fd);
    OASES_FAIL("{}: cannot lock '{}': {}", what, path, std::strerror(err));
  }
  write_holder(fd, this_process_holder_line());
  return FileLock(path, fd);
}

FileLock::FileLock(FileLock&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace oases
