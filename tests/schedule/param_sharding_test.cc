// ZeRO-3's parameter instructions (schedule::shard_parameters): on GPT-shaped programs under
// the within-step generators, lowered pipelines (1F1B, interleaved, zero-bubble) and
// forward-only steps, the pass gathers every bucket once per window of uses, the result
// verifies with sharded parameters, each WaitParams sits right before its window's first use,
// each ReleaseParams right after its last, and each GatherParams one compute instruction ahead
// (or right after the bucket's previous release, or at the start of the step). The verifier
// rejects hand-broken schedules naming the instruction. ZeRO-1/2's deferred gathers: every
// bucket gathered once, all at the start in the order of first use, each waited right before
// it, none released.
#include "schedule/pipeline_2bw.h"
#include "schedule/pipeline_lowering.h"
#include "schedule/schedule.h"

#include "core/error.h"
#include "support/gpt_program.h"
#include "support/stage_programs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace oases::schedule {
namespace {

using testing::gpt_program;

// Each segment reads the parameters of the bucket it belongs to: the one made final by the
// last segment at or before it that names a ready bucket (a layer's attention and MLP share
// the layer's). Programs whose segments already name their buckets keep them.
ops::Program with_param_buckets(ops::Program program) {
  for (const ops::SegmentShape& shape : program.segments)
    if (!shape.param_buckets.empty()) return program;
  int bucket = -1;
  for (ops::SegmentShape& shape : program.segments) {
    if (shape.ready_bucket >= 0) bucket = shape.ready_bucket;
    if (bucket >= 0) shape.param_buckets = {bucket};
  }
  return program;
}

ScheduleSpec sharded(ScheduleKind kind, Recompute recompute, int micro_batches, int sub_batches,
                     bool reshard_after_forward, bool training = true) {
  ScheduleSpec spec{kind, recompute, micro_batches, sub_batches, training};
  spec.sharded_params = true;
  spec.reshard_after_forward = reshard_after_forward;
  return spec;
}

bool is_compute(Op op) {
  return op == Op::forward || op == Op::recompute || op == Op::backward ||
         op == Op::backward_weight;
}

bool reads(const ops::Program& program, const Instruction& ins, int bucket) {
  if (!is_compute(ins.op)) return false;
  const std::vector<int>& buckets =
      program.segments[static_cast<std::size_t>(ins.segment)].param_buckets;
  return std::find(buckets.begin(), buckets.end(), bucket) != buckets.end();
}

Schedule without_parameter_instructions(const Schedule& schedule) {
  Schedule out;
  for (const Instruction& ins : schedule)
    if (!is_parameter_op(ins.op)) out.push_back(ins);
  return out;
}

// Checks the placement rule on `result` = shard_parameters(`original`) and returns the number
// of gathers of each bucket.
std::map<int, int> check_placement(const ops::Program& program, const ScheduleSpec& spec,
                                   const Schedule& original, const Schedule& result,
                                   const std::string& what) {
  EXPECT_NO_THROW(verify_schedule(program, spec, result)) << what;
  EXPECT_EQ(without_parameter_instructions(result), original) << what << ": something else moved";
  std::map<int, int> gathers;
  const std::size_t n = result.size();
  for (std::size_t i = 0; i < n; ++i) {
    const Instruction& ins = result[i];
    if (!is_parameter_op(ins.op)) continue;
    const int b = ins.bucket;
    const std::string where = what + ": " + std::to_string(i) + " " + to_string(ins);
    if (ins.op == Op::wait_params) {
      // Right before the window's first use (other buckets' waits may stand between).
      std::size_t j = i + 1;
      while (j < n && result[j].op == Op::wait_params) ++j;
      EXPECT_TRUE(j < n && reads(program, result[j], b)) << where;
    } else if (ins.op == Op::release_params) {
      // Right after the window's last use (other buckets' releases may stand between).
      std::ptrdiff_t j = static_cast<std::ptrdiff_t>(i) - 1;
      while (j >= 0 && result[static_cast<std::size_t>(j)].op == Op::release_params) --j;
      EXPECT_TRUE(j >= 0 && reads(program, result[static_cast<std::size_t>(j)], b)) << where;
    } else {
      ++gathers[b];
      std::size_t wait = i + 1;
      int computes = 0;
      for (; wait < n && !(result[wait].op == Op::wait_params && result[wait].bucket == b); ++wait)
        computes += is_compute(result[wait].op);
      if (wait == n) {
        ADD_FAILURE() << where << ": never waited";
        continue;
      }
      // Just after the bucket's previous release (parameter instructions between), or at the
      // start of a step whose first compute is the first use: nothing computes before the
      // wait. Otherwise right before the compute instruction ahead of the first use.
      bool after_release = false, at_start = true;
      for (std::ptrdiff_t j = static_cast<std::ptrdiff_t>(i) - 1; j >= 0; --j) {
        const Instruction& before = result[static_cast<std::size_t>(j)];
        if (!is_parameter_op(before.op)) {
          at_start = false;
          break;
        }
        after_release |= before.op == Op::release_params && before.bucket == b;
      }
      if (after_release) {
        EXPECT_EQ(computes, 0) << where;
      } else if (!(at_start && computes == 0)) {
        EXPECT_EQ(computes, 1) << where;
        std::size_t next = i + 1;
        while (next < n && is_parameter_op(result[next].op)) ++next;
        EXPECT_TRUE(next < n && is_compute(result[next].op)) << where;
      }
    }
  }
  // Between two instructions: releases, then gathers, then waits, each by ascending bucket.
  for (std::size_t i = 1; i < n; ++i) {
    const Instruction &a = result[i - 1], &b = result[i];
    if (!is_parameter_op(a.op) || !is_parameter_op(b.op)) continue;
    const auto rank = [](Op op) {
      return op == Op::release_params ? 0 : op == Op::gather_params ? 1 : 2;
    };
    EXPECT_TRUE(rank(a.op) < rank(b.op) || (a.op == b.op && a.bucket < b.bucket))
        << what << ": " << to_string(a) << " before " << to_string(b);
  }
  return gathers;
}

std::map<int, int> shard_and_check(const ops::Program& program, const ScheduleSpec& spec,
                                   const Schedule& original, const std::string& what,
                                   Schedule* out = nullptr) {
  Schedule result = original;
  shard_parameters(program, spec, result);
  if (out) *out = result;
  return check_placement(program, spec, original, result, what);
}

std::string describe(const ScheduleSpec& spec) {
  return std::string(name(spec.kind)) + "/" + std::string(name(spec.recompute)) +
         " mb=" + std::to_string(spec.micro_batches) + " sb=" + std::to_string(spec.sub_batches) +
         (spec.training ? "" : " eval") +
         (spec.reshard_after_forward ? " reshard" : " kept to backward");
}

TEST(ShardParameters, MegatronPrintsTheExpectedInstructionList) {
  const ops::Program program = with_param_buckets(gpt_program(1));
  const ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, 1, 1, true);
  Schedule s = generate(program, spec);
  shard_parameters(program, spec, s);
  EXPECT_EQ(to_string(s),
            "GatherParams(bucket=0)\n"
            "GatherParams(bucket=1)\n"
            "WaitParams(bucket=0)\n"
            "Forward(seg=0, mb=0, sb=0)\n"
            "ReleaseParams(bucket=0)\n"
            "Start(fwd, seg=0, mb=0, sb=0)\n"
            "Wait(fwd, seg=0, mb=0, sb=0)\n"
            "WaitParams(bucket=1)\n"
            "Forward(seg=1, mb=0, sb=0)\n"
            "Start(fwd, seg=1, mb=0, sb=0)\n"
            "Wait(fwd, seg=1, mb=0, sb=0)\n"
            "GatherParams(bucket=2)\n"
            "Forward(seg=2, mb=0, sb=0)\n"
            "ReleaseParams(bucket=1)\n"
            "Start(fwd, seg=2, mb=0, sb=0)\n"
            "Wait(fwd, seg=2, mb=0, sb=0)\n"
            "WaitParams(bucket=2)\n"
            "Forward(seg=3, mb=0, sb=0)\n"
            "ReleaseParams(bucket=2)\n"
            "GatherParams(bucket=2)\n"
            "WaitParams(bucket=2)\n"
            "Backward(seg=3, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=3, mb=0, sb=0)\n"
            "Wait(bwd, seg=3, mb=0, sb=0)\n"
            "GatherParams(bucket=1)\n"
            "Backward(seg=3, stage=1, mb=0, sb=0)\n"
            "ReleaseParams(bucket=2)\n"
            "ReduceGrads(bucket=2)\n"
            "Free(seg=3, internals, mb=0, sb=0)\n"
            "WaitParams(bucket=1)\n"
            "Backward(seg=2, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=2, mb=0, sb=0)\n"
            "Wait(bwd, seg=2, mb=0, sb=0)\n"
            "Backward(seg=2, stage=1, mb=0, sb=0)\n"
            "Free(seg=2, checkpoint|internals, mb=0, sb=0)\n"
            "Backward(seg=1, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=1, mb=0, sb=0)\n"
            "Wait(bwd, seg=1, mb=0, sb=0)\n"
            "GatherParams(bucket=0)\n"
            "Backward(seg=1, stage=1, mb=0, sb=0)\n"
            "ReleaseParams(bucket=1)\n"
            "ReduceGrads(bucket=1)\n"
            "Free(seg=1, checkpoint|internals|core, mb=0, sb=0)\n"
            "WaitParams(bucket=0)\n"
            "Backward(seg=0, stage=0, mb=0, sb=0)\n"
            "ReleaseParams(bucket=0)\n"
            "ReduceGrads(bucket=0)\n"
            "OptimizerStep\n");
}

