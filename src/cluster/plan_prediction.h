// A run's own layout predicted from a profile measured in that layout (`oases simulate
// --profile`, and `oases plan --degrees-only --profile` under sequence or context parallelism),
// and plans of such layouts predicted on a cluster description (`oases plan --degrees-only
// --cluster`).
//
// The planner's cost model (planner/cost_model.h) builds GPT programs of plain tensor-parallel
// layers; a run with sequence parallelism or context parallelism has other segments (the
// shard segments, the attention's all-to-all or ring steps, planner::ProfiledLayout). Here the
// program is the run's own: rank 0's model built shape-only as the engine builds it
// (cluster::shape_only_rank), its schedule the one the runtime executes (passes included), each
// instruction priced from the profile by its segment's kind and degree
// (planner::profiled_costs); the memory is that rank's engine figures (the model's own slots,
// scratch and the schedule's peak of kept sets, with parameters, gradients and optimizer state
// under the config's ZeRO stage and offload), so the activations are the engine's prediction,
// not scaled from the profile.
#pragma once

#include "plan/run_config.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "planner/profile.h"
#include "sim/cluster.h"

#include <vector>

namespace oases::cluster {

// The config's layout at parallel.plan's degrees (resolved as the run resolves it; "auto" is
// the caller's to resolve first). UserError when the profile was measured for another model,
// batch split or layout (planner::check_profile_matches, check_profile_layout), lacks a
// segment kind at some layer's degree (planner::check_profiled_kinds), or the config has
// parallel.pp > 1. Per rank: a data-parallel run's gradient reduction over dp is not priced;
// the context-parallel ranks' is, as the profile measured it.
planner::Prediction predict_from_profile(const plan::RunConfig& config,
                                         const planner::Profile& profile);

// For planner::make_plan: the config with `degrees` as its plan (and as many layers) predicted
// by predict_from_profile. UserError for a model with MoE layers (their pattern,
// model.moe_every, cannot lose one layer of a kind). `config` and `profile` must outlive the
// predictor.
planner::PlanPredictor profile_plan_predictor(const plan::RunConfig& config,
                                              const planner::Profile& profile);

// The same on a cluster description: the config with `degrees` as its plan (and as many
// layers) simulated on the whole cluster (simulate_cluster); the step, compute and exposed
// communication of its slowest rank, the memory of the rank that needs the most. `config` and
// `cluster` must outlive the predictor.
planner::PlanPredictor cluster_plan_predictor(const plan::RunConfig& config,
                                              const sim::ClusterSpec& cluster);

}  // namespace oases::cluster
