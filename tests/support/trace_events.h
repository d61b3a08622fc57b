// Reading a Chrome trace written by `oases train --set log.trace=...` (runtime/trace.h): the
// complete events of one rank's lane (0: compute, 1: communication) and the (micro-batch,
// sub-batch) instance an event names.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace oases::testing {

struct TraceEvent {
  std::string name;
  double start_us = 0;
  double duration_us = 0;
};

// The complete events of one rank's lane.
inline std::vector<TraceEvent> lane_events(const nlohmann::json& trace, int rank, int lane) {
  std::vector<TraceEvent> out;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("pid", -1) != rank || e.value("tid", -1) != lane)
      continue;
    out.push_back(
        {e.at("name").get<std::string>(), e.at("ts").get<double>(), e.at("dur").get<double>()});
  }
  return out;
}

// (micro-batch, sub-batch) from "... mb<m> sb<s>...".
inline std::optional<std::pair<int, int>> instance_of(const std::string& name) {
  static const std::regex pattern(R"( mb(\d+) sb(\d+)(?: |$))");
  std::smatch m;
  if (!std::regex_search(name, m, pattern)) return std::nullopt;
  return std::pair{std::stoi(m[1]), std::stoi(m[2])};
}

// " mb<m> sb<s>", as trace events name an instance.
inline std::string instance_suffix(int mb, int sb) {
  return " mb" + std::to_string(mb) + " sb" + std::to_string(sb);
}

// Fails the test for every collective of `rank` that begins while its own instance recomputes
// (recomputation must never wait on, or replay, a collective of the instance it rebuilds).
inline void expect_no_collective_during_own_recompute(const nlohmann::json& trace, int rank) {
  const std::vector<TraceEvent> comm = lane_events(trace, rank, 1);
  for (const TraceEvent& r : lane_events(trace, rank, 0)) {
    if (r.name.rfind("R ", 0) != 0) continue;
    const auto instance = instance_of(r.name);
    EXPECT_TRUE(instance.has_value()) << r.name;
    for (const TraceEvent& c : comm)
      if (instance_of(c.name) == instance && c.start_us > r.start_us &&
          c.start_us < r.start_us + r.duration_us)
        ADD_FAILURE() << "rank " << rank << ": " << c.name << " begins during " << r.name;
  }
}

}  // namespace oases::testing