// Megatron without recomputation: each bucket is read in the forward and in the backward of
// every micro-batch. Resharding after forward gathers it for each; keeping it to the backward
// gathers it once per micro-batch.
TEST(ShardParameters, MegatronGathersEachBucketPerPassOrPerMicroBatch) {
  const int layers = 3;
  const ops::Program program = with_param_buckets(gpt_program(layers));
  for (int micro_batches : {1, 2}) {
    for (bool reshard : {true, false}) {
      const ScheduleSpec spec =
          sharded(ScheduleKind::megatron, Recompute::none, micro_batches, 1, reshard);
      const std::map<int, int> gathers =
          shard_and_check(program, spec, generate(program, spec), describe(spec));
      ASSERT_EQ(gathers.size(), static_cast<std::size_t>(layers + 2)) << describe(spec);
      for (const auto& [bucket, count] : gathers)
        EXPECT_EQ(count, micro_batches * (reshard ? 2 : 1)) << describe(spec) << " bucket "
                                                            << bucket;
    }
  }
}

// Full recomputation reads a layer's parameters again in the Recompute before its Backward:
// the backward window begins there, and without resharding the layer stays gathered from its
// forward through its recomputation and backward.
TEST(ShardParameters, FullRecomputationGathersBeforeTheReplay) {
  const int layers = 3;
  const ops::Program program = with_param_buckets(gpt_program(layers));
  for (bool reshard : {true, false}) {
    const ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::full, 1, 1, reshard);
    Schedule s;
    const std::map<int, int> gathers =
        shard_and_check(program, spec, generate(program, spec), describe(spec), &s);
    for (int bucket = 1; bucket <= layers; ++bucket)
      EXPECT_EQ(gathers.at(bucket), reshard ? 2 : 1) << describe(spec) << " bucket " << bucket;
    if (!reshard) continue;
    // Layer 0's backward window opens at the replay of its attention.
    const std::string text = to_string(s);
    EXPECT_NE(text.find("WaitParams(bucket=1)\nRecompute(seg=1, "), std::string::npos) << text;
  }
}

