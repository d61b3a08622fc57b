// The joint planner (cluster/joint_plan.h): its choice against brute force on small spaces
// (every global choice and every assignment of per-layer policies simulated whole), the
// errors for a memory limit below any plan and for a world no layout divides, and its plan
// file: the settings round-trip and a run naming the file gets the same config as the
// settings given by hand.
#include "cluster/joint_plan.h"

#include "cluster/cluster_profile.h"
#include "cluster/cluster_simulation.h"
#include "core/error.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "support/files.h"
#include "support/test_clusters.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace oases::cluster {
namespace {

// A fast switch inside a node, a slow network between nodes.
sim::ClusterSpec cluster_of(int nodes, int per_node) {
  return testing::switched_cluster(nodes, per_node, 20e9, 2e9, 4e9);
}

plan::RunConfig tiny_config(int world, int layers) {
  plan::RunConfig config = plan::parse_run_config("", "test");
  config.model.layers = layers;
  config.model.hidden = 256;
  config.model.heads = 4;
  config.model.ffn_hidden = 1024;
  config.model.vocab_size = 512;
  config.model.seq_len = 64;
  config.train.micro_batch = 2;
  config.train.global_batch = 8;
  config.parallel.tp = world;
  return config;
}

double peak_memory(const ClusterSimulation& s) {
  double most = 0;
  for (const SimulatedRank& rank : s.ranks)
    most = std::max(most, static_cast<double>(planner::resident_memory(rank.memory).total()));
  return most;
}

std::vector<std::string> per_layer_lists(const std::vector<std::string>& words, int layers) {
  std::vector<std::string> lists{""};
  for (int l = 0; l < layers; ++l) {
    std::vector<std::string> longer;
    for (const std::string& prefix : lists)
      for (const std::string& w : words) longer.push_back(prefix.empty() ? w : prefix + "," + w);
    lists = std::move(longer);
  }
  return lists;
}

struct BruteForce {
  double best_step = std::numeric_limits<double>::infinity();
  std::string best;
  int simulated = 0;
};

// Every layout of `world` ranks without context parallelism or pipelines, every schedule
// family and sub-batch count, micro-batch, sequence parallelism, ZeRO stage, and every
// per-layer recomputation list the family allows, simulated whole; the fastest that fits.
BruteForce brute_force(const plan::RunConfig& base, const sim::ClusterSpec& cluster,
                       std::int64_t limit, const std::vector<std::int64_t>& zeros) {
  struct Family {
    const char* name;
    std::vector<int> sub_batches;
    std::vector<std::string> recompute;
  };
  const std::vector<Family> families{{"megatron", {1}, {"none", "selective", "full"}},
                                     {"cross-pass", {1, 2}, {"none", "selective", "full"}},
                                     {"fine-grained", {1}, {"none", "fine-grained"}},
                                     {"oases", {1, 2}, {"none", "fine-grained"}},
                                     {"oases-interleaved", {2}, {"none", "fine-grained"}}};
  const std::int64_t world = base.parallel.tp * base.parallel.dp;
  BruteForce out;
  for (std::int64_t tp = 1; tp <= world; tp *= 2) {
    const std::int64_t dp = world / tp;
    for (const Family& family : families)
      for (int sub_batches : family.sub_batches)
        for (std::int64_t micro_batch : {1, 2, 4})
          for (bool sp : {false, true})
            for (std::int64_t zero : zeros)
              for (const std::string& recompute :
                   per_layer_lists(family.recompute, static_cast<int>(base.model.layers))) {
                plan::RunConfig c = base;
                c.parallel.tp = tp;
                c.parallel.dp = dp;
                c.parallel.schedule = family.name;
                c.parallel.sub_batches = sub_batches;
                c.train.micro_batch = micro_batch;
                c.parallel.sequence_parallel = sp;
                c.parallel.zero = zero;
                c.parallel.recompute = recompute;
                try {
                  c.validate();
                  const ClusterSimulation s = simulate_cluster(c, cluster);
                  ++out.simulated;
                  if (peak_memory(s) <= static_cast<double>(limit) &&
                      s.step_seconds < out.best_step) {
                    out.best_step = s.step_seconds;
                    out.best =
                        fmt::format("tp {} dp {} {} sb {} mb {} sp {} zero {} recompute {}", tp, dp,
                                    family.name, sub_batches, micro_batch, sp, zero, recompute);
                  }
                } catch (const UserError&) {
                }
              }
  }
  return out;
}

JointSearchOptions small_space() {
  JointSearchOptions options;
  options.fixed = {"parallel.cp", "parallel.pp", "parallel.activation_compression"};
  options.simulate_best = 100000;  // every priced candidate simulated whole
  return options;
}

// The least and the most memory of the plans with every layer at one recomputation policy.
std::pair<double, double> uniform_memory_range(const plan::RunConfig& base,
                                               const sim::ClusterSpec& cluster) {
  double least = std::numeric_limits<double>::infinity(), most = 0;
  for (const char* recompute : {"none", "full"}) {
    plan::RunConfig c = base;
    c.parallel.tp = 1;
    c.parallel.dp = base.parallel.tp * base.parallel.dp;
    c.parallel.schedule = "megatron";
    c.parallel.recompute = recompute;
    const double memory = peak_memory(simulate_cluster(c, cluster));
    least = std::min(least, memory);
    most = std::max(most, memory);
  }
  return {least, most};
}

// On 2 and 4 ranks, with no limit and with limits that force recomputation on some layers (ZeRO
// searched, or kept at 0 so that only recomputation makes a plan fit), the plan chosen is as fast
// as the fastest feasible plan of the brute force (the estimate can misjudge by what a layer's
// marginal cost leaves out, which these spaces do not show).
TEST(JointPlan, NeverWorseThanBruteForceOnSmallSpaces) {
  for (int world : {2, 4})
    for (bool zero_searched : {true, false}) {
      const sim::ClusterSpec cluster = cluster_of(1, world);
      const plan::RunConfig base = tiny_config(world, 3);
      const auto [least, most] = uniform_memory_range(base, cluster);
      for (double fraction : {0.0, 0.5, 0.9}) {
        if (!zero_searched && fraction == 0.0) continue;
        const std::int64_t limit =
            fraction == 0.0 ? static_cast<std::int64_t>(cluster.device.memory_bytes)
                            : static_cast<std::int64_t>(least + fraction * (most - least));
        const std::string what = "world " + std::to_string(world) + ", limit " +
                                 std::to_string(limit) + (zero_searched ? "" : ", zero 0");
        JointSearchOptions options = small_space();
        options.memory_limit = limit;
        if (!zero_searched) options.fixed.push_back("parallel.zero");
        const JointPlanReport report = search_joint_plan(base, cluster, {}, options);
        const BruteForce brute = brute_force(
            base, cluster, limit,
            zero_searched ? std::vector<std::int64_t>{0, 1, 2, 3} : std::vector<std::int64_t>{0});
        ASSERT_GT(brute.simulated, 0) << what;
        ASSERT_TRUE(report.chosen.simulated) << what;
        EXPECT_LE(report.chosen.memory.total(), limit) << what;
        EXPECT_LE(report.chosen.step_seconds, brute.best_step * (1 + 1e-12))
            << what << ": chosen " << report.chosen.summary() << "\nbrute force's best:\n"
            << brute.best;
      }
    }
}

// The per-layer chain alone (every global choice kept): under limits between every layer
// recomputed and none, the policies chosen are as fast as the best of all 3^4 lists that fit,
// and some limit makes them mix.
TEST(JointPlan, LayerPoliciesMatchBruteForce) {
  const sim::ClusterSpec cluster = cluster_of(1, 2);
  plan::RunConfig base = tiny_config(2, 4);
  base.parallel.tp = 1;
  base.parallel.dp = 2;
  base.parallel.schedule = "cross-pass";
  base.parallel.sub_batches = 1;
  base.parallel.recompute = "none";
  const auto [least, most] = uniform_memory_range(base, cluster);
  int mixed = 0;
  for (double fraction : {0.2, 0.45, 0.7}) {
    const auto limit = static_cast<std::int64_t>(least + fraction * (most - least));
    JointSearchOptions options = small_space();
    options.memory_limit = limit;
    for (const char* key :
         {"parallel.tp", "parallel.dp", "parallel.schedule", "parallel.sub_batches",
          "train.micro_batch", "parallel.zero", "parallel.sequence_parallel"})
      options.fixed.push_back(key);
    const JointPlanReport report = search_joint_plan(base, cluster, {}, options);
    double best = std::numeric_limits<double>::infinity();
    std::string best_list;
    for (const std::string& list : per_layer_lists({"none", "selective", "full"}, 4)) {
      plan::RunConfig c = base;
      c.parallel.recompute = list;
      const ClusterSimulation s = simulate_cluster(c, cluster);
      if (peak_memory(s) <= static_cast<double>(limit) && s.step_seconds < best) {
        best = s.step_seconds;
        best_list = list;
      }
    }
    EXPECT_LE(report.chosen.step_seconds, best * (1 + 1e-12))
        << "limit " << limit << ": chosen " << report.chosen.summary() << ", brute force's best "
        << best_list;
    for (const auto& [key, value] : report.chosen.settings)
      if (key == "parallel.recompute" && value.find(',') != std::string::npos) ++mixed;
  }
  EXPECT_GT(mixed, 0) << "no limit made the chain mix recomputation policies";
}

// The prediction of the chosen plan is the whole simulation of its own settings.
TEST(JointPlan, ChosenPredictionIsItsOwnSimulation) {
  const sim::ClusterSpec cluster = cluster_of(2, 2);
  const plan::RunConfig base = tiny_config(4, 4);
  const JointPlanReport report = search_joint_plan(base, cluster, {}, small_space());
  const ClusterSimulation s =
      simulate_cluster(apply_settings(base, report.chosen.settings), cluster);
  EXPECT_EQ(report.chosen.step_seconds, s.step_seconds);
  EXPECT_EQ(static_cast<double>(report.chosen.memory.total()), peak_memory(s));
  for (const JointCandidate& a : report.alternatives) {
    EXPECT_TRUE(a.simulated);
    EXPECT_GE(a.step_seconds, report.chosen.step_seconds);
  }
  ASSERT_FALSE(report.best_of_family.empty());
  EXPECT_TRUE(report.best_of_family.contains(report.chosen.family));
}

TEST(JointPlan, ResultDoesNotDependOnThreads) {
  const sim::ClusterSpec cluster = cluster_of(1, 4);
  const plan::RunConfig base = tiny_config(4, 3);
  JointSearchOptions one = small_space(), two = small_space();
  one.threads = 1;
  two.threads = 2;
  one.simulate_best = two.simulate_best = 3;
  const JointPlanReport a = search_joint_plan(base, cluster, {}, one);
  const JointPlanReport b = search_joint_plan(base, cluster, {}, two);
  EXPECT_EQ(a.chosen.settings, b.chosen.settings);
  EXPECT_EQ(a.chosen.step_seconds, b.chosen.step_seconds);
  ASSERT_EQ(a.alternatives.size(), b.alternatives.size());
  for (std::size_t i = 0; i < a.alternatives.size(); ++i)
    EXPECT_EQ(a.alternatives[i].settings, b.alternatives[i].settings);
}

TEST(JointPlan, MemoryBelowAnyPlanNamesTheLeastThatFitsAndItsLayouts) {
  const sim::ClusterSpec cluster = cluster_of(1, 2);
  JointSearchOptions options = small_space();
  options.memory_limit = 1 << 20;
  try {
    search_joint_plan(tiny_config(2, 3), cluster, {}, options);
    FAIL() << "a 1 MiB limit fits nothing";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("fits the memory limit of 0.00 GiB"), std::string::npos) << message;
    EXPECT_NE(message.find("the smallest memory that fits is"), std::string::npos) << message;
    EXPECT_NE(message.find("GiB: tp "), std::string::npos) << message;
    EXPECT_NE(message.find("raise the limit"), std::string::npos) << message;
  }
}

