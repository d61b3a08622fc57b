// TraceRecorder: what each lane of this rank did, as Chrome trace events ("X" complete events,
// microseconds). Open the written file in Perfetto or chrome://tracing. Lanes: the compute
// lane runs segments; the communication lane shows each collective from the moment the
// communicator began it to its completion; the optimizer lane the gradient reductions' issue
// and the optimizer step (under ZeRO-3 also the issue of parameter gathers and releases).
// Under pipeline parallelism the compute lane also shows each Recv's wait (the bubble) and the
// point-to-point lane each Send on the wire; under ZeRO-3 it shows each WaitParams' wait. It
// listens to the executor (runtime/executor.h) and names each event after its instruction:
// "F attention.3 mb0 sb1", "R mlp.0 mb0 sb0 [internals]", "B1 head mb0 sb0",
// "AR fwd head_softmax mb0 sb0", "AR-max fwd head mb0 sb0", "AG bwd reshard.2 mb0 sb0",
// "ReduceGrads bucket3", "OptimizerStep", "Send act mb2 sb0 -> 1", "Recv grad mb1 sb0 <- 1"
// (peers are pipeline stages), "GatherParams bucket3", "WaitParams bucket3",
// "ReleaseParams bucket3".
#pragma once

#include "runtime/executor.h"

#include <chrono>
#include <string>
#include <vector>

namespace oases::runtime {

class TraceRecorder final : public InstructionListener {
 public:
  struct Event {
    std::string name;
    Lane lane;
    double start_us;
    double duration_us;
  };

  TraceRecorder() : origin_(std::chrono::steady_clock::now()) {}
  // Recorders of several processes on one host share the monotonic clock: given one origin,
  // their events line up.
  explicit TraceRecorder(std::chrono::steady_clock::time_point origin) : origin_(origin) {}

  void record(const InstructionRecord& record) override;

  double now_us() const { return us_at(std::chrono::steady_clock::now()); }
  double us_at(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  }
  void add(std::string name, Lane lane, double start_us, double end_us) {
    events_.push_back({std::move(name), lane, start_us, end_us - start_us});
  }
  const std::vector<Event>& events() const { return events_; }
  // This rank's pipeline stage: its process is then named "rank 3, stage 1" (unset: "rank 3").
  void set_pipeline_stage(int stage) { pipeline_stage_ = stage; }

  // Chrome trace JSON; `rank` becomes the process id so traces of several ranks can be merged.
  std::string to_json(int rank) const;
  // The JSON array of this recorder's events (lane names included) under process id `rank`.
  std::string events_json(int rank) const;
  // Writes to_json(rank) to path atomically (temporary name, then rename).
  void write(const std::string& path, int rank) const;

  // One Chrome trace from the events_json() arrays of several ranks, written atomically.
  static void write_merged(const std::string& path, const std::vector<std::string>& event_arrays);

 private:
  std::chrono::steady_clock::time_point origin_;
  std::vector<Event> events_;
  int pipeline_stage_ = -1;  // -1: none
};

// The event name of an instruction record (above).
std::string trace_name(const InstructionRecord& record);

}  // namespace oases::runtime
