#include "core/log.h"

namespace oases {

void log_line(LogLevel level, std::string_view message) {
  const char* prefix = level == LogLevel::info ? "" : level == LogLevel::warning ? "warning: " : "error: ";
  fmt::print(stderr, "{}{}\n", prefix, message);
  std::fflush(stderr);
}

}  // namespace oases
