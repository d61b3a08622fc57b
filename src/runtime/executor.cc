#include "runtime/executor.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <thread>

namespace oases::runtime {

ExecutionStats& ExecutionStats::operator+=(const ExecutionStats& other) {
  compute_seconds += other.compute_seconds;
  exposed_comm_seconds += other.exposed_comm_seconds;
  bubble_seconds += other.bubble_seconds;
  comm_seconds += other.comm_seconds;
  exposed_all_to_all_seconds += other.exposed_all_to_all_seconds;
  all_to_all_seconds += other.all_to_all_seconds;
  exposed_cp_seconds += other.exposed_cp_seconds;
  cp_seconds += other.cp_seconds;
  collectives += other.collectives;
  peak_activation_bytes = std::max(peak_activation_bytes, other.peak_activation_bytes);
  return *this;
}

namespace detail {

// A collective, or a message over the point-to-point group, from its start to its
// completion. Each field is written on one stream and read on the next only after an event
// (or by the host once every stream has finished).
struct Flight {
  explicit Flight(const schedule::Instruction& ins) : instruction(ins) {}
  schedule::Instruction instruction;
  ops::Segment::CollectiveCall call;  // a collective's (compute stream)
  Tensor buffer;  // a message's: the staged copy sent, or where it is received (compute stream)
  std::unique_ptr<comm::Work> work;   // once issued (communication or point-to-point stream)
  Event issued, done;                 // on that stream: after the issue, after the completion
  // Valid once done: when it was on the wire, as the communicator measured it or, where the
  // backend does not, from its issue to its completion.
  comm::WorkTiming wire() const {
    return work->timing().value_or(comm::WorkTiming{issued.time(), done.time()});
  }
};

struct SendSlot {
  Buffer buffer;                      // the staging buffer (compute stream)
  std::shared_ptr<Flight> in_flight;  // the send from it not yet completed (host)
};

struct Measure {
  enum class Kind {
    compute,         // a compute instruction's run
    collective,      // a Wait: the compute stream waiting, and the collective on the wire
    receive,         // a RecvWait: the compute stream waiting
    hook,            // a hook's run on the host
    parameter_wait,  // WaitParams: its hook's run, which the compute stream waits for
    send,            // a completed Send: its time on the wire
    last_sends,      // the compute stream waiting for the sends still in flight at the end
  };
  Kind kind = Kind::compute;
  schedule::Instruction instruction{};
  Event began{}, finished{};        // the span it measures (not for a send)
  std::shared_ptr<Flight> flight{};  // a collective or a send
};

struct RunState {
  const ops::StepContext& own_batch;
  const ops::StepContext& previous_batch;
  const StepHooks& hooks;
  InstructionListener* listener;
  std::vector<Measure>& measures;  // empty at the start
  ExecutionStats stats{};

