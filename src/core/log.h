// Logging to stderr with a level prefix. Stateless: callers that want quiet output pass their
// verbosity down explicitly; the one setting read from the environment, OASES_LOG_LEVEL, is
// read at each use.
//
// ProgressLine is the status line of a long loop (training steps, data preparation): redrawn
// in place on a terminal, one plain line per update otherwise (logs and tests see every
// update as its own line).
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <string_view>

namespace oases {

enum class LogLevel { debug, info, warning, error };

// True when the environment sets OASES_LOG_LEVEL=debug: debug lines (for example where in
// the source a UserError was raised) are shown; otherwise they are dropped.
bool debug_logging_enabled();

// Writes one line to stderr (a debug line only when debug_logging_enabled()); UserError when
// stderr cannot take it (its redirect target is full or gone), so that a run never continues
// with its log silently cut short.
void log_line(LogLevel level, std::string_view message);

template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (debug_logging_enabled()) log_line(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}
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

// A status line that a loop updates, on `out` (stderr unless a test passes another stream).
//
// In place (a terminal): update() returns the cursor to the start of the line ('\r'), writes
// the text (cut to the terminal's width, so that it never wraps) and clears what an older,
// longer text left ("\x1b[K"), without a newline. keep() and log() first end the pending
// line, so that what must stay on screen (validation results, saved checkpoints, warnings,
// the last step) is never overwritten: keep() turns the pending line into `line` and ends it;
// log() ends the pending line as it is (it stays visible above the message) and writes the
// message on its own line. The destructor ends a pending line, so an error printed after it
// starts on a line of its own.
//
// Plain lines (not a terminal): update(), keep() and log() each write one line, exactly as
// log_info() (and log_line for log()) would.
//
// Every write is flushed; a stream that cannot take it is a UserError, as for log_line. Not
// thread-safe: one loop owns it.
class ProgressLine {
 public:
  enum class Mode { in_place, plain_lines };

  // in_place when stderr is a terminal, plain_lines otherwise.
  static Mode mode_for_stderr();

  explicit ProgressLine(Mode mode, std::FILE* out = stderr);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void update(std::string_view line);
  void keep(std::string_view line);
  void log(LogLevel level, std::string_view message);

  Mode mode() const { return mode_; }

 private:
  void write(std::string_view text);
  std::string fit_to_width(std::string_view line) const;

  Mode mode_;
  std::FILE* out_;
  bool pending_ = false;  // an in-place line is on screen, not ended by a newline
};

}  // namespace oases
