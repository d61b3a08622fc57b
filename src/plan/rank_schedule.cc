#include "plan/rank_schedule.h"

#include "schedule/pipeline.h"
#include "schedule/pipeline_lowering.h"

namespace oases::plan {

schedule::Schedule rank_schedule(const RunConfig& config, const ops::Program& program,
                                 const schedule::ScheduleSpec& spec, int pp, int pp_rank) {
  schedule::Schedule schedule;
  if (pp > 1) {
    const auto virtual_stages = static_cast<int>(config.parallel.virtual_stages);
    if (spec.training) {
      schedule::PipelineSpec pipeline;
      pipeline.kind = schedule::parse_pipeline_kind(config.parallel.pipeline, "parallel.pipeline");
      pipeline.stages = pp;
      pipeline.virtual_stages = virtual_stages;
      pipeline.micro_batches = spec.micro_batches;
      // A step on its own (the run of a drained step, without a predecessor in flight).
      if (pipeline.kind == schedule::PipelineKind::two_bw)
        return two_bw_schedule(program, spec, pp, pp_rank, {false, true}).schedule;
      schedule = schedule::lower_pipeline(program, spec, pipeline, pp_rank);
    } else {
      schedule = schedule::lower_forward_only_pipeline(program, spec, pp, virtual_stages, pp_rank);
    }
  } else {
    schedule = schedule::generate(program, spec);
  }
  if (spec.training && spec.partitioned_checkpoints)
    schedule::partition_kept_checkpoints(program, schedule);
  if (const auto encoding = activation_encoding(config); spec.training && encoding)
    schedule::compress_kept_sets(program, schedule, *encoding);
  if (spec.sharded_params || spec.deferred_param_gather)
    schedule::shard_parameters(program, spec, schedule);
  schedule::verify_schedule(program, spec, schedule);
  return schedule;
}

schedule::LoweredRun two_bw_schedule(const ops::Program& program, const schedule::ScheduleSpec& spec,
                                     int pp, int pp_rank, schedule::TwoBwRun run) {
  schedule::PipelineSpec pipeline;
  pipeline.kind = schedule::PipelineKind::two_bw;
  pipeline.stages = pp;
  pipeline.micro_batches = spec.micro_batches;
  schedule::LoweredRun lowered = schedule::lower_2bw_run(program, spec, pipeline, pp_rank, run);
  if (spec.partitioned_checkpoints) schedule::partition_kept_checkpoints(program, lowered.schedule);
  if (spec.sharded_params) schedule::shard_parameters(program, spec, lowered.schedule);
  schedule::verify_schedule(program, spec, lowered.schedule, lowered.carry);
  return lowered;
}

}  // namespace oases::plan
