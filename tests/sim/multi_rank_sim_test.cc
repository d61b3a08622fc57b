// simulate_ranks on hand-written pipelines, where the step time and every rank's bubble follow
// by hand: P ranks of one segment each (one chunk per rank), m micro-batches, a Forward taking
// F seconds and a Backward B seconds. The schedules are checked by the schedule verifier
// first, so the timings are of pipelines the runtime would accept.
#include "sim/schedule_sim.h"

#include "core/error.h"
#include "support/gpt_program.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace oases::sim {
namespace {

using schedule::Direction;
using schedule::Instruction;
using schedule::Op;
using schedule::Payload;
using schedule::Recompute;
using schedule::Schedule;
using schedule::ScheduleKind;
using schedule::ScheduleSpec;

// Rank `rank` of `stages`: one segment, whose input comes from the previous rank and whose
// output goes to the next one (where there are such ranks).
ops::Program stage_program(int rank, int stages) {
  ops::SegmentShape segment{"stage." + std::to_string(rank), false, false, 1};
  segment.input_from_peer = rank > 0;
  segment.output_to_peer = rank < stages - 1;
  return {{segment}};
}

ScheduleSpec pipeline_spec(int micro_batches) {
  return {ScheduleKind::megatron, Recompute::none, micro_batches, 1, true};
}

// What one rank computes, in order: the forward or the backward of a micro-batch.
struct Action {
  bool forward;
  int micro_batch;
};

std::size_t position_of(const std::vector<Action>& actions, bool forward, int micro_batch) {
  for (std::size_t i = 0; i < actions.size(); ++i)
    if (actions[i].forward == forward && actions[i].micro_batch == micro_batch) return i;
  ADD_FAILURE() << "no action for micro-batch " << micro_batch;
  return actions.size();
}

// Lowers the actions of rank `rank` (actions[r]: rank r's) to instructions: the input's receive
// (RecvStart, RecvWait) right before a Forward and the output's Send right after it; the
// gradient's receive right before a Backward and the input gradient's Send right after it. Except: where a Backward
// follows a Forward here and the next rank runs that Backward before that Forward (the steady
// state of 1F1B), the next rank sends the gradient before it receives the activation, so the
// activation goes after the gradient's Recv, as a blocking Send and Recv would need. A
// message's slot is its micro-batch. The optimizer step ends the schedule.
Schedule lower(int rank, const std::vector<std::vector<Action>>& actions) {
  const int stages = static_cast<int>(actions.size());
  const std::vector<Action>& own = actions[rank];
  Schedule out;
  auto add = [&](Op op, int mb) -> Instruction& {
    Instruction ins{op};
    ins.segment = 0;
    ins.micro_batch = mb;
    ins.chunk = rank;
    out.push_back(ins);
    return out.back();
  };
  auto message = [&](Op op, Payload payload, int mb, int peer) {
    Instruction& ins = add(op, mb);
    ins.payload = payload;
    ins.peer = peer;
    ins.slot = mb;
  };
  auto receive = [&](Payload payload, int mb, int peer) {
    message(Op::recv, payload, mb, peer);
    message(Op::recv_wait, payload, mb, peer);
  };
  const bool first = rank == 0, last = rank == stages - 1;
  int unsent_activation = -1;
  for (std::size_t i = 0; i < own.size(); ++i) {
    const int mb = own[i].micro_batch;
    if (own[i].forward) {
      if (!first) receive(Payload::activation, mb, rank - 1);
      add(Op::forward, mb);
      if (last) continue;
      const bool gradient_first =
          i + 1 < own.size() && !own[i + 1].forward &&
          position_of(actions[rank + 1], false, own[i + 1].micro_batch) <
              position_of(actions[rank + 1], true, mb);
      if (gradient_first)
        unsent_activation = mb;
      else
        message(Op::send, Payload::activation, mb, rank + 1);
    } else {
      if (!last) receive(Payload::gradient, mb, rank + 1);
      if (unsent_activation >= 0)
        message(Op::send, Payload::activation, unsent_activation, rank + 1);
      unsent_activation = -1;
      add(Op::backward, mb).direction = Direction::backward;
      if (!first) message(Op::send, Payload::gradient, mb, rank - 1);
    }
  }
  out.push_back(Instruction{Op::optimizer_step});  // free: no gradient buckets to wait for
  return out;
}

// GPipe: every forward, then every backward, micro-batches in order.
std::vector<Action> gpipe_actions(int micro_batches) {
  std::vector<Action> actions;
  for (int mb = 0; mb < micro_batches; ++mb) actions.push_back({true, mb});
  for (int mb = 0; mb < micro_batches; ++mb) actions.push_back({false, mb});
  return actions;
}

// 1F1B (PipeDream-flush): P - rank - 1 warm-up forwards, then a forward and a backward in
// turn, then the remaining backwards.
std::vector<Action> one_f_one_b_actions(int rank, int stages, int micro_batches) {
  const int warm_up = std::min(stages - rank - 1, micro_batches);
  std::vector<Action> actions;
  int forwards = 0, backwards = 0;
  while (forwards < warm_up) actions.push_back({true, forwards++});
  while (forwards < micro_batches) {
    actions.push_back({true, forwards++});
    actions.push_back({false, backwards++});
  }
  while (backwards < micro_batches) actions.push_back({false, backwards++});
  return actions;
}

enum class Order { gpipe, one_f_one_b };
const char* name(Order order) { return order == Order::gpipe ? "GPipe" : "1F1B"; }

// Every rank's schedule, each verified alone and the group's messages verified together.
std::vector<Schedule> pipeline(Order order, int stages, int micro_batches) {
  std::vector<std::vector<Action>> actions;
  for (int rank = 0; rank < stages; ++rank)
    actions.push_back(order == Order::gpipe ? gpipe_actions(micro_batches)
                                            : one_f_one_b_actions(rank, stages, micro_batches));
  std::vector<Schedule> schedules;
  for (int rank = 0; rank < stages; ++rank) {
    schedules.push_back(lower(rank, actions));
    schedule::verify_schedule(stage_program(rank, stages), pipeline_spec(micro_batches),
                              schedules.back());
  }
  schedule::verify_point_to_point(schedules);
  return schedules;
}

CostModel forward_backward_costs(double forward, double backward, double p2p = 0) {
  CostModel costs;
  costs.compute = [=](const Instruction& ins) {
    return ins.op == Op::forward ? forward : backward;
  };
  costs.collective = [](const Instruction&) { return 0.0; };
  if (p2p > 0) costs.p2p = [=](const Instruction&) { return p2p; };
  return costs;
}

int count(const Schedule& s, Op op) {
  return static_cast<int>(std::count_if(s.begin(), s.end(), [&](const Instruction& ins) {
    return ins.op == op;
  }));
}

void expect_same(const SimResult& multi, const SimResult& single, const std::string& what) {
  EXPECT_EQ(multi.step_seconds, single.step_seconds) << what;
  EXPECT_EQ(multi.compute_seconds, single.compute_seconds) << what;
  EXPECT_EQ(multi.exposed_comm_seconds, single.exposed_comm_seconds) << what;
  EXPECT_EQ(multi.comm_seconds, single.comm_seconds) << what;
}

// The schedules and cost models of schedule_sim_test: overlapped and blocking schedules with
// slowdowns, data-parallel reductions on a shared link and an optimizer step.
TEST(MultiRankSimulator, OneRankWithoutMessagesGivesTheSingleRankResult) {
  std::vector<Schedule> schedules;
  for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective})
    schedules.push_back(
        schedule::generate(testing::gpt_program(3), {ScheduleKind::megatron, r, 2, 1, true}));
  schedules.push_back(schedule::generate(
      testing::gpt_program(3), {ScheduleKind::oases, Recompute::fine_grained, 2, 2, true}));
  schedules.push_back(schedule::generate(
      testing::gpt_program(2), {ScheduleKind::cross_pass, Recompute::full, 1, 2, true}));

  CostModel costs;
  costs.compute = [](const Instruction& ins) { return ins.op == Op::backward ? 2.0 : 1.0; };
  costs.collective = [](const Instruction& ins) { return 0.3 + 0.1 * ins.segment; };
  std::vector<CostModel> models(4, costs);
  models[1].overlap_slowdown = 0.25;
  models[1].collective_slowdown = 1.0;
  models[2].reduce_grads = [](int bucket) { return bucket == 0 ? 10.0 : 0.7; };
  models[2].optimizer_step = 0.5;
  models[3] = models[2];
  models[3].shared_link = true;
  models[3].overlap_slowdown = 0.1;

  for (std::size_t s = 0; s < schedules.size(); ++s) {
    for (std::size_t m = 0; m < models.size(); ++m) {
      const std::string what = "schedule " + std::to_string(s) + ", costs " + std::to_string(m);
      const SimResult single = simulate(schedules[s], models[m]);
      const MultiRankResult multi = simulate_ranks({schedules[s]}, models[m]);
      ASSERT_EQ(multi.ranks.size(), 1u);
      expect_same(multi.ranks[0], single, what);
      EXPECT_EQ(multi.step_seconds, single.step_seconds) << what;
      EXPECT_EQ(multi.ranks[0].bubble_seconds, 0.0) << what;
      EXPECT_EQ(multi.ranks[0].p2p_seconds, 0.0) << what;
    }
  }
  // Ranks that exchange nothing run as they would alone; the step is the slower one's.
  const MultiRankResult pair = simulate_ranks({schedules[0], schedules[3]}, models[3]);
  ASSERT_EQ(pair.ranks.size(), 2u);
  expect_same(pair.ranks[0], simulate(schedules[0], models[3]), "independent rank 0");
  expect_same(pair.ranks[1], simulate(schedules[3], models[3]), "independent rank 1");
  EXPECT_EQ(pair.step_seconds, std::max(pair.ranks[0].step_seconds, pair.ranks[1].step_seconds));
}

