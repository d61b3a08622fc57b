#include "core/line_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace oases {

LineFile::LineFile(std::string path, Start start) : path_(std::move(path)) {
  const auto parent = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  OASES_CHECK(!ec, "cannot create the folder '{}' for '{}': {}", parent.string(), path_,
              ec.message());
  const int truncate = start == Start::truncate ? O_TRUNC : 0;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | truncate, 0644);
  OASES_CHECK(fd_ >= 0, "cannot open '{}' for writing: {}", path_, std::strerror(errno));
}

LineFile::~LineFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LineFile::append(std::string_view line) {
  std::string text(line);
  text += '\n';
  const char* bytes = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, bytes, left);
    if (n < 0 && errno == EINTR) continue;
    OASES_CHECK(n > 0, "cannot write to '{}' ({} of {} bytes of a line written): {}", path_,
                text.size() - left, text.size(),
                n == 0 ? std::string("no space written") : std::string(std::strerror(errno)));
    bytes += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace oases
