#include "schedule/pipeline_2bw.h"

#include "core/error.h"
#include "schedule/pipeline_lowering.h"

#include <algorithm>

namespace oases::schedule {
namespace {

// The stream of `batches` batches lowered on one rank, each event labelled with its run.
struct Stream {
  std::vector<LoweredAction> events;
  std::vector<int> run_of;  // per event
};

Stream lower_stream(const ops::Program& stage_program, const ScheduleSpec& within_stage,
                    const PipelineSpec& pipeline, int rank, int batches) {
  const int m = pipeline.micro_batches;
  PipelineSpec stream = pipeline;
  stream.kind = PipelineKind::one_f_one_b;
  stream.micro_batches = batches * m;
  ScheduleSpec within = within_stage;
  within.micro_batches = stream.micro_batches;
  const PipelineOrders orders = pipeline_orders(stream);
  Stream out;
  out.events = lower_actions(stage_program, within, stream, orders, rank);
  // F(g) belongs to the run of its batch; B(g) to the run of the forward it pairs with in the
  // steady state, F(g + w), and the cool-down's backwards to the last run. A message belongs to
  // the run of the next compute action: the runs chained give back the stream's exact order
  // (a run's last gradient Sends may follow the next action's Recvs in it).
  const int warm_up = pipeline.stages - 1 - rank;
  out.run_of.assign(out.events.size(), batches - 1);
  int next_run = batches - 1;
  for (std::size_t i = out.events.size(); i-- > 0;) {
    const LoweredAction& event = out.events[i];
    if (!event.message) {
      const int g = event.action.micro_batch;
      const int paired = event.action.kind == PipelineAction::forward ? g : g + warm_up;
      next_run = std::min(paired / m, batches - 1);
    }
    out.run_of[i] = next_run;
  }
  return out;
}

// Names micro-batch g of the stream as (batch relative to `own`, micro-batch of its batch).
void relabel(Instruction& ins, int own, int m, int sub_batches) {
  const int g = ins.micro_batch;
  ins.batch = g / m - own;
  ins.micro_batch = g % m;
  if (ins.op == Op::send || ins.op == Op::recv || ins.op == Op::recv_wait)
    ins.slot = ins.micro_batch * sub_batches + ins.sub_batch;
}

bool is_compute(Op op) { return op == Op::forward || op == Op::recompute || op == Op::backward; }

// Inserts ReduceGrads(bucket) of `batch` after the last backward stage of the segment that makes
// the bucket final, among that batch's instructions; right before the batch's OptimizerStep
// where the run holds none of them (the bucket became final in an earlier run).
void reduce_batch(const ops::Program& program, int batch, int chunk, Schedule& out) {
  for (int s = 0; s < static_cast<int>(program.segments.size()); ++s) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(s)];
    if (shape.ready_bucket < 0) continue;
    const auto last = std::find_if(out.rbegin(), out.rend(), [&](const Instruction& ins) {
      return ins.op == Op::backward && ins.batch == batch && ins.segment == s &&
             ins.stage == shape.backward_stages - 1;
    });
    Instruction reduce{Op::reduce_grads};
    reduce.bucket = shape.ready_bucket;
    reduce.batch = batch;
    reduce.chunk = chunk;
    if (last != out.rend()) {
      out.insert(last.base(), reduce);
      continue;
    }
    const auto step = std::find_if(out.begin(), out.end(), [&](const Instruction& ins) {
      return ins.op == Op::optimizer_step && ins.batch == batch;
    });
    OASES_ASSERT(step != out.end(), "no optimizer step of batch {}", batch);
    out.insert(step, reduce);
  }
}

}  // namespace

