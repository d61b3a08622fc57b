// Predictions of a run's own program (cluster/plan_prediction.h): from a profile, the plain
// tensor-parallel layout agrees with the planner's cost model, a sequence-parallel one keeps the
// engine's own memory figures, a profile of another layout is refused; on a cluster, the
// planner's chosen plan for a context-parallel run is the whole-cluster simulation's.
#include "cluster/plan_prediction.h"

#include "cluster/cluster_profile.h"
#include "cluster/cluster_simulation.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "support/files.h"
#include "support/test_clusters.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace oases::cluster {
namespace {

sim::ClusterSpec four_by_two() {
  return oases::testing::four_by_two_cluster();
}

plan::RunConfig tiny(int tp) { return oases::testing::cluster_test_run(tp, 1); }

// The engine's own memory figures of rank 0 of `config`, as the cost model's kinds.
std::int64_t engine_activation_bytes(const plan::RunConfig& config) {
  return static_cast<std::int64_t>(
      shape_only_rank(plan::make_run_plan(config))->memory.activations);
}

// The profile of a plain tensor-parallel run, priced on the cluster, with the shard segments of
// sequence parallelism added at every degree above 1 (each action 1 us per profiled row).
planner::Profile sequence_parallel_profile(const plan::RunConfig& config,
                                           const sim::ClusterSpec& cluster) {
  plan::RunConfig plain = config;
  plain.parallel.sequence_parallel = false;
  planner::Profile profile = cluster_profile(plain, cluster);
  profile.layout.sequence_parallel = true;
  for (planner::DegreeProfile& d : profile.degrees) {
    if (d.degree == 1) continue;
    const double t = 1e-6 * static_cast<double>(d.rows);
    for (const char* kind : {"attention_in", "mlp_in", "head_in"}) {
      d.segments[kind] = {t, t, t, t};
      d.collectives[std::string(kind) + ".fwd_s"] = t;
      d.collectives[std::string(kind) + ".bwd_s"] = t;
    }
  }
  return profile;
}

TEST(PlanPrediction, ThePlainLayoutsOwnProgramAgreesWithThePlannersCostModel) {
  const sim::ClusterSpec cluster = four_by_two();
  for (const int tp : {1, 2}) {
    const plan::RunConfig config = tiny(tp);
    const planner::Profile profile = cluster_profile(config, cluster);
    const plan::RunPlan plan = plan::make_run_plan(config);
    const planner::Prediction own = predict_from_profile(config, profile);
    const planner::Prediction model = planner::predict_plan(
        profile, std::vector<int>(4, tp), plan.schedule, config.train.micro_batch);
    // The same segments, schedule and prices: the same step to rounding.
    EXPECT_NEAR(own.step_seconds, model.step_seconds, 1e-12 * model.step_seconds) << "tp " << tp;
    EXPECT_NEAR(own.compute_seconds, model.compute_seconds, 1e-12 * model.compute_seconds);
    EXPECT_NEAR(own.exposed_comm_seconds, model.exposed_comm_seconds,
                1e-12 * std::max(1e-9, model.exposed_comm_seconds));
    // The memory is the engine's own figure, which the cost model approximates from the
    // profiled set sizes.
    EXPECT_EQ(own.memory.activations, engine_activation_bytes(config));
    EXPECT_EQ(own.memory.params, model.memory.params);
  }
}

TEST(PlanPrediction, ASequenceParallelLayoutIsPricedFromItsOwnSegmentsAndMemory) {
  const sim::ClusterSpec cluster = four_by_two();
  plan::RunConfig config = tiny(2);
  config.parallel.sequence_parallel = true;
  const planner::Profile profile = sequence_parallel_profile(config, cluster);
  const planner::Prediction sp = predict_from_profile(config, profile);
  plan::RunConfig plain_config = tiny(2);
  const planner::Prediction plain =
      predict_from_profile(plain_config, cluster_profile(plain_config, cluster));
  // The activations are the engine's own figure for the sequence-parallel layout (its shard
  // slots and gathered buffers), not the plain layout's.
  EXPECT_EQ(sp.memory.activations, engine_activation_bytes(config));
  EXPECT_NE(sp.memory.activations, plain.memory.activations);
  // The shard segments' work is priced on top of the plain layers'.
  EXPECT_GT(sp.compute_seconds, plain.compute_seconds);
  // A plain profile lacks the shard segments' layout; a degree-1 layer has none to price.
  testing::expect_user_error(
      [&] { predict_from_profile(config, cluster_profile(plain_config, cluster)); },
      {"was measured with parallel.sequence_parallel = false; this config sets true"});
  config.parallel.plan = "1,2,2,2";
  testing::expect_user_error([&] { predict_from_profile(config, profile); },
                             {"segment attention_in.0", "at tensor-parallel degree 1",
                              "give every layer a degree above 1"});
}

TEST(PlanPrediction, TheChosenPlanOfAContextParallelRunIsTheClustersSimulationOfIt) {
  const sim::ClusterSpec cluster = four_by_two();
  for (const char* kind : {"ring", "all-to-all"}) {
    plan::RunConfig config = tiny(2);
    config.parallel.cp = 2;
    config.parallel.cp_kind = kind;
    config.train.global_batch = 8;
    const plan::RunPlan plan = plan::make_run_plan(config);
    const planner::PlanReport report =
        planner::make_plan(cluster_profile(config, cluster), plan.schedule, 0, false,
                           cluster_plan_predictor(config, cluster));
    ASSERT_EQ(report.uniform.size(), 2u) << kind;
    plan::RunConfig chosen = config;
    chosen.parallel.plan = fmt::format("{}", fmt::join(report.chosen.degrees, ","));
    const ClusterSimulation simulated = simulate_cluster(chosen, cluster);
    EXPECT_DOUBLE_EQ(report.chosen.predicted_step_seconds, simulated.step_seconds) << kind;
    std::size_t most = 0;
    for (const SimulatedRank& r : simulated.ranks) most = std::max(most, r.memory.total());
    EXPECT_EQ(static_cast<std::size_t>(report.chosen.predicted_memory_bytes), most) << kind;
  }
}

}  // namespace
}  // namespace oases::cluster
