// Whole-cluster simulation (cluster/cluster_simulation.h): the folded simulation (one rank per
// pipeline stage) against every rank simulated on its own devices, the symmetry rule, memory
// and FLOP accounting against counts by hand, and the errors a user meets.
#include "cluster/cluster_simulation.h"

#include "core/error.h"
#include "plan/run_config.h"
#include "planner/cost_model.h"
#include "sim/collective_costs.h"
#include "support/test_clusters.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace oases::cluster {
namespace {

// nodes x per_node devices: a switch inside a node, a network between nodes whose uplink
// the node's devices share.
sim::ClusterSpec cluster_of(int nodes, int per_node) {
  return testing::switched_cluster(nodes, per_node, 200e9, 25e9, 100e9);
}

// A small GPT on tp x dp x pp ranks with `micro_batches` micro-batches of 2 per data-parallel
// rank per step.
plan::RunConfig tiny_config(int tp, int dp, int pp, int micro_batches) {
  plan::RunConfig config = plan::parse_run_config("", "test");
  config.model.layers = 8;
  config.model.hidden = 64;
  config.model.heads = 4;
  config.model.ffn_hidden = 256;
  config.model.vocab_size = 512;
  config.model.seq_len = 32;
  config.train.micro_batch = 2;
  config.train.global_batch = 2 * dp * micro_batches;
  config.parallel.tp = tp;
  config.parallel.dp = dp;
  config.parallel.pp = pp;
  config.parallel.pipeline = "1f1b";
  config.parallel.schedule = "megatron";
  config.parallel.recompute = "none";
  return config;
}

void expect_near_relative(double a, double b, const std::string& what) {
  EXPECT_LE(std::abs(a - b), 1e-12 * std::max(std::abs(a), std::abs(b))) << what << ": " << a << " vs " << b;
}

// 64 ranks (tp 2 x dp 8 x pp 4) on 8 nodes of 8: every tensor-parallel pair inside a node, the
// data-parallel groups across a node's four pairs and the pipeline across nodes. Every rank of a
// stage simulated on its own gives the representative's figures.
TEST(ClusterSimulation, FoldedEqualsEveryRankOnSixtyFourRanks) {
  const sim::ClusterSpec cluster = cluster_of(8, 8);
  const plan::RunConfig config = tiny_config(2, 8, 4, 8);
  ASSERT_TRUE(cluster_layout_is_symmetric(plan::make_run_plan(config), cluster));
  const ClusterSimulation folded = simulate_cluster(config, cluster);
  ClusterSimulationOptions every;
  every.fold = false;
  const ClusterSimulation unfolded = simulate_cluster(config, cluster, every);
  ASSERT_TRUE(folded.folded);
  ASSERT_FALSE(unfolded.folded);
  ASSERT_EQ(folded.ranks.size(), 4u);
  ASSERT_EQ(unfolded.ranks.size(), 64u);
  expect_near_relative(folded.step_seconds, unfolded.step_seconds, "step");
  expect_near_relative(folded.model_flops_per_step, unfolded.model_flops_per_step, "model FLOPs");
  for (const SimulatedRank& rank : unfolded.ranks) {
    const SimulatedRank& representative = folded.ranks.at(static_cast<std::size_t>(rank.stage));
    const std::string what = "rank " + std::to_string(rank.rank);
    expect_near_relative(rank.time.step_seconds, representative.time.step_seconds, what + " step");
    expect_near_relative(rank.time.compute_seconds, representative.time.compute_seconds, what + " compute");
    expect_near_relative(rank.time.exposed_comm_seconds, representative.time.exposed_comm_seconds,
                         what + " exposed");
    expect_near_relative(rank.time.bubble_seconds, representative.time.bubble_seconds, what + " bubble");
    expect_near_relative(rank.memory.total(), representative.memory.total(), what + " memory");
  }
  // The pipeline's first stage waits in bubbles, and the data-parallel reductions cost something.
  EXPECT_GT(folded.ranks[3].time.bubble_seconds + folded.ranks[0].time.bubble_seconds, 0.0);
  EXPECT_GT(folded.ranks[0].time.exposed_comm_seconds, 0.0);
}

// Nodes of 3 devices under tp 2: pair {0, 1} is inside a node, {2, 3} straddles two. The rule
// does not fold, and the straddling pair pays for the network.
// One model per rank scheduled for several micro-batch counts gives what each count's own
// simulation gives, bit for bit: pipelines (1F1B and interleaved), ZeRO-3 and the overlapped
// families, folded and rank by rank.
TEST(ClusterSimulation, SeveralMicroBatchCountsEqualEachAlone) {
  const sim::ClusterSpec cluster = cluster_of(2, 4);
  struct Case {
    int tp, dp, pp;
    const char* schedule;
    const char* pipeline;
    int virtual_stages;
    int zero;
  };
  for (const Case& c : {Case{2, 2, 2, "oases", "1f1b", 1, 3},
                        Case{2, 2, 2, "oases-interleaved", "interleaved", 2, 0},
                        Case{1, 4, 2, "megatron", "zero-bubble", 1, 2},
                        Case{4, 2, 1, "cross-pass", "1f1b", 1, 1}}) {
    plan::RunConfig config = tiny_config(c.tp, c.dp, c.pp, 2);
    config.parallel.schedule = c.schedule;
    config.parallel.sub_batches = std::string_view(c.schedule).starts_with("oases") ? 2 : 1;
    config.parallel.pipeline = c.pipeline;
    config.parallel.virtual_stages = c.virtual_stages;
    config.parallel.zero = c.zero;
    for (const bool fold : {true, false}) {
      SCOPED_TRACE(fmt::format("{} {} zero {} fold {}", c.schedule, c.pipeline, c.zero, fold));
      ClusterSimulationOptions options;
      options.fold = fold;
      const std::vector<std::int64_t> counts{4, 2, 8};
      const std::vector<ClusterSimulation> together =
          simulate_cluster_at(config, cluster, counts, options);
      ASSERT_EQ(together.size(), counts.size());
      for (std::size_t k = 0; k < counts.size(); ++k) {
        plan::RunConfig alone = config;
        alone.train.global_batch = counts[k] * config.train.micro_batch * config.parallel.dp;
        const ClusterSimulation expected = simulate_cluster(alone, cluster, options);
        EXPECT_EQ(together[k].step_seconds, expected.step_seconds) << counts[k];
        EXPECT_EQ(together[k].model_flops_per_step, expected.model_flops_per_step);
        EXPECT_EQ(together[k].tokens_per_step, expected.tokens_per_step);
        ASSERT_EQ(together[k].ranks.size(), expected.ranks.size());
        for (std::size_t r = 0; r < expected.ranks.size(); ++r) {
          EXPECT_EQ(together[k].ranks[r].rank, expected.ranks[r].rank);
          EXPECT_EQ(together[k].ranks[r].time.step_seconds, expected.ranks[r].time.step_seconds);
          EXPECT_EQ(planner::resident_memory(together[k].ranks[r].memory).total(),
                    planner::resident_memory(expected.ranks[r].memory).total())
              << "count " << counts[k] << ", rank " << expected.ranks[r].rank;
        }
      }
    }
  }
}

TEST(ClusterSimulation, AnAsymmetricLayoutIsSimulatedRankByRank) {
  const sim::ClusterSpec cluster = cluster_of(2, 3);
  const plan::RunConfig config = tiny_config(2, 2, 1, 2);
  EXPECT_FALSE(cluster_layout_is_symmetric(plan::make_run_plan(config), cluster));
  const ClusterSimulation s = simulate_cluster(config, cluster);
  EXPECT_FALSE(s.folded);
  ASSERT_EQ(s.ranks.size(), 4u);
  EXPECT_GT(s.ranks[2].time.exposed_comm_seconds, s.ranks[0].time.exposed_comm_seconds);
  double slowest = 0;
  for (const SimulatedRank& rank : s.ranks) slowest = std::max(slowest, rank.time.step_seconds);
  EXPECT_EQ(s.step_seconds, slowest);
}

// Memory and FLOPs by hand for one rank holding the whole model (fp32, AdamW).
TEST(ClusterSimulation, MemoryAndModelFlopsFollowTheCountsByHand) {
  const sim::ClusterSpec cluster = cluster_of(1, 2);
  plan::RunConfig config = tiny_config(1, 1, 1, 3);
  const ClusterSimulation s = simulate_cluster(config, cluster);
  ASSERT_EQ(s.ranks.size(), 1u);
  const double h = 64, f = 256, V = 512, S = 32, L = 8, rows = 2;
  // Per layer: QKV, projection, two MLP matrices with biases, two norms; plus the token and
  // position embeddings and the final norm (the head ties to the token embedding).
  const double per_layer = 3 * h * h + 3 * h + h * h + h + h * f + f + f * h + h + 4 * h;
  const double params = L * per_layer + V * h + S * h + 2 * h;
  EXPECT_DOUBLE_EQ(s.ranks[0].memory.params, 4 * params);
  EXPECT_DOUBLE_EQ(s.ranks[0].memory.grads, 4 * params);
  EXPECT_DOUBLE_EQ(s.ranks[0].memory.optimizer, 8 * params);
  EXPECT_GT(s.ranks[0].memory.activations, 0.0);
  // Forward products per layer: 2 x tokens x (4 h^2 + 2 h f) and the attention's 2 x 2 S^2 h
  // per sequence; the head 2 x tokens x h V; backward twice the forward.
  const double tokens = rows * S;
  const double forward = L * (2 * tokens * (4 * h * h + 2 * h * f) + rows * 4 * S * S * h) +
                         2 * tokens * h * V;
  EXPECT_NEAR(s.model_flops_per_step, 3 * forward * 3, 1e-9 * 9 * forward);
  EXPECT_DOUBLE_EQ(s.tokens_per_step, 3 * rows * S);
}

TEST(ClusterSimulation, ClustersThatCannotRunTheConfigAreClearErrors) {
  const plan::RunConfig config = tiny_config(2, 2, 2, 4);
  try {
    simulate_cluster(config, cluster_of(1, 4));
    FAIL() << "a cluster of 4 devices ran 8 ranks";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("4"), std::string::npos) << what;
    EXPECT_NE(what.find("8"), std::string::npos) << what;
  }
  sim::ClusterSpec profile_only = cluster_of(2, 4);
  profile_only.device.peak_flops.clear();
  EXPECT_THROW(simulate_cluster(config, profile_only), UserError);
  plan::RunConfig fp16 = config;
  fp16.train.precision = "fp16";
  try {
    simulate_cluster(fp16, cluster_of(2, 4));
    FAIL() << "fp16 priced on a device without an fp16 peak";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("peak_tflops.fp16"), std::string::npos) << what;
    EXPECT_NE(what.find("bf16, fp32"), std::string::npos) << what;
  }
}

