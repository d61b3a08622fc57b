#include "schedule/schedule.h"

#include "core/error.h"

#include <gtest/gtest.h>

namespace oases::schedule {
namespace {

// The shape of a 1-layer GPT: embedding, attention, mlp, head, with gradient buckets
// (embeddings 0, layer 1, final norm 2) that become final after embedding, attention, head.
ProgramShape one_layer_gpt() {
  return {{{true, false, 1, 0}, {true, true, 2, 1}, {true, true, 2, -1}, {false, false, 1, 2}}};
}

TEST(MegatronSchedule, PrintsTheExpectedInstructionList) {
  const Schedule s = megatron_schedule(one_layer_gpt(), 1, true);
  EXPECT_EQ(to_string(s),
            "Forward(seg=0, mb=0, sb=0)\n"
            "Start(fwd, seg=0, mb=0, sb=0)\n"
            "Wait(fwd, seg=0, mb=0, sb=0)\n"
            "Forward(seg=1, mb=0, sb=0)\n"
            "Start(fwd, seg=1, mb=0, sb=0)\n"
            "Wait(fwd, seg=1, mb=0, sb=0)\n"
            "Forward(seg=2, mb=0, sb=0)\n"
            "Start(fwd, seg=2, mb=0, sb=0)\n"
            "Wait(fwd, seg=2, mb=0, sb=0)\n"
            "Forward(seg=3, mb=0, sb=0)\n"
            "Backward(seg=3, stage=0, mb=0, sb=0)\n"
            "ReduceGrads(bucket=2)\n"
            "Backward(seg=2, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=2, mb=0, sb=0)\n"
            "Wait(bwd, seg=2, mb=0, sb=0)\n"
            "Backward(seg=2, stage=1, mb=0, sb=0)\n"
            "Backward(seg=1, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=1, mb=0, sb=0)\n"
            "Wait(bwd, seg=1, mb=0, sb=0)\n"
            "Backward(seg=1, stage=1, mb=0, sb=0)\n"
            "ReduceGrads(bucket=1)\n"
            "Backward(seg=0, stage=0, mb=0, sb=0)\n"
            "ReduceGrads(bucket=0)\n"
            "OptimizerStep\n");
}

TEST(MegatronSchedule, VerifiesForEveryMicroBatchCountAndForwardOnly) {
  for (int mb = 1; mb <= 4; ++mb) {
    EXPECT_NO_THROW(verify_schedule(one_layer_gpt(), mb, megatron_schedule(one_layer_gpt(), mb, true)));
    const Schedule eval = megatron_schedule(one_layer_gpt(), mb, false);
    EXPECT_NO_THROW(verify_schedule(one_layer_gpt(), mb, eval));
    for (const Instruction& ins : eval) EXPECT_NE(ins.op, Op::backward);
    // Buckets are reduced once, after the last micro-batch's backward pass has made them final.
    const Schedule train = megatron_schedule(one_layer_gpt(), mb, true);
    int reductions = 0;
    for (std::size_t i = 0; i < train.size(); ++i) {
      if (train[i].op != Op::reduce_grads) continue;
      ++reductions;
      EXPECT_EQ(train[i - 1].op, Op::backward);
      EXPECT_EQ(train[i - 1].micro_batch, mb - 1);
    }
    EXPECT_EQ(reductions, 3);
  }
}

TEST(VerifySchedule, RejectsBrokenSchedules) {
  const ProgramShape shape = one_layer_gpt();
  Schedule s = megatron_schedule(shape, 1, true);

  Schedule missing_wait = s;
  missing_wait.erase(missing_wait.begin() + 2);  // Wait(fwd, seg=0)
  EXPECT_THROW(verify_schedule(shape, 1, missing_wait), InternalError);

  Schedule backward_first = s;
  std::swap(backward_first[9], backward_first[10]);  // Backward(head) before Forward(head)
  EXPECT_THROW(verify_schedule(shape, 1, backward_first), InternalError);

  Schedule stage_before_collective = s;
  std::swap(stage_before_collective[14], stage_before_collective[15]);  // stage 1 before Wait
  EXPECT_THROW(verify_schedule(shape, 1, stage_before_collective), InternalError);

  Schedule double_start = s;
  double_start.insert(double_start.begin() + 1, s[1]);
  EXPECT_THROW(verify_schedule(shape, 1, double_start), InternalError);
}

}  // namespace
}  // namespace oases::schedule
