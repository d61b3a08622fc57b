// Logging to stderr with a level prefix and (once distributed) the rank. Stateless: callers
// that want quiet output pass their verbosity down explicitly.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string_view>

namespace oases {

enum class LogLevel { info, warning, error };

// Writes one line to stderr; UserError when stderr cannot take it (its redirect target is
// full or gone), so that a run never continues with its log silently cut short.
void log_line(LogLevel level, std::string_view message);

template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_warning(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::warning, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace oases