// Sub-batches (oases, cross-pass) and interleaved micro-batches (oases-interleaved,
// oases-deferred): a layer's uses by all sub-batches of a micro-batch's forward form one
// window; the result verifies and follows the placement rule whatever the interleaving.
TEST(ShardParameters, OverlappedSchedulesVerifyAndGatherLayersOncePerPass) {
  const int layers = 3;
  const ops::Program program = with_param_buckets(gpt_program(layers, 2));
  for (bool reshard : {true, false}) {
    const ScheduleSpec oases = sharded(ScheduleKind::oases, Recompute::fine_grained, 2, 2, reshard);
    const std::map<int, int> gathers =
        shard_and_check(program, oases, generate(program, oases), describe(oases));
    for (int bucket = 1; bucket <= layers; ++bucket)
      EXPECT_EQ(gathers.at(bucket), reshard ? 4 : 2) << describe(oases) << " bucket " << bucket;
    for (const ScheduleSpec& spec :
         {sharded(ScheduleKind::cross_pass, Recompute::full, 2, 2, reshard),
          sharded(ScheduleKind::oases_interleaved, Recompute::fine_grained, 3, 2, reshard),
          sharded(ScheduleKind::oases_deferred, Recompute::fine_grained, 3, 2, reshard),
          sharded(ScheduleKind::megatron, Recompute::sqrt, 2, 1, reshard)}) {
      ScheduleSpec with_groups = spec;
      with_groups.recompute_every = 2;
      shard_and_check(program, with_groups, generate(program, with_groups),
                      describe(with_groups));
    }
  }
}