  const ops::StepContext& context_of(const schedule::Instruction& ins) const {
    return ins.batch < 0 ? previous_batch : own_batch;
  }
};

}  // namespace detail

namespace {

using detail::Measure;
using schedule::Op;
using Clock = std::chrono::steady_clock;
using Interval = std::pair<Clock::time_point, Clock::time_point>;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Total length of the union of the intervals.
double union_seconds(std::vector<Interval> intervals) {
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

// Work enqueued on `later` from now on runs after the work enqueued on `earlier` so far.
void order_after(Stream& earlier, Stream& later) {
  if (earlier.mode() == StreamMode::immediate) return;  // its work so far is done
  Event point;
  point.record(earlier);
  point.make_wait(later);
}

std::tuple<int, int, int, int, bool> collective_key(const schedule::Instruction& ins) {
  return {ins.segment, ins.micro_batch, ins.sub_batch, schedule::collective_channel(ins),
          ins.replay};
}

void run_compute(ops::Segment& segment, const ops::StepContext& ctx,
                 const schedule::Instruction& ins) {
  switch (ins.op) {
    case Op::forward: segment.forward(ctx, ins.micro_batch, ins.sub_batch); return;
    case Op::recompute: segment.recompute(ctx, ins.micro_batch, ins.sub_batch, ins.sets); return;
    case Op::backward:
      if (ins.input_only) segment.backward_input(ctx, ins.micro_batch, ins.sub_batch, ins.stage);
      else segment.backward(ctx, ins.micro_batch, ins.sub_batch, ins.stage);
      return;
    case Op::backward_weight: segment.backward_weight(ctx, ins.micro_batch, ins.sub_batch); return;
    default: OASES_ASSERT(false, "{} is not a compute instruction", schedule::to_string(ins));
  }
}

void run_keep_sets(ops::Segment& segment, const schedule::Instruction& ins) {
  switch (ins.op) {
    case Op::free: segment.release(ins.micro_batch, ins.sub_batch, ins.sets); return;
    case Op::encode:
      segment.encode(ins.micro_batch, ins.sub_batch, ins.sets, ins.encoding);
      return;
    case Op::decode: segment.decode(ins.micro_batch, ins.sub_batch, ins.sets); return;
    case Op::partition: segment.partition(ins.micro_batch, ins.sub_batch, ins.sets); return;
    default: OASES_ASSERT(false, "{} keeps no sets", schedule::to_string(ins));
  }
}

ops::Segment::CollectiveCall collective_call(ops::Segment& segment,
                                             const schedule::Instruction& ins) {
  const ops::Segment::CollectiveCall call =
      ins.op == Op::gather_sets ? segment.gather_sets(ins.micro_batch, ins.sub_batch, ins.sets)
      : ins.direction == schedule::Direction::forward
          ? segment.forward_collective(ins.micro_batch, ins.sub_batch)
          : segment.backward_collective(ins.micro_batch, ins.sub_batch);
  OASES_ASSERT(call.group != nullptr, "{}: collective without a group", segment.name());
  return call;
}

std::unique_ptr<comm::Work> issue(const ops::Segment::CollectiveCall& call) {
  switch (call.kind) {
    case ops::CollectiveKind::all_reduce: return call.group->all_reduce_async(call.buffer, call.op);
    case ops::CollectiveKind::all_gather: return call.group->all_gather_async(call.block, call.buffer);
    case ops::CollectiveKind::all_to_all: return call.group->all_to_all_async(call.block, call.buffer);
    case ops::CollectiveKind::shift:
      return call.group->shift_async(call.block, call.buffer, call.shift);
    case ops::CollectiveKind::reduce_scatter: {
      const std::int64_t ranks = call.group->size();
      OASES_ASSERT(call.buffer.numel() % ranks == 0, "reduce-scatter of {} elements over {} ranks",
                   call.buffer.numel(), ranks);
      return call.group->reduce_scatter_blocks_async(
          call.buffer.reshaped({call.buffer.numel()}),
          std::vector<std::int64_t>(static_cast<std::size_t>(ranks), call.buffer.numel() / ranks),
          call.op);
    }
  }
  OASES_ASSERT(false, "unknown collective kind");
  __builtin_unreachable();
}

// Copies `tensor` into `staging` (grown to fit it); the copy.
Tensor stage(const Tensor& tensor, Buffer& staging) {
  if (staging.bytes() < tensor.nbytes()) staging = Buffer(tensor.nbytes(), tensor.device());
  const Tensor copy = staging.tensor(tensor.dtype(), {tensor.numel()});
  kernels::copy(tensor.reshaped({tensor.numel()}), copy);
  return copy;
}

void invoke_hook(const schedule::Instruction& ins, const StepHooks& hooks) {
  const auto call = [&](const std::function<void(int)>& hook) {
    if (hook) hook(ins.bucket);
  };
  switch (ins.op) {
    case Op::reduce_grads: return call(hooks.reduce_grads);
    case Op::optimizer_step:
      if (hooks.optimizer_step) hooks.optimizer_step();
      return;
    case Op::use_weights:
      OASES_ASSERT(hooks.use_weights, "{} without a use_weights hook", schedule::to_string(ins));
      return hooks.use_weights(ins.batch);
    case Op::gather_params: return call(hooks.gather_params);
    case Op::wait_params: return call(hooks.wait_params);
    case Op::release_params: return call(hooks.release_params);
    default: OASES_ASSERT(false, "{} calls no hook", schedule::to_string(ins));
  }
}

double span_seconds(const Measure& m) { return elapsed_seconds(m.began, m.finished); }

// Adds what `m` measured to `stats`, and a collective's time on the wire to `wire`.
void account(const Measure& m, const ops::Program& program, ExecutionStats& stats,
             std::vector<Interval>& wire) {
  switch (m.kind) {
    case Measure::Kind::compute: stats.compute_seconds += span_seconds(m); return;
    case Measure::Kind::receive: stats.bubble_seconds += span_seconds(m); return;
    case Measure::Kind::parameter_wait:
    case Measure::Kind::last_sends: stats.exposed_comm_seconds += span_seconds(m); return;
    case Measure::Kind::collective: {
      const double waited = span_seconds(m);
      const ops::Segment::CollectiveCall& call = m.flight->call;
      const bool over_cp =
          call.kind == ops::CollectiveKind::shift ||
          (call.kind == ops::CollectiveKind::all_to_all &&
           program.segments[static_cast<std::size_t>(m.instruction.segment)]
                   .context_parallel_ranks > 0);
      const bool moe = call.kind == ops::CollectiveKind::all_to_all && !over_cp;
      stats.exposed_comm_seconds += waited;
      if (moe) stats.exposed_all_to_all_seconds += waited;
      if (over_cp) stats.exposed_cp_seconds += waited;
      if (call.group->size() == 1) return;  // nothing was on a wire
      const comm::WorkTiming timing = m.flight->wire();
      wire.emplace_back(timing.began, timing.finished);
      const double on_wire = seconds(timing.finished - timing.began);
      if (moe) stats.all_to_all_seconds += on_wire;
      if (over_cp) stats.cp_seconds += on_wire;
      return;
    }
    case Measure::Kind::hook:
    case Measure::Kind::send: return;
  }
}

// What the listener is told of `m` (nothing for the last sends' wait).
std::optional<InstructionRecord> record_of(const Measure& m, const ops::Program& program) {
  InstructionRecord r;
  r.instruction = m.instruction;
  const bool has_segment = m.kind != Measure::Kind::hook &&
                           m.kind != Measure::Kind::parameter_wait &&
                           m.kind != Measure::Kind::last_sends;
  if (has_segment) r.segment = &program.segments[static_cast<std::size_t>(m.instruction.segment)];
  const bool on_the_wire = m.kind == Measure::Kind::collective || m.kind == Measure::Kind::send;
  if (on_the_wire) {
    const comm::WorkTiming timing = m.flight->wire();
    r.began = timing.began;
    r.finished = timing.finished;
  } else {
    r.began = m.began.time();
    r.finished = m.finished.time();
  }
  switch (m.kind) {
    case Measure::Kind::compute:
    case Measure::Kind::receive:
    case Measure::Kind::parameter_wait: r.lane = Lane::compute; return r;
    case Measure::Kind::hook: r.lane = Lane::optimizer; return r;
    case Measure::Kind::collective:
      r.collective = m.flight->call.kind;
      r.reduce = m.flight->call.op;
      r.lane = Lane::communication;
      return r;
    case Measure::Kind::send: r.lane = Lane::point_to_point; return r;
    case Measure::Kind::last_sends: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

Executor::Executor(std::vector<std::unique_ptr<ops::Segment>>& segments,
                   const ops::Program& program, ops::ActivationStore& store,
                   std::size_t static_activation_bytes, ExecutorOptions options)
    : segments_(segments),
      program_(program),
      store_(store),
      static_bytes_(static_activation_bytes),
      compute_(Device::cpu(), options.streams),
      communication_(Device::cpu(), options.streams),
      point_to_point_(Device::cpu(), options.streams),
      host_(Device::cpu(), StreamMode::immediate),
      compute_delay_seconds_(options.compute_delay_seconds) {}

Executor::~Executor() = default;

ExecutionStats Executor::run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                             const StepHooks& hooks, InstructionListener* listener) {
  return run(schedule, ctx, ctx, hooks, listener);
}

ExecutionStats Executor::run(const schedule::Schedule& schedule, const ops::StepContext& own_batch,
                             const ops::StepContext& previous_batch, const StepHooks& hooks,
                             InstructionListener* listener) {
  measures_.clear();  // keeps its capacity: a step allocates nothing for its measures
  RunState run{own_batch, previous_batch, hooks, listener, measures_};
  store_.reset_peak();  // the streams are idle between runs
  try {
    for (const schedule::Instruction& ins : schedule) dispatch(ins, run);
    OASES_ASSERT(in_flight_.empty(), "schedule ended with collectives in flight");
    OASES_ASSERT(receives_.empty(), "schedule ended with receives posted and never waited");
    finish_sends(run);
    synchronize_streams();
  } catch (...) {
    // The streams' work refers to the run's contexts and hooks: it must be over before they
    // go. The failure rethrown is the first one, this.
    try {
      synchronize_streams();
    } catch (...) {
    }
    in_flight_.clear();  // abandoned with the run
    receives_.clear();
    throw;
  }
  return resolve(run);
}

void Executor::dispatch(const schedule::Instruction& ins, RunState& run) {
  switch (ins.op) {
    case Op::forward:
    case Op::recompute:
    case Op::backward:
    case Op::backward_weight: return compute(ins, run);
    case Op::free:
    case Op::encode:
    case Op::decode:
    case Op::partition: return keep_sets(ins);
    case Op::start:
    case Op::gather_sets: return start_collective(ins, run);
    case Op::wait:
    case Op::wait_sets: return wait_collective(ins, run);
    case Op::reduce_grads:
    case Op::optimizer_step:
    case Op::use_weights:
    case Op::gather_params:
    case Op::wait_params:
    case Op::release_params: return call_hook(ins, run);
    case Op::send: return send(ins, run);
    case Op::recv: return post_receive(ins);
    case Op::recv_wait: return wait_receive(ins, run);
  }
}

void Executor::compute(const schedule::Instruction& ins, RunState& run) {
  ops::Segment& segment = segment_of(ins);
  const ops::StepContext& ctx = run.context_of(ins);
  Measure measure{Measure::Kind::compute, ins};
  measure.began.record(compute_);
  compute_.enqueue([&segment, &ctx, &ins, delay = compute_delay_seconds_] {
    run_compute(segment, ctx, ins);
    if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  });
  measure.finished.record(compute_);
  run.measures.push_back(std::move(measure));
}

void Executor::keep_sets(const schedule::Instruction& ins) {
  ops::Segment& segment = segment_of(ins);
  compute_.enqueue([&segment, &ins] { run_keep_sets(segment, ins); });
}

void Executor::start_collective(const schedule::Instruction& ins, RunState& run) {
  OASES_ASSERT(!in_flight_.contains(collective_key(ins)), "{}: the collective is already in flight",
               schedule::to_string(ins));
  ops::Segment& segment = segment_of(ins);
  auto flight = std::make_shared<Flight>(ins);
  compute_.enqueue([&segment, &ins, flight] { flight->call = collective_call(segment, ins); });
  order_after(compute_, communication_);
  communication_.enqueue([flight] {
    const comm::IssuerLabel label(*flight->call.group, schedule::to_string(flight->instruction));
    flight->work = issue(flight->call);
  });
  flight->issued.record(communication_);
  in_flight_.emplace(collective_key(ins), std::move(flight));
  ++run.stats.collectives;
}

void Executor::wait_collective(const schedule::Instruction& ins, RunState& run) {
  auto started = in_flight_.extract(collective_key(ins));
  OASES_ASSERT(!started.empty(), "wait on a collective never started: {}",
               schedule::to_string(ins));
  Measure measure = complete(communication_, std::move(started.mapped()));
  measure.kind = Measure::Kind::collective;
  measure.instruction = ins;
  run.measures.push_back(std::move(measure));
}

void Executor::call_hook(const schedule::Instruction& ins, RunState& run) {
  synchronize_streams();  // hooks are host code (the header says why)
  const bool waits = ins.op == Op::wait_params;
  Measure measure{waits ? Measure::Kind::parameter_wait : Measure::Kind::hook, ins};
  measure.began.record(host_);
  invoke_hook(ins, run.hooks);
  measure.finished.record(host_);
  if (waits || (run.listener && ins.op != Op::use_weights)) run.measures.push_back(std::move(measure));
}

void Executor::send(const schedule::Instruction& ins, RunState& run) {
  OASES_ASSERT(peers_ != nullptr, "{}: no point-to-point group", schedule::to_string(ins));
  ops::Segment& segment = segment_of(ins);
  std::shared_ptr<SendSlot>& slot = send_slots_[{ins.payload, ins.slot}];
  if (!slot) slot = std::make_shared<SendSlot>();
  finish_send(*slot, run);  // the slot's previous message must be out before its buffer is reused
  auto flight = std::make_shared<Flight>(ins);
  compute_.enqueue([&segment, &ins, slot, flight] {
    flight->buffer = stage(segment.send_buffer(ins.payload, ins.micro_batch, ins.sub_batch),
                           slot->buffer);
  });
  order_after(compute_, point_to_point_);
  point_to_point_.enqueue([peers = peers_, flight] {
    const comm::IssuerLabel label(*peers, schedule::to_string(flight->instruction));
    flight->work = peers->send_async(flight->buffer, flight->instruction.peer, flight->instruction.slot);
  });
  flight->issued.record(point_to_point_);
  slot->in_flight = std::move(flight);
}

void Executor::finish_send(SendSlot& slot, RunState& run) {
  if (!slot.in_flight) return;
  Measure measure = complete(point_to_point_, std::move(slot.in_flight));
  slot.in_flight = nullptr;
  if (!run.listener) return;
  measure.kind = Measure::Kind::send;
  measure.instruction = measure.flight->instruction;
  run.measures.push_back(std::move(measure));
}

void Executor::finish_sends(RunState& run) {
  Measure measure{Measure::Kind::last_sends};
  measure.began.record(compute_);
  for (auto& [key, slot] : send_slots_) finish_send(*slot, run);
  measure.finished.record(compute_);
  run.measures.push_back(std::move(measure));
}

void Executor::post_receive(const schedule::Instruction& ins) {
  OASES_ASSERT(peers_ != nullptr, "{}: no point-to-point group", schedule::to_string(ins));
  OASES_ASSERT(!receives_.contains(receive_key(ins)), "{}: the receive is already posted",
               schedule::to_string(ins));
  ops::Segment& segment = segment_of(ins);
  auto flight = std::make_shared<Flight>(ins);
  compute_.enqueue([&segment, &ins, flight] {
    flight->buffer = segment.recv_buffer(ins.payload, ins.micro_batch, ins.sub_batch);
  });
  order_after(compute_, point_to_point_);
  point_to_point_.enqueue([peers = peers_, flight] {
    const comm::IssuerLabel label(*peers, schedule::to_string(flight->instruction));
    flight->work = peers->recv_async(flight->buffer, flight->instruction.peer, flight->instruction.slot);
  });
  receives_.emplace(receive_key(ins), std::move(flight));
}

void Executor::wait_receive(const schedule::Instruction& ins, RunState& run) {
  auto posted = receives_.extract(receive_key(ins));
  OASES_ASSERT(!posted.empty(), "{}: the receive was never posted", schedule::to_string(ins));
  Measure measure = complete(point_to_point_, std::move(posted.mapped()));
  measure.kind = Measure::Kind::receive;
  measure.instruction = ins;
  run.measures.push_back(std::move(measure));
}

Measure Executor::complete(Stream& stream, std::shared_ptr<Flight> flight) {
  Measure measure;
  // Recorded first: on immediate streams the wait below is the compute stream's (the caller's).
  measure.began.record(compute_);
  stream.enqueue([flight] { flight->work->wait(); });
  flight->done.record(stream);
  flight->done.make_wait(compute_);
  measure.finished.record(compute_);
  measure.flight = std::move(flight);
  return measure;
}

void Executor::synchronize_streams() {
  std::exception_ptr first;
  for (Stream* stream : {&compute_, &communication_, &point_to_point_}) {
    try {
      stream->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

ExecutionStats Executor::resolve(RunState& run) const {
  std::vector<Interval> wire;
  for (const Measure& measure : run.measures) {
    account(measure, program_, run.stats, wire);
    if (!run.listener) continue;
    if (const std::optional<InstructionRecord> record = record_of(measure, program_))
      run.listener->record(*record);
  }
  run.stats.comm_seconds += union_seconds(std::move(wire));
  run.stats.peak_activation_bytes = static_bytes_ + store_.peak_bytes();
  return run.stats;
}

}  // namespace oases::runtime
