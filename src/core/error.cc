#include "core/error.h"

#include <cstring>

namespace oases::detail {
namespace {
std::string location_of(const char* path, int line) {
  const char* slash = std::strrchr(path, '/');
  return fmt::format("{}:{}", slash ? slash + 1 : path, line);
}
}  // namespace

void throw_user_error(const char* file, int line, const std::string& message) {
  throw UserError(message, location_of(file, line));
}

void throw_internal_error(const char* file, int line, const char* condition,
                          const std::string& message) {
  const std::string location = location_of(file, line);
  throw InternalError(fmt::format("internal error: {} [{}] ({})", message, condition, location),
                      location);
}
}  // namespace oases::detail
