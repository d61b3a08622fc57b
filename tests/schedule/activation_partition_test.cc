// partition_kept_checkpoints (schedule.h): Partition, GatherSets and WaitSets around each
// replicated checkpoint's wait between its forward-side and backward-side readers, on every
// within-stage schedule; the verifier holds reads of partitioned checkpoints to be errors;
// peak_activation_bytes counts slices.
#include "schedule/schedule.h"

#include "core/error.h"
#include "support/gpt_program.h"
#include "support/schedule_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace oases::schedule {
namespace {

using Case = testing::ScheduleCase;

// The layers' checkpoints are identical over the tp ranks of their group, as model::Model
// builds them.
ops::Program replicated_program(int layers, int tp) {
  ops::Program program = testing::gpt_program(layers, tp);
  for (ops::SegmentShape& shape : program.segments) {
    if (shape.layer < 0) continue;
    shape.collective_ranks = shape.degree = tp;
    shape.checkpoint_replicated = tp > 1;
    shape.has_weight_part = true;
  }
  return program;
}

Schedule without_partitions(const Schedule& schedule) {
  Schedule out;
  for (const Instruction& ins : schedule)
    if (ins.op != Op::partition && ins.op != Op::gather_sets && ins.op != Op::wait_sets)
      out.push_back(ins);
  return out;
}

std::size_t count(const Schedule& schedule, Op op) {
  return static_cast<std::size_t>(std::count_if(
      schedule.begin(), schedule.end(), [&](const Instruction& ins) { return ins.op == op; }));
}

bool is_compute(Op op) {
  return op == Op::forward || op == Op::recompute || op == Op::backward ||
         op == Op::backward_weight;
}

TEST(PartitionKeptCheckpoints, EverySchedulesPartitionedFormVerifiesAndKeepsLess) {
  for (int tp : {2, 4}) {
    const ops::Program program = replicated_program(4, tp);
    for (const Case& c : testing::within_stage_schedules()) {
      for (int micro_batches : {1, 3}) {
        ScheduleSpec spec{c.kind, c.recompute, micro_batches, c.sub_batches, true};
        if (c.recompute == Recompute::sqrt) spec.recompute_every = 2;
        const Schedule plain = generate(program, spec);
        const std::string what = std::string(name(c.kind)) + " " + std::string(name(c.recompute)) + " mb" +
                                 std::to_string(micro_batches) + " tp" + std::to_string(tp);
        Schedule partitioned = plain;
        partition_kept_checkpoints(program, partitioned);
        EXPECT_NO_THROW(verify_schedule(program, spec, partitioned)) << what;
        // The pass only inserts; every Partition is gathered back and waited for.
        EXPECT_EQ(without_partitions(partitioned), plain) << what;
        EXPECT_GT(count(partitioned, Op::partition), 0u) << what;
        EXPECT_EQ(count(partitioned, Op::partition), count(partitioned, Op::gather_sets)) << what;
        EXPECT_EQ(count(partitioned, Op::partition), count(partitioned, Op::wait_sets)) << what;
        for (std::size_t i = 0; i < partitioned.size(); ++i) {
          const Instruction& ins = partitioned[i];
          if (ins.op == Op::partition) {
            EXPECT_EQ(ins.sets, ops::kCheckpoint) << what;
            EXPECT_GE(program.segments[static_cast<std::size_t>(ins.segment)].layer, 0) << what;
          }
          // A gather travels while a compute instruction runs: the next compute comes before
          // the gather's wait.
          if (ins.op != Op::gather_sets) continue;
          Instruction wait = ins;
          wait.op = Op::wait_sets;
          const auto waited = std::find(partitioned.begin() + static_cast<std::ptrdiff_t>(i),
                                        partitioned.end(), wait);
          ASSERT_NE(waited, partitioned.end()) << what;
          EXPECT_TRUE(std::any_of(partitioned.begin() + static_cast<std::ptrdiff_t>(i), waited,
                                  [](const Instruction& x) { return is_compute(x.op); }))
              << what << ": " << to_string(ins) << " waited at once";
        }
        // Without recomputation the peak holds the internals too, and falls less; it falls.
        EXPECT_LT(peak_activation_bytes(program, partitioned), peak_activation_bytes(program, plain))
            << what;
      }
    }
  }
}

// Full recomputation keeps each layer's first checkpoint alone: at tp ranks each keeps 1/tp of
// them. At the peak (the last layer's recomputation) the checkpoints of all layers but that
// one, gathered already, are slices.
TEST(PartitionKeptCheckpoints, UnderFullRecomputationThePeakFallsToASliceOfTheCheckpoints) {
  const int tp = 4, layers = 8;
  const ops::Program program = replicated_program(layers, tp);
  const ScheduleSpec spec{ScheduleKind::megatron, Recompute::full, 1, 1, true};
  const Schedule plain = generate(program, spec);
  Schedule partitioned = plain;
  partition_kept_checkpoints(program, partitioned);
  const std::size_t checkpoint = program.segments[1].checkpoint_bytes;
  const std::size_t before = peak_activation_bytes(program, plain);
  const std::size_t after = peak_activation_bytes(program, partitioned);
  EXPECT_EQ(before - after, static_cast<std::size_t>(layers - 1) * checkpoint * (tp - 1) / tp);
}

TEST(PartitionKeptCheckpoints, OnlyReplicatedCheckpointsArePartitioned) {
  const ops::Program program = testing::gpt_program(2, 1);  // nothing replicated at tp 1
  const ScheduleSpec spec{ScheduleKind::megatron, Recompute::full, 2, 1, true};
  const Schedule plain = generate(program, spec);
  Schedule s = plain;
  partition_kept_checkpoints(program, s);
  EXPECT_EQ(s, plain);
  // A hand-written Partition of a checkpoint that is not replicated is refused.
  ops::Program replicated = replicated_program(2, 2);
  Schedule forced = generate(replicated, spec);
  partition_kept_checkpoints(replicated, forced);
  replicated.segments[1].checkpoint_replicated = false;
  try {
    verify_schedule(replicated, spec, forced);
    ADD_FAILURE() << "a Partition of a checkpoint that is not replicated was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("not replicated"), std::string::npos) << e.what();
  }
}

TEST(PartitionKeptCheckpoints, TheVerifierRejectsReadingAPartitionedCheckpoint) {
  const ops::Program program = replicated_program(2, 2);
  const ScheduleSpec spec{ScheduleKind::oases, Recompute::fine_grained, 2, 2, true};
  Schedule s = generate(program, spec);
  partition_kept_checkpoints(program, s);
  const auto first = [&](Op op) {
    return std::find_if(s.begin(), s.end(), [&](const Instruction& ins) { return ins.op == op; }) -
           s.begin();
  };
  const auto rejects = [&](Schedule broken, const std::string& message, const char* what) {
    try {
      verify_schedule(program, spec, broken);
      ADD_FAILURE() << what << " was accepted";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  {
    Schedule broken = s;
    broken.erase(broken.begin() + first(Op::wait_sets));
    rejects(broken, "while it is partitioned (its GatherSets was not waited)",
            "a read of a checkpoint whose gather was not waited");
  }
  {
    Schedule broken = s;
    Instruction wait = broken[static_cast<std::size_t>(first(Op::wait_sets))];
    Instruction gather = wait;
    gather.op = Op::gather_sets;
    broken.erase(std::find(broken.begin(), broken.end(), gather));
    broken.erase(std::find(broken.begin(), broken.end(), wait));
    rejects(broken, "while it is partitioned", "a read of a partitioned checkpoint");
  }
  {
    Schedule broken = s;
    broken.erase(broken.begin() + first(Op::partition));
    rejects(broken, "which is not partitioned", "a gather of a whole checkpoint");
  }
}

// GatherSets lands before the last compute instruction of another sub-batch ahead of the
// reader: under the oases schedule the other sub-batch computes while the gather travels.
TEST(PartitionKeptCheckpoints, UnderOasesTheGatherTravelsWhileTheOtherSubBatchComputes) {
  const ops::Program program = replicated_program(3, 2);
  const ScheduleSpec spec{ScheduleKind::oases, Recompute::fine_grained, 1, 2, true};
  Schedule s = generate(program, spec);
  partition_kept_checkpoints(program, s);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i].op != Op::gather_sets) continue;
    std::size_t next = i + 1;
    while (!is_compute(s[next].op)) ++next;
    EXPECT_NE(s[next].sub_batch, s[i].sub_batch) << to_string(s[i]) << " before " << to_string(s[next]);
  }
}

}  // namespace
}  // namespace oases::schedule
