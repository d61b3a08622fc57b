#include "runtime/executor.h"

#include "core/error.h"
#include "core/timer.h"

#include <fmt/format.h>

namespace oases::runtime {

namespace {
std::string trace_name(const schedule::Instruction& ins, const std::string& segment) {
  using schedule::Op;
  switch (ins.op) {
    case Op::forward: return fmt::format("F {} mb{} sb{}", segment, ins.micro_batch, ins.sub_batch);
    case Op::backward:
      return fmt::format("B{} {} mb{} sb{}", ins.stage, segment, ins.micro_batch, ins.sub_batch);
    case Op::start:
    case Op::wait:
      return fmt::format("AR {} {} mb{} sb{}",
                         ins.direction == schedule::Direction::forward ? "fwd" : "bwd", segment,
                         ins.micro_batch, ins.sub_batch);
    case Op::reduce_grads: return fmt::format("ReduceGrads bucket{}", ins.segment);
    case Op::optimizer_step: return "OptimizerStep";
  }
  return "?";
}
}  // namespace

ExecutionStats Executor::run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                             const StepHooks& hooks, TraceRecorder* trace) {
  using schedule::Op;
  ExecutionStats stats;
  for (const schedule::Instruction& ins : schedule) {
    const double start_us = trace ? trace->now_us() : 0;
    const auto key = std::tuple{ins.segment, ins.micro_batch, ins.sub_batch,
                                static_cast<int>(ins.direction)};
    switch (ins.op) {
      case Op::forward:
        segments_[static_cast<std::size_t>(ins.segment)]->forward(ctx, ins.micro_batch);
        break;
      case Op::backward:
        segments_[static_cast<std::size_t>(ins.segment)]->backward(ctx, ins.micro_batch, ins.stage);
        break;
      case Op::start: {
        ops::Segment& segment = *segments_[static_cast<std::size_t>(ins.segment)];
        const Tensor buffer = ins.direction == schedule::Direction::forward
                                  ? segment.forward_collective_buffer()
                                  : segment.backward_collective_buffer();
        in_flight_[key] = {tp_.all_reduce_async(buffer, comm::ReduceOp::sum), start_us};
        break;
      }
      case Op::wait: {
        auto it = in_flight_.find(key);
        OASES_ASSERT(it != in_flight_.end(), "wait on a collective never started: {}",
                     schedule::to_string(ins));
        const Stopwatch waited;
        it->second.work->wait();
        stats.exposed_comm_seconds += waited.seconds();
        if (trace)
          trace->add(trace_name(ins, segments_[static_cast<std::size_t>(ins.segment)]->name()),
                     TraceRecorder::Lane::communication, it->second.issued_us, trace->now_us());
        in_flight_.erase(it);
        break;
      }
      case Op::reduce_grads:
        if (hooks.reduce_grads) hooks.reduce_grads(ins.segment);
        break;
      case Op::optimizer_step:
        if (hooks.optimizer_step) hooks.optimizer_step();
        break;
    }
    if (trace && ins.op != Op::start && ins.op != Op::wait) {
      const std::string segment = ins.op == Op::forward || ins.op == Op::backward
                                      ? segments_[static_cast<std::size_t>(ins.segment)]->name()
                                      : "";
      trace->add(trace_name(ins, segment),
                 ins.op == Op::optimizer_step || ins.op == Op::reduce_grads
                     ? TraceRecorder::Lane::optimizer
                     : TraceRecorder::Lane::compute,
                 start_us, trace->now_us());
    }
  }
  OASES_ASSERT(in_flight_.empty(), "schedule ended with collectives in flight");
  return stats;
}

}  // namespace oases::runtime
