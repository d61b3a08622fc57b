// TraceRecorder: what each lane of this rank did, as Chrome trace events ("X" complete events,
// microseconds). Open the written file in Perfetto or chrome://tracing. Lanes: the compute
// lane runs segments; the communication lane shows each collective from issue to completion
// as observed by the Wait that consumed it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace oases::runtime {

class TraceRecorder {
 public:
  enum class Lane { compute = 0, communication = 1, optimizer = 2 };

  struct Event {
    std::string name;
    Lane lane;
    double start_us;
    double duration_us;
  };

  TraceRecorder() : origin_(std::chrono::steady_clock::now()) {}

  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
        .count();
  }
  void add(std::string name, Lane lane, double start_us, double end_us) {
    events_.push_back({std::move(name), lane, start_us, end_us - start_us});
  }
  const std::vector<Event>& events() const { return events_; }

  // Chrome trace JSON; `rank` becomes the process id so traces of several ranks can be merged.
  std::string to_json(int rank) const;
  // Writes to_json(rank) to path atomically (temporary name, then rename).
  void write(const std::string& path, int rank) const;

 private:
  std::chrono::steady_clock::time_point origin_;
  std::vector<Event> events_;
};

}  // namespace oases::runtime
