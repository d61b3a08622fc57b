// Schedule IR: per rank, an ordered list of instructions over a Program's segments and
// collectives (ops/program.h). Generators are pure functions of (Program, ScheduleSpec); the
// runtime executes a Schedule on devices and the simulator executes the same list on a cost
// model. Schedules print one instruction per line so tests can diff them.
//
// The generators share one construction. Each (micro-batch, sub-batch) instance of the
// program gets its own instruction stream: forward through every segment, then backward,
// with the recomputation policy deciding which tensor sets are freed after Forward and
// regenerated before Backward. The streams of the sub-batches of a micro-batch are then cut
// after every collective Start into phases and interleaved phase by phase, so the collective
// of one sub-batch is in flight while the others compute (with one sub-batch this is the
// plain blocking order). Micro-batches run one after another.
//
//   schedule       recompute                     ARs per layer fwd/recompute/bwd   overlap
//   megatron       none | full | selective       2 / 0|2|0 / 2                     no
//   fine-grained   fine-grained                  2 / 0 / 2                         no
//   cross-pass     full (default) | any          2 / 2 / 2 with full               yes
//   oases          fine-grained                  2 / 0 / 2                         yes
#pragma once

#include "ops/program.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace oases::schedule {

enum class Op : std::uint8_t {
  forward,         // Forward(segment, mb, sb): every tensor set of the segment becomes live
  recompute,       // Recompute(segment, sets, mb, sb): regenerate `sets` (kOutput: and the output)
  backward,        // Backward(segment, stage, mb, sb)
  start,           // Start(collective of segment in direction, mb, sb): issue asynchronously
  wait,            // Wait(...): later instructions may use the reduced buffer
  free,            // Free(segment, sets, mb, sb)
  reduce_grads,    // ReduceGrads(bucket): start the data-parallel reduction of a bucket of
                   // gradients that are final (`segment` holds the bucket id)
  optimizer_step,  // OptimizerStep
};

enum class Direction : std::uint8_t { forward, backward };

struct Instruction {
  Op op;
  int segment = -1;
  int stage = 0;  // backward stage
  Direction direction = Direction::forward;  // which collective of the segment (start/wait)
  int micro_batch = 0;
  int sub_batch = 0;
  ops::TensorSets sets = 0;  // recompute: sets regenerated; free: sets freed
  bool replay = false;       // start/wait: a forward collective replayed by a recomputation
  bool operator==(const Instruction&) const = default;
};

using Schedule = std::vector<Instruction>;

enum class ScheduleKind { megatron, fine_grained, cross_pass, oases };
enum class Recompute { none, full, selective, fine_grained };

std::string_view name(ScheduleKind kind);  // "megatron", "fine-grained", "cross-pass", "oases"
std::string_view name(Recompute policy);   // "none", "full", "selective", "fine-grained"
// Parse the names above; UserError naming `setting`, the value and the valid names.
ScheduleKind parse_schedule_kind(std::string_view text, std::string_view setting);
Recompute parse_recompute(std::string_view text, std::string_view setting);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::megatron;
  Recompute recompute = Recompute::none;
  int micro_batches = 1;
  int sub_batches = 1;
  bool training = true;  // false: forward passes only (evaluation, generation)
};

// UserError when the combination cannot run: fine-grained and oases imply fine-grained
// recomputation; megatron and fine-grained run whole micro-batches (one sub-batch).
void check_spec(const ScheduleSpec& spec);

// The generator for spec.kind.
Schedule generate(const ops::Program& program, const ScheduleSpec& spec);

// Checks that the schedule can run: every data dependency is met (a segment's input has been
// computed and, where a collective reduces it, waited on; backward stages after the following
// segment's backward and after their collective), no tensor set is read before it is produced
// or after it is freed, collectives are started once and waited once, every instance runs its
// whole program, nothing is left live at the end, and gradient buckets are reduced only once
// final. Throws InternalError describing the first violation.
void verify_schedule(const ops::Program& program, const ScheduleSpec& spec,
                     const Schedule& schedule);

// Checks that the ranks of one group (one schedule each) issue their collectives in the same
// order, which the communicators' issue-order matching requires. Throws InternalError naming
// the first rank and position that differ.
void verify_collective_order(const std::vector<Schedule>& schedules_of_group);

// Peak bytes of tensor sets live at once when `schedule` runs (what the executor's activation
// store will report), from the set sizes in the program.
std::size_t peak_activation_bytes(const ops::Program& program, const Schedule& schedule);

std::string to_string(const Instruction& instruction);
std::string to_string(const Schedule& schedule);  // one instruction per line

}  // namespace oases::schedule
