// The instruction lists a rank runs, built once for the engine that runs them and the
// simulators that price them: generated from the rank's program (one pipeline stage) or
// lowered from the pipeline schedule's order for its stage, then the passes the config asks for
// (partitioned checkpoints, compressed kept sets in training, sharded parameters), verified.
#pragma once

#include "ops/program.h"
#include "schedule/pipeline_2bw.h"
#include "schedule/schedule.h"
#include "plan/run_config.h"

namespace oases::plan {

// One pass of `spec.micro_batches` micro-batches (training or forward only, as spec.training
// says) on the rank at stage `pp_rank` of `pp` stages. Under the 2bw pipeline a training pass
// is one drained step (two_bw_schedule with {false, true}).
// REQUIRES: spec is schedule_spec(config) (auto settings resolved) with micro_batches and
// training set for the pass; program is the rank's.
schedule::Schedule rank_schedule(const RunConfig& config, const ops::Program& program,
                                 const schedule::ScheduleSpec& spec, int pp, int pp_rank);

// A 2bw run of `spec` lowered for the stage, with the passes the spec asks for, verified.
schedule::LoweredRun two_bw_schedule(const ops::Program& program, const schedule::ScheduleSpec& spec,
                                     int pp, int pp_rank, schedule::TwoBwRun run);

}  // namespace oases::plan
