// Send and Recv between pipeline stages, executed: a LLaMA of two layers cut into two stages
// on two ranks (rank 0: embedding and layer 0, ending in a StageOutputSegment; rank 1: layer 1,
// whose input arrives from rank 0, and the head), driven by a hand-written GPipe schedule over
// two micro-batches (every forward, then every backward). The schedules pass the per-rank and
// the point-to-point verifiers, and the stages compute exactly what one process computes: in
// fp64 the loss and every parameter's gradient agree with the whole model's to relative 1e-10,
// dropout included (masks are keyed by global indices, whichever rank draws them). Both stream
// modes: immediate, and asynchronous (compute, collectives and messages each on a thread).
#include "comm/mesh.h"
#include "model/model.h"
#include "mpi_test_support.h"
#include "runtime/executor.h"
#include "schedule/schedule.h"
#include "support/numbers.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace oases::runtime {
namespace {

namespace mpitest = comm::mpitest;

using schedule::Instruction;
using schedule::Op;
using schedule::Schedule;

constexpr std::int64_t kMicroBatch = 2, kMicroBatches = 2, kSeq = 8;

model::ModelConfig llama() {
  model::ModelConfig c = oases::testing::tiny_equivalence_model("llama", 2);
  c.seq_len = kSeq;
  return c;
}

model::ModelOptions options(comm::Communicator& tp, std::int64_t first, std::int64_t end) {
  model::ModelOptions o;
  o.dtype = DType::f64;
  o.micro_batch = kMicroBatch;
  o.seed = 11;
  o.tp = &tp;
  o.first_layer = first;
  o.end_layer = end;
  return o;
}

Instruction make(Op op, int segment, int mb) {
  Instruction ins{op};
  ins.segment = segment;
  ins.micro_batch = mb;
  return ins;
}
Instruction message(Op op, ops::Payload payload, int segment, int mb, int peer, int chunk) {
  Instruction ins = make(op, segment, mb);
  ins.payload = payload;
  ins.peer = peer;
  ins.slot = mb;  // one buffer slot per micro-batch in flight
  ins.chunk = chunk;
  return ins;
}

// One stage's forward pass of micro-batch mb: receive the input (all but the first stage),
// every segment with its forward collective, send the output (all but the last stage).
void append_forward(const ops::Program& p, int chunk, int mb, Schedule& out) {
  const int last = static_cast<int>(p.segments.size()) - 1;
  if (p.segments.front().input_from_peer)
    for (Op op : {Op::recv, Op::recv_wait})
      out.push_back(message(op, ops::Payload::activation, 0, mb, chunk - 1, chunk));
  for (int s = 0; s <= last; ++s) {
    out.push_back(make(Op::forward, s, mb));
    if (p.segments[static_cast<std::size_t>(s)].has_forward_collective) {
      out.push_back(make(Op::start, s, mb));
      out.push_back(make(Op::wait, s, mb));
    }
  }
  if (p.segments.back().output_to_peer)
    out.push_back(message(Op::send, ops::Payload::activation, last, mb, chunk + 1, chunk));
}

// Its backward pass: receive the output's gradient, every segment in reverse with its backward
// collective, free what was kept, send the input's gradient back.
void append_backward(const ops::Program& p, int chunk, int mb, Schedule& out) {
  const int last = static_cast<int>(p.segments.size()) - 1;
  if (p.segments.back().output_to_peer)
    for (Op op : {Op::recv, Op::recv_wait})
      out.push_back(message(op, ops::Payload::gradient, last, mb, chunk + 1, chunk));
  for (int s = last; s >= 0; --s) {
    const ops::SegmentShape& shape = p.segments[static_cast<std::size_t>(s)];
    for (int stage = 0; stage < shape.backward_stages; ++stage) {
      Instruction b = make(Op::backward, s, mb);
      b.stage = stage;
      b.direction = schedule::Direction::backward;
      out.push_back(b);
      if (stage == 0 && shape.has_backward_collective) {
        for (Op op : {Op::start, Op::wait}) {
          Instruction c = make(op, s, mb);
          c.direction = schedule::Direction::backward;
          out.push_back(c);
        }
      }
    }
    if (shape.sets) {
      Instruction free = make(Op::free, s, mb);
      free.sets = shape.sets;
      out.push_back(free);
    }
  }
  if (p.segments.front().input_from_peer)
    out.push_back(message(Op::send, ops::Payload::gradient, 0, mb, chunk - 1, chunk));
}

// GPipe on one stage: every forward, every backward (last micro-batch first), then each
// bucket's reduction and the optimizer step.
Schedule gpipe(const ops::Program& p, int chunk) {
  Schedule out;
  for (int mb = 0; mb < kMicroBatches; ++mb) append_forward(p, chunk, mb, out);
  for (int mb = kMicroBatches - 1; mb >= 0; --mb) append_backward(p, chunk, mb, out);
  for (const ops::SegmentShape& shape : p.segments) {
    if (shape.ready_bucket < 0) continue;
    Instruction reduce{Op::reduce_grads};
    reduce.bucket = shape.ready_bucket;
    out.push_back(reduce);
  }
  out.push_back(Instruction{Op::optimizer_step});
  for (Instruction& ins : out) ins.chunk = chunk;
  return out;
}

std::vector<std::int32_t> tokens(std::uint32_t stream, std::int64_t vocab) {
  return oases::testing::philox_tokens(0, stream, kMicroBatch * kMicroBatches * kSeq,
                                       static_cast<std::uint32_t>(vocab), {3, 4});
}

ops::StepContext step_context(const std::vector<std::int32_t>& inputs,
                              const std::vector<std::int32_t>& targets) {
  ops::StepContext ctx;
  ctx.step = 5;
  ctx.loss_gradient_scale = 1.0 / static_cast<double>(targets.size());
  for (std::int64_t mb = 0; mb < kMicroBatches; ++mb) {
    const std::int64_t row = mb * kMicroBatch;
    ctx.micro_batches.push_back({inputs.data() + row * kSeq, targets.data() + row * kSeq, row});
  }
  return ctx;
}

class Pipeline : public ::testing::TestWithParam<StreamMode> {};

INSTANTIATE_TEST_SUITE_P(BothStreamModes, Pipeline,
                         ::testing::Values(StreamMode::immediate, StreamMode::asynchronous),
                         [](const auto& mode) { return std::string(stream_mode_name(mode.param)); });

TEST_P(Pipeline, TwoStagesWithSendAndRecvComputeWhatOneProcessComputes) {
  const ExecutorOptions streams{GetParam()};
  ASSERT_EQ(mpitest::runtime().world_size(), 2);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 1, 2, mpitest::test_options());
  const int stage = mesh.pp_rank();
  comm::SelfCommunicator tp;
  const model::ModelConfig config = llama();
  const auto inputs = tokens(1, config.vocab_size), targets = tokens(2, config.vocab_size);
  const ops::StepContext ctx = step_context(inputs, targets);

