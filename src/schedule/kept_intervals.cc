// schedule::kept_intervals (kept_intervals.h).
#include "schedule/kept_intervals.h"

#include <map>
#include <tuple>

namespace oases::schedule {
namespace {

using ops::kCheckpoint;
using ops::kCore;
using ops::kInternals;
using ops::kOutput;
using ops::SegmentShape;
using ops::TensorSet;
using ops::TensorSets;

constexpr TensorSet kKeptSets[] = {kCheckpoint, kInternals, kCore};

const SegmentShape& shape_at(const ops::Program& program, int segment) {
  return program.segments[static_cast<std::size_t>(segment)];
}

// Calls read(segment, set) for every kept set of the instruction's instance (same batch,
// micro-batch and sub-batch) that it reads, as the verifier models reads.
template <class Read>
void for_each_set_read(const ops::Program& program, const Instruction& ins, Read&& read) {
  const SegmentShape& shape = shape_at(program, ins.segment);
  const auto own = [&](TensorSet set) {
    if (shape.sets & set) read(ins.segment, set);
  };
  const auto input = [&] {  // the epilogue's residual: the previous segment's checkpoint
    if (shape.input_from_peer || ins.segment == 0) return;
    if (shape_at(program, ins.segment - 1).sets & kCheckpoint) read(ins.segment - 1, kCheckpoint);
    if (shape.residual_of >= 0 && (shape_at(program, shape.residual_of).sets & kCheckpoint))
      read(shape.residual_of, kCheckpoint);
  };
  const auto others = [&] {
    for (std::size_t i = 0; i < shape.reads_sets_of.size(); ++i) {
      const int owner = shape.reads_sets_of[i];
      for (TensorSet set : kKeptSets)
        if (shape_at(program, owner).sets & set & shape.sets_read_of(i)) read(owner, set);
    }
  };
  switch (ins.op) {
    case Op::forward:
      input();
      others();
      break;
    case Op::recompute:
      if (ins.sets & kCheckpoint) input();
      else if (ins.sets & kInternals) own(kCheckpoint);
      else if (ins.sets & kCore) own(kInternals);
      if (ins.sets & kOutput)
        for (TensorSet set : kKeptSets) own(set);
      break;
    case Op::backward:
    case Op::backward_weight:
      for (TensorSet set : kKeptSets) own(set);
      others();
      break;
    default:
      break;
  }
}

// Which side of the set's wait an instruction of the set's own segment reads it from: besides
// the compute, the segment's collectives and messages may use buffers kept with the instance
// (a loss segment's row statistics, a stage's output), so they count as readers too.
enum class Side { none, forward, backward };
Side own_side(const Instruction& ins) {
  switch (ins.op) {
    case Op::forward: return Side::forward;
    case Op::recompute:
    case Op::backward:
    case Op::backward_weight: return Side::backward;
    case Op::start:
    case Op::wait:
      return ins.direction == Direction::forward && !ins.replay ? Side::forward : Side::backward;
    case Op::send:
    case Op::recv:
    case Op::recv_wait:
      return ins.payload == ops::Payload::activation ? Side::forward : Side::backward;
    default: return Side::none;
  }
}

// One open interval of a set, from the instruction that produced it.
struct Open {
  bool from_forward = false;
  std::size_t last_forward_read = 0;
  std::ptrdiff_t first_backward_read = -1;
  int chunk = 0;
};

}  // namespace

bool is_compute_op(Op op) {
  return op == Op::forward || op == Op::recompute || op == Op::backward ||
         op == Op::backward_weight;
}

std::vector<KeptInterval> kept_intervals(const ops::Program& program, const Schedule& schedule) {
  using Key = std::tuple<int, int, int, int, int>;  // batch, segment, mb, sb, set
  std::map<Key, Open> open;
  std::vector<KeptInterval> intervals;
  // compute_before[i]: compute instructions among schedule[0, i).
  std::vector<std::size_t> compute_before(schedule.size() + 1, 0);
  for (std::size_t i = 0; i < schedule.size(); ++i)
    compute_before[i + 1] = compute_before[i] + (is_compute_op(schedule[i].op) ? 1 : 0);

  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const Instruction& ins = schedule[i];
    if (ins.segment < 0) continue;
    const Side side = own_side(ins);
    const auto note_read = [&](int segment, TensorSet set) {
      auto it = open.find({ins.batch, segment, ins.micro_batch, ins.sub_batch, set});
      if (it == open.end()) return;  // produced by an earlier run (a carried batch)
      Open& interval = it->second;
      if (interval.first_backward_read >= 0) return;
      if (side == Side::forward) interval.last_forward_read = i;
      else interval.first_backward_read = static_cast<std::ptrdiff_t>(i);
    };
    if (side != Side::none) {
      for (TensorSet set : kKeptSets)
        if (shape_at(program, ins.segment).sets & set) note_read(ins.segment, set);
    }
    if (is_compute_op(ins.op)) for_each_set_read(program, ins, note_read);
    const SegmentShape& shape = shape_at(program, ins.segment);
    if (ins.op == Op::forward || ins.op == Op::recompute) {
      const TensorSets produced = ins.op == Op::forward ? shape.sets : (ins.sets & ~kOutput);
      for (TensorSet set : kKeptSets)
        if (produced & set)
          open[{ins.batch, ins.segment, ins.micro_batch, ins.sub_batch, set}] =
              Open{ins.op == Op::forward, i, -1, ins.chunk};
    } else if (ins.op == Op::free) {
      for (TensorSet set : kKeptSets) {
        if (!(ins.sets & set)) continue;
        const auto it = open.find({ins.batch, ins.segment, ins.micro_batch, ins.sub_batch, set});
        if (it == open.end()) continue;
        const Open interval = it->second;
        open.erase(it);
        if (!interval.from_forward || interval.first_backward_read < 0) continue;
        const auto backward = static_cast<std::size_t>(interval.first_backward_read);
        intervals.push_back({ins.batch, ins.segment, ins.micro_batch, ins.sub_batch, set,
                             interval.chunk, interval.last_forward_read, backward,
                             compute_before[backward] -
                                 compute_before[interval.last_forward_read + 1]});
      }
    }
  }
  return intervals;
}

}  // namespace oases::schedule