// Two CPU ranks over one capped link, as clusters/this-machine-loopback.toml describes them.
sim::ClusterSpec loopback(sim::EfficiencyCurve efficiency) {
  sim::ClusterSpec c;
  c.name = "test-loopback";
  c.nodes = 2;
  c.devices_per_node = 1;
  c.device.name = "CPU rank";
  c.device.memory_bytes = 8.0 * (1 << 30);
  c.device.memory_bytes_per_second = 1e10;
  c.tiers = {{"loopback", 2, 50e6, 0, 60e-6, std::move(efficiency)}};
  return c;
}

planner::Profile measured_link(std::int64_t bytes, int ranks, double seconds) {
  planner::Profile p;
  p.replica_link = {bytes, ranks, seconds};
  return p;
}

TEST(CalibrateReplicaLink, TheMeasuredAllReduceTakesItsMeasuredTime) {
  // 50 MB each way at 50 MB/s: 1 s on the wire, plus 2 steps of 60 us. Measured 1.25 s more:
  // the link reached 0.8 of its rate at that size.
  const sim::ClusterSpec given = loopback({{4.2e6, 1e8}, {1.0, 0.6}});
  const double seconds = 1.25 + 120e-6;
  const sim::ClusterSpec c = calibrate_replica_link(given, measured_link(50'000'000, 2, seconds));
  const sim::EfficiencyCurve& curve = c.tiers.at(0).efficiency;
  ASSERT_EQ(curve.x, (std::vector<double>{4.2e6, 5e7}));  // the point beyond it is replaced
  EXPECT_DOUBLE_EQ(curve.fraction.at(0), 1.0);
  EXPECT_NEAR(curve.fraction.at(1), 0.8, 1e-12);
  EXPECT_NEAR(sim::collective_seconds(c, sim::CollectiveOp::all_reduce, 5e7, {0, 1}), seconds,
              1e-12);
  // Below the first point transfers are priced as before; beyond the measured size the
  // measured fraction holds.
  EXPECT_DOUBLE_EQ(sim::collective_seconds(c, sim::CollectiveOp::all_reduce, 1e6, {0, 1}),
                   sim::collective_seconds(given, sim::CollectiveOp::all_reduce, 1e6, {0, 1}));
  EXPECT_DOUBLE_EQ(c.tiers[0].efficiency_at(2e8), curve.fraction.at(1));
}

