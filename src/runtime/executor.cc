#include "runtime/executor.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <algorithm>

namespace oases::runtime {

ExecutionStats& ExecutionStats::operator+=(const ExecutionStats& other) {
  compute_seconds += other.compute_seconds;
  exposed_comm_seconds += other.exposed_comm_seconds;
  bubble_seconds += other.bubble_seconds;
  comm_seconds += other.comm_seconds;
  exposed_all_to_all_seconds += other.exposed_all_to_all_seconds;
  all_to_all_seconds += other.all_to_all_seconds;
  collectives += other.collectives;
  peak_activation_bytes = std::max(peak_activation_bytes, other.peak_activation_bytes);
  return *this;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Total length of the union of the intervals.
double union_seconds(std::vector<std::pair<Clock::time_point, Clock::time_point>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0;
  Clock::time_point covered{};
  for (const auto& [begin, end] : intervals) {
    const Clock::time_point from = std::max(begin, covered);
    if (end > from) total += seconds(end - from);
    covered = std::max(covered, end);
  }
  return total;
}

bool is_compute(schedule::Op op) {
  return op == schedule::Op::forward || op == schedule::Op::recompute ||
         op == schedule::Op::backward || op == schedule::Op::backward_weight;
}

}  // namespace

ExecutionStats Executor::run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                             const StepHooks& hooks, InstructionListener* listener) {
  return run(schedule, ctx, ctx, hooks, listener);
}

ExecutionStats Executor::run(const schedule::Schedule& schedule, const ops::StepContext& own_batch,
                             const ops::StepContext& previous_batch, const StepHooks& hooks,
                             InstructionListener* listener) {
  using schedule::Op;
  ExecutionStats stats;
  store_.reset_peak();
  std::vector<std::pair<Clock::time_point, Clock::time_point>> wire;
  for (const schedule::Instruction& ins : schedule) {
    const Clock::time_point began = Clock::now();
    const auto key = std::tuple{ins.segment, ins.micro_batch, ins.sub_batch,
                                schedule::collective_channel(ins), ins.replay};
    const ops::StepContext& ctx = ins.batch < 0 ? previous_batch : own_batch;
    const bool has_segment = ins.op != Op::reduce_grads && ins.op != Op::optimizer_step &&
                             ins.op != Op::use_weights && !schedule::is_parameter_op(ins.op);
    ops::Segment* segment = has_segment ? segments_[static_cast<std::size_t>(ins.segment)].get() : nullptr;
    const ops::SegmentShape* shape =
        has_segment ? &program_.segments[static_cast<std::size_t>(ins.segment)] : nullptr;
    switch (ins.op) {
      case Op::forward: segment->forward(ctx, ins.micro_batch, ins.sub_batch); break;
      case Op::recompute:
        segment->recompute(ctx, ins.micro_batch, ins.sub_batch, ins.sets);
        break;
      case Op::backward:
        if (ins.input_only) segment->backward_input(ctx, ins.micro_batch, ins.sub_batch, ins.stage);
        else segment->backward(ctx, ins.micro_batch, ins.sub_batch, ins.stage);
        break;
      case Op::backward_weight:
        segment->backward_weight(ctx, ins.micro_batch, ins.sub_batch);
        break;
      case Op::free: segment->release(ins.micro_batch, ins.sub_batch, ins.sets); break;
      case Op::encode:
        segment->encode(ins.micro_batch, ins.sub_batch, ins.sets, ins.encoding);
        break;
      case Op::decode: segment->decode(ins.micro_batch, ins.sub_batch, ins.sets); break;
      case Op::partition: segment->partition(ins.micro_batch, ins.sub_batch, ins.sets); break;
      case Op::start:
      case Op::gather_sets: {
        const ops::Segment::CollectiveCall call =
            ins.op == Op::gather_sets
                ? segment->gather_sets(ins.micro_batch, ins.sub_batch, ins.sets)
            : ins.direction == schedule::Direction::forward
                ? segment->forward_collective(ins.micro_batch, ins.sub_batch)
                : segment->backward_collective(ins.micro_batch, ins.sub_batch);
        OASES_ASSERT(call.group != nullptr, "{}: collective without a group", segment->name());
        std::unique_ptr<comm::Work> work;
        switch (call.kind) {
          case ops::CollectiveKind::all_reduce:
            work = call.group->all_reduce_async(call.buffer, call.op);
            break;
          case ops::CollectiveKind::all_gather:
            work = call.group->all_gather_async(call.block, call.buffer);
            break;
          case ops::CollectiveKind::all_to_all:
            work = call.group->all_to_all_async(call.block, call.buffer);
            break;
        }
        in_flight_[key] = {std::move(work), began, call};
        ++stats.collectives;
        break;
      }
      case Op::wait:
      case Op::wait_sets: {
        auto it = in_flight_.find(key);
        OASES_ASSERT(it != in_flight_.end(), "wait on a collective never started: {}",
                     schedule::to_string(ins));
        it->second.work->wait();
        const Clock::time_point done = Clock::now();
        stats.exposed_comm_seconds += seconds(done - began);
        // Where the backend does not time its operations, the issue-to-wait span stands in.
        const comm::WorkTiming timing =
            it->second.work->timing().value_or(comm::WorkTiming{it->second.issued, done});
        if (it->second.call.group->size() > 1) wire.emplace_back(timing.began, timing.finished);
        if (it->second.call.kind == ops::CollectiveKind::all_to_all) {
          stats.exposed_all_to_all_seconds += seconds(done - began);
          if (it->second.call.group->size() > 1)
            stats.all_to_all_seconds += seconds(timing.finished - timing.began);
        }
        if (listener) {
          InstructionRecord record{ins, shape, it->second.call.kind, it->second.call.op,
                                   Lane::communication, timing.began, timing.finished};
          listener->record(record);
        }
        in_flight_.erase(it);
        break;
      }
      case Op::reduce_grads:
        if (hooks.reduce_grads) hooks.reduce_grads(ins.bucket);
        break;
      case Op::optimizer_step:
        if (hooks.optimizer_step) hooks.optimizer_step();
        break;
      case Op::use_weights:
        OASES_ASSERT(hooks.use_weights, "{} without a use_weights hook", schedule::to_string(ins));
        hooks.use_weights(ins.batch);
        break;
      case Op::gather_params:
        if (hooks.gather_params) hooks.gather_params(ins.bucket);
        break;
      case Op::wait_params: {
        if (hooks.wait_params) hooks.wait_params(ins.bucket);
        // The compute lane can do nothing until the parameters are in: exposed communication.
        const Clock::time_point arrived = Clock::now();
        stats.exposed_comm_seconds += seconds(arrived - began);
        if (listener) {
          InstructionRecord record;
          record.instruction = ins;
          record.lane = Lane::compute;
          record.began = began;
          record.finished = arrived;
          listener->record(record);
        }
        break;
      }
      case Op::release_params:
        if (hooks.release_params) hooks.release_params(ins.bucket);
        break;
      case Op::send: send(ins, *segment, listener); break;
      case Op::recv: {
        OASES_ASSERT(peers_ != nullptr, "{}: no point-to-point group", schedule::to_string(ins));
        const Tensor buffer = segment->recv_buffer(ins.payload, ins.micro_batch, ins.sub_batch);
        std::unique_ptr<comm::Work>& posted = receives_[receive_key(ins)];
        OASES_ASSERT(!posted, "{}: the receive is already posted", schedule::to_string(ins));
        posted = peers_->recv_async(buffer, ins.peer, ins.slot);
        break;
      }
      case Op::recv_wait: {
        const auto posted = receives_.find(receive_key(ins));
        OASES_ASSERT(posted != receives_.end(), "{}: the receive was never posted",
                     schedule::to_string(ins));
        posted->second->wait();
        receives_.erase(posted);
        const Clock::time_point arrived = Clock::now();
        stats.bubble_seconds += seconds(arrived - began);
        if (listener) {
          InstructionRecord record{ins, shape, ops::CollectiveKind::all_reduce,
                                   comm::ReduceOp::sum, Lane::compute, began, arrived};
          listener->record(record);
        }
        break;
      }
    }
    const Clock::time_point ended = Clock::now();
    if (is_compute(ins.op)) stats.compute_seconds += seconds(ended - began);
    const bool reported = is_compute(ins.op) || ins.op == Op::reduce_grads ||
                          ins.op == Op::optimizer_step || ins.op == Op::gather_params ||
                          ins.op == Op::release_params;
    if (listener && reported) {
      InstructionRecord record;
      record.instruction = ins;
      record.segment = shape;
      record.lane = is_compute(ins.op) ? Lane::compute : Lane::optimizer;
      record.began = began;
      record.finished = ended;
      listener->record(record);
    }
  }
  OASES_ASSERT(in_flight_.empty(), "schedule ended with collectives in flight");
  OASES_ASSERT(receives_.empty(), "schedule ended with receives posted and never waited");
  const Clock::time_point sends_began = Clock::now();
  for (auto& [slot, staged] : staged_) finish_send(staged, listener);
  stats.exposed_comm_seconds += seconds(Clock::now() - sends_began);
  stats.comm_seconds += union_seconds(std::move(wire));
  stats.peak_activation_bytes = static_bytes_ + store_.peak_bytes();
  return stats;
}

