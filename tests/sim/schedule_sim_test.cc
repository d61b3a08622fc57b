// The simulator on GPT-shaped schedules with uniform costs, where the step time follows by
// hand: blocking schedules pay every collective; overlapped ones hide a collective no longer
// than the compute of the other sub-batch's phase; a parameter gather (ZeRO-3) hides behind the
// compute issued ahead of its wait.
#include "sim/schedule_sim.h"

#include "support/gpt_program.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace oases::sim {
namespace {

using schedule::Op;
using schedule::Recompute;
using schedule::ScheduleKind;
using schedule::ScheduleSpec;

struct Counts {
  int compute = 0, collectives = 0;
};
Counts count(const schedule::Schedule& s) {
  Counts c;
  for (const auto& ins : s) {
    if (ins.op == Op::forward || ins.op == Op::recompute || ins.op == Op::backward) ++c.compute;
    if (ins.op == Op::start) ++c.collectives;
  }
  return c;
}

CostModel uniform(double compute, double collective) {
  CostModel m;
  m.compute = [=](const schedule::Instruction&) { return compute; };
  m.collective = [=](const schedule::Instruction&) { return collective; };
  return m;
}

TEST(Simulator, BlockingSchedulesPayEveryCollective) {
  const ops::Program program = testing::gpt_program(3);
  for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective}) {
    const auto s = schedule::generate(program, {ScheduleKind::megatron, r, 2, 1, true});
    const Counts n = count(s);
    const SimResult result = simulate(s, uniform(1.0, 0.25));
    EXPECT_DOUBLE_EQ(result.step_seconds, n.compute * 1.0 + n.collectives * 0.25);
    EXPECT_DOUBLE_EQ(result.exposed_comm_seconds, n.collectives * 0.25);
    EXPECT_DOUBLE_EQ(result.comm_seconds, n.collectives * 0.25);
  }
}

// Compressed activations: each Encode and Decode takes the codec's price on the compute lane
// (a blocking schedule adds them to its step); without a codec they are free.
TEST(Simulator, EncodesAndDecodesTakeTheCodecsTimeOnTheComputeLane) {
  const ops::Program program = testing::gpt_program(3);
  auto s = schedule::generate(program, {ScheduleKind::megatron, Recompute::none, 2, 1, true});
  const double plain = simulate(s, uniform(1.0, 0.25)).step_seconds;
  schedule::compress_kept_sets(program, s, ops::ActivationEncoding::fp8_e4m3);
  const auto passes = std::ranges::count_if(s, [](const schedule::Instruction& ins) {
    return ins.op == Op::encode || ins.op == Op::decode;
  });
  ASSERT_GT(passes, 0);
  EXPECT_DOUBLE_EQ(simulate(s, uniform(1.0, 0.25)).step_seconds, plain);
  CostModel priced = uniform(1.0, 0.25);
  priced.codec = [](const schedule::Instruction& ins) {
    return ins.op == Op::encode ? 0.125 : 0.0625;
  };
  const auto encodes = std::ranges::count_if(
      s, [](const schedule::Instruction& ins) { return ins.op == Op::encode; });
  const SimResult result = simulate(s, priced);
  EXPECT_DOUBLE_EQ(result.step_seconds, plain + 0.125 * static_cast<double>(encodes) +
                                            0.0625 * static_cast<double>(passes - encodes));
}

// MoE all-to-alls cost their per-peer volume: (ranks - 1) x (latency + block / bandwidth); the
// other collectives keep their price.
TEST(Simulator, AllToAllsCostTheirPerPeerVolume) {
  const Link link{1e9, 1e-5};
  EXPECT_DOUBLE_EQ(all_to_all_seconds(8e6, 4, link), 3 * (1e-5 + 2e6 / 1e9));
  EXPECT_DOUBLE_EQ(all_to_all_seconds(8e6, 2, link), 1e-5 + 4e6 / 1e9);
  EXPECT_DOUBLE_EQ(all_to_all_seconds(8e6, 1, link), 0.0);
  ops::Program program = testing::gpt_program(3);
  ops::SegmentShape& moe = program.segments[2];  // the first MLP, made an expert exchange
  moe.forward_kind = moe.backward_kind = ops::CollectiveKind::all_to_all;
  moe.collective_ranks = 4;
  moe.forward_collective_elements = moe.backward_collective_elements = 1'000'000;
  program.set_element_bytes = 8;
  const auto s = schedule::generate(program, {ScheduleKind::megatron, Recompute::none, 2, 1, true});
  CostModel costs = uniform(1.0, 0.25);
  price_all_to_alls(costs, program, link);
  int exchanges = 0;
  for (const auto& ins : s) exchanges += ins.op == Op::start && ins.segment == 2;
  EXPECT_EQ(exchanges, 2 * 2);  // forward and backward of 2 micro-batches
  const Counts n = count(s);
  const SimResult result = simulate(s, costs);
  EXPECT_NEAR(result.step_seconds,
              n.compute * 1.0 + (n.collectives - exchanges) * 0.25 +
                  exchanges * all_to_all_seconds(8e6, 4, link),
              1e-12);
}

