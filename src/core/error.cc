#include "core/error.h"

#include <cstring>

namespace oases::detail {
namespace {
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void throw_user_error(const char* file, int line, const std::string& message) {
  throw UserError(fmt::format("{} ({}:{})", message, base_name(file), line));
}

void throw_internal_error(const char* file, int line, const char* condition,
                          const std::string& message) {
  throw InternalError(fmt::format("internal error: {} [{}] ({}:{})", message, condition,
                                  base_name(file), line));
}
}  // namespace oases::detail