void Executor::send(const schedule::Instruction& ins, ops::Segment& segment,
                    InstructionListener* listener) {
  OASES_ASSERT(peers_ != nullptr, "{}: no point-to-point group", schedule::to_string(ins));
  const Tensor tensor = segment.send_buffer(ins.payload, ins.micro_batch, ins.sub_batch);
  Staged& staged = staged_[{ins.payload, ins.slot}];
  finish_send(staged, listener);  // the slot's previous message must be out before reuse
  if (staged.buffer.bytes() < tensor.nbytes()) staged.buffer = Buffer(tensor.nbytes(), tensor.device());
  const Tensor copy = staged.buffer.tensor(tensor.dtype(), {tensor.numel()});
  kernels::copy(tensor.reshaped({tensor.numel()}), copy);
  staged.issued = Clock::now();
  staged.instruction = ins;
  staged.in_flight = peers_->send_async(copy, ins.peer, ins.slot);
}

void Executor::finish_send(Staged& staged, InstructionListener* listener) {
  if (!staged.in_flight) return;
  staged.in_flight->wait();
  if (listener) {
    const comm::WorkTiming timing =
        staged.in_flight->timing().value_or(comm::WorkTiming{staged.issued, Clock::now()});
    InstructionRecord record{staged.instruction, &program_.segments[static_cast<std::size_t>(staged.instruction.segment)],
                             ops::CollectiveKind::all_reduce, comm::ReduceOp::sum,
                             Lane::point_to_point, timing.began, timing.finished};
    listener->record(record);
  }
  staged.in_flight.reset();
}

}  // namespace oases::runtime