  // The whole model in one process, under the plain schedule.
  model::Model whole(config, options(tp, 0, -1));
  schedule::ScheduleSpec spec;
  spec.micro_batches = static_cast<int>(kMicroBatches);
  Executor reference(whole.segments(), whole.program(), whole.activations(),
                     whole.static_activation_bytes(), streams);
  whole.zero_grads();
  reference.run(schedule::generate(whole.program(), spec), ctx, {});

  // This rank's stage.
  model::Model part(config, options(tp, stage, stage + 1));
  EXPECT_EQ(part.has_embedding(), stage == 0);
  EXPECT_EQ(part.has_head(), stage == 1);
  const ops::Program& program = part.program();
  EXPECT_EQ(program.segments.back().output_to_peer, stage == 0);
  EXPECT_EQ(program.segments.front().input_from_peer, stage == 1);
  const Schedule mine = gpipe(program, stage);
  EXPECT_NO_THROW(schedule::verify_schedule(program, [] {
    schedule::ScheduleSpec s;
    s.micro_batches = static_cast<int>(kMicroBatches);
    return s;
  }(), mine));
  // Both ranks' lists, for the group checks: every rank builds both stages' programs.
  std::vector<Schedule> both;
  for (int s = 0; s < 2; ++s) {
    model::Model other(config, options(tp, s, s + 1));
    both.push_back(gpipe(other.program(), s));
  }
  EXPECT_NO_THROW(schedule::verify_point_to_point(both));

  Executor executor(part.segments(), program, part.activations(), part.static_activation_bytes(),
                    streams);
  executor.set_point_to_point(&mesh.pp_group());
  part.zero_grads();
  int reductions = 0;
  const ExecutionStats stats = executor.run(mine, ctx, {[&](int) { ++reductions; }, {}});
  EXPECT_EQ(reductions, 2);
  EXPECT_EQ(part.activations().live_count(), 0u);
  EXPECT_GE(stats.exposed_comm_seconds, 0.0);

  // The loss lives on the last stage.
  if (stage == 1) {
    EXPECT_EQ(part.loss().count, whole.loss().count);
    EXPECT_NEAR(part.loss().sum, whole.loss().sum, 1e-10 * std::abs(whole.loss().sum));
  }
  for (const auto& p : part.layout().params()) {
    const Tensor got = part.layout().view(part.grads(), p);
    const Tensor want = whole.layout().view(whole.grads(), whole.layout().find(p.name));
    double diff = 0, norm = 0;
    for (std::int64_t i = 0; i < got.numel(); ++i) {
      diff += std::pow(got.data<double>()[i] - want.data<double>()[i], 2);
      norm += std::pow(want.data<double>()[i], 2);
    }
    EXPECT_GT(norm, 0) << p.name;
    EXPECT_LE(std::sqrt(diff), 1e-10 * std::sqrt(norm)) << "stage " << stage << " " << p.name;
  }
}

}  // namespace
}  // namespace oases::runtime
