// Zero-bubble (ZB-H1) lowering: the stage programs of small GPT and LLaMA models cut into P
// stages, lowered with the backward split into input parts (I) and deferred weight parts (W);
// every rank's schedule verifies alone, the ranks' messages pair up and cannot deadlock under
// blocking Send/Recv, each rank computes in its ZB-H1 order, every instance's weight part runs
// once. The verifier rejects hand-broken schedules (a weight part before its input part, a
// Free of a set a pending weight part reads, a weight part run twice or never, a bucket reduced
// before its weight parts) naming the instruction.
#include "schedule/pipeline_lowering.h"

#include "core/error.h"
#include "support/gpt_program.h"
#include "support/stage_programs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace oases::schedule {
namespace {

// The programs of `stages` stages of a model of stages + 1 layers (the last stage holds two).
std::vector<ops::Program> stage_programs(const std::string& arch, int stages, int sub_batches) {
  return testing::tiny_stage_programs(testing::tiny_stage_model(arch, stages + 1), stages, 1,
                                      sub_batches);
}

PipelineSpec zero_bubble(int stages, int micro_batches) {
  PipelineSpec p;
  p.kind = PipelineKind::zero_bubble;
  p.stages = stages;
  p.micro_batches = micro_batches;
  return p;
}

// Whole micro-batches under megatron (without recomputation, or with whole layers recomputed),
// or two sub-batches under oases.
ScheduleSpec within_spec(int sub_batches, int micro_batches,
                         Recompute recompute = Recompute::none) {
  if (sub_batches == 1) return {ScheduleKind::megatron, recompute, micro_batches, 1, true};
  return {ScheduleKind::oases, Recompute::fine_grained, micro_batches, sub_batches, true};
}

// The compute actions a lowered schedule runs, read back from its instructions (sub-batch 0):
// F starts with Forward of segment 0, I with the input-only stage 0 of the last segment that has
// a weight part, W with the first BackwardWeight of a micro-batch.
std::vector<PipelineAction> actions_of(const ops::Program& program, const Schedule& schedule,
                                       int chunk) {
  int last_split = -1;
  for (int s = 0; s < static_cast<int>(program.segments.size()); ++s)
    if (program.segments[static_cast<std::size_t>(s)].has_weight_part) last_split = s;
  std::vector<PipelineAction> out;
  for (const Instruction& ins : schedule) {
    if (ins.sub_batch != 0) continue;
    if (ins.op == Op::forward && ins.segment == 0)
      out.push_back({PipelineAction::forward, chunk, ins.micro_batch});
    if (ins.op == Op::backward && ins.input_only && ins.segment == last_split && ins.stage == 0)
      out.push_back({PipelineAction::backward_input, chunk, ins.micro_batch});
    if (ins.op == Op::backward_weight && ins.segment == last_split)
      out.push_back({PipelineAction::backward_weight, chunk, ins.micro_batch});
  }
  return out;
}

std::string rejection(const ops::Program& program, const ScheduleSpec& spec,
                      const Schedule& schedule) {
  try {
    verify_schedule(program, spec, schedule);
  } catch (const InternalError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(ZeroBubbleLowering, EveryRankVerifiesFollowsItsOrderAndTheMessagesCannotDeadlock) {
  int lowered = 0;
  for (const std::string arch : {"gpt", "llama"}) {
    for (int stages : {2, 3, 4}) {
      for (const auto& [sub_batches, recompute] :
           {std::pair{1, Recompute::none}, std::pair{1, Recompute::full},
            std::pair{2, Recompute::fine_grained}}) {
        const std::vector<ops::Program> programs = stage_programs(arch, stages, sub_batches);
        for (int m : {stages, 2 * stages, 4 * stages + 1}) {
          const std::string what = fmt::format("{} P={} m={} sb={} recompute {}", arch, stages, m,
                                               sub_batches, name(recompute));
          const PipelineSpec pipeline = zero_bubble(stages, m);
          const ScheduleSpec spec = within_spec(sub_batches, m, recompute);
          const PipelineOrders orders = pipeline_orders(pipeline);
          std::vector<Schedule> group;
          for (int rank = 0; rank < stages; ++rank) {
            const ops::Program& program = programs[static_cast<std::size_t>(rank)];
            group.push_back(lower_pipeline(program, spec, pipeline, rank));
            const Schedule& mine = group.back();
            EXPECT_NO_THROW(verify_schedule(program, spec, mine)) << what << " rank " << rank;
            EXPECT_EQ(actions_of(program, mine, rank), orders[static_cast<std::size_t>(rank)])
                << what << " rank " << rank;
            // Every instance of a segment with a weight part: input-only stages, one W.
            std::map<std::tuple<int, int, int>, int> weight_parts;
            for (const Instruction& ins : mine) {
              if (ins.op == Op::backward_weight)
                ++weight_parts[{ins.segment, ins.micro_batch, ins.sub_batch}];
              if (ins.op == Op::backward) {
                EXPECT_EQ(ins.input_only,
                          program.segments[static_cast<std::size_t>(ins.segment)].has_weight_part)
                    << what << " " << to_string(ins);
              }
            }
            int split_segments = 0;
            for (const ops::SegmentShape& shape : program.segments) split_segments += shape.has_weight_part;
            EXPECT_GT(split_segments, 0) << what;
            EXPECT_EQ(weight_parts.size(),
                      static_cast<std::size_t>(split_segments * m * sub_batches))
                << what << " rank " << rank;
            for (const auto& [instance, count] : weight_parts) EXPECT_EQ(count, 1) << what;
          }
          EXPECT_NO_THROW(verify_point_to_point(group)) << what;
          ++lowered;
        }
      }
    }
  }
  EXPECT_EQ(lowered, 2 * 3 * 3 * 3);
}

// The vocab-parallel head's head_loss defers the vocabulary GEMM, reading the logits the head
// keeps: the head's Free moves after head_loss's weight part. (One stage, as a rank of a
// tensor-parallel group sees its program.)
TEST(ZeroBubbleLowering, TheHeadKeepsItsLogitsUntilHeadLossHasRunItsWeightPart) {
  ops::Program program = testing::gpt_program(2, 2);
  int head = -1, head_loss = -1;
  for (int s = 0; s < static_cast<int>(program.segments.size()); ++s) {
    ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(s)];
    if (shape.name == "head") head = s;
    if (shape.name == "head_loss") head_loss = s;
    shape.has_weight_part = shape.layer >= 0 || shape.name == "head_loss";
    if (shape.layer >= 0) shape.deferred_gradient_bytes = 1000;
  }
  const ScheduleSpec spec = within_spec(2, 3);
  const Schedule s = lower_pipeline(program, spec, zero_bubble(1, 3), 0);
  ASSERT_NO_THROW(verify_schedule(program, spec, s));
  for (int mb = 0; mb < 3; ++mb) {
    for (int sb = 0; sb < 2; ++sb) {
      const auto at = [&](Op op, int segment) {
        return std::find_if(s.begin(), s.end(), [&](const Instruction& ins) {
                 return ins.op == op && ins.segment == segment && ins.micro_batch == mb &&
                        ins.sub_batch == sb;
               }) - s.begin();
      };
      EXPECT_LT(at(Op::backward_weight, head_loss), at(Op::free, head)) << mb << " " << sb;
      EXPECT_LT(at(Op::backward, head), at(Op::backward_weight, head_loss)) << mb << " " << sb;
    }
  }
  // The stash of a layer segment's input part counts from its stage 0 until its weight part:
  // with nothing else kept, the peak is one micro-batch's (two sub-batches, four layer
  // segments), since one rank alone runs each W right after its I.
  ops::Program stash_only = program;
  for (ops::SegmentShape& shape : stash_only.segments)
    shape.checkpoint_bytes = shape.internals_bytes = shape.core_bytes = 0;
  EXPECT_EQ(peak_activation_bytes(stash_only, s), 2u * 4u * 1000u);
  EXPECT_NE(to_string(s).find("BackwardWeight(seg=" + std::to_string(head_loss) + ", mb=0, sb=1)"),
            std::string::npos);
  EXPECT_NE(to_string(s).find("Backward(seg=1, stage=0, mb=0, sb=0, input-only)"),
            std::string::npos);
}

TEST(ZeroBubbleLowering, VerifierRejectsBrokenWeightPartsNamingTheInstruction) {
  const std::vector<ops::Program> programs = stage_programs("gpt", 2, 1);
  const ops::Program& program = programs[1];  // layers 1 and 2, the head
  const ScheduleSpec spec = within_spec(1, 2);
  const Schedule good = lower_pipeline(program, spec, zero_bubble(2, 2), 1);
  ASSERT_NO_THROW(verify_schedule(program, spec, good));
  const auto index_of = [&](const Schedule& s, auto&& predicate) {
    return static_cast<std::size_t>(std::find_if(s.begin(), s.end(), predicate) - s.begin());
  };
  const std::size_t first_weight =
      index_of(good, [](const Instruction& ins) { return ins.op == Op::backward_weight; });
  ASSERT_LT(first_weight, good.size());
  const Instruction weight = good[first_weight];
  const auto is_input_stage0 = [&](const Instruction& ins) {
    return ins.op == Op::backward && ins.segment == weight.segment &&
           ins.micro_batch == weight.micro_batch && ins.sub_batch == weight.sub_batch &&
           ins.stage == 0;
  };

  // W before its I: moved to just before the instance's first backward stage.
  {
    Schedule broken = good;
    broken.erase(broken.begin() + static_cast<std::ptrdiff_t>(first_weight));
    const std::size_t at = index_of(broken, is_input_stage0);
    broken.insert(broken.begin() + static_cast<std::ptrdiff_t>(at), weight);
    const std::string message = rejection(program, spec, broken);
    EXPECT_NE(message.find(fmt::format("instruction {} ({})", at, to_string(weight))),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("weight part before the instance's input-only backward has finished"),
              std::string::npos)
        << message;
  }
  // A Free of a set the pending W reads: the Free that follows it, moved before it.
  {
    Schedule broken = good;
    const std::size_t free_at = first_weight + 1;
    ASSERT_EQ(broken[free_at].op, Op::free);
    ASSERT_EQ(broken[free_at].segment, weight.segment);
    const Instruction free = broken[free_at];
    std::swap(broken[first_weight], broken[free_at]);
    const std::string message = rejection(program, spec, broken);
    EXPECT_NE(message.find(fmt::format("instruction {} ({})", first_weight, to_string(free))),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(fmt::format("which the pending weight part of segment {}", weight.segment)),
              std::string::npos)
        << message;
  }
  // W twice.
  {
    Schedule broken = good;
    broken.insert(broken.begin() + static_cast<std::ptrdiff_t>(first_weight + 1), weight);
    EXPECT_NE(rejection(program, spec, broken).find(fmt::format(
                  "instruction {} ({}): weight part twice", first_weight + 1, to_string(weight))),
              std::string::npos);
  }
  // W never (and its Free with it): the bucket it belongs to is reduced too early.
  {
    Schedule broken = good;
    broken.erase(broken.begin() + static_cast<std::ptrdiff_t>(first_weight),
                 broken.begin() + static_cast<std::ptrdiff_t>(first_weight + 2));
    const std::string message = rejection(program, spec, broken);
    EXPECT_NE(message.find("ReduceGrads"), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format("the weight part of segment {} mb {} sb {} has not run",
                                       weight.segment, weight.micro_batch, weight.sub_batch)),
              std::string::npos)
        << message;
  }
  // An input-only backward of a segment with no weight part.
  {
    Schedule broken = good;
    const std::size_t head_backward = index_of(broken, [&](const Instruction& ins) {
      return ins.op == Op::backward &&
             !program.segments[static_cast<std::size_t>(ins.segment)].has_weight_part;
    });
    ASSERT_LT(head_backward, broken.size());
    broken[head_backward].input_only = true;
    EXPECT_NE(rejection(program, spec, broken)
                  .find("an input-only backward of a segment without a weight part"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace oases::schedule
