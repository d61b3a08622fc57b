// What the engine runs and what the cluster simulation prices are the same: for a grid of
// configs (every schedule and recompute policy, every pipeline, every ZeRO stage, every
// precision, and uniform, listed and file plans), each rank's engine and that rank's shape-only
// model in the cluster simulation (cluster::build_shape_only_rank) are built from one RunPlan,
// and they must agree on the schedule spec, on the instruction list of a training step and on
// every memory figure, byte for byte. Run at 4 ranks (tp 2 x dp 2, pp 2 x dp 2, tp 2 x pp 2).
#include "cluster/cluster_simulation.h"
#include "comm/mesh.h"
#include "mpi_test_support.h"
#include "plan/run_plan.h"
#include "planner/planner.h"
#include "sim/cluster.h"
#include "train/engine.h"
#include "train/trainer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace oases::cluster {
namespace {

namespace mpitest = comm::mpitest;

constexpr const char* kCluster = OASES_SOURCE_DIR "/clusters/rtx3090-pcie.toml";

plan::RunConfig base(int tp, int dp, int pp) {
  plan::RunConfig c;
  c.model.layers = 4;
  c.model.hidden = 16;
  c.model.heads = 2;
  c.model.ffn_hidden = 32;
  c.model.vocab_size = 30;
  c.model.seq_len = 8;
  c.model.attention_dropout = 0.1;
  c.parallel.tp = tp;
  c.parallel.dp = dp;
  c.parallel.pp = pp;
  // Micro-batches of 4 split into sub-batches of 2, which the two replicas of a layer at degree
  // 1 under tp 2 divide.
  c.train.micro_batch = 4;
  c.train.global_batch = 4 * 4 * dp;  // four micro-batches per step
  return c;
}

// How many configs of the grid ran; every rank counts alike.
struct Tally {
  int built = 0, rejected = 0;
};

// Builds the engine and the simulated rank of `config` on this rank and compares them; a
// config that does not validate (settings that cannot run together) is skipped on every rank
// alike.
void compare(const plan::RunConfig& config, comm::Mesh& mesh, const sim::ClusterSpec& cluster,
             const std::string& what, Tally& tally) {
  std::optional<plan::RunPlan> plan;
  try {
    config.validate();  // as parse_run_config does for a config a user writes
    plan = plan::make_run_plan(config, mesh.world_rank());
  } catch (const UserError&) {
    ++tally.rejected;
    return;
  }
  SCOPED_TRACE(what);
  ++tally.built;
  train::TrainingEngine engine(*plan, train::parallel_groups(mesh));
  const std::unique_ptr<ShapeOnlyRank> simulated = build_shape_only_rank(*plan, cluster);
  EXPECT_EQ(engine.plan().schedule.kind, plan->schedule.kind);
  EXPECT_EQ(engine.plan().schedule.sharded_params, plan->schedule.sharded_params);
  EXPECT_EQ(engine.plan().schedule.deferred_param_gather, plan->schedule.deferred_param_gather);
  EXPECT_EQ(engine.schedule_for(engine.local_batch(), true), simulated->schedule)
      << "the simulation prices another instruction list than the engine runs";
  const planner::MemoryFigures ran = engine.memory_figures();
  const planner::MemoryFigures priced = simulated->memory;
  EXPECT_EQ(ran.params, priced.params);
  EXPECT_EQ(ran.working_copy, priced.working_copy);
  EXPECT_EQ(ran.grads, priced.grads);
  EXPECT_EQ(ran.optimizer, priced.optimizer);
  EXPECT_EQ(ran.activations, priced.activations);
  EXPECT_EQ(ran.offloaded, priced.offloaded);
}

using Setter = std::function<void(plan::RunConfig&)>;
struct Choice {
  std::string name;
  Setter apply;
};

std::vector<Choice> precisions() {
  std::vector<Choice> out;
  for (const char* p : {"fp32", "fp64", "bf16", "fp16"})
    out.push_back({p, [p](plan::RunConfig& c) {
                     c.train.precision = p;
                     // 16-bit products by the path every CPU has, so every rank rounds alike
                     // without measuring.
                     if (std::string(p) == "bf16" || std::string(p) == "fp16")
                       c.train.gemm16_path = "convert+sgemm";
                   }});
  return out;
}

std::vector<Choice> zero_stages() {
  std::vector<Choice> out;
  for (int z = 0; z <= 3; ++z)
    out.push_back({fmt::format("zero {}", z), [z](plan::RunConfig& c) { c.parallel.zero = z; }});
  return out;
}

std::vector<Choice> schedules() {
  std::vector<Choice> out;
  for (const char* recompute : {"none", "full", "selective", "sqrt"})
    out.push_back({fmt::format("megatron/{}", recompute), [recompute](plan::RunConfig& c) {
                     c.parallel.schedule = "megatron";
                     c.parallel.recompute = recompute;
                   }});
  for (const char* kind : {"fine-grained", "cross-pass", "oases", "oases-interleaved", "oases-deferred"})
    out.push_back({kind, [kind](plan::RunConfig& c) { c.parallel.schedule = kind; }});
  return out;
}

// Runs `config` under every combination of the choice lists.
void for_each_combination(const plan::RunConfig& config, const std::vector<std::vector<Choice>>& lists,
                          const std::function<void(const plan::RunConfig&, const std::string&)>& run,
                          std::size_t at = 0, const std::string& what = "") {
  if (at == lists.size()) return run(config, what);
  for (const Choice& choice : lists[at]) {
    plan::RunConfig c = config;
    choice.apply(c);
    for_each_combination(c, lists, run, at + 1, what + (what.empty() ? "" : ", ") + choice.name);
  }
}

class PlanAgreement : public ::testing::Test {
 protected:
  void SetUp() override {
    if (mpitest::runtime().world_size() != 4) GTEST_SKIP() << "runs at 4 ranks";
    cluster_ = sim::load_cluster(kCluster);
  }
  void run_grid(int tp, int dp, int pp, const std::vector<std::vector<Choice>>& lists) {
    comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), tp, dp, pp, mpitest::test_options());
    Tally tally;
    for_each_combination(base(tp, dp, pp), lists,
                         [&](const plan::RunConfig& c, const std::string& what) {
                           compare(c, mesh, cluster_, what, tally);
                         });
    // The grid must exercise something: most of its configs run.
    EXPECT_GT(tally.built, tally.rejected);
    if (mpitest::runtime().world_rank() == 0)
      std::printf("tp %d dp %d pp %d: %d configs compared, %d rejected by the plan\n", tp, dp, pp,
                  tally.built, tally.rejected);
  }
  sim::ClusterSpec cluster_;
};

