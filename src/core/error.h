// Error policy. Two kinds of failure, two types:
//  - UserError: the input (config, data, checkpoint, command line) is wrong. The message says
//    what was expected, what was found, and what to change. Thrown by OASES_CHECK.
//  - InternalError: an invariant of the engine itself broke (a bug). Thrown by OASES_ASSERT.
// Both record file:line of the check in location(). A UserError's what() is the message alone:
// the user acts on the message, and a source position would only distract (the CLI shows it
// when OASES_LOG_LEVEL=debug). An InternalError's what() includes it, since it goes into a bug
// report. The CLI prints the message and exits non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace oases {

class Error : public std::runtime_error {
 public:
  // `location`: "file.cc:123" of the check that failed; empty when not thrown by a check.
  explicit Error(const std::string& message, std::string location = {})
      : std::runtime_error(message), location_(std::move(location)) {}

  const std::string& location() const { return location_; }

 private:
  std::string location_;
};

class UserError : public Error {
 public:
  using Error::Error;
};

class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_user_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_internal_error(const char* file, int line, const char* condition,
                                       const std::string& message);
}  // namespace detail

}  // namespace oases

// OASES_CHECK(cond, "format {}", args...): a user-facing precondition.
#define OASES_CHECK(cond, ...)                                                         \
  do {                                                                                 \
    if (!(cond)) [[unlikely]]                                                          \
      ::oases::detail::throw_user_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// OASES_FAIL("format {}", args...): unconditional user error.
#define OASES_FAIL(...) ::oases::detail::throw_user_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

// OASES_ASSERT(cond, "format {}", args...): an internal invariant; failure is a bug.
#define OASES_ASSERT(cond, ...)                                                     \
  do {                                                                              \
    if (!(cond)) [[unlikely]]                                                       \
      ::oases::detail::throw_internal_error(__FILE__, __LINE__, #cond,              \
                                            ::fmt::format(__VA_ARGS__));            \
  } while (0)