TEST(CalibrateReplicaLink, WithoutACurveTheFractionHoldsForEverySize) {
  const sim::ClusterSpec c =
      calibrate_replica_link(loopback({}), measured_link(50'000'000, 2, 2.0 + 120e-6));
  EXPECT_NEAR(c.tiers[0].efficiency_at(1e3), 0.5, 1e-12);
  EXPECT_NEAR(c.tiers[0].efficiency_at(5e7), 0.5, 1e-12);
}

TEST(CalibrateReplicaLink, AFasterMeasurementThanTheLinkIsTheWholeLink) {
  const sim::ClusterSpec c =
      calibrate_replica_link(loopback({}), measured_link(50'000'000, 2, 0.9));
  EXPECT_DOUBLE_EQ(c.tiers[0].efficiency_at(5e7), 1.0);
}

TEST(CalibrateReplicaLink, NothingMeasuredOrTooFewDevicesLeavesTheClusterAlone) {
  const sim::ClusterSpec given = loopback({{4.2e6, 5.04e7}, {1.0, 0.854}});
  for (const planner::Profile& p : {planner::Profile{}, measured_link(50'000'000, 4, 1.0)}) {
    const sim::ClusterSpec c = calibrate_replica_link(given, p);
    EXPECT_EQ(c.tiers[0].efficiency.x, given.tiers[0].efficiency.x);
    EXPECT_EQ(c.tiers[0].efficiency.fraction, given.tiers[0].efficiency.fraction);
  }
}

}  // namespace
}  // namespace oases::cluster
