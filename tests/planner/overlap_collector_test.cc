#include "planner/profiler.h"

#include <gtest/gtest.h>

#include <chrono>

namespace oases::planner {
namespace {

using schedule::Direction;
using schedule::Instruction;
using schedule::Op;

// Records of hand-made steps: every time is in seconds from one origin.
class OverlapCollectorTest : public ::testing::Test {
 protected:
  OverlapCollectorTest() {
    attention_.name = "attention.0";
    mlp_.name = "mlp.0";
    DegreeProfile& d = blocking_;
    d.segments["attention"] = {.forward_s = 1.0, .recompute_s = 0.25, .backward0_s = 2.0,
                               .backward1_s = 0.5};
    d.segments["mlp"] = {.forward_s = 1.0, .recompute_s = 0.5, .backward0_s = 2.0,
                         .backward1_s = 0.5};
    d.collectives["attention.fwd_s"] = 1.0;
    d.collectives["attention.bwd_s"] = 1.5;
    d.collectives["mlp.fwd_s"] = 1.0;
  }

  static runtime::InstructionRecord::Clock::time_point at(double seconds) {
    return runtime::InstructionRecord::Clock::time_point{} +
           std::chrono::duration_cast<runtime::InstructionRecord::Clock::duration>(
               std::chrono::duration<double>(seconds));
  }
  void compute(const ops::SegmentShape& segment, Instruction ins, double began, double finished) {
    runtime::InstructionRecord r;
    r.instruction = ins;
    r.segment = &segment;
    r.lane = runtime::Lane::compute;
    r.began = at(began);
    r.finished = at(finished);
    collector_.record(r);
  }
  void collective(const ops::SegmentShape& segment, Direction direction, double began,
                  double finished, bool replay = false) {
    runtime::InstructionRecord r;
    r.instruction = {.op = Op::wait, .direction = direction, .replay = replay};
    r.segment = &segment;
    r.lane = runtime::Lane::communication;
    r.began = at(began);
    r.finished = at(finished);
    collector_.record(r);
  }
  static Instruction forward() { return {.op = Op::forward}; }

