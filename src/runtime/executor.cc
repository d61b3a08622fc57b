#include "runtime/executor.h"

#include "core/error.h"
#include "core/timer.h"

#include <fmt/format.h>

#include <algorithm>

namespace oases::runtime {

ExecutionStats& ExecutionStats::operator+=(const ExecutionStats& other) {
  compute_seconds += other.compute_seconds;
  exposed_comm_seconds += other.exposed_comm_seconds;
  comm_seconds += other.comm_seconds;
  collectives += other.collectives;
  peak_activation_bytes = std::max(peak_activation_bytes, other.peak_activation_bytes);
  return *this;
}

namespace {

using Clock = std::chrono::steady_clock;

// Trace names carry the segment, micro-batch and sub-batch; tests count collectives by them.
std::string trace_name(const schedule::Instruction& ins, const std::string& segment,
                       ops::CollectiveKind kind = ops::CollectiveKind::all_reduce) {
  using schedule::Op;
  switch (ins.op) {
    case Op::forward: return fmt::format("F {} mb{} sb{}", segment, ins.micro_batch, ins.sub_batch);
    case Op::recompute:
      return fmt::format("R {} mb{} sb{} [{}]", segment, ins.micro_batch, ins.sub_batch,
                         ops::tensor_sets_name(ins.sets));
    case Op::backward:
      return fmt::format("B{} {} mb{} sb{}", ins.stage, segment, ins.micro_batch, ins.sub_batch);
    case Op::start:
    case Op::wait:
      return fmt::format("{} {}{} {} mb{} sb{}",
                         kind == ops::CollectiveKind::all_reduce ? "AR" : "AG",
                         ins.direction == schedule::Direction::forward ? "fwd" : "bwd",
                         ins.replay ? " replay" : "", segment, ins.micro_batch, ins.sub_batch);
    case Op::free:
      return fmt::format("Free {} mb{} sb{} [{}]", segment, ins.micro_batch, ins.sub_batch,
                         ops::tensor_sets_name(ins.sets));
    case Op::reduce_grads: return fmt::format("ReduceGrads bucket{}", ins.bucket);
    case Op::optimizer_step: return "OptimizerStep";
    case Op::send:
    case Op::recv: return schedule::to_string(ins);
  }
  return "?";
}

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

}  // namespace

ExecutionStats Executor::run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                             const StepHooks& hooks, TraceRecorder* trace) {
  using schedule::Op;
  ExecutionStats stats;
  store_.reset_peak();
  std::vector<std::pair<Clock::time_point, Clock::time_point>> wire;
  const auto trace_us = [&](Clock::time_point t) { return trace->us_at(t); };
  for (const schedule::Instruction& ins : schedule) {
    const Clock::time_point began = Clock::now();
    const auto key = std::tuple{ins.segment, ins.micro_batch, ins.sub_batch,
                                static_cast<int>(ins.direction), ins.replay};
    ops::Segment* segment = ins.op == Op::reduce_grads || ins.op == Op::optimizer_step
                                ? nullptr
                                : segments_[static_cast<std::size_t>(ins.segment)].get();
    double blocked = 0;  // seconds in collectives the segment ran itself
    switch (ins.op) {
      case Op::forward: segment->forward(ctx, ins.micro_batch, ins.sub_batch); break;
      case Op::recompute:
        segment->recompute(ctx, ins.micro_batch, ins.sub_batch, ins.sets);
        break;
      case Op::backward:
        segment->backward(ctx, ins.micro_batch, ins.sub_batch, ins.stage);
        break;
      case Op::free: segment->release(ins.micro_batch, ins.sub_batch, ins.sets); break;
      case Op::start: {
        const ops::Segment::CollectiveCall call =
            ins.direction == schedule::Direction::forward
                ? segment->forward_collective(ins.sub_batch)
                : segment->backward_collective(ins.sub_batch);
        OASES_ASSERT(call.group != nullptr, "{}: collective without a group", segment->name());
        std::unique_ptr<comm::Work> work =
            call.kind == ops::CollectiveKind::all_reduce
                ? call.group->all_reduce_async(call.buffer, comm::ReduceOp::sum)
                : call.group->all_gather_async(call.block, call.buffer);
        in_flight_[key] = {std::move(work), began,
                           trace ? trace_name(ins, segment->name(), call.kind) : std::string(),
                           call.group->size() > 1};
        ++stats.collectives;
        break;
      }
      case Op::wait: {
        auto it = in_flight_.find(key);
        OASES_ASSERT(it != in_flight_.end(), "wait on a collective never started: {}",
                     schedule::to_string(ins));
        it->second.work->wait();
        const Clock::time_point done = Clock::now();
        stats.exposed_comm_seconds += seconds(done - began);
        // Where the backend does not time its operations, the issue-to-wait span stands in.
        const comm::WorkTiming timing =
            it->second.work->timing().value_or(comm::WorkTiming{it->second.issued, done});
        if (it->second.on_wire) wire.emplace_back(timing.began, timing.finished);
        if (trace)
          trace->add(it->second.name, TraceRecorder::Lane::communication,
                     trace_us(timing.began), trace_us(timing.finished));
        in_flight_.erase(it);
        break;
      }
      case Op::reduce_grads:
        if (hooks.reduce_grads) hooks.reduce_grads(ins.bucket);
        break;
      case Op::optimizer_step:
        if (hooks.optimizer_step) hooks.optimizer_step();
        break;
      case Op::send:
      case Op::recv:
        OASES_ASSERT(false, "Send/Recv ({}) is not supported by this executor yet",
                     schedule::to_string(ins));
        break;
    }
    if (segment) {
      for (const auto& c : segment->take_blocking_collectives()) {
        blocked += seconds(c.finished - c.began);
        if (tp_.size() > 1) wire.emplace_back(c.began, c.finished);
        if (trace)
          trace->add(fmt::format("AR {} {} mb{} sb{}", c.name, segment->name(), ins.micro_batch,
                                 ins.sub_batch),
                     TraceRecorder::Lane::communication, trace_us(c.began), trace_us(c.finished));
      }
    }
    const Clock::time_point ended = Clock::now();
    if (ins.op == Op::forward || ins.op == Op::recompute || ins.op == Op::backward) {
      stats.compute_seconds += seconds(ended - began) - blocked;
      stats.exposed_comm_seconds += blocked;
    }
    if (trace && ins.op != Op::start && ins.op != Op::wait) {
      trace->add(trace_name(ins, segment ? segment->name() : ""),
                 ins.op == Op::optimizer_step || ins.op == Op::reduce_grads
                     ? TraceRecorder::Lane::optimizer
                     : TraceRecorder::Lane::compute,
                 trace_us(began), trace_us(ended));
    }
  }
  OASES_ASSERT(in_flight_.empty(), "schedule ended with collectives in flight");
  stats.comm_seconds += union_seconds(std::move(wire));
  stats.peak_activation_bytes = static_bytes_ + store_.peak_bytes();
  return stats;
}

}  // namespace oases::runtime
