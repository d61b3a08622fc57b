#include "runtime/trace.h"

#include "core/atomic_file.h"
#include "core/error.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

namespace oases::runtime {

namespace {
nlohmann::json event_array(const std::vector<TraceRecorder::Event>& recorded, int rank) {
  nlohmann::json events = nlohmann::json::array();
  const char* lane_names[] = {"compute", "communication", "optimizer"};
  for (int lane = 0; lane < 3; ++lane)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", lane},
                      {"args", {{"name", lane_names[lane]}}}});
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (const TraceRecorder::Event& e : recorded)
    events.push_back({{"name", e.name}, {"ph", "X"}, {"pid", rank},
                      {"tid", static_cast<int>(e.lane)}, {"ts", e.start_us},
                      {"dur", e.duration_us}});
  return events;
}

void write_text(const std::string& path, const std::string& text) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomically(path, text);
}
}  // namespace

std::string TraceRecorder::to_json(int rank) const {
  return nlohmann::json{{"traceEvents", event_array(events_, rank)}, {"displayTimeUnit", "ms"}}
      .dump();
}

std::string TraceRecorder::events_json(int rank) const { return event_array(events_, rank).dump(); }

void TraceRecorder::write(const std::string& path, int rank) const { write_text(path, to_json(rank)); }

void TraceRecorder::write_merged(const std::string& path,
                                 const std::vector<std::string>& event_arrays) {
  nlohmann::json events = nlohmann::json::array();
  for (const std::string& array : event_arrays)
    for (auto& event : nlohmann::json::parse(array)) events.push_back(std::move(event));
  write_text(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump());
}

}  // namespace oases::runtime