  ops::SegmentShape attention_, mlp_;
  DegreeProfile blocking_;
  OverlapCollector collector_;
};

TEST_F(OverlapCollectorTest, ComputeUnderACollectiveSolvesForItsSlowdown) {
  // A forward of 1 s alone takes 1.5 s wholly under a collective: 1 = 0 + 1.5 / (1 + s),
  // s = 0.5. The collective (1 s alone) runs 1.5 s beside compute and 0.5 s alone after it:
  // 1 = 0.5 + 1.5 / (1 + c), c = 2.
  compute(attention_, forward(), 0.0, 1.5);
  collective(mlp_, Direction::forward, 0.0, 2.0);
  collector_.end_step();
  const OverlapCollector::Estimate e = collector_.estimate(blocking_);
  ASSERT_TRUE(e.compute_slowdown.has_value());
  ASSERT_TRUE(e.collective_slowdown.has_value());
  EXPECT_NEAR(*e.compute_slowdown, 0.5, 1e-9);
  EXPECT_NEAR(*e.collective_slowdown, 2.0, 1e-9);
  EXPECT_NEAR(e.compute_share_in_flight, 1.0, 1e-9);
  EXPECT_NEAR(e.collective_share_under_compute, 0.75, 1e-9);
}

TEST_F(OverlapCollectorTest, OnlyThePartUnderTheOtherLaneIsSlowed) {
  // Forward 1 s alone, traced [0, 1.25] with a collective on the wire over [0.75, 1.25]:
  // outside 0.75, inside 0.5: 1 = 0.75 + 0.5 / (1 + s), s = 1. The collective [0.75, 2.0]
  // (1 s alone): inside 0.5, outside 0.75, likewise c = 1.
  compute(attention_, forward(), 0.0, 1.25);
  collective(attention_, Direction::forward, 0.75, 2.0);
  collector_.end_step();
  const OverlapCollector::Estimate e = collector_.estimate(blocking_);
  ASSERT_TRUE(e.compute_slowdown && e.collective_slowdown);
  EXPECT_NEAR(*e.compute_slowdown, 1.0, 1e-9);
  EXPECT_NEAR(*e.collective_slowdown, 1.0, 1e-9);
  EXPECT_NEAR(e.compute_share_in_flight, 0.4, 1e-9);
}

TEST_F(OverlapCollectorTest, PricesEachInstructionAsTheCostModelDoes) {
  // Alone: backward stage 0 of attention 2 s, stage 1 of the MLP 0.5 s, a recompute of the
  // MLP's internals 0.5 s, one with the output (a whole forward) 1 s: 4 s. Traced in 5 s, all
  // under collectives: s = 0.25. The collectives: attention's backward one (1.5 s alone) and a
  // replayed forward one of the MLP (1 s alone, on the wire like any other), 2.5 s alone,
  // traced 5 s under compute: c = 1.
  compute(attention_, {.op = Op::backward, .stage = 0}, 0.0, 2.5);
  compute(mlp_, {.op = Op::backward, .stage = 1}, 2.5, 3.125);
  compute(mlp_, {.op = Op::recompute, .sets = ops::kInternals}, 3.125, 3.75);
  compute(mlp_, {.op = Op::recompute, .sets = static_cast<ops::TensorSets>(ops::kInternals | ops::kOutput)}, 3.75, 5.0);
  collective(attention_, Direction::backward, 0.0, 2.5);
  collective(mlp_, Direction::forward, 2.5, 5.0, /*replay=*/true);
  collector_.end_step();
  const OverlapCollector::Estimate e = collector_.estimate(blocking_);
  ASSERT_TRUE(e.compute_slowdown && e.collective_slowdown);
  EXPECT_NEAR(*e.compute_slowdown, 0.25, 1e-9);
  EXPECT_NEAR(*e.collective_slowdown, 1.0, 1e-9);
}

TEST_F(OverlapCollectorTest, TheEstimateIsTheMedianOfTheSteps) {
  // Forwards wholly under a collective, 1 s alone: traced 1.2, 1.9 and 1.3 s.
  double t = 0;
  for (double traced : {1.2, 1.9, 1.3}) {
    compute(attention_, forward(), t, t + traced);
    collective(mlp_, Direction::forward, t, t + traced);
    collector_.end_step();
    t += 10;
  }
  const OverlapCollector::Estimate e = collector_.estimate(blocking_);
  ASSERT_TRUE(e.compute_slowdown);
  EXPECT_NEAR(*e.compute_slowdown, 0.3, 1e-9);
}

TEST_F(OverlapCollectorTest, StepsThatDoNotOverlapMeasureNothing) {
  // A blocking schedule: compute, then its collective, then compute again, twice.
  for (int step = 0; step < 2; ++step) {
    const double t = 10.0 * step;
    compute(attention_, forward(), t, t + 1);
    collective(attention_, Direction::forward, t + 1, t + 2);
    compute(mlp_, forward(), t + 2, t + 3);
    collector_.end_step();
  }
  const OverlapCollector::Estimate e = collector_.estimate(blocking_);
  EXPECT_FALSE(e.compute_slowdown.has_value());
  EXPECT_FALSE(e.collective_slowdown.has_value());
  EXPECT_EQ(e.compute_share_in_flight, 0.0);
}

TEST_F(OverlapCollectorTest, AMinorityOfOverlappingStepsMeasuresNothing) {
  compute(attention_, forward(), 0, 1.5);
  collective(mlp_, Direction::forward, 0, 1.5);
  collector_.end_step();
  for (int step = 1; step < 3; ++step) {
    const double t = 10.0 * step;
    compute(attention_, forward(), t, t + 1);
    collective(attention_, Direction::forward, t + 1, t + 2);
    collector_.end_step();
  }
  EXPECT_FALSE(collector_.estimate(blocking_).compute_slowdown.has_value());
}

TEST_F(OverlapCollectorTest, AStepSlowerOutsideThanAloneIsLeftOut) {
  // Outside the collective the attention forward took 2.5 s where both forwards cost 2 s: the host slowed
  // down between the measurements, and the step cannot say what overlap did. The other two
  // steps give 0.5 and 0.1; the median of what is left is their mean.
  compute(attention_, forward(), 0, 2.5);
  compute(mlp_, forward(), 2.5, 3.5);
  collective(mlp_, Direction::forward, 2.5, 3.5);
  collector_.end_step();
  compute(attention_, forward(), 10, 11.5);
  collective(mlp_, Direction::forward, 10, 11.5);
  collector_.end_step();
  compute(attention_, forward(), 20, 21.1);
  collective(mlp_, Direction::forward, 20, 21.1);
  collector_.end_step();
  const OverlapCollector::Estimate e = collector_.estimate(blocking_);
  ASSERT_TRUE(e.compute_slowdown);
  EXPECT_NEAR(*e.compute_slowdown, 0.3, 1e-9);
}

TEST(BlockingSeconds, NamesTheProfiledTimeOfEachInstruction) {
  DegreeProfile d;
  d.segments["mlp"] = {.forward_s = 1, .recompute_s = 2, .backward0_s = 3, .backward1_s = 4};
  d.collectives["mlp.bwd_s"] = 5;
  EXPECT_EQ(blocking_seconds(d, "mlp", {.op = Op::forward}), 1);
  EXPECT_EQ(blocking_seconds(d, "mlp", {.op = Op::recompute, .sets = ops::kCore}), 2);
  EXPECT_EQ(blocking_seconds(d, "mlp", {.op = Op::recompute, .sets = static_cast<ops::TensorSets>(ops::kCore | ops::kOutput)}),
            1);
  EXPECT_EQ(blocking_seconds(d, "mlp", {.op = Op::backward, .stage = 1}), 4);
  EXPECT_EQ(blocking_seconds(d, "mlp", {.op = Op::wait, .direction = Direction::backward}), 5);
  EXPECT_EQ(blocking_seconds(d, "mlp", {.op = Op::wait, .direction = Direction::forward}), 0);
  EXPECT_EQ(blocking_seconds(d, "attention", {.op = Op::forward}), 0);
}

}  // namespace
}  // namespace oases::planner
