// JSON from files a user hands the engine (safetensors headers, profiles, plans), read
// without the two traps nlohmann's defaults leave for bad input:
//  - Depth. nlohmann parses iteratively, but copying or printing a value recurses once per
//    level, so a value nested 20,000 deep (40 KB of brackets) overflows the stack when an
//    error message prints it. parse_untrusted_json refuses nesting deeper than kMaxJsonDepth.
//  - Integers. nlohmann's conversion to an integer type is unchecked: it wraps an integer the
//    type cannot hold (a degree of 4294967298 read as 2), truncates a floating-point number,
//    and is undefined for one beyond the type's range. json_integer accepts only integers the
//    type holds.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace oases::io {

// Deeper than any file oases writes (a profile nests 5 levels).
inline constexpr int kMaxJsonDepth = 64;

// As nlohmann::json::parse, which throws json::parse_error for malformed text; nesting deeper
// than kMaxJsonDepth is a UserError naming `source` ("safetensors file 'x.safetensors'").
nlohmann::json parse_untrusted_json(const std::string& text, const std::string& source);

// The value of `j` as T, or nullopt when `j` is not an integer in T's range.
template <class T>
std::optional<T> json_integer(const nlohmann::json& j) {
  using limits = std::numeric_limits<T>;
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    if (v <= static_cast<std::uint64_t>(limits::max())) return static_cast<T>(v);
  } else if (j.is_number_integer()) {
    const auto v = j.get<std::int64_t>();
    if (v >= static_cast<std::int64_t>(limits::min()) &&
        v <= static_cast<std::int64_t>(limits::max()))
      return static_cast<T>(v);
  }
  return std::nullopt;
}

}  // namespace oases::io