// With free messages, rank r starts its first forward r F in, waits again before its first
// backward until the gradient has come back down the pipeline, and ends r B before the last
// rank to end (rank 0): each rank's bubble is (P - 1) F + (P - 1 - r) B, and it and the tail
// after the rank's end add up to the closed form (P - 1)(F + B). GPipe and 1F1B agree.
TEST(MultiRankSimulator, PipelineBubblesMeetTheClosedForms) {
  for (Order order : {Order::gpipe, Order::one_f_one_b}) {
    for (int stages : {2, 4}) {
      for (int micro_batches : {stages, stages + 3}) {
        for (auto [forward, backward] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}}) {
          const std::string what = std::string(name(order)) + " P=" + std::to_string(stages) +
                                   " m=" + std::to_string(micro_batches) +
                                   " B=" + std::to_string(backward);
          const MultiRankResult result =
              simulate_ranks(pipeline(order, stages, micro_batches),
                             forward_backward_costs(forward, backward));
          const double per_micro_batch = forward + backward;
          EXPECT_DOUBLE_EQ(result.step_seconds,
                           (micro_batches + stages - 1) * per_micro_batch) << what;
          ASSERT_EQ(result.ranks.size(), static_cast<std::size_t>(stages));
          for (int r = 0; r < stages; ++r) {
            const RankSimResult& rank = result.ranks[r];
            EXPECT_DOUBLE_EQ(rank.compute_seconds, micro_batches * per_micro_batch) << what;
            EXPECT_DOUBLE_EQ(rank.bubble_seconds,
                             (stages - 1) * forward + (stages - 1 - r) * backward)
                << what << " rank " << r;
            EXPECT_DOUBLE_EQ(rank.step_seconds, result.step_seconds - r * backward)
                << what << " rank " << r;
            EXPECT_DOUBLE_EQ(rank.bubble_seconds + result.step_seconds - rank.step_seconds,
                             (stages - 1) * per_micro_batch)
                << what << " rank " << r;
            EXPECT_EQ(rank.exposed_comm_seconds, 0.0);
          }
        }
      }
    }
  }
}

