#include "io/untrusted_json.h"

#include "core/error.h"

namespace oases::io {

nlohmann::json parse_untrusted_json(const std::string& text, const std::string& source) {
  // The callback sees every value as it is parsed, with its depth (0: the outermost).
  return nlohmann::json::parse(
      text, [&](int depth, nlohmann::json::parse_event_t, const nlohmann::json&) {
        OASES_CHECK(depth <= kMaxJsonDepth,
                    "{} is damaged or not the file expected: its JSON nests deeper than {} "
                    "levels",
                    source, kMaxJsonDepth);
        return true;
      });
}

}  // namespace oases::io
