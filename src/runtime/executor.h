// Executor: interprets a Schedule on this rank. Compute instructions run on the calling thread
// (the compute lane; kernels parallelise internally); collectives are issued asynchronously on
// the group each segment names (the communication lane): all-reduces of partial sums and
// all-gathers of reshards, waited on where the schedule says. Free instructions release tensor sets from the activation store, so the peak of live
// activations is a property of the schedule.
//
// Per run it reports the compute lane's busy time, the time it stood idle waiting on
// collectives (exposed communication), how long collectives were on the wire, and the peak
// activation memory; with a TraceRecorder every instruction becomes a trace event.
#pragma once

#include "comm/communicator.h"
#include "ops/activation_store.h"
#include "ops/segment.h"
#include "runtime/trace.h"
#include "schedule/schedule.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace oases::runtime {

struct StepHooks {
  std::function<void(int bucket)> reduce_grads;  // ReduceGrads(bucket) instruction
  std::function<void()> optimizer_step;  // OptimizerStep instruction
};

struct ExecutionStats {
  double compute_seconds = 0;        // Forward, Recompute and Backward instructions
  double exposed_comm_seconds = 0;   // compute lane blocked on collectives
  double comm_seconds = 0;           // collectives in flight on the wire (union of intervals)
  int collectives = 0;               // collectives issued by the schedule
  std::size_t peak_activation_bytes = 0;  // boundary buffers + peak of the activation store

  ExecutionStats& operator+=(const ExecutionStats& other);
};

class Executor {
 public:
  // `static_activation_bytes`: activation memory allocated once (boundary buffers, scratch),
  // added to the store's peak.
  Executor(std::vector<std::unique_ptr<ops::Segment>>& segments, comm::Communicator& tp,
           ops::ActivationStore& store, std::size_t static_activation_bytes)
      : segments_(segments), tp_(tp), store_(store), static_bytes_(static_activation_bytes) {}

  // Runs every instruction in order; with a recorder, each one is also traced.
  ExecutionStats run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                     const StepHooks& hooks, TraceRecorder* trace = nullptr);

 private:
  struct InFlight {
    std::unique_ptr<comm::Work> work;
    std::chrono::steady_clock::time_point issued;
    std::string name;
    bool on_wire = false;  // a group of more than one rank
  };

  std::vector<std::unique_ptr<ops::Segment>>& segments_;
  comm::Communicator& tp_;
  ops::ActivationStore& store_;
  std::size_t static_bytes_;
  std::map<std::tuple<int, int, int, int, bool>, InFlight> in_flight_;
};

}  // namespace oases::runtime
