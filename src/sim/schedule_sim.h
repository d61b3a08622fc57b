// Schedule simulator: runs a Schedule on a cost model instead of devices, with the executor's
// semantics. One compute lane runs Forward, Recompute and Backward back to back; one
// communication lane per group runs collectives in issue order (a collective begins when it is
// issued and the lane is free), so Start never blocks and Wait holds the compute lane until
// that collective ends. Data-parallel gradient reductions run on their own lane and the
// optimizer step waits for all of them.
//
// With CostModel::shared_link the two communication lanes share one link's bandwidth equally
// while both are busy, so a collective that meets a reduction in flight ends later by the time
// they overlap, and so does the reduction.
//
// Compute that runs while a collective of the same rank is on the wire can be slowed by
// `overlap_slowdown` (on CPUs the progress threads and the network stack share the cores; on
// GPUs communication kernels take some SMs): an instruction advances at 1 / (1 + slowdown) of
// its speed for as long as the tensor-parallel lane is busy, and at full speed afterwards.
#pragma once

#include "schedule/schedule.h"

#include <functional>

namespace oases::sim {

struct CostModel {
  // Seconds of a Forward, Recompute or Backward instruction.
  std::function<double(const schedule::Instruction&)> compute;
  // Seconds a tensor-parallel collective (a Start instruction's) spends on the wire.
  std::function<double(const schedule::Instruction&)> collective;
  // Seconds of the data-parallel reduction of a gradient bucket; null: none.
  std::function<double(int bucket)> reduce_grads;
  double optimizer_step = 0;
  double overlap_slowdown = 0;  // compute under an in-flight collective takes (1 + this) x
  // The data-parallel reductions use the same link as the tensor-parallel collectives (the
  // replicas of a layer inside the tensor-parallel group): while both lanes are busy each
  // moves at half speed.
  bool shared_link = false;
};

struct SimResult {
  double step_seconds = 0;
  double compute_seconds = 0;       // compute lane busy (slowdown included)
  double exposed_comm_seconds = 0;  // compute lane waiting on collectives (TP and DP)
  double comm_seconds = 0;          // tensor-parallel lane busy
};

SimResult simulate(const schedule::Schedule& schedule, const CostModel& costs);

}  // namespace oases::sim
