#include "runtime/trace.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace oases::runtime {

std::string TraceRecorder::to_json(int rank) const {
  nlohmann::json events = nlohmann::json::array();
  const char* lane_names[] = {"compute", "communication", "optimizer"};
  for (int lane = 0; lane < 3; ++lane)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", lane},
                      {"args", {{"name", lane_names[lane]}}}});
  for (const Event& e : events_)
    events.push_back({{"name", e.name}, {"ph", "X"}, {"pid", rank},
                      {"tid", static_cast<int>(e.lane)}, {"ts", e.start_us},
                      {"dur", e.duration_us}});
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void TraceRecorder::write(const std::string& path, int rank) const {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    OASES_CHECK(out.good(), "log.trace: cannot write '{}'", path);
    out << to_json(rank);
    OASES_CHECK(out.good(), "log.trace: writing '{}' failed", path);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace oases::runtime
