// The compact notation and the rank x position grid (schedule_grid.h), and the verifiers'
// rejections: schedules broken on purpose, written as text, are rejected with the message's
// first line as before and the grid around the failing instruction below it, the failing
// cells marked.
#include "schedule/schedule_grid.h"

#include "core/error.h"
#include "support/gpt_program.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace oases::schedule {
namespace {

TEST(CompactNotation, EveryOpHasItsShortForm) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {"Forward(seg=3, mb=0, sb=1)", "F3.0.1"},
      {"Forward(seg=3, mb=0, sb=1, chunk=2, batch=-1)", "F3.0.1'"},
      {"Recompute(seg=3, checkpoint|internals|core|output, mb=0, sb=1)", "R3.0.1:ciko"},
      {"Backward(seg=12, stage=1, mb=10, sb=0)", "B12.10.0/1"},
      {"Backward(seg=2, stage=0, mb=1, sb=0, input-only)", "I2.1.0/0"},
      {"BackwardWeight(seg=2, mb=1, sb=0)", "W2.1.0"},
      {"Start(fwd, seg=4, mb=1, sb=0)", "sf4.1.0"},
      {"Start(fwd, seg=4, mb=1, sb=0, replay)", "sr4.1.0"},
      {"Wait(bwd, seg=4, mb=1, sb=0)", "wb4.1.0"},
      {"Wait(fwd, seg=4, mb=1, sb=0, replay)", "wr4.1.0"},
      {"Free(seg=1, checkpoint|core, mb=0, sb=0)", "x1.0.0:ck"},
      {"Encode(seg=1, internals, mb=0, sb=0, fp8)", "e1.0.0:i"},
      {"Decode(seg=1, internals, mb=0, sb=0, bf16)", "d1.0.0:i"},
      {"Partition(seg=1, checkpoint, mb=0, sb=0)", "pt1.0.0:c"},
      {"GatherSets(seg=1, checkpoint, mb=0, sb=0)", "gs1.0.0:c"},
      {"WaitSets(seg=1, checkpoint, mb=0, sb=0)", "ws1.0.0:c"},
      {"GatherParams(bucket=5)", "gp5"},
      {"WaitParams(bucket=5)", "wp5"},
      {"ReleaseParams(bucket=5)", "rp5"},
      {"ReduceGrads(bucket=5, chunk=1)", "rg5"},
      {"OptimizerStep", "step"},
      {"OptimizerStep(batch=-1)", "step'"},
      {"UseWeights(batch=-1)", "uw-1"},
      {"UseWeights(batch=0)", "uw0"},
      {"Send(activation, seg=7, mb=2, sb=0, peer=1, slot=2)", "a7.2.0>1"},
      {"Send(gradient, seg=0, mb=2, sb=0, peer=0, slot=2, chunk=1)", "g0.2.0>0"},
      {"RecvStart(activation, seg=0, mb=2, sb=0, peer=0, slot=2, chunk=1)", "sa0.2.0<0"},
      {"RecvWait(gradient, seg=7, mb=2, sb=1, peer=1, slot=2, batch=-1)", "wg7.2.1<1'"},
  };
  for (const auto& [text, compact] : cases)
    EXPECT_EQ(compact_string(parse_instruction(text)), compact) << text;
}

TEST(Grid, WithoutMarksShowsEveryRowAndColumn) {
  const Schedule rank0 = parse_schedule(
      "Forward(seg=0, mb=0, sb=0)\n"
      "Send(activation, seg=0, mb=0, sb=0, peer=1, slot=0)\n");
  const Schedule rank1 = parse_schedule(
      "RecvStart(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)\n"
      "RecvWait(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)\n"
      "Forward(seg=0, mb=0, sb=0, chunk=1)\n");
  EXPECT_EQ(format_grid({rank0, rank1}, {}),
            "  pos  rank 0     rank 1\n"
            "    0  F0.0.0     sa0.0.0<0\n"
            "    1  a0.0.0>1   wa0.0.0<0\n"
            "    2             F0.0.0\n");
}

TEST(Grid, CellsAreCutToFourteenCharacters) {
  const Schedule s = parse_schedule("Recompute(seg=1234, checkpoint|internals|core, mb=567, sb=89)");
  EXPECT_EQ(format_grid({s}, {{0, 0}}),
            "  pos  rank 0\n"
            ">   0 [R1234.567.89:~]\n");
}

// The message of the InternalError `check` throws; a test failure if it throws none.
std::string rejection(const std::function<void()>& check) {
  try {
    check();
  } catch (const InternalError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted a schedule that should be rejected";
  return "";
}
std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }
std::string after_first_line(const std::string& message) {
  const std::size_t end = message.find('\n');
  return end == std::string::npos ? "" : message.substr(end + 1);
}