// Forward-only steps read every bucket in forward alone: one window each, whatever the
// micro-batches and the resharding.
TEST(ShardParameters, ForwardOnlyStepsGatherEachBucketOnce) {
  const ops::Program program = with_param_buckets(gpt_program(2, 2));
  for (bool reshard : {true, false}) {
    for (const ScheduleSpec& spec :
         {sharded(ScheduleKind::megatron, Recompute::none, 2, 1, reshard, false),
          sharded(ScheduleKind::oases, Recompute::fine_grained, 2, 2, reshard, false)}) {
      const std::map<int, int> gathers =
          shard_and_check(program, spec, generate(program, spec), describe(spec));
      EXPECT_EQ(gathers.size(), 4u) << describe(spec);
      for (const auto& [bucket, count] : gathers) EXPECT_EQ(count, 1) << describe(spec);
    }
  }
}

// Without an optimizer step a bucket left gathered is caught at the end.
TEST(ShardParameters, AForwardOnlyStepLeavingABucketGatheredIsRejectedAtTheEnd) {
  const ops::Program program = with_param_buckets(gpt_program(2, 2));
  const ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, 2, 1, true, false);
  Schedule s = generate(program, spec);
  shard_parameters(program, spec, s);
  const auto last_release = std::find_if(s.rbegin(), s.rend(), [](const Instruction& ins) {
    return ins.op == Op::release_params;
  });
  ASSERT_NE(last_release, s.rend());
  const int bucket = last_release->bucket;
  s.erase(std::next(last_release).base());
  try {
    verify_schedule(program, spec, s);
    ADD_FAILURE() << "a bucket gathered at the end was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("bucket " + std::to_string(bucket) +
                                         " is not sharded at the end (gathered and never "
                                         "released)"),
              std::string::npos)
        << e.what();
  }
}

// A segment reading two buckets (a head tied to the embeddings): both are gathered before it,
// in ascending order, and the embeddings stay gathered from the embedding's forward through
// the head's.
TEST(ShardParameters, SegmentsReadingSeveralBucketsGatherThemInAscendingOrder) {
  const int layers = 2;
  ops::Program program = with_param_buckets(gpt_program(layers));
  ops::SegmentShape& head = program.segments.back();
  head.param_buckets = {0, layers + 1};
  for (bool reshard : {true, false}) {
    const ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, 1, 1, reshard);
    Schedule s;
    const std::map<int, int> gathers =
        shard_and_check(program, spec, generate(program, spec), describe(spec), &s);
    EXPECT_EQ(gathers.at(0), reshard ? 2 : 1) << describe(spec);
    const std::string text = to_string(s);
    EXPECT_NE(text.find("WaitParams(bucket=3)\nForward(seg=5, mb=0, sb=0)"), std::string::npos)
        << text;
  }
}

// Compressed activations after sharding: Encode and Decode go around the sets, the parameter
// instructions stay where they were, and the result verifies.
TEST(ShardParameters, CompressedActivationsComposeWithSharding) {
  const ops::Program program = with_param_buckets(gpt_program(2, 2));
  const ScheduleSpec spec = sharded(ScheduleKind::oases, Recompute::fine_grained, 2, 2, true);
  Schedule s = generate(program, spec);
  shard_parameters(program, spec, s);
  compress_kept_sets(program, s, ops::ActivationEncoding::bf16);
  EXPECT_NO_THROW(verify_schedule(program, spec, s));
}

TEST(ShardParameters, RejectsSchedulesAlreadyShardedAndSpecsWithoutSharding) {
  const ops::Program program = with_param_buckets(gpt_program(1));
  ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, 1, 1, true);
  Schedule s = generate(program, spec);
  shard_parameters(program, spec, s);
  EXPECT_THROW(shard_parameters(program, spec, s), InternalError);
  spec.sharded_params = false;
  Schedule plain = generate(program, spec);
  EXPECT_THROW(shard_parameters(program, spec, plain), InternalError);
}

// ---- Pipelines ----

// The stage programs of a model of P v + 1 layers cut into P x v chunks (the last holds two):
// rank r builds chunks r, r + P, ...
std::vector<ops::Program> stage_programs(int stages, int virtual_stages, int sub_batches) {
  std::vector<ops::Program> out =
      testing::tiny_stage_programs(testing::tiny_stage_model("gpt", stages * virtual_stages + 1),
                                   stages, virtual_stages, sub_batches);
  for (ops::Program& program : out) program = with_param_buckets(program);
  return out;
}

