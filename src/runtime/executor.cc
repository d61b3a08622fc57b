#include "runtime/executor.h"

#include "core/error.h"
#include "core/timer.h"

namespace oases::runtime {

ExecutionStats Executor::run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                             const StepHooks& hooks) {
  using schedule::Op;
  ExecutionStats stats;
  for (const schedule::Instruction& ins : schedule) {
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
        in_flight_[key] = tp_.all_reduce_async(buffer, comm::ReduceOp::sum);
        break;
      }
      case Op::wait: {
        auto it = in_flight_.find(key);
        OASES_ASSERT(it != in_flight_.end(), "wait on a collective never started: {}",
                     schedule::to_string(ins));
        const Stopwatch waited;
        it->second->wait();
        stats.exposed_comm_seconds += waited.seconds();
        in_flight_.erase(it);
        break;
      }
      case Op::reduce_grads:
        if (hooks.reduce_grads) hooks.reduce_grads();
        break;
      case Op::optimizer_step:
        if (hooks.optimizer_step) hooks.optimizer_step();
        break;
    }
  }
  OASES_ASSERT(in_flight_.empty(), "schedule ended with collectives in flight");
  return stats;
}

}  // namespace oases::runtime
