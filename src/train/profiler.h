// The profiler behind `oases profile`: measures a model's segments and collectives at every
// candidate tensor-parallel degree on the devices it runs on (planner/profile.h).
#pragma once

#include "comm/mesh.h"
#include "model/model.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "planner/planner.h"
#include "planner/profile.h"

#include <functional>

namespace oases::train {

struct ProfileOptions {
  int warmup_steps = 1;
  int steps = 3;  // timed steps per degree; times are medians over them (and over layers)
  bool progress = true;
};

// Each segment kind's kept sets, and what the MoE segments' collectives move, as `model` holds
// them at this degree (for pricing them at other rows and over the expert-parallel link: the
// all-to-alls exchange whole buffers of every expert's slots, the same at any ep).
void record_segment_shapes(const model::Model& model, planner::DegreeProfile& degree);

// The profile's description of the run (model, batch split, element size, memory settings,
// ep) with no degrees measured yet. UserError when parallel.tp is not a power of two or a
// sub-batch does not split over some degree's replicas, or a degree does not divide the model.
planner::Profile profile_of_run(const plan::RunPlan& plan);

// Collective over every rank of the run (config.parallel.tp x parallel.cp ranks; dp = pp = 1,
// or dp = parallel.ep > 1 for a mixture-of-experts model: tp x ep ranks). For each power-of-two
// degree k dividing tp, the ranks form tp / k groups of k (make_mesh(k, tp / k), which must keep
// the run's cp ranks in each group's context-parallel axis and fill the rest of the world with
// copies of that grid: with ep > 1 every tensor-parallel group measures at once, as the
// data-parallel replicas of a run compute at once) and each trains its share of a sub-batch
// with blocking collectives and fine-grained recomputation, so that every segment action and
// every collective is timed on its own. The engines run the run's layout
// (planner::ProfiledLayout): sequence parallelism at every degree above 1, the run's context
// parallelism (the cp ranks sum the engine's gradients) at every degree. MoE segments run with
// every expert local (ep = 1); with parallel.ep > 1 the link of the expert-parallel group
// (make_mesh(tp, ep) with its expert groups) is measured apart (planner::Profile::expert_link). At
// degree tp, when the run's schedule overlaps compute with its collectives, that schedule's own
// steps run after each timed step and give the degree's overlap_slowdown and collective_slowdown
// (planner::OverlapCollector); otherwise a GEMM loop under an all-reduce gives them.
// Every rank returns the profile of its group; rank 0's is the one to write.
planner::Profile run_profile(const plan::RunConfig& config, const ProfileOptions& options,
                             const std::function<comm::Mesh(int tp, int dp)>& make_mesh);

// The prediction of plans of the run's own program from a profile of its layout
// (cluster::profile_plan_predictor, which lives above the engine); the predictor may refer to
// the profile, which outlives it.
using PredictorOf = std::function<planner::PlanPredictor(const planner::Profile& profile)>;

// The joint search (cluster::search_joint_plan, which lives above the engine) over what one
// profile of the run prices on these ranks: the chosen plan (its settings, as `--set` takes
// them, and its report), or UserError when nothing fits.
using JointSearch =
    std::function<planner::Plan(const plan::RunConfig& config, const planner::Profile& profile)>;

// parallel.plan = "auto": profiles the model on these ranks (as run_profile); with `joint`,
// chooses the run's settings by the joint search over what that profile prices (schedule
// family, sub-batches, tensor- and data-parallel degrees among those profiled, per-layer
// recomputation and compression, sequence parallelism, ZeRO); then, where the choice keeps
// every rank in one tensor-parallel group, plans each layer's degree under
// parallel.memory_limit (planner::make_plan). Rank 0 decides and tells the others. Returns the
// config with the chosen settings and parallel.plan set to the chosen degrees. A sequence- or
// context-parallel layout's plans are predicted by `own_program` (UserError without one).
// Rank 0 writes the plan file to `plan_path` (when not empty) and, with options.progress,
// prints the plan. Collective over every rank of the run; UserError (on every rank) when no
// plan fits the limit (when the joint search finds nothing that fits, the degree planner's
// answer for the config as given stands, or its error).
plan::RunConfig plan_automatically(const plan::RunConfig& config, const ProfileOptions& options,
                                   const std::function<comm::Mesh(int tp, int dp)>& make_mesh,
                                   const std::string& plan_path,
                                   const PredictorOf& own_program = {},
                                   const JointSearch& joint = {});

}  // namespace oases::train
