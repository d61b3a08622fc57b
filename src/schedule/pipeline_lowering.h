// Pipeline lowering: one pipeline rank's instruction schedule (schedule.h) from the pipeline
// order of every rank (pipeline.h) and the within-stage schedule (megatron, fine-grained,
// cross-pass, oases) that runs each micro-batch on the stage.
//
// Chunks. Rank r holds chunks r, r + P, ..., r + (v - 1) P (v = 1: chunk r alone). Its Program
// holds their segments one after another in model order; chunk_segment_ranges cuts it after
// every output_to_peer segment, so local chunk k (global chunk r + k P) is the k-th range.
//
// Compute. Rank r runs its order's actions in order. F(c, mb) becomes micro-batch mb's forward
// instructions over the segments of local chunk c / P and B(c, mb) its backward instructions,
// each over all sub-batches, interleaved phase by phase as the within-stage generator
// interleaves them (micro_batch_forward / micro_batch_backward over a SegmentRange);
// recomputation and frees are the within-stage policy's. Zero-bubble's I(c, mb) becomes the
// backward run input-only (micro_batch_backward_input: what the previous chunk waits for; its
// gradient Sends follow it) and W(c, mb) the deferred weight parts of every segment and
// sub-batch, with the Frees of the sets they read (micro_batch_backward_weight); a W sends and
// receives nothing. After the last action each bucket's ReduceGrads follows the last backward
// stage or weight part that makes it final, and OptimizerStep ends the list. Every instruction of an action names its global chunk c; a ReduceGrads names the chunk
// of the backward it follows, OptimizerStep chunk r.
//
// Messages (peers are ranks of the point-to-point group):
//   F(c, mb), c > 0          Recv(activation, first segment of c, mb, sb) from rank of c - 1
//   F(c, mb), c < C - 1      Send(activation, last segment of c, mb, sb) to rank of c + 1
//   B(c, mb), c < C - 1      Recv(gradient, last segment of c, mb, sb) from rank of c + 1
//   B(c, mb), c > 0          Send(gradient, first segment of c, mb, sb) to rank of c - 1
// for every sub-batch sb in order (the rank of chunk c is c % P: the next rank, or rank 0 after
// rank P - 1). A receive's RecvWait precedes the action that needs it and Sends follow the
// action that produced them, before the rank's next action: a Send reads its sub-batch's
// buffers, which the next action overwrites. A receive fills a buffer of its own
// (ops::Segment::recv_buffer, one per instance and payload, read only by the action that needs
// it), so it may come while an output of the previous action still waits to be sent, and it
// can be posted long before: the RecvStart of a receive that action k of the rank needs goes
// right after the compute instructions of action k - 2 (at the start of the step for k < 2),
// so that the transfer overlaps action k - 1 and the rank's waits for it. Not earlier, so that
// no more than the receive buffers of two actions are held before they fill.
//
// Order of messages. Rank r's messages are placed by running every rank's order together:
// a rank runs its next action once every message it needs has arrived and it has no unsent
// output; a message passes (its Send appended to the sender's list and its Recv to the
// receiver's, at once) when its sender holds it and the receiver's next action needs it. A rank
// holding unsent outputs may still receive what its next action needs (1F1B's steady state:
// the gradient for B(i) arrives before the activation of F(w + i) leaves). When no rank can
// move on that way, the held message of the lowest rank that holds one passes early, its Recv
// placed before the receiver's next action although a later action needs it: an interleaved
// order can leave two ranks each holding what the other needs only after its next action
// (Megatron-LM exchanges such pairs with one batched send and receive); GPipe and 1F1B orders
// never need it. Messages pass in one global sequence, and each rank issues its Sends and
// RecvWaits in that sequence; the RecvStarts are hoisted, but keep that order among themselves
// (each moves to the end of an earlier action, never past a RecvStart that came before it), so
// the i-th Send from a to b still meets the i-th receive b posts from a: MPI matches
// nonblocking receives per (source, tag, communicator) in posting order and slots are tags,
// and NCCL pairs in issue order.
//
// Deadlock freedom under rendezvous semantics (a Send blocks until its partner's RecvStart has
// been issued, a RecvWait until its partner's Send has, a RecvStart never blocks, nor does
// anything else the lowering places). Suppose every rank that has not ended is blocked, and let
// m be the first message of the global sequence whose Send or RecvWait has not returned. Before
// Send(m) on its sender stand only instructions that stood before it in the unhoisted list (the
// Sends and RecvWaits of messages before m, which have returned, and computation) and hoisted
// RecvStarts, which never block; so the sender has reached Send(m). Likewise the receiver has
// reached RecvWait(m), and RecvStart(m), which precedes it, has been issued. Then Send(m)
// returns, and after it RecvWait(m): a contradiction. Every rank also computes the same lists.
// Interleaved orders send activations around the ring (rank P - 1 to rank 0 between rounds of
// chunks); the same argument covers them.
//
// Slots. The message that chunk c sends for (mb, sb) uses slot (c / P * m + mb) * sub_batches
// + sb in its direction (v = 1: mb * sub_batches + sb): a tag unique within a step for each
// payload and pair of ranks, so a message is named by its slot in traces. (The executor stages
// sends per slot, so a step holds one send buffer per chunk, micro-batch and sub-batch at each
// cut.)
//
// Forward-only steps (evaluation, generation). lower_forward_only_pipeline runs, on each rank,
// the micro-batches in groups of P (the last group may be smaller): every local chunk in turn
// takes the whole group, F(r + k P, mb) for k = 0..v - 1 and mb in the group. Messages are
// merged as above. The within-stage generator frees a chunk's output as soon as it is computed;
// that Free waits until the Send of its sub-batch has read the output.
#pragma once