TEST(Simulator, OverlappedSchedulesHideCollectivesNoLongerThanAPhase) {
  const ops::Program program = testing::gpt_program(3);
  for (auto [kind, r] : {std::pair{ScheduleKind::oases, Recompute::fine_grained},
                         std::pair{ScheduleKind::cross_pass, Recompute::full}}) {
    const auto s = schedule::generate(program, {kind, r, 2, 2, true});
    const Counts n = count(s);
    // Each phase of the other sub-batch computes at least one instruction.
    const SimResult hidden = simulate(s, uniform(1.0, 1.0));
    EXPECT_DOUBLE_EQ(hidden.exposed_comm_seconds, 0.0) << schedule::name(kind);
    EXPECT_DOUBLE_EQ(hidden.step_seconds, n.compute * 1.0);
    // Longer collectives: the wire is the bottleneck and the step is at least its busy time.
    const SimResult bound = simulate(s, uniform(1.0, 3.0));
    EXPECT_GT(bound.exposed_comm_seconds, 0.0);
    EXPECT_GE(bound.step_seconds, bound.comm_seconds);
    EXPECT_LT(bound.step_seconds, n.compute * 1.0 + n.collectives * 3.0);  // still overlapped
  }
}

// Communication ~= compute with a transformer's proportions: a segment's Forward costs 1, each
// of its two backward stages 1 and its fine-grained recomputation 1 (backward ~= 2x forward),
// while its forward and backward collectives cost the same, scaled so that the wire is busy as
// long as the compute lane. Within one micro-batch oases' forward collectives outlast the
// forward compute of the other sub-batch (a third of the compute behind half the
// collectives), so a quarter of the communication stays exposed whatever the micro-batch
// count. Interleaving the next micro-batch's forward with this one's backward puts backward
// compute behind those collectives; what stays exposed is mostly the first micro-batch's
// forward, which has no backward to pair with, so its share falls as micro-batches grow.
TEST(Simulator, InterleavingMicroBatchesHidesTheLinkBoundForwardCollectives) {
  const ops::Program program = testing::gpt_program(4, 2);
  const auto exposed_share = [&](ScheduleKind kind, int micro_batches) {
    const auto s = schedule::generate(program, {kind, Recompute::fine_grained, micro_batches, 2, true});
    const Counts n = count(s);
    const double collective = static_cast<double>(n.compute) / n.collectives;
    const SimResult result = simulate(s, uniform(1.0, collective));
    EXPECT_NEAR(result.comm_seconds, result.compute_seconds, 1e-9) << schedule::name(kind);
    return result.exposed_comm_seconds / result.comm_seconds;
  };
  // One micro-batch: nothing to interleave, the same order as oases.
  EXPECT_DOUBLE_EQ(exposed_share(ScheduleKind::oases_interleaved, 1),
                   exposed_share(ScheduleKind::oases, 1));
  double previous = 1;
  for (int micro_batches : {2, 4, 8, 16}) {
    const double oases = exposed_share(ScheduleKind::oases, micro_batches);
    const double interleaved = exposed_share(ScheduleKind::oases_interleaved, micro_batches);
    EXPECT_GT(oases, 0.25) << micro_batches;  // link-bound forward collectives
    EXPECT_LT(interleaved, 0.6 * oases) << micro_batches;
    EXPECT_LT(interleaved, previous) << micro_batches;
    previous = interleaved;
  }
  // 16 micro-batches: 3.0% (8.9% at 4, 5.0% at 8), the first forward's share of the step.
  EXPECT_LT(previous, 0.035);
}

