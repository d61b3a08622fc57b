// The cost model on a synthetic profile whose predictions follow by hand.
#include "planner/cost_model.h"
#include "planner/planner.h"

#include "core/error.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(none.state_bytes, 4 * 1000);
  EXPECT_LT(fine.activation_bytes, none.activation_bytes);
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
  EXPECT_EQ(mixed.state_bytes, 4 * 1400);
  // Every layer at degree 2 is the uniform plan of the whole-model view.
  EXPECT_NEAR(predict_plan(p, {2, 2}, megatron, 4).step_seconds,
              predict_uniform(p, 2, megatron, 4).step_seconds, 1e-12);
  // Blocking schedules pay each reshard whole: one gather into layer 0's rows (backward) and
  // one out of them (forward).
  p.reshards["1-2"] = 0.5e-3;
  EXPECT_NEAR(predict_plan(p, {1, 2}, megatron, 4).step_seconds - mixed.step_seconds, 1e-3,
              1e-12);
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
