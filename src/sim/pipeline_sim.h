// Pipeline timing: all ranks' pipeline orders (schedule/pipeline.h) run together on a cost
// per action kind, before lowering, to price a pipeline schedule's bubbles.
//
// Each rank runs its list in order, one action at a time. An action starts when its rank has
// finished the previous one and its dependency (schedule/pipeline.h) has finished, plus
// `p2p` seconds when the dependency ran on another rank (the activation or gradient crosses a
// link; a dependency on the same rank, as between an interleaved rank's own chunks or W after
// its I, costs nothing). Transfers do not occupy either rank, and links have no contention.
//
// With unit costs the bubbles follow closed forms (tests/sim/pipeline_sim_test.cc): with
// F = 1 and B = 2, GPipe and 1F1B take 3 (m + P - 1) and every rank idles 3 (P - 1), i.e.
// (P - 1) / m of its 3 m of work; interleaved with per-chunk F = 1/v, B = 2/v idles
// (P - 1) / (v m) of its work; ZB-H1 with F = I = W = 1 idles P - 1, (P - 1) / (3 m) of it.
#pragma once

#include "schedule/pipeline.h"

#include <vector>

namespace oases::sim {

// Seconds of one action on one chunk and micro-batch, by kind.
struct PipelineCosts {
  double forward = 1;
  double backward = 2;         // B: input and weight gradients together
  double backward_input = 1;   // I (zero-bubble)
  double backward_weight = 1;  // W (zero-bubble)
  double p2p = 0;              // latency of one transfer between ranks
};

struct PipelineTiming {
  double makespan = 0;                     // the step: when the last rank finishes
  std::vector<double> busy;                // per rank: seconds computing
  std::vector<double> idle;                // per rank: makespan - busy
  std::vector<std::vector<double>> start;  // start[r][i]: when rank r's i-th action starts
};

// REQUIRES: `orders` pass schedule::verify_pipeline_orders(spec, orders) (InternalError
// otherwise: the simulation finds the same cyclic waits); costs >= 0.
PipelineTiming simulate_pipeline(const schedule::PipelineSpec& spec,
                                 const schedule::PipelineOrders& orders,
                                 const PipelineCosts& costs);

}  // namespace oases::sim