PipelineSpec pipeline_spec(PipelineKind kind, int stages, int virtual_stages, int micro_batches) {
  PipelineSpec p;
  p.kind = kind;
  p.stages = stages;
  p.virtual_stages = virtual_stages;
  p.micro_batches = micro_batches;
  return p;
}

// 1F1B on one chunk per rank, whole micro-batches: every F action reads each of the rank's
// buckets in forward and every B in backward, so the windows follow the rank's order: a run
// of actions of one kind when resharding, from one B -> F turn to the next when not.
TEST(ShardParameters, OneFOneBGathersPerRunOfActionsAndKeepsMessagesPaired) {
  const int stages = 2, m = 4;
  const std::vector<ops::Program> programs = stage_programs(stages, 1, 1);
  const PipelineSpec pipeline = pipeline_spec(PipelineKind::one_f_one_b, stages, 1, m);
  const PipelineOrders orders = pipeline_orders(pipeline);
  for (bool reshard : {true, false}) {
    const ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, m, 1, reshard);
    std::vector<Schedule> ranks;
    for (int r = 0; r < stages; ++r) {
      const ops::Program& program = programs[static_cast<std::size_t>(r)];
      const std::string what = describe(spec) + " 1f1b rank " + std::to_string(r);
      Schedule s;
      const std::map<int, int> gathers = shard_and_check(
          program, spec, lower_pipeline(program, spec, pipeline, r), what, &s);
      ranks.push_back(s);
      int windows = 1;
      const std::vector<PipelineAction>& order = orders[static_cast<std::size_t>(r)];
      for (std::size_t i = 1; i < order.size(); ++i) {
        const bool was_backward = order[i - 1].kind != PipelineAction::forward;
        const bool is_backward = order[i].kind != PipelineAction::forward;
        windows += (was_backward && !is_backward) || (reshard && !was_backward && is_backward);
      }
      EXPECT_FALSE(gathers.empty()) << what;
      for (const auto& [bucket, count] : gathers)
        EXPECT_EQ(count, windows) << what << " bucket " << bucket;
    }
    EXPECT_NO_THROW(verify_point_to_point(ranks)) << describe(spec);
  }
}

// Interleaved 1F1B (two chunks per rank), with sub-batches and recomputation, and zero-bubble
// with its deferred weight parts (BackwardWeight reads the parameters too).
TEST(ShardParameters, InterleavedAndZeroBubblePipelinesVerify) {
  for (bool reshard : {true, false}) {
    {
      const int stages = 2, m = 4;
      const std::vector<ops::Program> programs = stage_programs(stages, 2, 2);
      const PipelineSpec pipeline = pipeline_spec(PipelineKind::interleaved, stages, 2, m);
      const ScheduleSpec spec =
          sharded(ScheduleKind::oases, Recompute::fine_grained, m, 2, reshard);
      std::vector<Schedule> ranks;
      for (int r = 0; r < stages; ++r) {
        const ops::Program& program = programs[static_cast<std::size_t>(r)];
        Schedule s;
        shard_and_check(program, spec, lower_pipeline(program, spec, pipeline, r),
                        describe(spec) + " interleaved rank " + std::to_string(r), &s);
        ranks.push_back(s);
      }
      EXPECT_NO_THROW(verify_point_to_point(ranks));
    }
    {
      const int stages = 3, m = 4;
      const std::vector<ops::Program> programs = stage_programs(stages, 1, 1);
      const PipelineSpec pipeline = pipeline_spec(PipelineKind::zero_bubble, stages, 1, m);
      for (Recompute recompute : {Recompute::none, Recompute::full}) {
        const ScheduleSpec spec = sharded(ScheduleKind::megatron, recompute, m, 1, reshard);
        std::vector<Schedule> ranks;
        for (int r = 0; r < stages; ++r) {
          const ops::Program& program = programs[static_cast<std::size_t>(r)];
          Schedule s;
          shard_and_check(program, spec, lower_pipeline(program, spec, pipeline, r),
                          describe(spec) + " zero-bubble rank " + std::to_string(r), &s);
          ranks.push_back(s);
        }
        EXPECT_NO_THROW(verify_point_to_point(ranks)) << describe(spec);
      }
    }
  }
}