ScheduleSpec megatron(bool training = true) {
  return {ScheduleKind::megatron, Recompute::none, 1, 1, training};
}

// The forward of segment 2 reads segment 1's output before the Wait of segment 1's forward
// collective: rejected at position 5, the grid showing positions 2 to 8 with 5 marked.
TEST(VerifierGrid, ARejectedInstructionIsMarkedAmongItsNeighbours) {
  const Schedule broken = parse_schedule(R"(
    Forward(seg=0, mb=0, sb=0)
    Start(fwd, seg=0, mb=0, sb=0)
    Wait(fwd, seg=0, mb=0, sb=0)
    Forward(seg=1, mb=0, sb=0)
    Start(fwd, seg=1, mb=0, sb=0)
    Forward(seg=2, mb=0, sb=0)   # before the Wait below
    Wait(fwd, seg=1, mb=0, sb=0)
    Start(fwd, seg=2, mb=0, sb=0)
    Wait(fwd, seg=2, mb=0, sb=0)
    Forward(seg=3, mb=0, sb=0)
    Backward(seg=3, stage=0, mb=0, sb=0)
  )");
  const std::string message =
      rejection([&] { verify_schedule(testing::gpt_program(1), megatron(), broken); });
  EXPECT_EQ(first_line(message).rfind(
                "internal error: schedule rejected: instruction 5 (Forward(seg=2, mb=0, sb=0)): "
                "reads a forward collective that was not waited on [",
                0),
            0u)
      << message;
  EXPECT_EQ(after_first_line(message),
            "  pos  this rank\n"
            "  ...\n"
            "    2  wf0.0.0\n"
            "    3  F1.0.0\n"
            "    4  sf1.0.0\n"
            ">   5 [F2.0.0]\n"
            "    6  wf1.0.0\n"
            "    7  sf2.0.0\n"
            "    8  wf2.0.0\n"
            "  ...\n")
      << message;
}

// What is missing at the end marks the end of the list.
TEST(VerifierGrid, ARejectionAtTheEndMarksTheEnd) {
  ops::Program program;
  ops::SegmentShape only{"only", false, false, 1};
  only.ready_bucket = 0;
  program.segments.push_back(only);
  const Schedule no_step = parse_schedule(
      "Forward(seg=0, mb=0, sb=0)\n"
      "Backward(seg=0, stage=0, mb=0, sb=0)\n"
      "ReduceGrads(bucket=0)\n");
  const std::string message = rejection([&] { verify_schedule(program, megatron(), no_step); });
  EXPECT_NE(first_line(message).find("schedule rejected: at the end of the schedule: no "
                                     "optimizer step"),
            std::string::npos)
      << message;
  EXPECT_EQ(after_first_line(message),
            "  pos  this rank\n"
            "    0  F0.0.0\n"
            "    1  B0.0.0/0\n"
            "    2  rg0\n"
            "> end [end]\n")
      << message;
}

// Two ranks of a two-chunk pipeline, each waiting for the other's Send before its own.
TEST(VerifierGrid, ADeadlockMarksEveryBlockedRank) {
  const Schedule rank0 = parse_schedule(R"(
    Forward(seg=0, mb=0, sb=0)
    RecvStart(gradient, seg=0, mb=0, sb=0, peer=1, slot=0)
    RecvWait(gradient, seg=0, mb=0, sb=0, peer=1, slot=0)   # blocks: rank 1 sends it last
    Send(activation, seg=0, mb=0, sb=0, peer=1, slot=0)
    Backward(seg=0, stage=0, mb=0, sb=0)
  )");
  const Schedule rank1 = parse_schedule(R"(
    RecvStart(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)
    RecvWait(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)
    Forward(seg=0, mb=0, sb=0, chunk=1)
    Backward(seg=0, stage=0, mb=0, sb=0, chunk=1)
    Send(gradient, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)
  )");
  const std::string message = rejection([&] { verify_point_to_point({rank0, rank1}); });
  EXPECT_NE(first_line(message).find(
                "the point-to-point messages deadlock under rendezvous semantics (a Send waits "
                "for its RecvStart, a RecvWait for its Send): rank 0 instruction 2 (RecvWait("
                "gradient, seg=0, mb=0, sb=0, peer=1, slot=0)) waits for rank 1 instruction 4"),
            std::string::npos)
      << message;
  EXPECT_EQ(after_first_line(message),
            "  pos  rank 0      rank 1\n"
            "    0  F0.0.0      sa0.0.0<0\n"
            ">   1  sg0.0.0<1  [wa0.0.0<0]\n"
            ">   2 [wg0.0.0<1]  F0.0.0\n"
            "    3  a0.0.0>1    B0.0.0/0\n"
            "    4  B0.0.0/0    g0.0.0>0\n")
      << message;
}

