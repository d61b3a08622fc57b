// The cost model on a synthetic profile whose predictions follow by hand.
#include "planner/cost_model.h"
#include "planner/planner.h"

#include "core/error.h"
#include "support/files.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

namespace oases::planner {
namespace {

// Two layers; every segment action takes 1 ms per profiled row (rows = degree), every
// collective 0.5 ms per row at degree 2 (none at degree 1), the optimizer 10 ms.
Profile synthetic(double collective_ms) {
  Profile p;
  p.model.layers = 2;
  p.tp = 2;
  p.micro_batch = 4;
  p.sub_batches = 2;
  for (int k : {1, 2}) {
    DegreeProfile d;
    d.degree = k;
    d.rows = k;
    for (const char* kind : {"embedding", "attention", "mlp", "head"})
      d.segments[kind] = {1e-3 * k, 1e-3 * k, 1e-3 * k, 1e-3 * k};
    if (k == 2)
      for (const char* c : {"embedding.fwd_s", "attention.fwd_s", "attention.bwd_s", "mlp.fwd_s",
                            "mlp.bwd_s", "head.bwd_s"})
        d.collectives[c] = collective_ms * 1e-3 * k;
    d.optimizer_s = 0.01;
    d.parameter_bytes = 1000 * (3 - k);
    d.parameter_bytes_per_layer = 400 * (3 - k);
    d.activation_bytes["attention"] = {
        {"checkpoint", 64 * k}, {"internals", 256 * k}, {"core", 64 * k}};
    d.activation_bytes["mlp"] = {{"checkpoint", 64 * k}, {"internals", 512 * k}, {"core", 0}};
    d.activation_bytes["head"] = {{"internals", 128 * k}};
    d.static_activation_bytes = 1024 * k;
    p.degrees.push_back(d);
  }
  p.reshards["1-2"] = collective_ms * 1e-3;
  return p;
}

schedule::ScheduleSpec spec(schedule::ScheduleKind kind, schedule::Recompute r, int sub_batches) {
  return {kind, r, 1, sub_batches, true};
}

TEST(CostModel, WithoutCommunicationTheStepIsItsComputeAndOptimizer) {
  const Profile p = synthetic(0.0);
  // Degree 2, megatron without recomputation, one instance of 2 rows (the micro-batch of 4 over
  // one replica of degree 2... k / tp = 1, so 4 rows): every action scales to 4 ms.
  const Prediction none = predict_uniform(
      p, 2, spec(schedule::ScheduleKind::megatron, schedule::Recompute::none, 1), 4);
  // Forward: 6 segments; backward: embedding 1 stage, 5 segments x 2 stages.
  EXPECT_NEAR(none.step_seconds, (6 + 1 + 10) * 4e-3 + 0.01, 1e-12);
  EXPECT_NEAR(none.exposed_comm_seconds, 0.0, 1e-12);
  // Fine-grained recomputation adds one action per layer segment (4).
  const Prediction fine = predict_uniform(
      p, 2, spec(schedule::ScheduleKind::fine_grained, schedule::Recompute::fine_grained, 1), 4);
  EXPECT_NEAR(fine.step_seconds - none.step_seconds, 4 * 4e-3, 1e-12);
  EXPECT_EQ(none.memory.state(), 4 * 1000);
  EXPECT_LT(fine.memory.activations, none.memory.activations);
}

TEST(CostModel, OverlapHidesWhatBlockingSchedulesPay) {
  const Profile p = synthetic(0.5);  // each collective half a segment action
  const Prediction fine = predict_uniform(
      p, 2, spec(schedule::ScheduleKind::fine_grained, schedule::Recompute::fine_grained, 1), 4);
  const Prediction oases = predict_uniform(
      p, 2, spec(schedule::ScheduleKind::oases, schedule::Recompute::fine_grained, 2), 4);
  EXPECT_GT(fine.exposed_comm_seconds, 0.0);
  EXPECT_NEAR(oases.exposed_comm_seconds, 0.0, 1e-12);
  EXPECT_LT(oases.step_seconds, fine.step_seconds);
}

// A mixed plan runs each layer on its degree's rows: layer 0 at degree 1 works on half the
// rows (2 of a micro-batch of 4), layer 1 at degree 2 on all 4; the embedding and head on 4.
TEST(CostModel, MixedPlanPaysEachLayerAtItsDegreeAndItsReshards) {
  Profile p = synthetic(0.0);
  const auto megatron = spec(schedule::ScheduleKind::megatron, schedule::Recompute::none, 1);
  const Prediction mixed = predict_plan(p, {1, 2}, megatron, 4);
  // Forward: embedding 4 + layer 0 (2 + 2) + layer 1 (4 + 4) + head 4 = 20 ms; backward:
  // head 8, layer 1 16, layer 0 8, embedding 4 = 36 ms. Reshards add no compute. The optimizer
  // updates 1000 - 2 x 400 + 800 + 400 = 1400 bytes of parameters: 10 ms x 1.4.
  EXPECT_NEAR(mixed.step_seconds, 56e-3 + 14e-3, 1e-12);
  EXPECT_EQ(mixed.memory.state(), 4 * 1400);
  // Every layer at degree 2 is the uniform plan of the whole-model view.
  EXPECT_NEAR(predict_plan(p, {2, 2}, megatron, 4).step_seconds,
              predict_uniform(p, 2, megatron, 4).step_seconds, 1e-12);
  // Blocking schedules pay each reshard whole: one gather into layer 0's rows (backward) and
  // one out of them (forward).
  p.reshards["1-2"] = 0.5e-3;
  EXPECT_NEAR(predict_plan(p, {1, 2}, megatron, 4).step_seconds - mixed.step_seconds, 1e-3,
              1e-12);
}

// Partitioned checkpoints (ZeRO-R): the model keeps a slice of each layer's kept checkpoint, so
// the predicted activations fall; each gather costs what the profile's reshard from degree 1
// moves (the same all-gather), hidden behind the compute ahead of its reader unless compute
// slows under communication.
TEST(CostModel, PartitionedCheckpointsKeepLessAndPriceTheirGathers) {
  Profile p = synthetic(0.0);
  p.reshards["1-2"] = 0.5e-3;
  auto full = spec(schedule::ScheduleKind::megatron, schedule::Recompute::full, 1);
  auto partitioned = full;
  partitioned.partitioned_checkpoints = true;
  for (const double slowdown : {0.0, 1.0}) {
    const Prediction whole = predict_uniform(p, 2, full, 4, slowdown);
    const Prediction sliced = predict_uniform(p, 2, partitioned, 4, slowdown);
    EXPECT_LT(sliced.memory.activations, whole.memory.activations);
    EXPECT_EQ(sliced.memory.state(), whole.memory.state());
    EXPECT_NEAR(sliced.exposed_comm_seconds, whole.exposed_comm_seconds, 1e-12);
    if (slowdown == 0) {
      EXPECT_NEAR(sliced.step_seconds, whole.step_seconds, 1e-12);
    } else {
      EXPECT_GT(sliced.step_seconds, whole.step_seconds + 1e-4);
    }
    // The plan view agrees with the whole-model view.
    const Prediction plan = predict_plan(p, {2, 2}, partitioned, 4, slowdown);
    EXPECT_NEAR(plan.step_seconds, sliced.step_seconds, 1e-12);
  }
  // A layer at degree 1 has nothing to partition.
  const Prediction mixed = predict_plan(p, {1, 1}, partitioned, 4);
  EXPECT_EQ(mixed.memory.activations, predict_plan(p, {1, 1}, full, 4).memory.activations);
}

// The state splits by the profile's ratios; the parts add up to what the ratios' sum gives,
// to the byte, however each part rounds.
TEST(CostModel, StateSplitsIntoParametersGradientsAndOptimizerState) {
  Profile p = synthetic(0.0);
  p.param_bytes_ratio = 1.5;
  p.grad_bytes_ratio = 1.0 / 3;
  p.optimizer_bytes_ratio = 0.7;
  for (const std::int64_t bytes : {0, 1, 7, 1000, 123457, 1 << 30}) {
    const MemoryBytes m = state_memory(p, bytes);
    const auto b = static_cast<double>(bytes);
    EXPECT_EQ(m.params, std::llround(1.5 * b));
    EXPECT_EQ(m.grads, std::llround(b / 3));
    EXPECT_EQ(m.state(), std::llround((1.5 + 1.0 / 3 + 0.7) * b)) << bytes;
    EXPECT_NEAR(static_cast<double>(m.optimizer), 0.7 * b, 1.0) << bytes;
    EXPECT_EQ(m.activations, 0);
  }
  // A prediction carries the parts; its memory is their sum with the activations.
  const Prediction mixed =
      predict_plan(p, {1, 2}, spec(schedule::ScheduleKind::megatron, schedule::Recompute::none, 1), 4);
  EXPECT_EQ(mixed.memory.params, std::llround(1.5 * 1400));
  EXPECT_GT(mixed.memory.activations, 0);
  EXPECT_EQ(mixed.memory_bytes(), mixed.memory.params + mixed.memory.grads +
                                      mixed.memory.optimizer + mixed.memory.activations);
}

TEST(CostModel, ADegreeMissingFromTheProfileIsAnError) {
  EXPECT_THROW(
      predict_uniform(synthetic(0.0), 4,
                      spec(schedule::ScheduleKind::megatron, schedule::Recompute::none, 1), 4),
      UserError);
}

}  // namespace
}  // namespace oases::planner