TEST_F(PlanAgreement, SchedulesZeroStagesAndPrecisionsUnderTensorAndDataParallelism) {
  run_grid(2, 2, 1, {schedules(), zero_stages(), precisions()});
}

TEST_F(PlanAgreement, LayerPlansListedAndFromAFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("oases_plan_agreement_{}", getpid());
  const std::string file = (dir / "plan.json").string();
  if (mpitest::runtime().world_rank() == 0) {
    planner::Plan plan;
    plan.degrees = {2, 1, 1, 2};
    planner::write_plan(plan, 2, file);
  }
  comm::Mesh::create(mpitest::runtime(), 4, 1, 1, mpitest::test_options()).world().barrier();
  std::vector<Choice> plans;
  for (const std::string& p : std::vector<std::string>{"uniform", "1,2,2,1", file})
    plans.push_back({p, [p](plan::RunConfig& c) { c.parallel.plan = p; }});
  std::vector<Choice> partitioned{{"whole checkpoints", [](plan::RunConfig&) {}},
                                  {"partitioned checkpoints", [](plan::RunConfig& c) {
                                     c.parallel.partition_activations = true;
                                   }}};
  run_grid(2, 2, 1, {plans, zero_stages(), partitioned, {precisions()[0], precisions()[2]}});
  comm::Mesh::create(mpitest::runtime(), 4, 1, 1, mpitest::test_options()).world().barrier();
  if (mpitest::runtime().world_rank() == 0) std::filesystem::remove_all(dir);
}

std::vector<Choice> pipelines() {
  std::vector<Choice> out;
  for (const char* kind : {"gpipe", "1f1b", "zero-bubble", "2bw"})
    out.push_back({kind, [kind](plan::RunConfig& c) { c.parallel.pipeline = kind; }});
  out.push_back({"interleaved", [](plan::RunConfig& c) {
                   c.parallel.pipeline = "interleaved";
                   c.parallel.virtual_stages = 2;
                 }});
  return out;
}

TEST_F(PlanAgreement, PipelinesWithZeroAndPrecisions) {
  run_grid(1, 2, 2, {pipelines(), zero_stages(), precisions()});
}

TEST_F(PlanAgreement, PipelinesUnderTensorParallelism) {
  std::vector<Choice> kinds{{"megatron", [](plan::RunConfig& c) { c.parallel.schedule = "megatron"; }},
                            {"oases", [](plan::RunConfig& c) { c.parallel.schedule = "oases"; }}};
  run_grid(2, 1, 2, {pipelines(), kinds, {precisions()[0], precisions()[2]}});
}

}  // namespace
}  // namespace oases::cluster