// oases-deferred at communication ~= compute as the overlap benchmark calibrates it: the wire
// busy as long as a blocking run without recomputation computes (Forward 1, two backward stages
// of 1 per segment; the oases schedules add a recomputation of 1). Weight parts are half of a
// stage 0 (CostModel::weight_gradient_share), as they are for a layer's GEMMs. The program has
// the weight parts a tensor-parallel GPT has (every layer segment and head_loss).
// With two micro-batches oases-interleaved leaves exposed the first micro-batch's forward and
// the end of the second forward, whose collectives outnumber the phases of the backward beside
// it; deferred weight parts fill the latter. With more, the first phases of each later forward
// lead into the window before (the forward of 1 into the forward of 0), so that no forward
// collective is left without backward compute beside it and no window is left for weight parts
// to fill. Either way what stays exposed is the first forward alone (with the forward of 1's
// first phases), the same whatever the number of micro-batches.
TEST(Simulator, OnlyTheFirstForwardStaysExposed) {
  ops::Program program = testing::gpt_program(4, 2);
  for (ops::SegmentShape& shape : program.segments)
    shape.has_weight_part = shape.layer >= 0 || shape.name == "head_loss";
  const double collective = [&] {
    const auto blocking =
        schedule::generate(program, {ScheduleKind::megatron, Recompute::none, 1, 1, true});
    const Counts n = count(blocking);
    return static_cast<double>(n.compute) / n.collectives;
  }();
  const auto simulate_kind = [&](ScheduleKind kind, int micro_batches) {
    const auto s =
        schedule::generate(program, {kind, Recompute::fine_grained, micro_batches, 2, true});
    CostModel costs = uniform(1.0, collective);
    costs.weight_gradient_share = 0.5;
    const SimResult result = simulate(s, costs);
    // The first micro-batch's forward: everything before the first backward.
    const auto first_backward = std::find_if(
        s.begin(), s.end(), [](const schedule::Instruction& x) { return x.op == Op::backward; });
    const double first_forward = simulate({s.begin(), first_backward}, costs).exposed_comm_seconds;
    return std::pair{result, first_forward};
  };
  for (int micro_batches : {1, 2, 4, 8}) {
    const auto [interleaved, interleaved_first] =
        simulate_kind(ScheduleKind::oases_interleaved, micro_batches);
    const auto [deferred, deferred_first] =
        simulate_kind(ScheduleKind::oases_deferred, micro_batches);
    // The same work: the split backward costs what the whole one does.
    EXPECT_NEAR(deferred.compute_seconds, interleaved.compute_seconds, 1e-9) << micro_batches;
    EXPECT_NEAR(deferred.comm_seconds, interleaved.comm_seconds, 1e-9) << micro_batches;
    EXPECT_NEAR(deferred_first, interleaved_first, 1e-9) << micro_batches;
    if (micro_batches == 1) {  // oases' order: nothing to interleave, no window to fill
      EXPECT_NEAR(deferred.exposed_comm_seconds, interleaved.exposed_comm_seconds, 1e-9);
      continue;
    }
    EXPECT_NEAR(deferred.exposed_comm_seconds, deferred_first, 1e-9) << micro_batches;
    if (micro_batches == 2) {
      // The second forward's end adds exposed time under oases-interleaved, none under
      // oases-deferred.
      EXPECT_GT(interleaved.exposed_comm_seconds - interleaved_first, 0.5) << micro_batches;
      EXPECT_LT(deferred.step_seconds, interleaved.step_seconds) << micro_batches;
    } else {
      EXPECT_NEAR(interleaved.exposed_comm_seconds, interleaved_first, 1e-9) << micro_batches;
      EXPECT_NEAR(deferred.step_seconds, interleaved.step_seconds, 1e-9) << micro_batches;
    }
  }
}

TEST(Simulator, OverlappedComputeSlowsByTheCalibratedFactor) {
  const auto s = schedule::generate(testing::gpt_program(2),
                                    {ScheduleKind::oases, Recompute::fine_grained, 1, 2, true});
  CostModel costs = uniform(1.0, 0.5);
  const double plain = simulate(s, costs).compute_seconds;
  costs.overlap_slowdown = 0.2;
  const double slowed = simulate(s, costs).compute_seconds;
  EXPECT_GT(slowed, plain);
  EXPECT_LE(slowed, plain * 1.2 + 1e-12);
}

