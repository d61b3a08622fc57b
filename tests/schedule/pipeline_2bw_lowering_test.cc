// The PipeDream-2BW lowering (schedule/pipeline_2bw.h): every kind of run verifies with its
// declared carry, runs chained into a stream pass the point-to-point check (messages cross run
// boundaries), the stream never drains between batches, and the verifier rejects runs that lose
// what they carry or compute on the wrong weights.
#include "schedule/pipeline_2bw.h"

#include "core/error.h"
#include "support/stage_programs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace oases::schedule {
namespace {

// The programs of `stages` stages of a GPT of stages + 1 layers, as each rank builds its own.
std::vector<ops::Program> stage_programs(int stages, int sub_batches) {
  return testing::tiny_stage_programs(testing::tiny_stage_model("gpt", stages + 1), stages, 1,
                                      sub_batches);
}

PipelineSpec two_bw(int stages, int micro_batches) {
  PipelineSpec p;
  p.kind = PipelineKind::two_bw;
  p.stages = stages;
  p.micro_batches = micro_batches;
  return p;
}

const std::vector<ScheduleSpec> kWithinStage{
    {ScheduleKind::megatron, Recompute::none, 0, 1, true},
    {ScheduleKind::oases, Recompute::fine_grained, 0, 2, true}};

constexpr TwoBwRun kFirst{false, false}, kSteady{true, false}, kLast{true, true},
    kAlone{false, true};

// Index of the first (or last) compute instruction that starts (ends) a pipeline action: a
// forward of micro-batch `mb` of `batch` begins with Forward of segment 0, sub-batch 0; a
// backward ends with the last backward stage of segment 0 on the last sub-batch.
long first_forward(const Schedule& s, int batch) {
  for (std::size_t i = 0; i < s.size(); ++i)
    if (s[i].op == Op::forward && s[i].batch == batch) return static_cast<long>(i);
  return -1;
}
long last_backward(const Schedule& s, int batch) {
  for (std::size_t i = s.size(); i-- > 0;)
    if (s[i].op == Op::backward && s[i].batch == batch) return static_cast<long>(i);
  return -1;
}
// Micro-batches of `batch` whose forward starts before instruction `end`.
int forwards_before(const Schedule& s, int batch, long end) {
  int count = 0;
  for (long i = 0; i < end; ++i) {
    const Instruction& ins = s[static_cast<std::size_t>(i)];
    count += ins.op == Op::forward && ins.batch == batch && ins.segment == 0 && ins.sub_batch == 0;
  }
  return count;
}

TEST(TwoBwLowering, EveryRunVerifiesAndChainedRunsPassThePointToPointCheck) {
  int checked = 0;
  for (int stages : {2, 3, 4}) {
    for (const ScheduleSpec& base : kWithinStage) {
      const std::vector<ops::Program> programs = stage_programs(stages, base.sub_batches);
      for (int m : {stages + 1, 2 * stages}) {
        const std::string what = fmt::format("P={} m={} within {} sb={}", stages, m,
                                             name(base.kind), base.sub_batches);
        ScheduleSpec spec = base;
        spec.micro_batches = m;
        const PipelineSpec pipeline = two_bw(stages, m);
        std::vector<Schedule> stream(static_cast<std::size_t>(stages));
        std::vector<Schedule> alone(static_cast<std::size_t>(stages));
        for (int rank = 0; rank < stages; ++rank) {
          const ops::Program& program = programs[static_cast<std::size_t>(rank)];
          const std::string who = what + fmt::format(" rank {}", rank);
          const int warm_up = stages - 1 - rank;
          // first, steady, steady, last: four batches as one stream.
          for (const TwoBwRun run : {kFirst, kSteady, kSteady, kLast}) {
            const LoweredRun lowered = lower_2bw_run(program, spec, pipeline, rank, run);
            EXPECT_NO_THROW(verify_schedule(program, spec, lowered.schedule, lowered.carry))
                << who << " carries_in " << run.carries_in << " drains " << run.drains;
            // A run that does not drain leaves the last w backwards of its batch in flight.
            std::vector<int> expected_out;
            if (!run.drains)
              for (int mb = m - warm_up; mb < m; ++mb) expected_out.push_back(mb);
            EXPECT_EQ(lowered.carry.carried_out, expected_out) << who;
            for (const Instruction& ins : lowered.schedule) EXPECT_EQ(ins.chunk, rank) << who;
            auto& chained = stream[static_cast<std::size_t>(rank)];
            chained.insert(chained.end(), lowered.schedule.begin(), lowered.schedule.end());
          }
          const LoweredRun steady = lower_2bw_run(program, spec, pipeline, rank, kSteady);
          if (warm_up > 0) {
            // No flush: the rank runs w forwards of its batch before the previous batch's last
            // backward, which the previous run could not run.
            const long first = first_forward(steady.schedule, 0);
            const long last = last_backward(steady.schedule, -1);
            ASSERT_GE(first, 0) << who;
            ASSERT_GT(last, first) << who;
            EXPECT_EQ(forwards_before(steady.schedule, 0, last), warm_up) << who;
          } else {
            // The last rank finished the previous batch in the previous run and starts this
            // one with its first forward: nothing of the previous batch is left to wait for.
            EXPECT_EQ(last_backward(steady.schedule, -1), -1) << who;
            const auto compute = std::find_if(
                steady.schedule.begin(), steady.schedule.end(),
                [](const Instruction& ins) { return ins.op == Op::forward || ins.op == Op::backward; });
            ASSERT_NE(compute, steady.schedule.end()) << who;
            EXPECT_EQ(compute->op, Op::forward) << who;
            EXPECT_EQ(compute->batch, 0) << who;
          }
          const LoweredRun one = lower_2bw_run(program, spec, pipeline, rank, kAlone);
          EXPECT_NO_THROW(verify_schedule(program, spec, one.schedule, one.carry)) << who;
          alone[static_cast<std::size_t>(rank)] = one.schedule;
        }
        EXPECT_NO_THROW(verify_point_to_point(stream)) << what;
        EXPECT_NO_THROW(verify_point_to_point(alone)) << what;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 3 * 2 * 2);
}

// The stages' optimizer steps of a batch wait for each other (the global gradient norm): every
// message sent before a rank's step must be received before the receiver's, or a rank blocked in
// its step would hold back a Send another rank needs to complete before its own step.
TEST(TwoBwLowering, MessagesSentBeforeAStepAreReceivedBeforeTheReceiversStep) {
  for (int stages : {2, 3, 4}) {
    const std::vector<ops::Program> programs = stage_programs(stages, 2);
    for (int m : {stages + 1, 2 * stages}) {
      ScheduleSpec spec = kWithinStage.back();
      spec.micro_batches = m;
      for (const TwoBwRun run : {kSteady, kLast, kAlone}) {
        std::vector<Schedule> group;
        for (int rank = 0; rank < stages; ++rank)
          group.push_back(lower_2bw_run(programs[static_cast<std::size_t>(rank)], spec,
                                        two_bw(stages, m), rank, run).schedule);
        for (const int batch : {-1, 0}) {
          if ((batch == -1 && !run.carries_in) || (batch == 0 && !run.drains)) continue;
          const auto step_of = [&](const Schedule& s) {
            return std::find_if(s.begin(), s.end(), [&](const Instruction& ins) {
                     return ins.op == Op::optimizer_step && ins.batch == batch;
                   }) - s.begin();
          };
          for (int rank = 0; rank < stages; ++rank) {
            const Schedule& mine = group[static_cast<std::size_t>(rank)];
            const long my_step = step_of(mine);
            ASSERT_LT(my_step, static_cast<long>(mine.size()));
            for (long i = 0; i < my_step; ++i) {
              const Instruction& send = mine[static_cast<std::size_t>(i)];
              if (send.op != Op::send) continue;
              const Schedule& peer = group[static_cast<std::size_t>(send.peer)];
              const auto recv = std::find_if(peer.begin(), peer.end(), [&](const Instruction& ins) {
                return ins.op == Op::recv && ins.peer == rank && ins.payload == send.payload &&
                       ins.batch == send.batch && ins.micro_batch == send.micro_batch &&
                       ins.sub_batch == send.sub_batch;
              });
              ASSERT_NE(recv, peer.end()) << to_string(send);
              EXPECT_LT(recv - peer.begin(), step_of(peer))
                  << fmt::format("P={} m={} rank {} sends {} before its step of batch {}; rank {} "
                                 "receives it after its own",
                                 stages, m, rank, to_string(send), batch, send.peer);
            }
          }
        }
      }
    }
  }
}

TEST(TwoBwLowering, TheVerifierRejectsLostCarriesAndStaleWeights) {
  const std::vector<ops::Program> programs = stage_programs(2, 1);
  ScheduleSpec spec = kWithinStage.front();
  spec.micro_batches = 3;
  const LoweredRun steady = lower_2bw_run(programs[0], spec, two_bw(2, 3), 0, kSteady);
  ASSERT_NO_THROW(verify_schedule(programs[0], spec, steady.schedule, steady.carry));
  const auto rejected = [&](const Schedule& schedule, const RunCarry& carry) {
    try {
      verify_schedule(programs[0], spec, schedule, carry);
    } catch (const InternalError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // Without the declared carry the run's first instructions of batch -1 are out of place.
  RunCarry nothing_earlier;
  nothing_earlier.weight_versions = true;
  EXPECT_NE(rejected(steady.schedule, nothing_earlier).find("batch outside the run"),
            std::string::npos);
  // Dropping what it carries out leaves batch 0's last backwards missing.
  RunCarry no_carry_out = steady.carry;
  no_carry_out.carried_out.clear();
  EXPECT_NE(rejected(steady.schedule, no_carry_out).find("backward incomplete"), std::string::npos);
  // Computing on the other batch's weights.
  Schedule stale = steady.schedule;
  const auto use = std::find_if(stale.begin(), stale.end(), [](const Instruction& ins) {
    return ins.op == Op::use_weights && ins.batch == -1;
  });
  ASSERT_NE(use, stale.end());
  use->batch = 0;
  EXPECT_NE(rejected(stale, steady.carry).find("without a UseWeights of its batch"),
            std::string::npos);
  // A backward of batch 0 moved before the optimizer step of batch -1 would mix gradients.
  Schedule mixed = steady.schedule;
  const auto step = std::find_if(mixed.begin(), mixed.end(), [](const Instruction& ins) {
    return ins.op == Op::optimizer_step;
  });
  ASSERT_NE(step, mixed.end());
  const Instruction moved = *step;
  mixed.erase(step);
  mixed.push_back(moved);
  EXPECT_NE(rejected(mixed, steady.carry).find("before the optimizer step of batch -1"),
            std::string::npos);
}

TEST(TwoBwLowering, TooFewMicroBatchesIsAClearError) {
  const std::vector<ops::Program> programs = stage_programs(3, 1);
  ScheduleSpec spec = kWithinStage.front();
  spec.micro_batches = 3;
  try {
    lower_2bw_run(programs[0], spec, two_bw(3, 3), 0, kSteady);
    ADD_FAILURE() << "accepted 3 micro-batches over 3 stages";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parallel.pipeline = \"2bw\""), std::string::npos) << message;
    EXPECT_NE(message.find("parallel.pp = 3"), std::string::npos) << message;
    EXPECT_NE(message.find("valid: 4 or more"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace oases::schedule
