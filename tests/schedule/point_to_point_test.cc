// Send/Recv between pipeline chunks: the per-rank rules of verify_schedule and the group checks
// of verify_point_to_point, on a hand-written two-rank pipeline.
#include "schedule/schedule.h"

#include "core/error.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace oases::schedule {
namespace {

using ops::kCheckpoint;
using ops::kInternals;

// A two-layer GPT cut after its first layer (one segment per layer here, with a forward and a
// backward all-reduce). Rank 0 holds chunk 0: the embedding and layer 0; rank 1 holds chunk 1:
// layer 1 and the head. Each rank's program numbers its own segments from 0.
ops::SegmentShape layer_segment(int layer) {
  ops::SegmentShape shape{"layer." + std::to_string(layer), true, true, 2};
  shape.sets = kCheckpoint | kInternals;
  shape.checkpoint_bytes = shape.internals_bytes = 1024;
  shape.layer = layer;
  return shape;
}
ops::Program first_chunk() {
  ops::SegmentShape embedding{"embedding", true, false, 1};
  embedding.ready_bucket = 0;
  ops::SegmentShape layer = layer_segment(0);
  layer.ready_bucket = 1;
  layer.output_to_peer = true;
  return {{embedding, layer}};
}
ops::Program second_chunk() {
  ops::SegmentShape layer = layer_segment(1);
  layer.ready_bucket = 0;
  layer.input_from_peer = true;
  ops::SegmentShape head{"head", false, true, 2};
  head.sets = kInternals;
  head.internals_bytes = 1024;
  head.ready_bucket = 1;
  return {{layer, head}};
}

constexpr int kMicroBatches = 2;
ScheduleSpec spec(bool training = true) {
  return {ScheduleKind::megatron, Recompute::none, kMicroBatches, 1, training};
}

// Appends one rank's instructions, all in one chunk. A message's slot is its micro-batch.
class Writer {
 public:
  explicit Writer(int chunk) : chunk_(chunk) {}

  Writer& forward(int segment, int mb) { return add(Op::forward, segment, mb); }
  Writer& backward(int segment, int stage, int mb) {
    add(Op::backward, segment, mb);
    out_.back().stage = stage;
    out_.back().direction = Direction::backward;
    return *this;
  }
  Writer& collective(Direction direction, int segment, int mb) {
    for (Op op : {Op::start, Op::wait}) {
      add(op, segment, mb);
      out_.back().direction = direction;
    }
    return *this;
  }
  Writer& free(int segment, ops::TensorSets sets, int mb) {
    add(Op::free, segment, mb);
    out_.back().sets = sets;
    return *this;
  }
  Writer& send(Payload payload, int segment, int mb, int peer) {
    return message(Op::send, payload, segment, mb, peer);
  }
  // A receive posted and waited at once.
  Writer& recv(Payload payload, int segment, int mb, int peer) {
    return post(payload, segment, mb, peer).wait(payload, segment, mb, peer);
  }
  Writer& post(Payload payload, int segment, int mb, int peer) {
    return message(Op::recv, payload, segment, mb, peer);
  }
  Writer& wait(Payload payload, int segment, int mb, int peer) {
    return message(Op::recv_wait, payload, segment, mb, peer);
  }
  Writer& finish_step() {
    for (int bucket : {1, 0}) {
      add(Op::reduce_grads, -1, 0);
      out_.back().bucket = bucket;
    }
    out_.push_back(Instruction{Op::optimizer_step});
    return *this;
  }
  Schedule schedule() const { return out_; }

 private:
  Writer& add(Op op, int segment, int mb) {
    Instruction ins{op};
    ins.segment = segment;
    ins.micro_batch = mb;
    ins.chunk = chunk_;
    out_.push_back(ins);
    return *this;
  }
  Writer& message(Op op, Payload payload, int segment, int mb, int peer) {
    add(op, segment, mb);
    out_.back().payload = payload;
    out_.back().peer = peer;
    out_.back().slot = mb;
    return *this;
  }

