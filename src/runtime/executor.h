// Executor: interprets a Schedule on this rank. Compute instructions run on the calling thread
// (kernels parallelise internally); collectives are issued asynchronously on the tensor-
// parallel communicator and waited on where the schedule says. Time spent blocked in Wait is
// the exposed communication of the step.
#pragma once

#include "comm/communicator.h"
#include "runtime/trace.h"
#include "ops/segment.h"
#include "schedule/schedule.h"

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
  double exposed_comm_seconds = 0;  // time the compute lane waited on collectives
};

class Executor {
 public:
  Executor(std::vector<std::unique_ptr<ops::Segment>>& segments, comm::Communicator& tp)
      : segments_(segments), tp_(tp) {}

  // Runs every instruction in order; with a recorder, each one is also traced.
  ExecutionStats run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                     const StepHooks& hooks, TraceRecorder* trace = nullptr);

 private:
  std::vector<std::unique_ptr<ops::Segment>>& segments_;
  comm::Communicator& tp_;
  struct InFlight {
    std::unique_ptr<comm::Work> work;
    double issued_us = 0;
  };
  std::map<std::tuple<int, int, int, int>, InFlight> in_flight_;
};

}  // namespace oases::runtime