// Per-rank prices: a pipeline whose last stage computes twice as slowly is the closed form of a
// pipeline of that stage's speed for its share; each rank's events tile its compute lane, and
// each message is an event from its departure to its arrival.
TEST(MultiRankSimulator, EachRankTakesItsOwnPricesAndRecordsItsActivities) {
  const int stages = 3, micro_batches = 4;
  const std::vector<Schedule> schedules = pipeline(Order::one_f_one_b, stages, micro_batches);
  std::vector<CostModel> costs(stages, forward_backward_costs(1.0, 2.0, 0.25));
  costs[stages - 1] = forward_backward_costs(2.0, 4.0, 0.25);
  const MultiRankResult result = simulate_ranks(schedules, costs, true);
  ASSERT_EQ(result.ranks.size(), static_cast<std::size_t>(stages));
  EXPECT_DOUBLE_EQ(result.ranks[stages - 1].compute_seconds, micro_batches * 6.0);
  EXPECT_DOUBLE_EQ(result.ranks[0].compute_seconds, micro_batches * 3.0);
  // Uniform prices with the slow stage's give a longer step; the fast ones a shorter one.
  EXPECT_LT(result.step_seconds,
            simulate_ranks(schedules, forward_backward_costs(2.0, 4.0, 0.25)).step_seconds);
  EXPECT_GT(result.step_seconds,
            simulate_ranks(schedules, forward_backward_costs(1.0, 2.0, 0.25)).step_seconds);
  for (int r = 0; r < stages; ++r) {
    double computing = 0, sending = 0;
    int messages = 0;
    double last_end = 0;
    for (const SimEvent& e : result.events) {
      if (e.rank != r) continue;
      EXPECT_LE(e.begin, e.end);
      if (e.lane == SimEvent::Lane::compute) {
        EXPECT_GE(e.begin, last_end - 1e-12) << "rank " << r << ": compute events overlap";
        last_end = e.end;
        computing += e.end - e.begin;
      } else if (e.lane == SimEvent::Lane::messages) {
        ++messages;
        sending += e.end - e.begin;
        EXPECT_NE(e.name.find("Send"), std::string::npos) << e.name;
      }
    }
    EXPECT_DOUBLE_EQ(computing, result.ranks[r].compute_seconds) << "rank " << r;
    EXPECT_EQ(messages, count(schedules[r], Op::send)) << "rank " << r;
    EXPECT_DOUBLE_EQ(sending, result.ranks[r].p2p_seconds) << "rank " << r;
    EXPECT_LE(last_end, result.ranks[r].step_seconds + 1e-12);
  }
  // Without recording, the same result and no events.
  const MultiRankResult quiet = simulate_ranks(schedules, costs);
  EXPECT_TRUE(quiet.events.empty());
  EXPECT_EQ(quiet.step_seconds, result.step_seconds);
}

