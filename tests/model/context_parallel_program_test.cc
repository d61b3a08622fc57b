// Context parallelism as the schedules see it: the program of one rank of a cp group (built by
// shape alone). The all-to-all kind splits every attention layer into its projections, its
// core and its output projection, whose all-to-alls over the cp group are collectives like any
// other: the oases schedule overlaps each with the other sub-batch's compute and never replays
// one, and the kept activations per rank are those of half the tokens, the core's q|k|v and
// output held once each. The ring kind passes key/value blocks by shifts, each travelling
// while a step attends to the block in hand.
#include "comm/communicator.h"
#include "model/model.h"
#include "schedule/schedule.h"
#include "support/overlap_checks.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace oases::model {
namespace {

using ops::CollectiveKind;
using schedule::Op;

ModelOptions options(comm::Communicator& tp, comm::Communicator* cp, int sub_batches) {
  ModelOptions o;
  o.tp = &tp;
  o.cp = cp;
  o.micro_batch = 4;
  o.sub_batches = sub_batches;
  o.shape_only = true;
  return o;
}

TEST(ContextParallelProgram, AttentionIsThreeSegmentsAroundTwoAllToAlls) {
  comm::ShapeOnlyCommunicator tp(0, 1, "tp"), cp(1, 2, "cp");
  const Model model(testing::tiny_model(2), options(tp, &cp, 1));
  std::vector<std::string> names;
  for (const ops::SegmentShape& s : model.program().segments) names.push_back(s.name);
  const std::vector<std::string> expected{
      "embedding",   "attention.0",      "attention_core.0", "attention_out.0", "mlp.0",
      "attention.1", "attention_core.1", "attention_out.1",  "mlp.1",           "head"};
  ASSERT_EQ(std::vector<std::string>(names.begin(), names.begin() + 10), expected);
  const auto& segments = model.program().segments;
  for (int layer = 0; layer < 2; ++layer) {
    const std::size_t first = 1 + 4 * static_cast<std::size_t>(layer);
    const ops::SegmentShape &projections = segments[first], &core = segments[first + 1],
                            &output = segments[first + 2], &mlp = segments[first + 3];
    EXPECT_EQ(projections.forward_kind, CollectiveKind::all_to_all);
    EXPECT_EQ(projections.backward_kind, CollectiveKind::all_reduce);
    EXPECT_EQ(core.forward_kind, CollectiveKind::all_to_all);
    EXPECT_EQ(core.backward_kind, CollectiveKind::all_to_all);
    EXPECT_EQ(output.forward_kind, CollectiveKind::all_reduce);
    EXPECT_EQ(output.backward_kind, CollectiveKind::all_to_all);
    for (const ops::SegmentShape* s : {&projections, &core, &output}) {
      EXPECT_EQ(s->context_parallel_ranks, 2) << s->name;
      EXPECT_EQ(s->layer, layer) << s->name;
      EXPECT_TRUE(s->recomputable) << s->name;
    }
    // The MLP adds the residual the projections' checkpoint holds, three segments back.
    EXPECT_EQ(mlp.residual_of, static_cast<int>(first)) << mlp.name;
    EXPECT_EQ(core.sets, ops::kCheckpoint | ops::kCore);
  }
}

// At cp 2 a rank keeps, per layer, its half of the tokens' residual-stream values, norms and
// MLP activations, plus the core's q|k|v and output of every token for half the heads (the
// same element counts as its own tokens' q|k|v and output) and the output projection's input:
// of what one process keeps for all tokens, half, plus the output projection's input.
TEST(ContextParallelProgram, KeepsHalfThePerTokenActivationsPlusTheOutputProjectionsInput) {
  comm::ShapeOnlyCommunicator tp(0, 1, "tp"), cp(0, 2, "cp");
  const ModelConfig c = testing::tiny_model(2);
  schedule::ScheduleSpec spec;
  spec.kind = schedule::ScheduleKind::megatron;
  spec.recompute = schedule::Recompute::none;
  spec.micro_batches = 1;
  const auto kept_by_layers = [&](const Model& model) {
    std::size_t bytes = 0;
    for (const ops::SegmentShape& s : model.program().segments)
      if (s.layer >= 0) bytes += s.checkpoint_bytes + s.internals_bytes + s.core_bytes;
    return bytes;
  };
  const Model whole(c, options(tp, nullptr, 1));
  const Model split(c, options(tp, &cp, 1));
  const double n = 4.0 * static_cast<double>(c.seq_len), C = static_cast<double>(c.hidden);
  // Per layer: the output projection's input, n / 2 tokens of C; the statistics (norms, lse)
  // halve with the tokens, within each set's 64-byte padding.
  const double extra = 2 * (n / 2) * C * 4;
  const double half = static_cast<double>(kept_by_layers(whole)) / 2;
  EXPECT_NEAR(static_cast<double>(kept_by_layers(split)), half + extra, 2 * 2 * 3 * 64.0);
  EXPECT_LT(
      schedule::peak_activation_bytes(split.program(), schedule::generate(split.program(), spec)),
      schedule::peak_activation_bytes(whole.program(), schedule::generate(whole.program(), spec)));
}

// Under oases (tp 2 x cp 2) every forward and backward collective of a sub-batch, the
// all-to-alls included, is in flight while the other sub-batch computes, and fine-grained
// recomputation replays none.
TEST(ContextParallelProgram, OasesOverlapsEveryAllToAllAndReplaysNone) {
  comm::ShapeOnlyCommunicator tp(1, 2, "tp"), cp(1, 2, "cp");
  ModelConfig c = testing::tiny_model(2);
  c.heads = 4;  // a head group of one head per tensor- and context-parallel rank
  const Model model(c, options(tp, &cp, 2));
  schedule::ScheduleSpec spec;
  spec.kind = schedule::ScheduleKind::oases;
  spec.recompute = schedule::Recompute::fine_grained;
  spec.micro_batches = 2;
  spec.sub_batches = 2;
  const schedule::Schedule steps = schedule::generate(model.program(), spec);
  int all_to_alls = 0;
  for (const schedule::Instruction& start : testing::expect_every_collective_overlapped(steps)) {
    const ops::SegmentShape& shape =
        model.program().segments[static_cast<std::size_t>(start.segment)];
    const bool forward = start.direction == schedule::Direction::forward;
    if ((forward ? shape.forward_kind : shape.backward_kind) == CollectiveKind::all_to_all)
      ++all_to_alls;
  }
  // 2 micro-batches x 2 sub-batches x 2 layers x (2 forward + 2 backward).
  EXPECT_EQ(all_to_alls, 2 * 2 * 2 * 4);
}

// Context parallelism of the ring kind at cp 4: an attention layer is its projections, the
// step over the local block, and for each later block a receive segment and its step, the
// last step ending in the output projection. The blocks travel by shifts over the cp group,
// forward one way and their dk|dv backward the other.
TEST(ContextParallelProgram, RingAttentionIsTwoSegmentsPerRankAroundShifts) {
  comm::ShapeOnlyCommunicator tp(0, 1, "tp"), cp(1, 4, "cp");
  ModelOptions o = options(tp, &cp, 1);
  o.cp_kind = ops::ContextParallelKind::ring;
  const Model model(testing::tiny_model(2), o);
  const auto& segments = model.program().segments;
  std::vector<std::string> names;
  for (const ops::SegmentShape& s : segments) names.push_back(s.name);
  const std::vector<std::string> expected{
      "embedding",          "attention.0",        "attention_ring.0.0",
      "attention_recv.0.1", "attention_ring.0.1", "attention_recv.0.2",
      "attention_ring.0.2", "attention_out.0",    "mlp.0",
      "attention.1"};
  ASSERT_EQ(std::vector<std::string>(names.begin(), names.begin() + 10), expected);
  const std::size_t first = 1;
  const ops::SegmentShape& projections = segments[first];
  EXPECT_EQ(projections.forward_kind, CollectiveKind::shift);
  EXPECT_EQ(projections.backward_kind, CollectiveKind::all_reduce);
  EXPECT_EQ(projections.never_dropped, ops::kCore);
  for (std::size_t s = first + 1; s < first + 7; ++s) {
    const ops::SegmentShape& shape = segments[s];
    EXPECT_EQ(shape.context_parallel_ranks, 4) << shape.name;
    EXPECT_EQ(shape.layer, 0) << shape.name;
    const bool step = shape.name.rfind("attention_ring", 0) == 0;
    EXPECT_EQ(shape.beside_transfers, step) << shape.name;
    if (step) {
      EXPECT_FALSE(shape.has_forward_collective || shape.has_backward_collective) << shape.name;
      EXPECT_EQ(shape.reads_sets_of.front(), static_cast<int>(first)) << shape.name;
    } else {
      EXPECT_EQ(shape.backward_kind, CollectiveKind::shift) << shape.name;
      EXPECT_EQ(shape.sets, ops::kCheckpoint) << shape.name;
    }
  }
  EXPECT_EQ(segments[first + 6].forward_kind, CollectiveKind::all_reduce);
  EXPECT_EQ(segments[first + 7].residual_of, static_cast<int>(first));
}

// Under the megatron schedule, which overlaps nothing across instances, every ring shift of an
// instance is in flight while a step of the same instance attends to the block in hand: the
// Wait of each shift comes after that step's Forward (forward) or Backward (backward). Full
// recomputation replays the forward shifts (it replays every collective) and skips the steps.
TEST(ContextParallelProgram, EveryRingShiftTravelsWhileAStepComputes) {
  comm::ShapeOnlyCommunicator tp(0, 1, "tp"), cp(2, 4, "cp");
  ModelOptions o = options(tp, &cp, 1);
  o.cp_kind = ops::ContextParallelKind::ring;
  const Model model(testing::tiny_model(2), o);
  const auto& segments = model.program().segments;
  for (const schedule::Recompute recompute :
       {schedule::Recompute::none, schedule::Recompute::selective, schedule::Recompute::full}) {
    schedule::ScheduleSpec spec;
    spec.kind = schedule::ScheduleKind::megatron;
    spec.recompute = recompute;
    spec.micro_batches = 2;
    const schedule::Schedule steps = schedule::generate(model.program(), spec);
    int shifts = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const schedule::Instruction& start = steps[i];
      if (start.op != Op::start || start.replay) continue;
      const ops::SegmentShape& shape = segments[static_cast<std::size_t>(start.segment)];
      const bool forward = start.direction == schedule::Direction::forward;
      if ((forward ? shape.forward_kind : shape.backward_kind) != CollectiveKind::shift) continue;
      ++shifts;
      const int step = start.segment + (forward ? 1 : -1);
      bool computed = false;
      std::size_t j = i + 1;
      for (; j < steps.size(); ++j) {
        const schedule::Instruction& ins = steps[j];
        if (ins.micro_batch != start.micro_batch) continue;
        if (ins.segment == step && (ins.op == Op::forward || ins.op == Op::backward))
          computed = true;
        if (ins.op == Op::wait && ins.segment == start.segment && ins.direction == start.direction)
          break;
      }
      ASSERT_LT(j, steps.size()) << "no Wait for " << schedule::to_string(start);
      EXPECT_TRUE(computed) << schedule::to_string(start) << " waits before "
                            << segments[static_cast<std::size_t>(step)].name << " ran";
      EXPECT_TRUE(segments[static_cast<std::size_t>(step)].beside_transfers);
    }
    // 2 micro-batches x 2 layers x (3 forward + 3 backward) shifts.
    EXPECT_EQ(shifts, 2 * 2 * 6);
    for (const schedule::Instruction& ins : steps) {
      if (ins.op == Op::recompute) {
        EXPECT_FALSE(segments[static_cast<std::size_t>(ins.segment)].beside_transfers);
      }
    }
  }
}