#include "ops/program.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

#include <vector>

namespace oases::schedule {

// The chunks of a rank's program, in order: cut after every output_to_peer segment.
std::vector<SegmentRange> chunk_segment_ranges(const ops::Program& program);

// Rank `rank`'s schedule for pipeline.kind over `stage_program` (the program of the rank's
// chunks: chunk_segment_ranges gives v of them, each starting with an input_from_peer segment
// unless it is chunk 0 and ending with an output_to_peer segment unless it is chunk P v - 1),
// each micro-batch run by `within_stage`. With within_stage.training false: the forward-only
// schedule (lower_forward_only_pipeline; pipeline.kind and micro_batches are not read). The
// result passes verify_schedule(stage_program, within_stage, ...), and the ranks' schedules
// together pass verify_point_to_point.
// UserError: a spec check_pipeline_spec or check_spec rejects; a pipeline kind not lowered yet
// (above); within_stage.micro_batches != pipeline.micro_batches; rank outside [0, P).
Schedule lower_pipeline(const ops::Program& stage_program, const ScheduleSpec& within_stage,
                        const PipelineSpec& pipeline, int rank);

// Rank `rank`'s forward-only schedule (see above) of within_stage.micro_batches micro-batches
// through a pipeline of `stages` ranks holding `virtual_stages` chunks each. REQUIRES:
// within_stage.training false; the program's chunks as for lower_pipeline. UserError: a spec
// check_spec rejects; stages or virtual_stages below 1; rank outside [0, stages).
Schedule lower_forward_only_pipeline(const ops::Program& stage_program,
                                     const ScheduleSpec& within_stage, int stages,
                                     int virtual_stages, int rank);

// One event of rank `rank`'s lowered order: the instructions of a compute action (message
// false), or one Send or Recv (message true) with the action it came from or feeds.
struct LoweredAction {
  PipelineAction action;
  bool message = false;
  Schedule instructions;
};

// The events of rank `rank` for `orders` (F and B actions over pipeline.micro_batches, which
// may exceed a step's: pipeline_2bw.h lowers several batches as one stream), messages placed as
// lower_pipeline places them (each receive waited right where it is posted), every
// instruction naming chunk `rank`; no gradient reductions and no optimizer step. REQUIRES: verify_pipeline_orders(pipeline, orders) passes, v = 1, and
// within_stage.training.
std::vector<LoweredAction> lower_actions(const ops::Program& stage_program,
                                         const ScheduleSpec& within_stage,
                                         const PipelineSpec& pipeline,
                                         const PipelineOrders& orders, int rank);

}  // namespace oases::schedule