TEST(JointPlan, WorldNoLayoutDividesListsWhy) {
  // 3 ranks: 4 heads do not split in 3, 2 layers not over 3 stages, a batch of 4 not over 3
  // replicas, 64 positions not over 3 context-parallel ranks' 6 chunks.
  plan::RunConfig config = tiny_config(1, 2);
  config.parallel.tp = 3;
  config.train.global_batch = 4;
  config.train.micro_batch = 1;
  try {
    search_joint_plan(config, cluster_of(1, 4), {});
    FAIL() << "no layout of 3 ranks runs this model";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("no layout of the 3 ranks can run this config"), std::string::npos)
        << message;
    EXPECT_NE(message.find("parallel.tp"), std::string::npos) << message;
    EXPECT_NE(message.find("parallel.pp"), std::string::npos) << message;
  }
}

// On a cluster that computes from profiles (this machine's), a candidate is priced by a profile
// measured in its layout, micro-batch and sub-batches, and only by one: here the config's own.
TEST(JointPlan, ProfilesPriceTheLayoutsTheyWereMeasuredIn) {
  plan::RunConfig base = tiny_config(2, 3);
  base.parallel.schedule = "oases";
  base.parallel.sub_batches = 2;
  base.train.micro_batch = 4;  // sub-batches of 2, which split over degree 1's two replicas
  const planner::Profile profile = cluster_profile(base, cluster_of(1, 2));
  sim::ClusterSpec machine = cluster_of(1, 2);
  machine.device.peak_flops.clear();  // compute from the profile
  const JointPlanReport report = search_joint_plan(base, machine, {profile}, small_space());
  const auto setting = [&](const std::string& key) {
    for (const auto& [k, v] : report.chosen.settings)
      if (k == key) return v;
    return std::string();
  };
  EXPECT_EQ(setting("parallel.tp"), "2");
  EXPECT_EQ(setting("train.micro_batch"), "4");
  EXPECT_EQ(setting("parallel.sub_batches"), "2");
  EXPECT_GT(report.excluded.at("not priced by the profiles given"), 0);
  const ClusterSimulation whole = [&] {
    ClusterSimulationOptions options;
    options.profile = &profile;
    return simulate_cluster(apply_settings(base, report.chosen.settings), machine, options);
  }();
  EXPECT_EQ(report.chosen.step_seconds, whole.step_seconds);
}