// Start(collective of segment 0), Forward(segment 1), Wait(collective of segment 0).
schedule::Schedule compute_behind_a_collective() {
  schedule::Instruction start{schedule::Op::start}, forward{schedule::Op::forward},
      wait{schedule::Op::wait};
  start.segment = wait.segment = 0;
  forward.segment = 1;
  return {start, forward, wait};
}

// Only the part of an instruction that runs while a collective is on the wire is slowed: 1 s
// of compute behind a 0.5 s collective at slowdown 0.25 takes 0.5 s (0.4 s of work) + 0.6 s.
TEST(Simulator, OnlyTheOverlappedPartOfAnInstructionIsSlowed) {
  CostModel costs = uniform(1.0, 0.5);
  costs.overlap_slowdown = 0.25;
  const SimResult r = simulate(compute_behind_a_collective(), costs);
  EXPECT_NEAR(r.compute_seconds, 1.1, 1e-12);
  EXPECT_NEAR(r.step_seconds, 1.1, 1e-12);
  // A collective longer than the instruction slows all of it.
  costs.collective = [](const schedule::Instruction&) { return 5.0; };
  EXPECT_NEAR(simulate(compute_behind_a_collective(), costs).compute_seconds, 1.25, 1e-12);
}

// ReduceGrads of bucket 0, Start and Wait of segment 1's collective, OptimizerStep.
struct LinkInstructions {
  schedule::Instruction reduce{schedule::Op::reduce_grads}, start{schedule::Op::start},
      wait{schedule::Op::wait}, step{schedule::Op::optimizer_step};
};
LinkInstructions reduction_and_collective() {
  LinkInstructions i;
  i.reduce.bucket = 0;
  i.start.segment = i.wait.segment = 1;
  return i;
}

// On a shared link a collective that meets a reduction in flight moves at half speed while they
// overlap: ReduceGrads (1 s) then Start/Wait of a 0.5 s collective takes 1 s on the wire, and
// the reduction ends 0.5 s later than alone, which the optimizer step waits for.
TEST(Simulator, ReductionsAndCollectivesShareTheLink) {
  const auto [reduce, start, wait, step] = reduction_and_collective();
  CostModel costs = uniform(1.0, 0.5);
  costs.reduce_grads = [](int) { return 1.0; };
  EXPECT_NEAR(simulate({reduce, start, wait, step}, costs).step_seconds, 1.0, 1e-12);
  costs.shared_link = true;
  const SimResult shared = simulate({reduce, start, wait, step}, costs);
  EXPECT_NEAR(shared.step_seconds, 1.5, 1e-12);
  EXPECT_NEAR(simulate({reduce, start, wait}, costs).exposed_comm_seconds, 1.0, 1e-12);
  // The other order: the reduction meets the collective on the wire.
  EXPECT_NEAR(simulate({start, reduce, wait, step}, costs).step_seconds, 1.5, 1e-12);
}

// On a link that keeps issue order, a collective issued behind a reduction waits for all of
// it: ReduceGrads (1 s) then Start/Wait of a 0.5 s collective: the collective ends at 1.5 s,
// the reduction at 1 s as alone. Issued first, the collective moves alone and the reduction
// after it: both end at 0.5 s and 1.5 s.
TEST(Simulator, OnALinkInIssueOrderALaterTransferWaitsForTheEarlierOnes) {
  const auto [reduce, start, wait, step] = reduction_and_collective();
  CostModel costs = uniform(1.0, 0.5);
  costs.reduce_grads = [](int) { return 1.0; };
  costs.shared_link = true;
  costs.shared_link_in_issue_order = true;
  const SimResult behind = simulate({reduce, start, wait}, costs);
  EXPECT_NEAR(behind.step_seconds, 1.5, 1e-12);
  EXPECT_NEAR(behind.exposed_comm_seconds, 1.5, 1e-12);
  EXPECT_NEAR(simulate({reduce, start, wait, step}, costs).step_seconds, 1.5, 1e-12);
  const SimResult ahead = simulate({start, reduce, wait}, costs);
  EXPECT_NEAR(ahead.exposed_comm_seconds, 0.5, 1e-12);
  EXPECT_NEAR(simulate({start, reduce, wait, step}, costs).step_seconds, 1.5, 1e-12);
  // Without a shared link the flag changes nothing.
  costs.shared_link = false;
  EXPECT_NEAR(simulate({reduce, start, wait, step}, costs).step_seconds, 1.0, 1e-12);
}

