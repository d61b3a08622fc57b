// The planner's input priced on a cluster (cluster/cluster_profile.h): collectives, replica
// reductions and reshards against the collective model on the groups by hand, the memory ratios
// of fp32 AdamW, and the planner's prediction of a uniform plan from it against the whole-cluster
// simulation of the same run.
#include "cluster/cluster_profile.h"

#include "cluster/cluster_simulation.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "planner/cost_model.h"
#include "sim/collective_costs.h"
#include "support/test_clusters.h"

#include <gtest/gtest.h>

#include <cmath>

namespace oases::cluster {
namespace {

sim::ClusterSpec four_by_two() {
  return oases::testing::four_by_two_cluster();
}

plan::RunConfig tiny(int tp, int dp) { return oases::testing::cluster_test_run(tp, dp); }

TEST(ClusterProfile, CollectivesReductionsAndReshardsArePricedOnTheRunsGroups) {
  const sim::ClusterSpec cluster = four_by_two();
  const plan::RunConfig config = tiny(4, 2);
  const planner::Profile profile = cluster_profile(config, cluster);
  planner::check_profile_matches(profile, config.model, config.train.micro_batch, 2, {1, 2, 4},
                                 "cluster profile");
  ASSERT_EQ(profile.degrees.size(), 3u);
  const double row_bytes = 64.0 * 128 * 4;  // one sequence of the residual stream, fp32
  // Degree 4 holds a whole sub-batch of 4 sequences; its attention all-reduce spans devices
  // {0..3} beside {4..7} (the data-parallel copy).
  const planner::DegreeProfile& top = profile.degrees[2];
  EXPECT_EQ(top.rows, 4);
  EXPECT_DOUBLE_EQ(top.collectives.at("attention.fwd_s"),
                   sim::collective_seconds(cluster, sim::CollectiveOp::all_reduce, 4 * row_bytes,
                                           {0, 1, 2, 3}, {{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Degree 1: tensor-parallel collectives over a group of one, free; each layer's gradients over its 8 replicas.
  const planner::DegreeProfile& one = profile.degrees[0];
  EXPECT_EQ(one.rows, 1);
  EXPECT_EQ(one.collectives.at("attention.fwd_s"), 0.0);
  EXPECT_DOUBLE_EQ(one.replica_reduce_per_layer_s,
                   sim::collective_seconds(cluster, sim::CollectiveOp::all_reduce,
                                           static_cast<double>(one.parameter_bytes_per_layer),
                                           {0, 1, 2, 3, 4, 5, 6, 7}));
  // Degree 4 still reduces over its data-parallel replica, across the nodes.
  EXPECT_DOUBLE_EQ(top.replica_reduce_per_layer_s,
                   sim::collective_seconds(cluster, sim::CollectiveOp::all_reduce,
                                           static_cast<double>(top.parameter_bytes_per_layer), {0, 4},
                                           {{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // A quarter of the layer's weights (its norms and some biases are whole on every rank).
  EXPECT_NEAR(static_cast<double>(top.parameter_bytes_per_layer * 4),
              static_cast<double>(one.parameter_bytes_per_layer), 0.02 * one.parameter_bytes_per_layer);
  // Reshard 1-2: pairs gather two sequences, every pair of the run at once.
  EXPECT_DOUBLE_EQ(profile.reshards.at("1-2"),
                   sim::collective_seconds(cluster, sim::CollectiveOp::all_gather, 2 * row_bytes,
                                           {0, 1}, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  // Compute: a degree-k replica of a layer does k / T of the rows at 1 / k of the width; its
  // products are the same size, so it prices within the launch overheads of the whole.
  EXPECT_GT(one.segments.at("mlp").forward_s, 0.0);
  EXPECT_NEAR(one.segments.at("mlp").forward_s, top.segments.at("mlp").forward_s,
              0.5 * one.segments.at("mlp").forward_s);
  EXPECT_GT(top.segments.at("attention").recompute_s, 0.0);
  // fp32 AdamW: one copy of the parameters, one of the gradients, two moments.
  EXPECT_DOUBLE_EQ(profile.param_bytes_ratio, 1.0);
  EXPECT_DOUBLE_EQ(profile.grad_bytes_ratio, 1.0);
  EXPECT_DOUBLE_EQ(profile.optimizer_bytes_ratio, 2.0);
}

// The planner's simulation of the uniform plan from the priced profile and the whole-cluster
// simulation of the run price the same schedule from the same models (the planner on shapes
// scaled from one layer's, with the embedding and head as profiled): they agree within 10%.
TEST(ClusterProfile, UniformPlanPredictionAgreesWithTheClusterSimulation) {
  const sim::ClusterSpec cluster = four_by_two();
  for (int dp : {1, 2}) {
    const plan::RunConfig config = tiny(4, dp);
    const planner::Profile profile = planner::with_zero_share(cluster_profile(config, cluster), 0, dp);
    const schedule::ScheduleSpec spec = plan::make_run_plan(config).schedule;
    const planner::Prediction planned =
        planner::predict_plan(profile, {4, 4, 4, 4}, spec, config.train.micro_batch);
    const ClusterSimulation simulated = simulate_cluster(config, cluster);
    EXPECT_NEAR(planned.step_seconds, simulated.step_seconds, 0.1 * simulated.step_seconds)
        << "dp " << dp;
  }
}

// A profile measured at tp 2 times its degree-1 layers on half a sub-batch (each of the two
// replicas' share); a run at tp 1 (here a two-stage pipeline) gives each layer the whole
// sub-batch. Priced from that profile or from one measured at tp 1 (degree 1 on the whole
// sub-batch), the run takes the same time on a device whose every kernel is linear in its
// rows (constant efficiencies, no launch cost, memory traffic free).
TEST(ClusterProfile, AProfileAtTwoPricesAOneWideRunOnItsWholeSubBatch) {
  sim::ClusterSpec linear = testing::switched_cluster(1, 2, 10e9, 5e9, 5e9);
  linear.device.kernel_launch_seconds = 0;
  linear.device.gemm_efficiency = {{1.0}, {0.5}};
  linear.device.memory_efficiency = {{1.0}, {1.0}};
  linear.device.memory_bytes_per_second = 1e30;
  const auto megatron = [](int tp, int dp) {
    plan::RunConfig c = tiny(tp, dp);
    c.parallel.schedule = "megatron";
    c.parallel.sub_batches = 1;
    return c;
  };
  planner::Profile at_two = cluster_profile(megatron(2, 1), linear);
  planner::Profile at_one = cluster_profile(megatron(1, 2), linear);
  ASSERT_EQ(at_two.at_degree(1)->rows * 2, at_one.at_degree(1)->rows);
  // The replicas' all-reduce would calibrate the link differently; the pipeline does not use it.
  at_two.replica_link = at_one.replica_link = {};
  plan::RunConfig pipeline = megatron(1, 1);
  pipeline.parallel.pp = 2;
  pipeline.parallel.pipeline = "1f1b";
  sim::ClusterSpec machine = linear;
  machine.device.peak_flops.clear();  // compute from the profile
  const auto step = [&](const planner::Profile& profile) {
    ClusterSimulationOptions options;
    options.profile = &profile;
    return simulate_cluster(pipeline, machine, options).step_seconds;
  };
  const double from_two = step(at_two), from_one = step(at_one);
  EXPECT_LE(std::abs(from_two - from_one), 1e-12 * from_one) << from_two << " vs " << from_one;
}

// A compressed run priced from a profile pays its Encodes and Decodes at the profile's measured
// rate per element, in series with the rest on one rank: twice the rate, twice the cost.
TEST(ClusterProfile, CompressedSetsCostTheProfilesMeasuredRate) {
  plan::RunConfig plain = tiny(1, 1);
  plain.parallel.schedule = "megatron";
  plain.parallel.sub_batches = 1;
  plan::RunConfig compressed = plain;
  compressed.parallel.activation_compression = "fp8";
  planner::Profile profile = cluster_profile(plain, four_by_two());
  sim::ClusterSpec machine = four_by_two();
  machine.device.peak_flops.clear();  // compute from the profile
  const auto step = [&](const plan::RunConfig& config, const planner::Profile& p) {
    ClusterSimulationOptions options;
    options.profile = &p;
    return simulate_cluster(config, machine, options).step_seconds;
  };
  profile.activation_codec["fp8"] = {4e-9, 2e-9};
  const double once = step(compressed, profile) - step(plain, profile);
  profile.activation_codec["fp8"] = {8e-9, 4e-9};
  const double twice = step(compressed, profile) - step(plain, profile);
  EXPECT_GT(once, 0);
  EXPECT_NEAR(twice, 2 * once, 1e-9 * twice);
}

}  // namespace
}  // namespace oases::cluster