// Each message on the critical path of GPipe (the first micro-batch's activations down the
// pipeline, the first gradient back up) adds its d; messages no longer than F and B hide
// behind the compute of the following micro-batches.
TEST(MultiRankSimulator, GPipeStepGrowsByTwoHopsPerStageBoundary) {
  const double transfer = 0.25;
  for (int stages : {2, 4}) {
    for (int micro_batches : {stages, 2 * stages + 1}) {
      const std::vector<Schedule> schedules = pipeline(Order::gpipe, stages, micro_batches);
      const MultiRankResult free = simulate_ranks(schedules, forward_backward_costs(1.0, 2.0));
      const MultiRankResult paid =
          simulate_ranks(schedules, forward_backward_costs(1.0, 2.0, transfer));
      EXPECT_DOUBLE_EQ(paid.step_seconds, free.step_seconds + 2 * (stages - 1) * transfer)
          << "P=" << stages << " m=" << micro_batches;
      for (int r = 0; r < stages; ++r)
        EXPECT_DOUBLE_EQ(paid.ranks[r].p2p_seconds,
                         count(schedules[r], Op::send) * transfer);
    }
  }
}

// Messages of one pair queue on their link. Two ranks, three micro-batches, F = B = 1 s, each
// message 3 s. Activations leave rank 0 at 1, 2 and 3 s and arrive at 4, 7 and 10 s (each
// waiting for the one before it), so rank 1 computes forwards at 4, 7 and 10 s and backwards
// at 11, 12 and 13 s; the gradients leave at 12, 13 and 14 s and arrive at 15, 18 and 21 s,
// where rank 0 runs its backwards: the step ends at 22 s. Rank 0 waits 12 + 2 + 2 s, rank 1
// 4 + 2 + 2 s.
TEST(MultiRankSimulator, MessagesOfOnePairCrossTheirLinkInIssueOrder) {
  const MultiRankResult result =
      simulate_ranks(pipeline(Order::gpipe, 2, 3), forward_backward_costs(1.0, 1.0, 3.0));
  EXPECT_DOUBLE_EQ(result.step_seconds, 22.0);
  EXPECT_DOUBLE_EQ(result.ranks[0].step_seconds, 22.0);
  EXPECT_DOUBLE_EQ(result.ranks[0].bubble_seconds, 16.0);
  EXPECT_DOUBLE_EQ(result.ranks[1].step_seconds, 14.0);
  EXPECT_DOUBLE_EQ(result.ranks[1].bubble_seconds, 8.0);
  EXPECT_DOUBLE_EQ(result.ranks[0].p2p_seconds, 9.0);
  EXPECT_DOUBLE_EQ(result.ranks[1].p2p_seconds, 9.0);
}