// 2bw runs: the weights change at every UseWeights and OptimizerStep, so every window ends
// before them and no gather starts before the change ahead of its window; the runs verify with
// their carry, the messages stay paired, and a release moved past a change is rejected.
TEST(ShardParameters, TwoBwRunsHoldNoGatheredBucketWhereTheWeightsChange) {
  const int stages = 2, m = 3;
  const std::vector<ops::Program> programs = stage_programs(stages, 1, 1);
  const PipelineSpec pipeline = pipeline_spec(PipelineKind::two_bw, stages, 1, m);
  for (bool reshard : {true, false}) {
    const ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, m, 1, reshard);
    for (const TwoBwRun kind : {TwoBwRun{false, true}, TwoBwRun{false, false},
                                TwoBwRun{true, false}, TwoBwRun{true, true}}) {
      const std::string what = describe(spec) + " 2bw run carries_in=" +
                               std::to_string(kind.carries_in) + " drains=" +
                               std::to_string(kind.drains);
      std::vector<Schedule> ranks;
      for (int r = 0; r < stages; ++r) {
        const ops::Program& program = programs[static_cast<std::size_t>(r)];
        const LoweredRun run = lower_2bw_run(program, spec, pipeline, r, kind);
        Schedule s = run.schedule;
        shard_parameters(program, spec, s);
        EXPECT_NO_THROW(verify_schedule(program, spec, s, run.carry)) << what << " rank " << r;
        EXPECT_EQ(without_parameter_instructions(s), run.schedule) << what;
        std::map<int, int> gathered;  // bucket -> 0 sharded, 1 gathering or gathered
        int switches = 0, gathers = 0;
        for (const Instruction& ins : s) {
          if (ins.op == Op::gather_params) ++gathers, gathered[ins.bucket] = 1;
          if (ins.op == Op::release_params) gathered[ins.bucket] = 0;
          if (ins.op != Op::use_weights && ins.op != Op::optimizer_step) continue;
          ++switches;
          for (const auto& [bucket, state] : gathered)
            EXPECT_EQ(state, 0) << what << " rank " << r << ": bucket " << bucket
                                << " gathered at " << to_string(ins);
        }
        EXPECT_GT(switches, 0) << what;
        EXPECT_GT(gathers, 0) << what;
        ranks.push_back(s);
        // Hand-broken: the first release that precedes a change moved past it.
        for (std::size_t i = 0; i + 1 < s.size(); ++i) {
          if (s[i].op != Op::release_params) continue;
          std::size_t change = i + 1;
          while (change < s.size() && !is_compute(s[change].op) &&
                 s[change].op != Op::use_weights && s[change].op != Op::optimizer_step)
            ++change;
          if (change == s.size() || is_compute(s[change].op)) continue;
          Schedule broken = s;
          const Instruction release = broken[i];
          broken.erase(broken.begin() + static_cast<std::ptrdiff_t>(i));
          broken.insert(broken.begin() + static_cast<std::ptrdiff_t>(change), release);
          try {
            verify_schedule(program, spec, broken, run.carry);
            ADD_FAILURE() << what << ": a bucket gathered across a change of weights was accepted";
          } catch (const InternalError& e) {
            EXPECT_NE(std::string(e.what()).find("changes the weights while bucket"),
                      std::string::npos)
                << e.what();
          }
          break;
        }
      }
      EXPECT_NO_THROW(verify_point_to_point(ranks)) << what;
    }
  }
}

TEST(ShardParameters, ForwardOnlyPipelinesVerify) {
  const int stages = 2;
  const std::vector<ops::Program> programs = stage_programs(stages, 2, 1);
  const ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, 3, 1, true, false);
  std::vector<Schedule> ranks;
  for (int r = 0; r < stages; ++r) {
    const ops::Program& program = programs[static_cast<std::size_t>(r)];
    Schedule s;
    shard_and_check(program, spec, lower_forward_only_pipeline(program, spec, stages, 2, r),
                    "forward-only pipeline rank " + std::to_string(r), &s);
    ranks.push_back(s);
  }
  EXPECT_NO_THROW(verify_point_to_point(ranks));
}

// ---- The verifier ----

