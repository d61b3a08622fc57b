// Pipeline lowering: one pipeline rank's instruction schedule (schedule.h) from the pipeline
// order of every rank (pipeline.h) and the within-stage schedule (megatron, fine-grained,
// cross-pass, oases) that runs each micro-batch on the stage.
//
// Compute. Rank r runs its order's actions in order. F(chunk r, mb) becomes micro-batch mb's
// forward instructions and B(chunk r, mb) its backward instructions, each over all sub-batches,
// interleaved phase by phase as the within-stage generator interleaves them
// (micro_batch_forward / micro_batch_backward); recomputation and frees are the within-stage
// policy's. After the last action each bucket's ReduceGrads follows the last backward stage that
// makes it final, and OptimizerStep ends the list. Every instruction names chunk r.
//
// Messages (v = 1: rank r holds chunk r; peers are ranks of the point-to-point group):
//   F on r > 0       Recv(activation, segment 0 (input_from_peer), mb, sb) from r - 1
//   F on r < P - 1   Send(activation, last segment (output_to_peer), mb, sb) to r + 1
//   B on r < P - 1   Recv(gradient, last segment, mb, sb) from r + 1
//   B on r > 0       Send(gradient, segment 0, mb, sb) to r - 1
// for every sub-batch sb in order. Recvs precede the action that needs them and Sends follow the
// action that produced them, before the rank's next action: a Send reads its sub-batch's
// buffers, which the next action overwrites, and a gradient Recv fills the sub-batch's gradient
// buffer, which only the action it feeds may read.
//
// Order of messages. Rank r's messages are placed by running every rank's order together:
// a rank runs its next action once every message it needs has arrived and it has no unsent
// output; a message passes (its Send appended to the sender's list and its Recv to the
// receiver's, at once) when its sender holds it and the receiver's next action needs it. A rank
// holding unsent outputs may still receive what its next action needs (1F1B's steady state:
// the gradient for B(i) arrives before the activation of F(w + i) leaves). Since messages pass in
// one global sequence and each rank issues its messages in that sequence, the schedules cannot
// deadlock even when every Send and Recv blocks until its partner arrives (the globally first
// message not yet passed has both ends waiting at it), and every rank computes the same lists.
//
// Slots. The message of (mb, sb) uses slot mb * sub_batches + sb in both directions: a tag
// unique within a step for each payload and pair of ranks, so a message is named by its slot in
// traces. (The executor stages sends per slot, so a step holds one send buffer per
// micro-batch and sub-batch at each cut.)
//
// Not lowered yet (UserError "not lowered yet"): interleaved (v > 1) and zero-bubble. A
// segment's backward stages are cut at its backward collective, not into an input-gradient part
// and a weight-gradient part, so the zero-bubble split into I and W cannot be expressed; nor are
// forward-only (evaluation) steps, where the stage's output is freed as soon as it is computed.
#pragma once

#include "ops/program.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

namespace oases::schedule {

// Rank `rank`'s schedule for pipeline.kind over `stage_program` (the program of chunk `rank`:
// starting with an input_from_peer segment unless rank is 0, ending with an output_to_peer
// segment unless rank is P - 1), each micro-batch run by `within_stage`. The result passes
// verify_schedule(stage_program, within_stage, ...), and the ranks' schedules together pass
// verify_point_to_point.
// UserError: a spec check_pipeline_spec or check_spec rejects; a pipeline kind or v not lowered
// yet (above); within_stage.training false; within_stage.micro_batches != pipeline.micro_batches;
// rank outside [0, P).
Schedule lower_pipeline(const ops::Program& stage_program, const ScheduleSpec& within_stage,
                        const PipelineSpec& pipeline, int rank);

// One event of rank `rank`'s lowered order: the instructions of a compute action (message
// false), or one Send or Recv (message true) with the action it came from or feeds.
struct LoweredAction {
  PipelineAction action;
  bool message = false;
  Schedule instructions;
};

// The events of rank `rank` for `orders` (F and B actions over pipeline.micro_batches, which
// may exceed a step's: pipeline_2bw.h lowers several batches as one stream), messages placed as
// lower_pipeline places them, every instruction naming chunk `rank`; no gradient reductions
// and no optimizer step. REQUIRES: verify_pipeline_orders(pipeline, orders) passes, v = 1, and
// within_stage.training.
std::vector<LoweredAction> lower_actions(const ops::Program& stage_program,
                                         const ScheduleSpec& within_stage,
                                         const PipelineSpec& pipeline,
                                         const PipelineOrders& orders, int rank);

}  // namespace oases::schedule
