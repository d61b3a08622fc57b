// Schedule simulator: runs a Schedule on a cost model instead of devices, with the executor's
// semantics. One compute lane runs Forward, Recompute and Backward back to back; the
// tensor-parallel collectives run on a communication lane in issue order (a collective begins
// when it is issued and the ones before it are done), so Start never blocks and Wait holds the
// compute lane until that collective ends. Data-parallel gradient reductions run on a lane of
// their own and the optimizer step waits for all of them.
//
// Lanes running at once slow each other, as they do on shared hardware: compute runs at
// 1 / (1 + overlap_slowdown) of its speed while any communication is in flight (on CPUs the
// progress threads and the network stack take cores; on GPUs communication kernels take SMs);
// communication runs at 1 / (1 + collective_slowdown) while compute runs (the network stack
// waits for a core); and with `shared_link` the two communication lanes split the link's
// bandwidth while both are busy. Time advances from one completion to the next, so only the
// overlapping parts of two activities slow down.
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
  double overlap_slowdown = 0;     // compute under in-flight communication takes (1 + this) x
  double collective_slowdown = 0;  // communication while compute runs takes (1 + this) x
  // The data-parallel reductions use the same link as the tensor-parallel collectives (the
  // replicas of a layer inside the tensor-parallel group).
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