TEST(JointPlan, FixingASettingItDoesNotChooseIsAnError) {
  JointSearchOptions options = small_space();
  options.fixed.push_back("train.lr");
  try {
    search_joint_plan(tiny_config(2, 3), cluster_of(1, 2), {}, options);
    FAIL() << "train.lr is not searched";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--fix train.lr: not a setting the joint search chooses; valid: "
                           "parallel.tp, "),
              std::string::npos)
        << message;
  }
}

// The plan file holds the chosen settings; a config naming it is the config with the settings
// applied by hand.
TEST(JointPlan, PlanFileRoundTripsAndAppliesItsSettings) {
  const sim::ClusterSpec cluster = cluster_of(1, 2);
  const plan::RunConfig base = tiny_config(2, 3);
  JointSearchOptions options = small_space();
  options.memory_limit =
      static_cast<std::int64_t>(0.5 * (uniform_memory_range(base, cluster).first +
                                       uniform_memory_range(base, cluster).second));
  const JointPlanReport report = search_joint_plan(base, cluster, {}, options);
  const testing::TempDir dir("joint_plan_file");
  const std::string path = (dir.path() / "plan.json").string();
  const planner::Plan file = joint_plan_file(report, base);
  const int tp = std::stoi(file.settings.front().second);
  planner::write_plan(file, tp, path);
  // The file keeps the settings, not their order.
  auto sorted = [](std::vector<std::pair<std::string, std::string>> v) {
    std::ranges::sort(v);
    return v;
  };
  EXPECT_EQ(sorted(planner::read_plan_settings(path)), sorted(report.chosen.settings));
  const planner::Plan read = planner::read_plan(path, tp, base.model.layers);
  EXPECT_EQ(sorted(read.settings), sorted(report.chosen.settings));
  EXPECT_EQ(read.predicted_memory, report.chosen.memory);
  EXPECT_EQ(read.predicted_step_seconds, report.chosen.step_seconds);
  EXPECT_FALSE(read.report_json.empty());

  plan::RunConfig named =
      plan::parse_run_config(plan::to_toml(base), "test", {"parallel.plan=" + path});
  plan::RunConfig by_hand = apply_settings(base, report.chosen.settings);
  by_hand.parallel.plan = path;
  EXPECT_EQ(plan::to_toml(named), plan::to_toml(by_hand));
}