// The i-th Send from rank 0 to rank 1 meets a RecvStart for another micro-batch: both cells
// are marked, at their own positions.
TEST(VerifierGrid, AMismatchedMessageMarksBothSides) {
  const Schedule rank0 = parse_schedule(R"(
    Forward(seg=0, mb=0, sb=0)
    Send(activation, seg=0, mb=0, sb=0, peer=1, slot=0)
    Forward(seg=0, mb=1, sb=0)
    Send(activation, seg=0, mb=1, sb=0, peer=1, slot=1)
  )");
  const Schedule rank1 = parse_schedule(R"(
    RecvStart(activation, seg=0, mb=1, sb=0, peer=0, slot=1, chunk=1)
    RecvStart(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)
  )");
  const std::string message = rejection([&] { verify_point_to_point({rank0, rank1}); });
  EXPECT_NE(first_line(message).find("message 0 from rank 0 to rank 1 does not match: rank 0 "
                                     "instruction 1"),
            std::string::npos)
      << message;
  EXPECT_EQ(after_first_line(message),
            "  pos  rank 0     rank 1\n"
            ">   0  F0.0.0    [sa0.1.0<0]\n"
            ">   1 [a0.0.0>1]  sa0.0.0<0\n"
            "    2  F0.1.0\n"
            "    3  a0.1.0>1\n")
      << message;
}

// Collective order compares the ranks' Starts: the grid shows them one row per collective.
TEST(VerifierGrid, ACollectiveOrderMismatchShowsTheStartsOfEveryRank) {
  const Schedule rank0 = parse_schedule(R"(
    Forward(seg=0, mb=0, sb=0)
    Start(fwd, seg=0, mb=0, sb=0)
    Forward(seg=0, mb=0, sb=1)
    Start(fwd, seg=0, mb=0, sb=1)
  )");
  const Schedule rank1 = parse_schedule(R"(
    Forward(seg=0, mb=0, sb=1)
    Start(fwd, seg=0, mb=0, sb=1)
    Forward(seg=0, mb=0, sb=0)
    Start(fwd, seg=0, mb=0, sb=0)
  )");
  const std::string message = rejection([&] { verify_collective_order({rank0, rank0, rank1}); });
  EXPECT_NE(first_line(message).find("schedule rejected: collective 0 of rank 2 is Start(fwd, "
                                     "seg=0, mb=0, sb=1) but rank 0 issues Start(fwd, seg=0, "
                                     "mb=0, sb=0)"),
            std::string::npos)
      << message;
  EXPECT_EQ(after_first_line(message),
            "  collective  rank 0    rank 1    rank 2\n"
            ">          0 [sf0.0.0]  sf0.0.0  [sf0.0.1]\n"
            "           1  sf0.0.1   sf0.0.1   sf0.0.0\n")
      << message;
}

// A group wider than the lines keeps the marked rank and its nearest neighbours (ranks 0 and
// 11 do not fit in 100 characters).
TEST(VerifierGrid, AWideGroupKeepsTheColumnsNearTheMark) {
  std::vector<Schedule> ranks(12, parse_schedule("Forward(seg=0, mb=0, sb=0)"));
  ranks[6].push_back(parse_instruction("Send(activation, seg=0, mb=0, sb=0, peer=40, slot=0)"));
  const std::string message = rejection([&] { verify_point_to_point(ranks); });
  EXPECT_NE(first_line(message).find("rank 6 instruction 1 (Send(activation, seg=0, mb=0, sb=0, "
                                     "peer=40, slot=0)) names peer 40, outside the group of 12 "
                                     "ranks"),
            std::string::npos)
      << message;
  const std::string grid = after_first_line(message);
  EXPECT_EQ(grid,
            "  pos  rank 1   rank 2   rank 3   rank 4   rank 5   rank 6      rank 7   rank 8   "
            "rank 9   rank 10\n"
            "    0  F0.0.0   F0.0.0   F0.0.0   F0.0.0   F0.0.0   F0.0.0      F0.0.0   F0.0.0   "
            "F0.0.0   F0.0.0\n"
            ">   1                                              [a0.0.0>40]\n"
            "(2 of 12 columns left out)\n");
  for (std::size_t begin = 0, end; (end = grid.find('\n', begin)) != std::string::npos;
       begin = end + 1)
    EXPECT_LE(end - begin, 100u) << grid;
}

}  // namespace
}  // namespace oases::schedule