class ShardedBroken : public ::testing::Test {
 protected:
  static std::size_t find(const Schedule& s, const std::string& text, std::size_t from = 0) {
    for (std::size_t i = from; i < s.size(); ++i)
      if (to_string(s[i]) == text) return i;
    ADD_FAILURE() << "no " << text;
    return 0;
  }
  static std::size_t find_last(const Schedule& s, const std::string& text) {
    for (std::size_t i = s.size(); i-- > 0;)
      if (to_string(s[i]) == text) return i;
    ADD_FAILURE() << "no " << text;
    return 0;
  }
  void expect_rejected(const Schedule& s, const std::string& reason,
                       const ScheduleSpec* with = nullptr) const {
    try {
      verify_schedule(program, with ? *with : spec, s);
      ADD_FAILURE() << "accepted a schedule that should fail with: " << reason;
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
  static Schedule erased(Schedule s, std::size_t at) {
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(at));
    return s;
  }
  static Schedule inserted(Schedule s, std::size_t at, const Instruction& ins) {
    s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), ins);
    return s;
  }
  Schedule good() const {
    Schedule s = generate(program, spec);
    shard_parameters(program, spec, s);
    return s;
  }
  ops::Program program = with_param_buckets(gpt_program(2));
  ScheduleSpec spec = sharded(ScheduleKind::megatron, Recompute::none, 1, 1, true);
};

TEST_F(ShardedBroken, TheGoodScheduleVerifies) {
  EXPECT_NO_THROW(verify_schedule(program, spec, good()));
}

TEST_F(ShardedBroken, ComputeWithoutWaitingForTheGather) {
  const Schedule s = good();
  const std::size_t wait = find(s, "WaitParams(bucket=1)");
  ASSERT_EQ(to_string(s[wait + 1]), "Forward(seg=1, mb=0, sb=0)");
  // The message names the instruction by its index in the broken schedule.
  expect_rejected(erased(s, wait),
                  "instruction " + std::to_string(wait) +
                      " (Forward(seg=1, mb=0, sb=0)): computes on sharded parameters of bucket "
                      "1 (its GatherParams was not waited)");
}

TEST_F(ShardedBroken, ComputeAfterTheRelease) {
  const Schedule s = good();
  // Layer 0's forward window ends after the MLP's Forward (segment 2): release it before.
  const std::size_t release = find(s, "ReleaseParams(bucket=1)");
  ASSERT_EQ(to_string(s[release - 1]), "Forward(seg=2, mb=0, sb=0)");
  Schedule early = erased(s, release);
  early = inserted(early, release - 1, s[release]);
  expect_rejected(early,
                  "(Forward(seg=2, mb=0, sb=0)): computes on sharded parameters of bucket 1");
}

TEST_F(ShardedBroken, NoGatherAtAll) {
  expect_rejected(generate(program, spec),
                  "instruction 0 (Forward(seg=0, mb=0, sb=0)): computes on sharded parameters of "
                  "bucket 0");
}

TEST_F(ShardedBroken, GatherTwice) {
  const Schedule s = good();
  const std::size_t gather = find(s, "GatherParams(bucket=1)");
  expect_rejected(inserted(s, gather + 1, s[gather]),
                  "GatherParams(bucket=1)): gathers bucket 1, which is already being gathered");
  // Gathering again once waited, without a release.
  const std::size_t wait = find(s, "WaitParams(bucket=1)");
  expect_rejected(inserted(s, wait + 1, s[gather]),
                  "gathers bucket 1, which is already gathered");
}

TEST_F(ShardedBroken, WaitWithoutAGatherAndReleaseOfABucketNotGathered) {
  const Schedule s = good();
  expect_rejected(erased(s, find(s, "GatherParams(bucket=1)")),
                  "(WaitParams(bucket=1)): waits for bucket 1, which no GatherParams is gathering");
  const std::size_t release = find(s, "ReleaseParams(bucket=1)");
  expect_rejected(inserted(s, release + 1, s[release]),
                  "(ReleaseParams(bucket=1)): releases bucket 1, which is not gathered");
}

// The optimizer step changes the weights: a bucket still gathered there would keep the other
// ranks' blocks of the version before.
TEST_F(ShardedBroken, BucketLeftGatheredAtTheOptimizerStep) {
  const Schedule s = good();
  expect_rejected(erased(s, find_last(s, "ReleaseParams(bucket=0)")),
                  "(OptimizerStep): changes the weights while bucket 0 is gathered");
}

TEST_F(ShardedBroken, ParameterInstructionsWithoutShardedParameters) {
  const Schedule s = good();
  ScheduleSpec plain = spec;
  plain.sharded_params = false;
  expect_rejected(s,
                  "instruction 0 (GatherParams(bucket=0)): a parameter instruction in a schedule "
                  "without sharded parameters",
                  &plain);
}

