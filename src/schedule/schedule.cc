#include "schedule/schedule.h"

#include "core/error.h"

#include <fmt/format.h>

#include <map>
#include <tuple>

namespace oases::schedule {

Schedule megatron_schedule(const ProgramShape& program, int micro_batches, bool training) {
  Schedule out;
  const int num_segments = static_cast<int>(program.segments.size());
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (int s = 0; s < num_segments; ++s) {
      out.push_back({Op::forward, s, 0, Direction::forward, mb, 0});
      if (program.segments[static_cast<std::size_t>(s)].has_forward_collective) {
        out.push_back({Op::start, s, 0, Direction::forward, mb, 0});
        out.push_back({Op::wait, s, 0, Direction::forward, mb, 0});
      }
    }
    if (!training) continue;
    for (int s = num_segments - 1; s >= 0; --s) {
      const SegmentShape& shape = program.segments[static_cast<std::size_t>(s)];
      for (int stage = 0; stage < shape.backward_stages; ++stage) {
        out.push_back({Op::backward, s, stage, Direction::backward, mb, 0});
        if (stage == 0 && shape.has_backward_collective) {
          out.push_back({Op::start, s, 0, Direction::backward, mb, 0});
          out.push_back({Op::wait, s, 0, Direction::backward, mb, 0});
        }
      }
      if (mb == micro_batches - 1 && shape.ready_bucket >= 0)
        out.push_back({Op::reduce_grads, shape.ready_bucket});
    }
  }
  if (training) out.push_back({Op::optimizer_step});
  return out;
}

void verify_schedule(const ProgramShape& program, int micro_batches, const Schedule& schedule) {
  using Key = std::tuple<int, int, int>;  // segment, micro-batch, sub-batch
  std::map<Key, int> forward_done, stages_done;
  std::map<std::tuple<int, int, int, int>, int> collective_state;  // 1 started, 2 waited
  const int num_segments = static_cast<int>(program.segments.size());
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const Instruction& ins = schedule[i];
    const auto where = [&] { return fmt::format("instruction {} ({})", i, to_string(ins)); };
    if (ins.op == Op::reduce_grads || ins.op == Op::optimizer_step) continue;
    OASES_ASSERT(ins.segment >= 0 && ins.segment < num_segments, "{}: no such segment", where());
    OASES_ASSERT(ins.micro_batch >= 0 && ins.micro_batch < micro_batches,
                 "{}: micro-batch out of range", where());
    const SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const Key key{ins.segment, ins.micro_batch, ins.sub_batch};
    const auto coll_key = std::tuple{ins.segment, ins.micro_batch, ins.sub_batch,
                                     static_cast<int>(ins.direction)};
    switch (ins.op) {
      case Op::forward:
        OASES_ASSERT(!forward_done[key], "{}: forward twice", where());
        if (ins.segment > 0) {
          const Key prev{ins.segment - 1, ins.micro_batch, ins.sub_batch};
          OASES_ASSERT(forward_done[prev], "{}: previous segment has not run forward", where());
          if (program.segments[static_cast<std::size_t>(ins.segment - 1)].has_forward_collective)
            OASES_ASSERT((collective_state[{ins.segment - 1, ins.micro_batch, ins.sub_batch, 0}]) == 2,
                         "{}: reads a forward collective that was not waited on", where());
        }
        forward_done[key] = 1;
        break;
      case Op::backward: {
        OASES_ASSERT(forward_done[key], "{}: backward before forward", where());
        OASES_ASSERT(stages_done[key] == ins.stage, "{}: backward stage out of order", where());
        if (ins.stage == 1 && shape.has_backward_collective)
          OASES_ASSERT((collective_state[{ins.segment, ins.micro_batch, ins.sub_batch, 1}]) == 2,
                       "{}: stage 1 before its backward collective completed", where());
        if (ins.stage == 0 && ins.segment + 1 < num_segments) {
          const Key next{ins.segment + 1, ins.micro_batch, ins.sub_batch};
          const int next_stages =
              program.segments[static_cast<std::size_t>(ins.segment + 1)].backward_stages;
          OASES_ASSERT(stages_done[next] == next_stages,
                       "{}: the following segment's backward has not finished", where());
        }
        stages_done[key] = ins.stage + 1;
        break;
      }
      case Op::start: {
        const bool exists = ins.direction == Direction::forward ? shape.has_forward_collective
                                                                 : shape.has_backward_collective;
        OASES_ASSERT(exists, "{}: segment has no such collective", where());
        OASES_ASSERT(collective_state[coll_key] == 0, "{}: collective started twice", where());
        if (ins.direction == Direction::forward)
          OASES_ASSERT(forward_done[key], "{}: starts before its forward ran", where());
        else
          OASES_ASSERT(stages_done[key] >= 1, "{}: starts before backward stage 0", where());
        collective_state[coll_key] = 1;
        break;
      }
      case Op::wait:
        OASES_ASSERT(collective_state[coll_key] == 1, "{}: wait without a start", where());
        collective_state[coll_key] = 2;
        break;
      default:
        break;
    }
  }
  for (const auto& [key, state] : collective_state)
    OASES_ASSERT(state == 2, "collective of segment {} micro-batch {} never waited on",
                 std::get<0>(key), std::get<1>(key));
}

std::string to_string(const Instruction& ins) {
  const char* dir = ins.direction == Direction::forward ? "fwd" : "bwd";
  switch (ins.op) {
    case Op::forward: return fmt::format("Forward(seg={}, mb={}, sb={})", ins.segment, ins.micro_batch, ins.sub_batch);
    case Op::backward: return fmt::format("Backward(seg={}, stage={}, mb={}, sb={})", ins.segment, ins.stage, ins.micro_batch, ins.sub_batch);
    case Op::start: return fmt::format("Start({}, seg={}, mb={}, sb={})", dir, ins.segment, ins.micro_batch, ins.sub_batch);
    case Op::wait: return fmt::format("Wait({}, seg={}, mb={}, sb={})", dir, ins.segment, ins.micro_batch, ins.sub_batch);
    case Op::reduce_grads: return fmt::format("ReduceGrads(bucket={})", ins.segment);
    case Op::optimizer_step: return "OptimizerStep";
  }
  return "?";
}

std::string to_string(const Schedule& schedule) {
  std::string out;
  for (const Instruction& ins : schedule) out += to_string(ins) + "\n";
  return out;
}

}  // namespace oases::schedule