// A collective started before a RecvWait keeps moving while the rank waits: rank 1 starts a 2 s
// collective and then waits 3 s for a message (1 s of compute on rank 0, then 2 s on the
// link); its Wait afterwards costs nothing.
TEST(MultiRankSimulator, CollectivesInFlightProgressDuringABubble) {
  Instruction forward{Op::forward}, send{Op::send}, start{Op::start}, recv{Op::recv},
      recv_wait{Op::recv_wait}, wait{Op::wait};
  forward.segment = send.segment = start.segment = recv.segment = recv_wait.segment =
      wait.segment = 0;
  send.peer = 1;
  recv.peer = recv_wait.peer = 0;
  send.slot = recv.slot = recv_wait.slot = 0;
  CostModel costs = forward_backward_costs(1.0, 1.0, 2.0);
  costs.collective = [](const Instruction&) { return 2.0; };
  costs.overlap_slowdown = 0.5;  // no compute overlaps it here, so nothing slows
  const MultiRankResult result =
      simulate_ranks({{forward, send}, {start, recv, recv_wait, wait}}, costs);
  EXPECT_DOUBLE_EQ(result.ranks[0].step_seconds, 1.0);
  EXPECT_DOUBLE_EQ(result.ranks[1].step_seconds, 3.0);
  EXPECT_DOUBLE_EQ(result.ranks[1].bubble_seconds, 3.0);
  EXPECT_DOUBLE_EQ(result.ranks[1].exposed_comm_seconds, 0.0);
  EXPECT_DOUBLE_EQ(result.ranks[1].comm_seconds, 2.0);
  EXPECT_DOUBLE_EQ(result.step_seconds, 3.0);
}

// The message of the InternalError `run` throws; a test failure if it throws none.
std::string rejection(const std::function<void()>& run) {
  try {
    run();
  } catch (const InternalError& e) {
    return e.what();
  }
  ADD_FAILURE() << "simulated schedules that cannot run";
  return "";
}
void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in\n" << message;
}

std::size_t position_of(const Schedule& s, const std::string& text) {  // of an instruction
  for (std::size_t i = 0; i < s.size(); ++i)
    if (schedule::to_string(s[i]) == text) return i;
  ADD_FAILURE() << "no " << text;
  return s.size();
}
void remove(Schedule& s, const std::string& text) {
  s.erase(s.begin() + static_cast<std::ptrdiff_t>(position_of(s, text)));
}

TEST(MultiRankSimulator, ARecvWhoseSendNeverComesNamesTheRankAndPosition) {
  std::vector<Schedule> schedules = pipeline(Order::gpipe, 2, 2);
  remove(schedules[1], "Send(gradient, seg=0, mb=1, sb=0, peer=0, slot=1, chunk=1)");
  const std::size_t recv =
      position_of(schedules[0], "RecvWait(gradient, seg=0, mb=1, sb=0, peer=1, slot=1)");
  const CostModel costs = forward_backward_costs(1.0, 1.0);
  expect_contains(rejection([&] { simulate_ranks(schedules, costs); }),
                  "rank 0 instruction " + std::to_string(recv) +
                      " (RecvWait(gradient, seg=0, mb=1, sb=0, peer=1, slot=1)) waits for "
                      "message 1 from rank 1, which ended after sending it 1");
}

