#include "cluster/plan_prediction.h"

#include "cluster/cluster_simulation.h"
#include "core/error.h"
#include "plan/run_plan.h"
#include "sim/schedule_sim.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace oases::cluster {
namespace {

// `config` with `degrees` as parallel.plan and one layer per degree (the planner prices one
// layer as the model less one, which the MoE layers' fixed pattern, model.moe_every, cannot
// follow: UserError for MoE models).
plan::RunConfig with_plan(const plan::RunConfig& config, const std::vector<int>& degrees,
                          const std::vector<bool>& moe) {
  OASES_CHECK(std::ranges::none_of(moe, [](bool m) { return m; }),
              "oases plan --degrees-only chooses per-layer degrees of a sequence- or "
              "context-parallel layout for dense models only (this one has MoE layers: "
              "model.moe_every = {}); `oases simulate` predicts the layout at the degrees "
              "parallel.plan gives",
              config.model.moe_every);
  OASES_CHECK(!degrees.empty(),
              "planning prices one layer as the model less one: with sequence or context "
              "parallelism model.layers must be at least 2");
  plan::RunConfig c = config;
  c.model.layers = static_cast<std::int64_t>(degrees.size());
  c.parallel.plan = fmt::format("{}", fmt::join(degrees, ","));
  return c;
}

// The plan's own program priced from the profile, which must match it.
planner::Prediction predict_checked(const plan::RunPlan& plan, const planner::Profile& profile) {
  const std::unique_ptr<ShapeOnlyRank> rank = shape_only_rank(plan);
  const ops::Program& program = rank->model->program();
  planner::check_profiled_kinds(profile, program);
  std::vector<int> layer_degrees = plan.layer_degrees;
  if (layer_degrees.empty())
    layer_degrees.assign(static_cast<std::size_t>(plan.config.model.layers), plan.mesh.tp);
  const sim::CostModel costs = planner::profiled_costs(
      profile, program,
      static_cast<double>(plan.config.train.micro_batch) / plan.schedule.sub_batches,
      layer_degrees);
  const sim::SimResult sim = sim::simulate(rank->schedule, costs);
  planner::Prediction p;
  p.step_seconds = sim.step_seconds;
  p.compute_seconds = sim.compute_seconds;
  p.exposed_comm_seconds = sim.exposed_comm_seconds;
  p.memory = planner::resident_memory(rank->memory);
  return p;
}

// UserError unless the profile was measured for the plan's model, batch split, degrees and
// layout.
void check_matches(const plan::RunPlan& plan, const planner::Profile& profile) {
  OASES_CHECK(plan.mesh.pp == 1,
              "a profile predicts one pipeline stage's layout; with parallel.pp = {} run `oases "
              "plan`, which predicts every pipeline schedule",
              plan.mesh.pp);
  plan.check_profile(profile, "the profile");
}

}  // namespace

planner::Prediction predict_from_profile(const plan::RunConfig& config,
                                         const planner::Profile& profile) {
  const plan::RunPlan plan = plan::make_run_plan(config);
  check_matches(plan, profile);
  return predict_checked(plan, profile);
}

planner::PlanPredictor profile_plan_predictor(const plan::RunConfig& config,
                                              const planner::Profile& profile) {
  check_matches(plan::make_run_plan(config), profile);
  return [&config, &profile](const std::vector<int>& degrees, const std::vector<bool>& moe) {
    return predict_checked(plan::make_run_plan(with_plan(config, degrees, moe)), profile);
  };
}

planner::PlanPredictor cluster_plan_predictor(const plan::RunConfig& config,
                                              const sim::ClusterSpec& cluster) {
  return [&config, &cluster](const std::vector<int>& degrees, const std::vector<bool>& moe) {
    const ClusterSimulation s = simulate_cluster(with_plan(config, degrees, moe), cluster);
    planner::Prediction p;
    p.step_seconds = s.step_seconds;
    for (const SimulatedRank& rank : s.ranks) {
      p.compute_seconds = std::max(p.compute_seconds, rank.time.compute_seconds);
      p.exposed_comm_seconds = std::max(p.exposed_comm_seconds, rank.time.exposed_comm_seconds);
      const planner::MemoryBytes m = planner::resident_memory(rank.memory);
      if (m.total() > p.memory.total()) p.memory = m;
    }
    return p;
  };
}

}  // namespace oases::cluster