// A collective slowed by compute: 0.5 s of wire at half speed while 0.6 s of compute runs
// moves 0.3 s of it, and the last 0.2 s run at full speed once the compute lane waits.
TEST(Simulator, CollectivesSlowWhileComputeRuns) {
  CostModel costs = uniform(0.6, 0.5);
  costs.collective_slowdown = 1.0;
  const SimResult r = simulate(compute_behind_a_collective(), costs);
  EXPECT_NEAR(r.step_seconds, 0.8, 1e-12);
  EXPECT_NEAR(r.exposed_comm_seconds, 0.2, 1e-12);
  EXPECT_NEAR(r.compute_seconds, 0.6, 1e-12);
}

TEST(Simulator, OptimizerStepWaitsForDataParallelReductions) {
  const auto s = schedule::generate(testing::gpt_program(1),
                                    {ScheduleKind::megatron, Recompute::none, 1, 1, true});
  CostModel costs = uniform(1.0, 0.0);
  costs.optimizer_step = 0.5;
  const double without = simulate(s, costs).step_seconds;
  // The embeddings' bucket (the last one made final) takes 10 s: the step waits for it.
  costs.reduce_grads = [](int bucket) { return bucket == 0 ? 10.0 : 0.1; };
  const SimResult with = simulate(s, costs);
  EXPECT_DOUBLE_EQ(with.step_seconds, without - 0.5 + 10.0 + 0.5);
  EXPECT_DOUBLE_EQ(with.exposed_comm_seconds, 10.0);
}

// Recomputation in groups of k layers (sqrt) is priced like any schedule: every layer segment's
// Recompute regenerates its output (a forward: ops::kOutput) and replays its forward collective,
// once per instance whatever k, so a blocking run pays exactly full recomputation's step: no
// recomputation plus one forward and one collective per layer segment. Under cross-pass the
// compute lane does the same work as under full.
TEST(Simulator, SqrtRecomputationPaysOneMoreForwardAndCollectivePerLayerSegment) {
  const int layers = 7, micro_batches = 2;
  const ops::Program program = testing::gpt_program(layers, 2);
  const double forward = 1.0, fine_grained = 0.4, backward = 2.0, collective = 0.25;
  CostModel costs;
  costs.compute = [&](const schedule::Instruction& ins) {
    if (ins.op == Op::recompute) return ins.sets & ops::kOutput ? forward : fine_grained;
    return ins.op == Op::forward ? forward : backward;
  };
  costs.collective = [&](const schedule::Instruction&) { return collective; };
  const auto run = [&](ScheduleKind kind, Recompute policy, int k, int sub_batches) {
    ScheduleSpec spec{kind, policy, micro_batches, sub_batches, true};
    spec.recompute_every = k;
    return simulate(schedule::generate(program, spec), costs);
  };
  const SimResult none = run(ScheduleKind::megatron, Recompute::none, 0, 1);
  const SimResult full_overlapped = run(ScheduleKind::cross_pass, Recompute::full, 0, 2);
  const double layer_segments = micro_batches * 2 * layers;
  for (int k = 1; k <= layers; ++k) {
    const SimResult blocking = run(ScheduleKind::megatron, Recompute::sqrt, k, 1);
    EXPECT_DOUBLE_EQ(blocking.compute_seconds, none.compute_seconds + layer_segments * forward)
        << "k=" << k;
    EXPECT_DOUBLE_EQ(blocking.step_seconds,
                     none.step_seconds + layer_segments * (forward + collective))
        << "k=" << k;
    const SimResult overlapped = run(ScheduleKind::cross_pass, Recompute::sqrt, k, 2);
    EXPECT_DOUBLE_EQ(overlapped.compute_seconds, full_overlapped.compute_seconds) << "k=" << k;
    EXPECT_DOUBLE_EQ(overlapped.comm_seconds, full_overlapped.comm_seconds) << "k=" << k;
  }
}