LoweredRun lower_2bw_run(const ops::Program& stage_program, const ScheduleSpec& within_stage,
                         const PipelineSpec& pipeline, int rank, TwoBwRun run) {
  check_pipeline_spec(pipeline);
  check_spec(within_stage);
  OASES_ASSERT(pipeline.kind == PipelineKind::two_bw, "lower_2bw_run of a {} pipeline",
               name(pipeline.kind));
  OASES_CHECK(within_stage.micro_batches == pipeline.micro_batches,
              "the within-stage schedule runs {} micro-batches but the pipeline {}; valid: the "
              "same number of micro-batches per step",
              within_stage.micro_batches, pipeline.micro_batches);
  OASES_CHECK(rank >= 0 && rank < pipeline.stages,
              "pipeline rank {} is outside the pipeline; valid: 0 to {}", rank,
              pipeline.stages - 1);
  const int m = pipeline.micro_batches;
  const int sub_batches = within_stage.sub_batches;
  // Lower the batches the run touches as one stream (its predecessor, itself, and its
  // successor, whose forwards close the run's last pairs), then cut the run out.
  const int own = run.carries_in ? 1 : 0;
  const int batches = own + 1 + (run.drains ? 0 : 1);
  const Stream stream = lower_stream(stage_program, within_stage, pipeline, rank, batches);

  LoweredRun out;
  out.carry.weight_versions = true;
  out.carry.steps_later = !run.drains;
  // The run's events, each with its batch (-1 or 0).
  struct RunEvent {
    LoweredAction event;
    int batch = 0;
  };
  std::vector<RunEvent> events;
  for (std::size_t i = 0; i < stream.events.size(); ++i) {
    LoweredAction event = stream.events[i];
    const int batch = event.action.micro_batch / m - own;
    for (Instruction& ins : event.instructions) relabel(ins, own, m, sub_batches);
    if (stream.run_of[i] < own) {
      // Earlier runs: only the previous batch's part matters to this run.
      if (batch == -1)
        out.carry.earlier.insert(out.carry.earlier.end(), event.instructions.begin(),
                                 event.instructions.end());
      continue;
    }
    if (stream.run_of[i] > own) {
      if (batch == 0 && event.action.kind == PipelineAction::backward) {
        const int mb = event.action.micro_batch % m;
        if (!event.message)
          out.carry.carried_out.push_back(mb);
        else if (event.instructions.front().op == Op::send &&
                 std::ranges::find(out.carry.carried_out, mb) == out.carry.carried_out.end() &&
                 std::ranges::find(out.carry.gradient_sent_later, mb) ==
                     out.carry.gradient_sent_later.end())
          out.carry.gradient_sent_later.push_back(mb);
      }
      continue;
    }
    event.action.micro_batch %= m;
    events.push_back({std::move(event), batch});
  }

  // The optimizer step of each batch this run finishes: after its last backward on this rank
  // and that backward's gradient Sends, so the previous rank never waits on the update.
  std::vector<int> finished;
  if (run.carries_in) finished.push_back(-1);
  if (run.drains) finished.push_back(0);
  for (const int batch : finished) {
    const auto last = std::find_if(events.rbegin(), events.rend(), [&](const RunEvent& e) {
      return !e.event.message && e.event.action.kind == PipelineAction::backward &&
             e.batch == batch;
    });
    RunEvent step;
    step.batch = batch;
    Instruction ins{Op::optimizer_step};
    ins.batch = batch;
    ins.chunk = rank;
    step.event.instructions.push_back(ins);
    if (last == events.rend()) {
      // Rank P - 1 ran batch -1's last backward in the previous run: its step joins the other
      // stages' (the gradient norm and the tied embedding meet across stages) before batch 0
      // computes anything, as the loss's forward already accumulates the head's gradients.
      OASES_ASSERT(batch == -1, "rank {} runs no backward of its own batch", rank);
      const auto first = std::find_if(events.begin(), events.end(),
                                      [](const RunEvent& e) { return !e.event.message; });
      OASES_ASSERT(first != events.end(), "rank {} computes nothing", rank);
      events.insert(first, std::move(step));
      continue;
    }
    // After the backward's Sends and the next action's Recvs: a rank's step waits for every
    // stage's (the gradient norm), so each message sent before a step must be received before
    // the receiver's step. The previous rank sends one forward more than this rank runs
    // before the backward: its activation arrives here.
    auto at = last.base();
    while (at != events.end() && at->event.message) ++at;
    events.insert(at, std::move(step));
  }

  // Flatten, switching weights before each compute instruction whose batch's version is not
  // the one in use; an optimizer step rewrites the newest version, so the next compute
  // switches again.
  constexpr int kUnknown = 2;  // no batch's version is known to be in use
  int weights = kUnknown;
  for (const RunEvent& run_event : events) {
    for (const Instruction& ins : run_event.event.instructions) {
      if (ins.op == Op::optimizer_step) weights = kUnknown;
      if (is_compute(ins.op) && weights != ins.batch) {
        Instruction use{Op::use_weights};
        use.batch = ins.batch;
        use.chunk = rank;
        out.schedule.push_back(use);
        weights = ins.batch;
      }
      out.schedule.push_back(ins);
    }
  }
  for (const int batch : finished) {
    // ReduceGrads go before the batch's OptimizerStep: insert them among its backwards.
    reduce_batch(stage_program, batch, rank, out.schedule);
  }
  return out;
}

}  // namespace oases::schedule
