// What a call rejects: the message of the UserError it throws ("" when it returns).
#pragma once

#include "core/error.h"

#include <functional>
#include <string>

namespace oases::testing {

inline std::string user_error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace oases::testing