TEST_F(ShardedBroken, ParameterInstructionsNameTheirBucketAlone) {
  const Schedule s = good();
  const std::size_t gather = find(s, "GatherParams(bucket=1)");
  Schedule with_segment = s;
  with_segment[gather].segment = 1;
  expect_rejected(with_segment, "a parameter instruction names its bucket alone");
  Schedule with_micro_batch = s;
  with_micro_batch[gather].micro_batch = 1;
  expect_rejected(with_micro_batch, "a parameter instruction names its bucket alone");
  Schedule negative = s;
  negative[gather].bucket = -1;
  expect_rejected(negative, "a parameter instruction needs a bucket (>= 0)");
}

// ---- Deferred gathers (ZeRO-1 and 2) ----

ScheduleSpec deferred(ScheduleKind kind, Recompute recompute, int micro_batches, int sub_batches,
                      bool training = true) {
  ScheduleSpec spec{kind, recompute, micro_batches, sub_batches, training};
  spec.deferred_param_gather = true;
  return spec;
}

// Every bucket is gathered once: the gathers open the schedule in the order of the buckets'
// first uses, each wait stands right before its bucket's first use, nothing is released, and
// the result verifies (every bucket ends gathered).
TEST(DeferredGathers, GatherEveryBucketOnceAheadOfItsFirstUse) {
  const ops::Program program = with_param_buckets(gpt_program(3));
  for (const ScheduleSpec& spec :
       {deferred(ScheduleKind::megatron, Recompute::none, 2, 1),
        deferred(ScheduleKind::oases, Recompute::fine_grained, 2, 2),
        deferred(ScheduleKind::oases_interleaved, Recompute::fine_grained, 3, 2),
        deferred(ScheduleKind::megatron, Recompute::full, 1, 1),
        deferred(ScheduleKind::oases, Recompute::fine_grained, 2, 2, false)}) {
    const std::string what =
        std::string(name(spec.kind)) + (spec.training ? "" : " forward only");
    const Schedule original = generate(program, spec);
    Schedule s = original;
    shard_parameters(program, spec, s);
    EXPECT_NO_THROW(verify_schedule(program, spec, s)) << what;
    EXPECT_EQ(without_parameter_instructions(s), original) << what;
    std::vector<int> gathered, first_used;
    std::map<int, int> waits;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const Instruction& ins = s[i];
      EXPECT_NE(ins.op, Op::release_params) << what;
      if (ins.op == Op::gather_params) {
        // All of them before anything else.
        EXPECT_EQ(i, gathered.size()) << what;
        gathered.push_back(ins.bucket);
      }
      if (ins.op == Op::wait_params) {
        ++waits[ins.bucket];
        std::size_t j = i + 1;
        while (j < s.size() && s[j].op == Op::wait_params) ++j;
        ASSERT_LT(j, s.size()) << what;
        EXPECT_TRUE(reads(program, s[j], ins.bucket)) << what << " at " << i;
        for (std::size_t k = 0; k < i; ++k)
          EXPECT_FALSE(reads(program, s[k], ins.bucket)) << what << ": used before its wait";
      }
      if (is_compute(ins.op))
        for (int b : program.segments[static_cast<std::size_t>(ins.segment)].param_buckets)
          if (std::find(first_used.begin(), first_used.end(), b) == first_used.end())
            first_used.push_back(b);
    }
    EXPECT_EQ(gathered, first_used) << what << ": gathers in the order of first use";
    for (const auto& [bucket, count] : waits) EXPECT_EQ(count, 1) << what << " bucket " << bucket;
    EXPECT_EQ(waits.size(), gathered.size()) << what;
  }
}

TEST_F(ShardedBroken, DeferredGathersRejectReleasesAndComputeBeforeTheWait) {
  const ScheduleSpec plan = deferred(ScheduleKind::megatron, Recompute::none, 1, 1);
  Schedule s = generate(program, plan);
  shard_parameters(program, plan, s);
  EXPECT_NO_THROW(verify_schedule(program, plan, s));
  const std::size_t wait = find(s, "WaitParams(bucket=1)");
  expect_rejected(erased(s, wait), "computes on sharded parameters of bucket 1", &plan);
  Instruction release{Op::release_params};
  release.bucket = 1;
  expect_rejected(inserted(s, s.size(), release),
                  "releases parameters under deferred gathers", &plan);
  // A gather never waited leaves its bucket short at the end.
  Instruction gather{Op::gather_params};
  gather.bucket = 7;
  expect_rejected(inserted(s, 0, gather),
                  "bucket 7 is not gathered at the end (its GatherParams was never waited)",
                  &plan);
}

}  // namespace
}  // namespace oases::schedule