// Pipelines are first estimated from one stage's simulation composed through the pipeline's
// orders; the best of those are priced again by reduced simulations of the pipeline. The
// choice must be the one that pricing every pipeline so from the start makes.
TEST(JointPlan, ComposedPipelineEstimatesChooseAsExactOnesDo) {
  const sim::ClusterSpec cluster = cluster_of(2, 4);
  for (const std::int64_t layers : {4, 8}) {
    plan::RunConfig base = tiny_config(8, static_cast<int>(layers));
    base.train.global_batch = 32;
    JointSearchOptions composed;
    composed.fixed = {"parallel.cp", "parallel.activation_compression"};
    composed.simulate_best = 12;
    composed.max_micro_batch = 4;
    // Without a limit, then with too little memory for the unlimited choice (chains of
    // recomputation over pipeline stages).
    for (const double share : {0.0, 0.7}) {
      JointSearchOptions exact = composed;
      exact.exact_estimates = true;
      if (share > 0) {
        const JointPlanReport free = search_joint_plan(base, cluster, {}, exact);
        composed.memory_limit = exact.memory_limit =
            static_cast<std::int64_t>(share * static_cast<double>(free.chosen.memory.total()));
      }
      const JointPlanReport a = search_joint_plan(base, cluster, {}, composed);
      const JointPlanReport b = search_joint_plan(base, cluster, {}, exact);
      SCOPED_TRACE(b.chosen.summary());
      if (share == 0 && layers == 4) {
        std::cerr << format_joint_plan_report(a, base) << "\n=====\n"
                  << format_joint_plan_report(b, base);
      }
      EXPECT_EQ(a.chosen.settings, b.chosen.settings);
      EXPECT_EQ(a.chosen.step_seconds, b.chosen.step_seconds);
      // The space holds pipelines, and the search met them.
      EXPECT_TRUE(b.chosen.settings[3].second != "1" ||
                  std::ranges::any_of(b.alternatives, [](const JointCandidate& c) {
                    return c.settings[3].second != "1";
                  }));
    }
  }
}