namespace oases::planner {
namespace {

// With communication at degree 2 and none at degree 1, degree 1 is faster but holds twice the
// weights: a limit between the two makes the planner mix degrees, a lower one is an error that
// says by how much.
TEST(Planner, MixesDegreesWhenMemoryBindsAndSaysWhenNothingFits) {
  Profile p = synthetic(0.5);
  p.model.layers = 4;
  for (auto& d : p.degrees) {
    d.parameter_bytes = (8 << 20) / d.degree;
    d.parameter_bytes_per_layer = (2 << 20) / d.degree;
  }
  const auto oases = spec(schedule::ScheduleKind::oases, schedule::Recompute::fine_grained, 2);
  const PlanReport free = make_plan(p, oases, 4, 0);
  ASSERT_EQ(free.uniform.size(), 2u);
  EXPECT_EQ(free.chosen.degrees, (std::vector<int>{1, 1, 1, 1}));
  const std::int64_t between =
      (free.uniform[0].prediction.memory_bytes() + free.uniform[1].prediction.memory_bytes()) / 2;
  const PlanReport bound = make_plan(p, oases, 4, between);
  EXPECT_FALSE(bound.uniform[0].fits);
  EXPECT_TRUE(bound.uniform[1].fits);
  int ones = 0, twos = 0;
  for (int k : bound.chosen.degrees) (k == 1 ? ones : twos)++;
  EXPECT_GT(ones, 0);
  EXPECT_GT(twos, 0);
  EXPECT_LE(bound.chosen.predicted_memory_bytes, between);
  try {
    make_plan(p, oases, 4, 1 << 20);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "parallel.memory_limit = 1048576 bytes is too small for any plan"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace oases::planner

namespace oases::planner {
namespace {

// Four layers whose weights dwarf their activations: 2 MiB per layer at degree 1, half at 2;
// degree 1 is the faster (no collectives).
Profile weighty() {
  Profile p = synthetic(0.5);
  p.model.layers = 4;
  for (auto& d : p.degrees) {
    d.parameter_bytes = (8 << 20) / d.degree;
    d.parameter_bytes_per_layer = (2 << 20) / d.degree;
  }
  return p;
}

// The report's memory line is the chosen plan's prediction by kind, which sums to its total,
// labelled with the settings the profile's ratios were measured under.
TEST(Planner, ReportGivesTheChosenPlansMemoryPerRankByKind) {
  Profile p = weighty();
  p.param_bytes_ratio = 1.5;
  p.grad_bytes_ratio = 1;
  p.optimizer_bytes_ratio = 2;
  p.precision = "bf16";
  p.zero = 1;
  const auto oases = spec(schedule::ScheduleKind::oases, schedule::Recompute::fine_grained, 2);
  const PlanReport report = make_plan(p, oases, 4, 0);
  const MemoryBytes& m = report.chosen.predicted_memory;
  EXPECT_EQ(m, predict_plan(p, report.chosen.degrees, oases, 4).memory);
  EXPECT_EQ(m.total(), report.chosen.predicted_memory_bytes);
  EXPECT_GT(m.params, 0);
  EXPECT_GT(m.grads, 0);
  EXPECT_GT(m.optimizer, 0);
  EXPECT_GT(m.activations, 0);
  const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  const std::string line = fmt::format(
      "memory per rank (pred.): params {:.1f} MiB, grads {:.1f} MiB, optimizer {:.1f} MiB, "
      "activations {:.1f} MiB, total {:.1f} MiB (state as profiled under zero 1, offload none, "
      "precision bf16)\n",
      mib(m.params), mib(m.grads), mib(m.optimizer), mib(m.activations),
      mib(report.chosen.predicted_memory_bytes));
  const std::string text = format_plan_report(report, oases, 0);
  EXPECT_NE(text.find(line), std::string::npos) << line << text;
  // A profile that does not record its settings: the line without the label.
  p.precision.clear();
  EXPECT_NE(format_plan_report(make_plan(p, oases, 4, 0), oases, 0).find(" MiB\ndegrees per layer"),
            std::string::npos);
}

// ZeRO-3 over 4 data-parallel ranks keeps a quarter of the parameters, gradients and optimizer
// state on a rank: under the same limit, the plan that ZeRO-0's state pushes to degree 2
// stays at the faster degree 1.
TEST(Planner, SmallerStatePerRankLetsLowerDegreesFit) {
  const auto oases = spec(schedule::ScheduleKind::oases, schedule::Recompute::fine_grained, 2);
  const std::int64_t limit = 20 << 20;
  Profile zero0 = weighty();  // 1, 1 and 2 bytes per parameter byte: 32 MiB at degree 1
  // ZeRO-3 over 4 data-parallel ranks, as `oases plan` applies it to a profile measured at
  // dp = 1: a quarter of each kind, 8 MiB at degree 1.
  const Profile zero3 = with_zero_share(weighty(), 3, 4);
  EXPECT_DOUBLE_EQ(zero3.param_bytes_ratio, 0.25);
  EXPECT_DOUBLE_EQ(zero3.grad_bytes_ratio, 0.25);
  EXPECT_DOUBLE_EQ(zero3.optimizer_bytes_ratio, 0.5);
  const Profile zero1 = with_zero_share(weighty(), 1, 4);
  EXPECT_DOUBLE_EQ(zero1.param_bytes_ratio, 1);
  EXPECT_DOUBLE_EQ(zero1.grad_bytes_ratio, 1);
  EXPECT_DOUBLE_EQ(zero1.optimizer_bytes_ratio, 0.5);
  EXPECT_EQ(with_zero_share(weighty(), 2, 2).grad_bytes_ratio, 0.5);
  const PlanReport unsharded = make_plan(zero0, oases, 4, limit);
  const PlanReport sharded = make_plan(zero3, oases, 4, limit);
  EXPECT_FALSE(unsharded.uniform[0].fits);
  EXPECT_TRUE(sharded.uniform[0].fits);
  EXPECT_EQ(sharded.chosen.degrees, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_GT(std::count(unsharded.chosen.degrees.begin(), unsharded.chosen.degrees.end(), 2), 0);
  for (const PlanReport* r : {&unsharded, &sharded})
    EXPECT_LE(r->chosen.predicted_memory_bytes, limit);
  EXPECT_LT(sharded.chosen.predicted_step_seconds, unsharded.chosen.predicted_step_seconds);
  // The same parameters on a rank, a quarter of the state.
  EXPECT_EQ(sharded.uniform[0].prediction.memory.state() * 4,
            unsharded.uniform[0].prediction.memory.state());
}

}  // namespace
}  // namespace oases::planner

namespace oases::planner {
namespace {

// A predictor standing in for the run's own program (cluster/plan_prediction.h): each layer at
// degree k costs cost_ms[k] and holds bytes[k]; it records every degree asked for.
struct RecordingPredictor {
  std::map<int, double> cost_ms;
  std::map<int, std::int64_t> bytes;
  std::vector<int>* asked;
  Prediction operator()(const std::vector<int>& degrees, const std::vector<bool>& moe) const {
    EXPECT_EQ(moe.size(), degrees.size());
    Prediction p;
    p.step_seconds = 0.001;
    p.memory.activations = 1 << 20;
    for (int k : degrees) {
      asked->push_back(k);
      p.step_seconds += cost_ms.at(k) * 1e-3;
      p.memory.activations += bytes.at(k);
    }
    return p;
  }
};

TEST(Planner, WithSequenceParallelismPlansTheDegreesAboveOneByTheGivenPredictor) {
  Profile p = synthetic(0.5);
  p.model.layers = 4;
  const auto oases = spec(schedule::ScheduleKind::oases, schedule::Recompute::fine_grained, 2);
  std::vector<int> asked;
  // Degree 1 would be the cheapest, but a sequence-parallel profile has no degree-1 layers.
  const RecordingPredictor predict{{{1, 1.0}, {2, 3.0}}, {{1, 200 << 10}, {2, 100 << 10}}, &asked};
  p.layout.sequence_parallel = true;
  const PlanReport report = make_plan(p, oases, 0, false, predict);
  ASSERT_EQ(report.uniform.size(), 1u);
  EXPECT_EQ(report.uniform[0].degree, 2);
  EXPECT_EQ(report.chosen.degrees, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_NEAR(report.chosen.predicted_step_seconds, 0.001 + 4 * 3e-3, 1e-12);
  EXPECT_EQ(report.chosen.predicted_memory_bytes, (1 << 20) + 4 * (100 << 10));
  EXPECT_TRUE(std::ranges::none_of(asked, [](int k) { return k == 1; }));
  // Without sequence parallelism degree 1 is a candidate again, and the predictor's costs
  // (not the cost model's) choose it.
  p.layout.sequence_parallel = false;
  asked.clear();
  const PlanReport plain = make_plan(p, oases, 0, false, predict);
  ASSERT_EQ(plain.uniform.size(), 2u);
  EXPECT_EQ(plain.chosen.degrees, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_NEAR(plain.chosen.predicted_step_seconds, 0.001 + 4 * 1e-3, 1e-12);
  // A memory limit between the two uniform plans mixes them.
  const PlanReport bound =
      make_plan(p, oases, (1 << 20) + 2 * (200 << 10) + 2 * (100 << 10), false, predict);
  EXPECT_EQ(std::ranges::count(bound.chosen.degrees, 1), 2);
  EXPECT_EQ(std::ranges::count(bound.chosen.degrees, 2), 2);
}

TEST(CostModel, AProgramSegmentTheProfileHasNoTimesForIsAnErrorSayingWhy) {
  Profile p = synthetic(0.0);
  for (const char* kind : {"head_softmax", "head_loss"}) p.degrees[1].segments[kind] = {};
  ops::Program program = program_at(p, 2, 2.0);
  EXPECT_NO_THROW(check_profiled_kinds(p, program));
  ops::SegmentShape shard;
  shard.name = "attention_in.0";
  shard.degree = 1;
  program.segments.insert(program.segments.begin() + 1, shard);
  testing::expect_user_error([&] { check_profiled_kinds(p, program); },
                             {"no times for segment attention_in.0 (kind \"attention_in\") at "
                              "tensor-parallel degree 1; it was measured with no sequence or "
                              "context parallelism: re-run `oases profile`"});
  p.layout.sequence_parallel = true;
  testing::expect_user_error([&] { check_profiled_kinds(p, program); },
                             {"a group of one has no sequence-parallel segments to measure: give "
                              "every layer a degree above 1"});
}

TEST(CostModel, ProfiledCostsPriceCollectivesByKindAndDegreeAndReplicasByBucket) {
  Profile p = synthetic(0.5);
  p.degrees[1].replica_reduce_per_layer_s = 0.002;  // a context-parallel pair at degree T
  p.degrees[0].replica_reduce_per_layer_s = 0.003;
  const ops::Program program = program_at(p, 2, 2.0);
  const sim::CostModel costs = profiled_costs(p, program, 2.0, {1, 2});
  schedule::Instruction start;
  start.op = schedule::Op::start;
  start.segment = 1;  // attention.0 at degree 2, 2 rows as profiled
  start.direction = schedule::Direction::forward;
  EXPECT_NEAR(costs.collective(start), 0.5e-3 * 2, 1e-15);
  // Bucket 1 + l: layer l at its degree; bucket 0: the parameters besides the layers at the
  // whole group's rate per byte (1000 - 2 x 400 bytes at 0.002 s per 400).
  EXPECT_NEAR(costs.reduce_grads(1), 0.003, 1e-15);
  EXPECT_NEAR(costs.reduce_grads(2), 0.002, 1e-15);
  EXPECT_NEAR(costs.reduce_grads(0), 0.002 * 200 / 400, 1e-15);
  EXPECT_EQ(costs.reduce_grads(3), 0.0);
  // The optimizer over the parameters the degrees leave here: 1000 - 2 x 400 + 800 + 400.
  EXPECT_NEAR(costs.optimizer_step, 0.01 * 1400 / 1000, 1e-15);
}

}  // namespace
}  // namespace oases::planner