  int chunk_;
  Schedule out_;
};

// Rank 0, chunk 0. Forward of a micro-batch: embedding, its all-reduce, layer 0, its all-reduce,
// the output to rank 1. Backward: the gradient from rank 1, layer 0, the embedding.
void first_forward(Writer& w, int mb, bool send = true) {
  w.forward(0, mb).collective(Direction::forward, 0, mb);
  w.forward(1, mb).collective(Direction::forward, 1, mb);
  if (send) w.send(Payload::activation, 1, mb, 1);
}
void first_backward(Writer& w, int mb, bool receive = true) {
  if (receive) w.recv(Payload::gradient, 1, mb, 1);
  w.backward(1, 0, mb).collective(Direction::backward, 1, mb).backward(1, 1, mb);
  w.free(1, kCheckpoint | kInternals, mb).backward(0, 0, mb);
}
// Rank 1, chunk 1. Forward: the input from rank 0, layer 1, its all-reduce, the head (the
// loss). Backward: head, layer 1, the input's gradient back to rank 0.
void second_forward(Writer& w, int mb, bool receive = true) {
  if (receive) w.recv(Payload::activation, 0, mb, 0);
  w.forward(0, mb).collective(Direction::forward, 0, mb).forward(1, mb);
}
void second_backward(Writer& w, int mb) {
  w.backward(1, 0, mb).collective(Direction::backward, 1, mb).backward(1, 1, mb);
  w.free(1, kInternals, mb);
  w.backward(0, 0, mb).collective(Direction::backward, 0, mb).backward(0, 1, mb);
  w.free(0, kCheckpoint | kInternals, mb).send(Payload::gradient, 0, mb, 0);
}

// GPipe: every forward, then every backward, micro-batches in order.
Schedule gpipe_first() {
  Writer w(0);
  for (int mb = 0; mb < kMicroBatches; ++mb) first_forward(w, mb);
  for (int mb = 0; mb < kMicroBatches; ++mb) first_backward(w, mb);
  return w.finish_step().schedule();
}
Schedule gpipe_second() {
  Writer w(1);
  for (int mb = 0; mb < kMicroBatches; ++mb) second_forward(w, mb);
  for (int mb = 0; mb < kMicroBatches; ++mb) second_backward(w, mb);
  return w.finish_step().schedule();
}

std::size_t find(const Schedule& s, const std::string& text) {
  for (std::size_t i = 0; i < s.size(); ++i)
    if (to_string(s[i]) == text) return i;
  ADD_FAILURE() << "no " << text;
  return s.size();
}
void remove(Schedule& s, const std::string& text) {
  s.erase(s.begin() + static_cast<std::ptrdiff_t>(find(s, text)));
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
void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in\n" << message;
}
void expect_rank_rejected(int rank, const Schedule& s, const std::string& reason) {
  const ops::Program program = rank == 0 ? first_chunk() : second_chunk();
  expect_contains(rejection([&] { verify_schedule(program, spec(), s); }), reason);
}

TEST(PointToPoint, TwoChunkPipelineVerifiesOnEachRankAndAcrossTheGroup) {
  const Schedule rank0 = gpipe_first(), rank1 = gpipe_second();
  EXPECT_NO_THROW(verify_schedule(first_chunk(), spec(), rank0));
  EXPECT_NO_THROW(verify_schedule(second_chunk(), spec(), rank1));
  EXPECT_NO_THROW(verify_point_to_point({rank0, rank1}));
  // Chunk 0 prints as every schedule without pipelines does; chunk 1 says so.
  EXPECT_EQ(to_string(rank0[6]), "Send(activation, seg=1, mb=0, sb=0, peer=1, slot=0)");
  EXPECT_EQ(to_string(rank0[7]), "Forward(seg=0, mb=1, sb=0)");
  EXPECT_EQ(to_string(rank1[0]),
            "RecvStart(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)");
  EXPECT_EQ(to_string(rank1[1]), "RecvWait(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)");
  EXPECT_EQ(to_string(rank1.back()), "OptimizerStep");
  EXPECT_EQ(to_string(rank1[rank1.size() - 2]), "ReduceGrads(bucket=0, chunk=1)");
}

// Valid alone on each rank; the ranks disagree on the order of the messages.
TEST(PointToPoint, SwappedPairNamesBothRanksAndPositions) {
  Writer w(0);
  for (int mb : {1, 0}) first_forward(w, mb);  // micro-batch 1 first
  for (int mb = 0; mb < kMicroBatches; ++mb) first_backward(w, mb);
  const Schedule rank0 = w.finish_step().schedule();
  EXPECT_NO_THROW(verify_schedule(first_chunk(), spec(), rank0));
  expect_contains(rejection([&] { verify_point_to_point({rank0, gpipe_second()}); }),
                  "message 0 from rank 0 to rank 1 does not match: rank 0 instruction 6 "
                  "(Send(activation, seg=1, mb=1, sb=0, peer=1, slot=1)) meets rank 1 "
                  "instruction 0 (RecvStart(activation, seg=0, mb=0, sb=0, peer=0, slot=0, "
                  "chunk=1))");
}

// Removes the RecvStart and the RecvWait of one receive (`fields`: what follows their names).
void remove_receive(Schedule& s, const std::string& fields) {
  remove(s, "RecvStart" + fields);
  remove(s, "RecvWait" + fields);
}

TEST(PointToPoint, MissingReceiveNamesTheUnmatchedSend) {
  Schedule rank0 = gpipe_first();
  remove_receive(rank0, "(gradient, seg=1, mb=1, sb=0, peer=1, slot=1)");
  expect_contains(rejection([&] { verify_point_to_point({rank0, gpipe_second()}); }),
                  "rank 1 sends 2 messages to rank 0, which receives 1 from rank 1; the first "
                  "without a partner is rank 1 instruction 33 (Send(gradient, seg=0, mb=1, "
                  "sb=0, peer=0, slot=1, chunk=1))");
  // The receiving rank alone already fails: its backward lacks the gradient.
  expect_rank_rejected(0, rank0, "the gradient of the segment's output was not received");
}

// Rank 0 waits for the gradient of micro-batch 0 before it sends micro-batch 1's activation,
// which rank 1 needs before it can compute that gradient: both wait for a receive first.
TEST(PointToPoint, CyclicWaitListsEveryBlockedRank) {
  Writer w(0);
  first_forward(w, 0);
  first_forward(w, 1, /*send=*/false);
  w.recv(Payload::gradient, 1, 0, 1).send(Payload::activation, 1, 1, 1);
  first_backward(w, 0, /*receive=*/false);
  first_backward(w, 1);
  const Schedule rank0 = w.finish_step().schedule();
  EXPECT_NO_THROW(verify_schedule(first_chunk(), spec(), rank0));
  const std::string message =
      rejection([&] { verify_point_to_point({rank0, gpipe_second()}); });
  expect_contains(message, "deadlock under rendezvous semantics");
  expect_contains(message,
                  "rank 0 instruction 14 (RecvWait(gradient, seg=1, mb=0, sb=0, peer=1, slot=0)) "
                  "waits for rank 1 instruction 22 (Send(gradient, seg=0, mb=0, sb=0, peer=0, "
                  "slot=0, chunk=1))");
  expect_contains(message,
                  "rank 1 instruction 7 (RecvWait(activation, seg=0, mb=1, sb=0, peer=0, slot=1, "
                  "chunk=1)) waits for rank 0 instruction 15 (Send(activation, seg=1, mb=1, "
                  "sb=0, peer=1, slot=1))");
}

// Both ranks send before they wait for what the other sends. Posted first, the receives let
// both Sends through; posted only after the Sends, each Send waits for a RecvStart the other
// rank has not reached.
TEST(PointToPoint, ReceivesPostedBeforeASendLetItThrough) {
  Writer posted_first(0);
  first_forward(posted_first, 0);
  first_forward(posted_first, 1, /*send=*/false);
  posted_first.post(Payload::gradient, 1, 0, 1).send(Payload::activation, 1, 1, 1);
  posted_first.wait(Payload::gradient, 1, 0, 1);
  first_backward(posted_first, 0, /*receive=*/false);
  first_backward(posted_first, 1);
  const Schedule rank0 = posted_first.finish_step().schedule();
  EXPECT_NO_THROW(verify_schedule(first_chunk(), spec(), rank0));
  // Rank 1 sends micro-batch 0's gradient before it posts the receive of micro-batch 1's input.
  Writer second(1);
  second_forward(second, 0);
  second_backward(second, 0);
  second_forward(second, 1);
  second_backward(second, 1);
  const Schedule rank1 = second.finish_step().schedule();
  EXPECT_NO_THROW(verify_schedule(second_chunk(), spec(), rank1));
  EXPECT_NO_THROW(verify_point_to_point({rank0, rank1}));

  // Rank 0 sends micro-batch 1's activation before it posts the gradient's receive: rank 0's
  // Send waits for rank 1's RecvStart, which follows rank 1's Send of the gradient, which
  // waits for rank 0's RecvStart.
  Writer sent_first(0);
  first_forward(sent_first, 0);
  first_forward(sent_first, 1);
  first_backward(sent_first, 0);
  first_backward(sent_first, 1);
  Schedule late = sent_first.finish_step().schedule();
  EXPECT_NO_THROW(verify_schedule(first_chunk(), spec(), late));
  const std::string message = rejection([&] { verify_point_to_point({late, rank1}); });
  expect_contains(message,
                  "rank 0 instruction 13 (Send(activation, seg=1, mb=1, sb=0, peer=1, slot=1)) "
                  "waits for rank 1 instruction 17 (RecvStart(activation, seg=0, mb=1, sb=0, "
                  "peer=0, slot=1, chunk=1))");
  expect_contains(message,
                  "rank 1 instruction 16 (Send(gradient, seg=0, mb=0, sb=0, peer=0, slot=0, "
                  "chunk=1)) waits for rank 0 instruction 14 (RecvStart(gradient, seg=1, mb=0, "
                  "sb=0, peer=1, slot=0))");
}

TEST(PointToPoint, ForwardOfAnInputFromPeerSegmentNeedsItsReceive) {
  Schedule rank1 = gpipe_second();
  remove_receive(rank1, "(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)");
  expect_rank_rejected(1, rank1,
                       "instruction 0 (Forward(seg=0, mb=0, sb=0, chunk=1)): the input "
                       "activation was not received");
}

TEST(PointToPoint, BackwardOfAnOutputToPeerSegmentNeedsTheGradientReceive) {
  Schedule rank0 = gpipe_first();
  remove_receive(rank0, "(gradient, seg=1, mb=0, sb=0, peer=1, slot=0)");
  expect_rank_rejected(0, rank0,
                       "instruction 14 (Backward(seg=1, stage=0, mb=0, sb=0)): the gradient of "
                       "the segment's output was not received");
}

TEST(PointToPoint, PeersMustBeOtherRanksOfTheGroup) {
  Schedule rank0 = gpipe_first();
  rank0[6].peer = 0;
  expect_contains(rejection([&] { verify_point_to_point({rank0, gpipe_second()}); }),
                  "rank 0 instruction 6 (Send(activation, seg=1, mb=0, sb=0, peer=0, slot=0)) "
                  "names peer 0, itself");
  rank0[6].peer = 2;
  expect_contains(rejection([&] { verify_point_to_point({rank0, gpipe_second()}); }),
                  "names peer 2, outside the group of 2 ranks");
}

TEST(PointToPoint, MatchedMessagesAgreeOnSlotAndChunk) {
  Schedule rank1 = gpipe_second();
  rank1[0].slot = 1;
  expect_contains(rejection([&] { verify_point_to_point({gpipe_first(), rank1}); }),
                  "message 0 from rank 0 to rank 1 does not match");
  // Activations go to the next chunk: a chunk 1 receiving from chunk 1 is not a neighbour.
  Schedule rank0 = gpipe_first();
  for (Instruction& ins : rank0)
    if (ins.op != Op::optimizer_step) ins.chunk = 1;
  EXPECT_NO_THROW(verify_schedule(first_chunk(), spec(), rank0));
  expect_contains(rejection([&] { verify_point_to_point({rank0, gpipe_second()}); }),
                  "an activation going to the next chunk");
}

// One broken copy of the pipeline per per-rank rule not covered above.
TEST(PointToPoint, EachRankChecksItsMessagesAgainstItsProgram) {
  const Schedule rank0 = gpipe_first(), rank1 = gpipe_second();

  Schedule early_gradient = rank1;  // sent before the last backward stage
  const std::size_t send =
      find(early_gradient, "Send(gradient, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)");
  std::swap(early_gradient[send], early_gradient[send - 2]);  // before Backward(seg=0, stage=1)
  expect_rank_rejected(1, early_gradient,
                       "sends the input gradient before the segment's last backward stage");

  Schedule unsent = rank1;
  remove(unsent, "Send(gradient, seg=0, mb=1, sb=0, peer=0, slot=1, chunk=1)");
  expect_rank_rejected(1, unsent, "segment 0 mb 1 sb 0: the gradient of its input was never sent");

  Schedule twice = rank0;
  twice.insert(twice.begin() + 7, rank0[6]);
  expect_rank_rejected(0, twice, "instruction 7 (Send(activation, seg=1, mb=0, sb=0, peer=1, "
                                 "slot=0)): sends the activation twice");

  Schedule before_wait = rank0;  // the output still in flight in its all-reduce
  std::swap(before_wait[5], before_wait[6]);
  expect_rank_rejected(0, before_wait,
                       "sends an output whose forward collective was not waited on");

  Schedule wrong_segment = rank0;
  wrong_segment[6].segment = 0;
  expect_rank_rejected(0, wrong_segment,
                       "sends an activation from a segment that is not output_to_peer");

  Schedule no_slot = rank0;
  no_slot[6].slot = -1;
  expect_rank_rejected(0, no_slot, "a message needs a slot (>= 0)");

  Schedule stray_peer = rank0;
  stray_peer[0].peer = 1;
  expect_rank_rejected(0, stray_peer, "only Send, RecvStart and RecvWait name a peer and a slot");

  Schedule wait_first = rank1;  // RecvWait before its RecvStart
  std::swap(wait_first[0], wait_first[1]);
  expect_rank_rejected(1, wait_first,
                       "instruction 0 (RecvWait(activation, seg=0, mb=0, sb=0, peer=0, slot=0, "
                       "chunk=1)): waits for a receive that was never posted");

  Schedule waited_twice = rank1;
  waited_twice.insert(waited_twice.begin() + 2, rank1[1]);
  expect_rank_rejected(1, waited_twice, "instruction 2 (RecvWait(activation, seg=0, mb=0, sb=0, "
                                        "peer=0, slot=0, chunk=1)): waits for a receive twice");

  Schedule posted_twice = rank1;
  posted_twice.insert(posted_twice.begin() + 1, rank1[0]);
  expect_rank_rejected(1, posted_twice, "instruction 1 (RecvStart(activation, seg=0, mb=0, sb=0, "
                                        "peer=0, slot=0, chunk=1)): posts the activation receive "
                                        "twice (first at instruction 0)");

  Schedule other_slot = rank1;  // the wait names another message than the one posted
  other_slot[1].slot = 1;
  expect_rank_rejected(1, other_slot,
                       "waits for a receive other than the one posted at instruction 0");

  Schedule mixed_chunks = rank1;
  mixed_chunks[5].chunk = 0;  // the head's Forward in chunk 0, layer 1 in chunk 1
  expect_rank_rejected(1, mixed_chunks, "segment 1 is in chunk 0, which must equal the chunk of "
                                        "segment 0 (1)");

  ops::Program unpaired = second_chunk();  // a boundary marked on one side only
  unpaired.segments[1].input_from_peer = true;
  expect_contains(rejection([&] { verify_schedule(unpaired, spec(), rank1); }),
                  "segments 0 and 1 do not agree on a chunk boundary");
}

// Evaluation through the pipeline: activations only; every set freed once read.
TEST(PointToPoint, ForwardOnlyPipelinesSendActivationsOnly) {
  Writer first(0), second(1);
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    first.forward(0, mb).collective(Direction::forward, 0, mb).forward(1, mb);
    first.free(1, kInternals, mb).collective(Direction::forward, 1, mb);
    first.send(Payload::activation, 1, mb, 1).free(1, kCheckpoint, mb);
    second.recv(Payload::activation, 0, mb, 0).forward(0, mb).free(0, kInternals, mb);
    second.collective(Direction::forward, 0, mb).forward(1, mb).free(1, kInternals, mb);
    second.free(0, kCheckpoint, mb);
  }
  const Schedule rank0 = first.schedule(), rank1 = second.schedule();
  EXPECT_NO_THROW(verify_schedule(first_chunk(), spec(false), rank0));
  EXPECT_NO_THROW(verify_schedule(second_chunk(), spec(false), rank1));
  EXPECT_NO_THROW(verify_point_to_point({rank0, rank1}));