// A pipeline's ranks keep more micro-batches in flight only until its warm-up is full: priced
// on reduced models with few micro-batches, the estimate of a run with many more holds its
// memory there rather than extending it linearly, and agrees with the whole simulation.
TEST(JointPlan, PipelineMemoryEstimateHoldsPastTheWarmUp) {
  const sim::ClusterSpec cluster = cluster_of(1, 2);
  for (const char* pipeline : {"1f1b", "interleaved", "zero-bubble"}) {
    SCOPED_TRACE(pipeline);
    plan::RunConfig base = tiny_config(1, 8);
    base.parallel.pp = 2;
    base.parallel.pipeline = pipeline;
    base.parallel.virtual_stages = std::string_view(pipeline) == "interleaved" ? 2 : 1;
    base.parallel.schedule = "megatron";
    base.parallel.recompute = "none";
    base.train.micro_batch = 1;
    base.train.global_batch = 32;  // 32 micro-batches; the reduced models run at most 6
    JointSearchOptions options;
    options.fixed = {"parallel.tp",
                     "parallel.cp",
                     "parallel.dp",
                     "parallel.pp",
                     "parallel.schedule",
                     "parallel.sub_batches",
                     "train.micro_batch",
                     "parallel.pipeline",
                     "parallel.virtual_stages",
                     "parallel.sequence_parallel",
                     "parallel.zero",
                     "parallel.offload",
                     "parallel.recompute",
                     "parallel.activation_compression"};
    const JointPlanReport report = search_joint_plan(base, cluster, {}, options);
    ASSERT_TRUE(report.chosen.simulated);
    const auto simulated = static_cast<double>(report.chosen.memory.total());
    EXPECT_NEAR(static_cast<double>(report.chosen.estimated_memory_bytes), simulated,
                0.02 * simulated);
    EXPECT_NEAR(report.chosen.estimated_step_seconds, report.chosen.step_seconds,
                0.02 * report.chosen.step_seconds);
  }
}

}  // namespace
}  // namespace oases::cluster
