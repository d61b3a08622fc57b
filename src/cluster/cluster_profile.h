// Planning for a cluster this machine is not: the planner's input (planner::Profile) priced by
// the cluster simulator's models instead of measured by `oases profile`.
//
// For each power-of-two degree k dividing parallel.tp = T, a degree-k replica's model is built
// shape-only (as cluster/cluster_simulation.h builds its ranks) on k / T of a sub-batch, and the
// schedule `oases profile` runs (fine-grained recomputation, blocking collectives) is priced
// instruction by instruction on the cluster: compute by roofline, each segment's collective over
// the devices of a degree-k group while every degree-k group of the run (T / k per
// tensor-parallel group, times parallel.dp) runs it, medians per segment kind as the profiler
// takes them. The rest follows the profiler's definitions with the run's layout:
//   replica_reduce_per_layer_s  one layer's gradient all-reduce over its replicas, which here
//                               include the data-parallel ones (the profiler, at dp = 1, has
//                               only the T / k inside the group), so the plan prices them;
//   reshards "a-b"              the all-gather of a sub-batch's rows of degree b from groups of
//                               degree a, every group at once;
//   memory ratios               the engine's figures at dp = 1 (planner::with_zero_share divides
//                               them as the run's ZeRO stage does);
//   expert_link                 the innermost tier holding an expert-parallel group.
#pragma once

#include "planner/profile.h"
#include "sim/cluster.h"
#include "plan/run_config.h"

namespace oases::cluster {

// UserError as `oases profile` for layouts the planner cannot take (parallel.tp not a power of
// two, sub-batches that do not split over a degree's replicas), and as simulate_cluster for a
// cluster that cannot price the config.
planner::Profile cluster_profile(const plan::RunConfig& config, const sim::ClusterSpec& cluster);

}  // namespace oases::cluster