schedule::Instruction with_bucket(Op op, int bucket) {
  schedule::Instruction ins{op};
  ins.bucket = bucket;
  return ins;
}

// ZeRO-3: a gather travels on the data-parallel lane from its GatherParams; its WaitParams holds
// the compute lane until it has arrived. With nothing computing in between, the whole gather
// is exposed; behind a compute instruction at least as long, none of it.
TEST(Simulator, ParameterGathersHideBehindTheComputeAheadOfThem) {
  schedule::Instruction forward{Op::forward}, other{Op::forward};
  forward.segment = 0;
  other.segment = 1;
  const auto gather = with_bucket(Op::gather_params, 0);
  const auto wait = with_bucket(Op::wait_params, 0);
  const auto release = with_bucket(Op::release_params, 0);
  CostModel costs = uniform(1.0, 0.0);
  costs.gather_params = [](int) { return 2.0; };

  const SimResult exposed = simulate({gather, wait, forward, release}, costs);
  EXPECT_DOUBLE_EQ(exposed.exposed_comm_seconds, 2.0);
  EXPECT_DOUBLE_EQ(exposed.step_seconds, 3.0);
  EXPECT_DOUBLE_EQ(exposed.comm_seconds, 0.0);  // not the tensor-parallel lane

  const SimResult partly = simulate({gather, other, wait, forward, release}, costs);
  EXPECT_DOUBLE_EQ(partly.exposed_comm_seconds, 1.0);
  EXPECT_DOUBLE_EQ(partly.step_seconds, 3.0);

  costs.gather_params = [](int) { return 0.75; };
  const SimResult hidden = simulate({gather, other, wait, forward, release}, costs);
  EXPECT_DOUBLE_EQ(hidden.exposed_comm_seconds, 0.0);
  EXPECT_DOUBLE_EQ(hidden.step_seconds, 2.0);

  // Gathers share the lane with the reductions, in issue order: one issued behind a 1 s
  // reduction arrives after it.
  costs.reduce_grads = [](int) { return 1.0; };
  const auto reduce = with_bucket(Op::reduce_grads, 1);
  EXPECT_DOUBLE_EQ(simulate({reduce, gather, wait, forward, release}, costs).exposed_comm_seconds,
                   1.75);
  // Unpriced gathers are free, even behind a reduction.
  costs.gather_params = nullptr;
  EXPECT_DOUBLE_EQ(simulate({reduce, gather, wait, forward, release}, costs).exposed_comm_seconds,
                   0.0);
}

// A whole sharded step (megatron, one layer, resharded after forward) at compute 1 s and
// gathers of 0.5 s: every gather hides behind the compute instruction ahead of its window,
// except the first (nothing computes before it) and the head's backward one (its forward ends
// right before, so it follows the release): 1 s exposed. One rank through simulate_ranks
// gives the same.
TEST(Simulator, ShardedStepExposesOnlyGathersWithoutComputeAhead) {
  ops::Program program = testing::gpt_program(1);
  const std::vector<std::vector<int>> buckets{{0}, {1}, {1}, {2}};
  for (std::size_t s = 0; s < program.segments.size(); ++s)
    program.segments[s].param_buckets = buckets[s];
  ScheduleSpec spec{ScheduleKind::megatron, Recompute::none, 1, 1, true};
  spec.sharded_params = true;
  schedule::Schedule s = schedule::generate(program, spec);
  schedule::shard_parameters(program, spec, s);
  CostModel costs = uniform(1.0, 0.0);
  costs.gather_params = [](int) { return 0.5; };
  const SimResult r = simulate(s, costs);
  const Counts n = count(s);
  EXPECT_DOUBLE_EQ(r.exposed_comm_seconds, 1.0);
  EXPECT_DOUBLE_EQ(r.step_seconds, n.compute * 1.0 + 1.0);
  const MultiRankResult ranks = simulate_ranks({s}, costs);
  EXPECT_DOUBLE_EQ(ranks.step_seconds, r.step_seconds);
  EXPECT_DOUBLE_EQ(ranks.ranks.front().exposed_comm_seconds, r.exposed_comm_seconds);
}

}  // namespace
}  // namespace oases::sim
