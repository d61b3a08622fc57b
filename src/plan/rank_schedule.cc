#include "plan/rank_schedule.h"

#include "schedule/pipeline.h"
#include "schedule/pipeline_lowering.h"

namespace oases::plan {

schedule::Schedule rank_schedule(const RunPlan& plan, const ops::Program& program,
                                 const schedule::ScheduleSpec& spec, int stage, bool verify) {
  const PipelinePlan& pipeline = plan.pipeline;
  // A step on its own (the run of a drained step, without a predecessor in flight).
  if (spec.training && pipeline.two_bw())
    return two_bw_schedule(program, spec, pipeline.stages, stage, {false, true}).schedule;
  schedule::Schedule schedule;
  if (pipeline.enabled() && spec.training) {
    schedule::PipelineSpec order;
    order.kind = pipeline.kind;
    order.stages = pipeline.stages;
    order.virtual_stages = pipeline.virtual_stages;
    order.micro_batches = spec.micro_batches;
    schedule = schedule::lower_pipeline(program, spec, order, stage);
  } else if (pipeline.enabled()) {
    schedule = schedule::lower_forward_only_pipeline(program, spec, pipeline.stages,
                                                     pipeline.virtual_stages, stage);
  } else {
    schedule = schedule::generate(program, spec);
  }
  if (spec.training && spec.partitioned_checkpoints)
    schedule::partition_kept_checkpoints(program, schedule);
  if (spec.training) {
    const ActivationCompression& compression = plan.settings.activation_compression;
    if (compression.whole)
      schedule::compress_kept_sets(program, schedule, *compression.whole);
    else if (compression.any())
      schedule::compress_kept_sets(program, schedule, compression.layers);
  }
  if (spec.sharded_params || spec.deferred_param_gather)
    schedule::shard_parameters(program, spec, schedule);
  if (verify) schedule::verify_schedule(program, spec, schedule);
  return schedule;
}

schedule::LoweredRun two_bw_schedule(const ops::Program& program, const schedule::ScheduleSpec& spec,
                                     int stages, int stage, schedule::TwoBwRun run) {
  schedule::PipelineSpec pipeline;
  pipeline.kind = schedule::PipelineKind::two_bw;
  pipeline.stages = stages;
  pipeline.micro_batches = spec.micro_batches;
  schedule::LoweredRun lowered = schedule::lower_2bw_run(program, spec, pipeline, stage, run);
  if (spec.partitioned_checkpoints) schedule::partition_kept_checkpoints(program, lowered.schedule);
  if (spec.sharded_params) schedule::shard_parameters(program, spec, lowered.schedule);
  schedule::verify_schedule(program, spec, lowered.schedule, lowered.carry);
  return lowered;
}

}  // namespace oases::plan
