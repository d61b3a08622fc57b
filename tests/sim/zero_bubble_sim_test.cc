// The simulator prices zero-bubble's split backward: with a weight-gradient share, an input-only
// stage 0 and its BackwardWeight together cost what the whole stage costs, so a one-stage
// zero-bubble step computes as long as the same step with whole backwards, and the cost model
// is never asked about the split instructions themselves.
#include "schedule/pipeline_lowering.h"
#include "sim/schedule_sim.h"
#include "support/gpt_program.h"

#include <gtest/gtest.h>

namespace oases::sim {
namespace {

using schedule::Instruction;
using schedule::Op;

TEST(ZeroBubbleSim, SplitBackwardsCostWhatWholeBackwardsCost) {
  ops::Program program = testing::gpt_program(2);
  for (ops::SegmentShape& shape : program.segments) shape.has_weight_part = shape.layer >= 0;
  const schedule::ScheduleSpec spec{schedule::ScheduleKind::megatron, schedule::Recompute::none,
                                    3, 1, true};
  const auto lowered = [&](schedule::PipelineKind kind) {
    schedule::PipelineSpec pipeline;
    pipeline.kind = kind;
    pipeline.stages = 1;
    pipeline.micro_batches = 3;
    return schedule::lower_pipeline(program, spec, pipeline, 0);
  };
  const schedule::Schedule split = lowered(schedule::PipelineKind::zero_bubble);
  const schedule::Schedule whole = lowered(schedule::PipelineKind::one_f_one_b);

  CostModel costs;
  int asked_about_split = 0;
  costs.compute = [&](const Instruction& ins) {
    if (ins.op == Op::backward_weight || ins.input_only) ++asked_about_split;
    if (ins.op == Op::forward) return 1.0;
    return ins.stage == 0 ? 3.0 : 0.5;
  };
  costs.collective = [](const Instruction&) { return 0.0; };
  costs.weight_gradient_share = 1.0 / 3.0;
  const SimResult zero_bubble = simulate(split, costs);
  EXPECT_EQ(asked_about_split, 0);
  EXPECT_NEAR(zero_bubble.compute_seconds, simulate(whole, costs).compute_seconds, 1e-9);
  EXPECT_GT(zero_bubble.compute_seconds, 0);

  // Without a share the cost model prices the split instructions itself: here the input part
  // at the whole stage's cost and W at none (what a profile of whole stages gives the planner).
  costs.weight_gradient_share = 0;
  int weight_parts = 0;
  for (const Instruction& ins : split) weight_parts += ins.op == Op::backward_weight;
  EXPECT_EQ(weight_parts, 4 * 3);
  costs.compute = [](const Instruction& ins) {
    if (ins.op == Op::backward_weight) return 0.0;
    if (ins.op == Op::forward) return 1.0;
    return ins.stage == 0 ? 3.0 : 0.5;
  };
  EXPECT_NEAR(simulate(split, costs).compute_seconds, simulate(whole, costs).compute_seconds, 1e-9);
}

}  // namespace
}  // namespace oases::sim
