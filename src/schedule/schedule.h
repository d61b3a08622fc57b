// Schedule IR: per rank, an ordered list of instructions over a Program's segments and
// collectives. Generators are pure functions of the program's shape; the runtime executes a
// Schedule on devices and the simulator executes the same list on a cost model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oases::schedule {

enum class Op : std::uint8_t {
  forward,         // Forward(segment, mb, sb)
  backward,        // Backward(segment, stage, mb, sb)
  start,           // Start(collective of segment in direction, mb, sb): issue asynchronously
  wait,            // Wait(...): later instructions may use the reduced buffer
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
  bool operator==(const Instruction&) const = default;
};

// What a generator needs to know about a Program: per segment, whether each collective exists
// and how many backward stages it has.
struct SegmentShape {
  bool has_forward_collective = false;
  bool has_backward_collective = false;
  int backward_stages = 1;
  // Gradient bucket whose gradients are all final once this segment's last backward stage has
  // run on the last micro-batch (-1: none). Lets the data-parallel reduction of later layers
  // overlap the backward pass of earlier ones.
  int ready_bucket = -1;
};

struct ProgramShape {
  std::vector<SegmentShape> segments;
};

using Schedule = std::vector<Instruction>;

// Megatron-LM's schedule without pipelining: each micro-batch runs its whole forward pass,
// then its whole backward pass, with every collective waited on right after it is issued.
// Gradients sum over micro-batches; on the last micro-batch each gradient bucket's
// data-parallel reduction starts as soon as its gradients are final, and the optimizer step
// (which waits for them) ends the schedule.
// training=false gives the forward passes only (evaluation).
Schedule megatron_schedule(const ProgramShape& program, int micro_batches, bool training);

// Checks the schedule: every collective started once and waited once after its start, every
// backward stage after its forward, stages in order, collectives of a segment in order.
// Throws InternalError describing the first violation.
void verify_schedule(const ProgramShape& program, int micro_batches, const Schedule& schedule);

std::string to_string(const Instruction& instruction);
std::string to_string(const Schedule& schedule);  // one instruction per line

}  // namespace oases::schedule
