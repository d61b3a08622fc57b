#include "core/log.h"

#include "core/error.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace oases {

void log_line(LogLevel level, std::string_view message) {
  const char* prefix = level == LogLevel::info      ? ""
                       : level == LogLevel::warning ? "warning: "
                                                    : "error: ";
  std::string line = prefix;
  line.append(message);
  line += '\n';
  // stderr is unbuffered: a failed write (a full disk under a redirect) shows here at once.
  errno = 0;
  const std::size_t written = std::fwrite(line.data(), 1, line.size(), stderr);
  const bool flushed = std::fflush(stderr) == 0;
  if (written != line.size() || !flushed) {
    const int error = errno;
    std::clearerr(stderr);
    OASES_FAIL("cannot write the log to standard error: {}",
               error ? std::strerror(error) : "short write");
  }
}

}  // namespace oases
