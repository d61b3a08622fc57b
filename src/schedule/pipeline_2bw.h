// PipeDream-2BW lowering (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
// Training", 2021): a pipeline that never flushes, with two versions of the weights.
//
// Update rule. Batch t (its m micro-batches, m > P) runs its forwards and backwards on W(t - 1)
// (W(-1) = W(0)), and its optimizer step computes W(t + 1) from W(t):
//   W(t + 1) = W(t) - update(gradient of batch t at W(t - 1)).
// Batch t + 1 thus needs only W(t), which exists before batch t's backwards are done, so the
// pipeline never drains between steps.
//
// Stream. Rank r runs 1F1B over the micro-batches of consecutive batches as one stream
// (micro-batch g = t m + i): w = P - 1 - r warm-up forwards, then pairs F(g + w), B(g). A run
// (one Executor::run, one call of train_step) holds the pairs whose forward belongs to its own
// batch t: it finishes batch t - 1's last w backwards (batch -1 in the run's instructions)
// interleaved with batch t's first forwards, then batch t's backwards except its last w, which
// the next run finishes ("carried out"). A run that drains (the last one, or one before a
// checkpoint or an evaluation) ends with those backwards instead, as 1F1B's cool-down does.
// Rank P - 1 (w = 0) carries nothing; on every other rank batch t + 1's first forwards run
// before batch t's last backward.
//
// Weights and gradients. After the last backward of a batch (its gradient Sends and the next
// action's Recvs), the rank reduces the batch's buckets and runs OptimizerStep(batch). The
// stages' steps of a batch wait for each other (the global gradient norm), so every message a
// rank sends before its step is received before the receiver's step; with sends that complete
// only once received, a step placed before such a Recv would deadlock. The batches share the
// gradient buffer, and every backward of batch t precedes every backward of batch t + 1, so
// gradients never mix. Rank P - 1 finishes batch t in the run of batch t (w = 0); its step of
// batch t comes first in the next run, before batch t + 1's first forward, which on that rank
// computes the loss and with it the head's weight gradients. The stages' steps of a batch meet
// (the global gradient norm, GPT's tied embedding), so rank P - 1 waits there for rank 0's last
// backward of the batch: the one wait per step that 2bw keeps under gradient clipping. UseWeights(batch) precedes each compute action whose batch's version
// is not the one in use (at the start of a run, after an optimizer step, and at each switch
// between the two batches in the 1F1B steady state); the executor hands it to
// StepHooks::use_weights.
//
// Messages. A message belongs to the run of the next compute action on its rank, so the runs
// concatenated are the stream's exact order and pass verify_point_to_point: the gradient Sends
// of a rank's last backward of a run open the next run (the previous rank's matching backward
// is carried into that run too, RunCarry::gradient_sent_later), and every message a run sends
// is received within it. Slots are per micro-batch of a batch: mb * sub_batches + sb.
#pragma once

#include "ops/program.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

namespace oases::schedule {

// Where a run sits in the stream.
struct TwoBwRun {
  bool carries_in = false;  // finishes the previous batch (false: the first run, or after a drain)
  bool drains = true;       // finishes its own batch (false: carries its last backwards out)
};

struct LoweredRun {
  Schedule schedule;
  // What the run shares with its neighbours (schedule.h): pass both to verify_schedule.
  RunCarry carry;
};

// Rank `rank`'s instructions for a run of a 2bw pipeline. pipeline.kind must be two_bw and
// pipeline.micro_batches (m) the micro-batches of a batch; within_stage as for lower_pipeline.
// UserError: what check_pipeline_spec or check_spec rejects (m <= P among them),
// within_stage.micro_batches != m, rank outside [0, P).
LoweredRun lower_2bw_run(const ops::Program& stage_program, const ScheduleSpec& within_stage,
                         const PipelineSpec& pipeline, int rank, TwoBwRun run);

}  // namespace oases::schedule