  Schedule with_gradient = rank1;
  with_gradient.push_back(gpipe_second()[22]);
  expect_contains(rejection([&] { verify_schedule(second_chunk(), spec(false), with_gradient); }),
                  "a gradient message in a forward-only schedule");
  Schedule unsent = rank0;
  remove(unsent, "Send(activation, seg=1, mb=1, sb=0, peer=1, slot=1)");
  expect_contains(rejection([&] { verify_schedule(first_chunk(), spec(false), unsent); }),
                  "segment 1 mb 1 sb 0: its output was never sent");
}

// What a receive carries is usable only after its RecvWait: a Forward or a backward stage 0
// that reads it between the RecvStart and the RecvWait is rejected at its own position.
TEST(PointToPoint, ReadingAReceivedBufferBeforeItsWaitNamesThePosition) {
  Schedule rank1 = gpipe_second();
  ASSERT_EQ(to_string(rank1[2]), "Forward(seg=0, mb=0, sb=0, chunk=1)");
  std::swap(rank1[1], rank1[2]);  // the Forward before the RecvWait
  expect_rank_rejected(1, rank1,
                       "instruction 1 (Forward(seg=0, mb=0, sb=0, chunk=1)): reads the input "
                       "activation before the RecvWait of its receive (posted at instruction 0)");

  Schedule rank0 = gpipe_first();
  const std::size_t wait = find(rank0, "RecvWait(gradient, seg=1, mb=0, sb=0, peer=1, slot=0)");
  ASSERT_EQ(to_string(rank0[wait + 1]), "Backward(seg=1, stage=0, mb=0, sb=0)");
  std::swap(rank0[wait], rank0[wait + 1]);
  expect_rank_rejected(0, rank0,
                       fmt::format("instruction {} (Backward(seg=1, stage=0, mb=0, sb=0)): reads "
                                   "the gradient of the segment's output before the RecvWait of "
                                   "its receive (posted at instruction {})",
                                   wait, wait - 1));
}

// A receive posted and never waited is rejected at the end, naming its RecvStart, before any
// other incompleteness of the schedule.
TEST(PointToPoint, AReceivePostedAndNeverWaitedIsRejected) {
  Schedule rank1 = gpipe_second();
  const std::size_t post =
      find(rank1, "RecvStart(activation, seg=0, mb=1, sb=0, peer=0, slot=1, chunk=1)");
  rank1.resize(post + 1);  // the step stops right after the post
  expect_rank_rejected(1, rank1,
                       fmt::format("at the end of the schedule: segment 0 mb 1 sb 0: the receive "
                                   "posted at instruction {} (RecvStart(activation, seg=0, mb=1, "
                                   "sb=0, peer=0, slot=1, chunk=1)) was never waited",
                                   post));
}

}  // namespace
}  // namespace oases::schedule