// Both ranks wait for a receive before they send: each blocked rank is named with what it
// waits for.
TEST(MultiRankSimulator, CyclicWaitNamesEveryBlockedRank) {
  std::vector<Schedule> schedules = pipeline(Order::gpipe, 2, 1);
  // Rank 0 waits for micro-batch 0's gradient before it sends the activation rank 1 needs: its
  // Send moves after the gradient's RecvStart and RecvWait.
  std::rotate(schedules[0].begin() + 1, schedules[0].begin() + 2, schedules[0].begin() + 4);
  const std::string message =
      rejection([&] { simulate_ranks(schedules, forward_backward_costs(1.0, 1.0)); });
  expect_contains(message, "rank 0 instruction 2 (RecvWait(gradient, seg=0, mb=0, sb=0, peer=1, "
                           "slot=0)) waits for message 0 from rank 1, which waits at rank 1 "
                           "instruction 1");
  expect_contains(message, "rank 1 instruction 1 (RecvWait(activation, seg=0, mb=0, sb=0, "
                           "peer=0, slot=0, chunk=1)) waits for message 0 from rank 0, which "
                           "waits at rank 0 instruction 2");
}

// A RecvStart is free and fixes which message the receive takes; only its RecvWait waits for
// the message to arrive. Rank 0 computes for 1 s and sends a message that takes 2 s; rank 1
// posts its receive, computes for 2 s and only then waits: 1 s of bubble instead of 3 s.
TEST(MultiRankSimulator, APostedReceiveWaitsOnlyForWhatIsLeftOfTheTransfer) {
  Instruction forward{Op::forward}, send{Op::send}, recv{Op::recv}, recv_wait{Op::recv_wait};
  forward.segment = send.segment = recv.segment = recv_wait.segment = 0;
  send.peer = 1;
  recv.peer = recv_wait.peer = 0;
  send.slot = recv.slot = recv_wait.slot = 0;
  const CostModel costs = forward_backward_costs(1.0, 1.0, 2.0);
  Instruction second_forward = forward;
  second_forward.micro_batch = 1;
  const MultiRankResult early =
      simulate_ranks({{forward, send}, {recv, forward, second_forward, recv_wait}}, costs);
  EXPECT_DOUBLE_EQ(early.ranks[1].bubble_seconds, 1.0);
  EXPECT_DOUBLE_EQ(early.ranks[1].step_seconds, 3.0);
  EXPECT_DOUBLE_EQ(early.ranks[1].compute_seconds, 2.0);
  // Waited at once, the same receive holds the rank for the whole transfer.
  const MultiRankResult late =
      simulate_ranks({{forward, send}, {recv, recv_wait, forward, second_forward}}, costs);
  EXPECT_DOUBLE_EQ(late.ranks[1].bubble_seconds, 3.0);
  EXPECT_DOUBLE_EQ(late.ranks[1].step_seconds, 5.0);
}

TEST(MultiRankSimulator, ASendNobodyReceivesIsRejected) {
  std::vector<Schedule> schedules = pipeline(Order::gpipe, 2, 2);
  remove(schedules[0], "RecvStart(gradient, seg=0, mb=1, sb=0, peer=1, slot=1)");
  remove(schedules[0], "RecvWait(gradient, seg=0, mb=1, sb=0, peer=1, slot=1)");
  expect_contains(
      rejection([&] { simulate_ranks(schedules, forward_backward_costs(1.0, 1.0)); }),
      "rank 1 sends 2 messages to rank 0, which receives 1; the first not received is rank 1 "
      "instruction");
}

TEST(MultiRankSimulator, MismatchedMessagesAndStrayPeersAreRejected) {
  const CostModel costs = forward_backward_costs(1.0, 1.0);
  std::vector<Schedule> swapped = pipeline(Order::gpipe, 2, 2);
  swapped[1][0].slot = 1;  // rank 1's first RecvStart expects micro-batch 0's activation
  expect_contains(rejection([&] { simulate_ranks(swapped, costs); }),
                  "message 0 from rank 0 to rank 1 does not match: rank 0 instruction 1");

  std::vector<Schedule> stray = pipeline(Order::gpipe, 2, 2);
  stray[0][1].peer = 2;
  expect_contains(rejection([&] { simulate_ranks(stray, costs); }),
                  "rank 0 instruction 1 (Send(activation, seg=0, mb=0, sb=0, peer=2, slot=0)) "
                  "names peer 2: not another rank of the group of 2");

  // Alone, a rank cannot price its messages.
  expect_contains(rejection([&] { simulate(pipeline(Order::gpipe, 2, 1)[0], costs); }),
                  "simulate_ranks prices them");
}

}  // namespace
}  // namespace oases::sim
