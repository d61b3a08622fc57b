#include "core/log.h"

#include "core/error.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace oases {
namespace {

const char* prefix_of(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug: ";
    case LogLevel::info: return "";
    case LogLevel::warning: return "warning: ";
    case LogLevel::error: return "error: ";
  }
  return "";
}

// Writes and flushes `text`; UserError when `out` cannot take it.
void write_checked(std::FILE* out, std::string_view text) {
  // stderr is unbuffered: a failed write (a full disk under a redirect) shows here at once.
  errno = 0;
  const std::size_t written = std::fwrite(text.data(), 1, text.size(), out);
  const bool flushed = std::fflush(out) == 0;
  if (written != text.size() || !flushed) {
    const int error = errno;
    std::clearerr(out);
    OASES_FAIL("cannot write the log to {}: {}", out == stderr ? "standard error" : "its stream",
               error ? std::strerror(error) : "short write");
  }
}

// Columns of the terminal behind `out`; 0 when unknown.
std::size_t terminal_columns(std::FILE* out) {
  winsize size{};
  if (ioctl(fileno(out), TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

}  // namespace

bool debug_logging_enabled() {
  const char* level = std::getenv("OASES_LOG_LEVEL");
  return level != nullptr && std::strcmp(level, "debug") == 0;
}

void log_line(LogLevel level, std::string_view message) {
  if (level == LogLevel::debug && !debug_logging_enabled()) return;
  std::string line = prefix_of(level);
  line.append(message);
  line += '\n';
  write_checked(stderr, line);
}

ProgressLine::Mode ProgressLine::mode_for_stderr() {
  return isatty(fileno(stderr)) ? Mode::in_place : Mode::plain_lines;
}

ProgressLine::ProgressLine(Mode mode, std::FILE* out) : mode_(mode), out_(out) {}

ProgressLine::~ProgressLine() {
  if (!pending_) return;
  // A destructor must not throw; a stream that fails here has nothing more to show anyway.
  std::fputc('\n', out_);
  std::fflush(out_);
}

void ProgressLine::write(std::string_view text) { write_checked(out_, text); }

std::string ProgressLine::fit_to_width(std::string_view line) const {
  const std::size_t columns = terminal_columns(out_);
  // One column short of the width: a line that fills it exactly wraps on some terminals.
  if (columns < 2 || line.size() < columns) return std::string(line);
  std::size_t cut = columns - 1;
  // Cut before a UTF-8 continuation byte, never inside a character.
  while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
  return std::string(line.substr(0, cut));
}

void ProgressLine::update(std::string_view line) {
  if (mode_ == Mode::plain_lines) {
    std::string text(line);
    text += '\n';
    write(text);
    return;
  }
  std::string text = "\r";
  text += fit_to_width(line);
  text += "\x1b[K";
  write(text);
  pending_ = true;
}

void ProgressLine::keep(std::string_view line) {
  if (mode_ == Mode::plain_lines) {
    std::string text(line);
    text += '\n';
    write(text);
    return;
  }
  pending_ = false;
  std::string text = "\r";
  text.append(line);
  text += "\x1b[K\n";
  write(text);
}

void ProgressLine::log(LogLevel level, std::string_view message) {
  if (level == LogLevel::debug && !debug_logging_enabled()) return;
  std::string text = pending_ ? "\n" : "";
  pending_ = false;
  text += prefix_of(level);
  text.append(message);
  text += '\n';
  write(text);
}

}  // namespace oases