// Under oases (tp 2 x cp 2, ring) every collective of a sub-batch, the shifts included, is in
// flight while the other sub-batch computes, and fine-grained recomputation replays none.
TEST(ContextParallelProgram, OasesOverlapsEveryRingShiftAndReplaysNone) {
  comm::ShapeOnlyCommunicator tp(1, 2, "tp"), cp(1, 2, "cp");
  ModelOptions o = options(tp, &cp, 2);
  o.cp_kind = ops::ContextParallelKind::ring;
  const Model model(testing::tiny_model(2), o);
  schedule::ScheduleSpec spec;
  spec.kind = schedule::ScheduleKind::oases;
  spec.recompute = schedule::Recompute::fine_grained;
  spec.micro_batches = 2;
  spec.sub_batches = 2;
  const schedule::Schedule steps = schedule::generate(model.program(), spec);
  int shifts = 0;
  for (const schedule::Instruction& start : testing::expect_every_collective_overlapped(steps)) {
    const ops::SegmentShape& shape =
        model.program().segments[static_cast<std::size_t>(start.segment)];
    const bool forward = start.direction == schedule::Direction::forward;
    if ((forward ? shape.forward_kind : shape.backward_kind) == CollectiveKind::shift) ++shifts;
  }
  // 2 micro-batches x 2 sub-batches x 2 layers x (1 forward + 1 backward).
  EXPECT_EQ(shifts, 2 * 2 * 2 * 2);
}

}  // namespace
}  // namespace oases::model
