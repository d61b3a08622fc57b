// The instruction lists a rank runs, built once for the engine that runs them and the
// simulators that price them: generated from the rank's program (one pipeline stage) or
// lowered from the pipeline schedule's order for its stage, then the passes the plan asks for
// (partitioned checkpoints, compressed kept sets in training, sharded parameters), verified.
#pragma once

#include "ops/program.h"
#include "plan/run_plan.h"
#include "schedule/pipeline_2bw.h"
#include "schedule/schedule.h"

namespace oases::plan {

// One pass of `spec.micro_batches` micro-batches (training or forward only, as spec.training
// says) on pipeline stage `stage`. Under the 2bw pipeline a training pass is one drained step
// (two_bw_schedule with {false, true}).
// REQUIRES: spec is plan.pass_spec(...) of this plan; program is the stage's.
// `verify` false leaves out the verifier (schedule::verify_schedule), for callers that only
// price many schedules generated exactly as verified ones are (the joint planner's estimates).
schedule::Schedule rank_schedule(const RunPlan& plan, const ops::Program& program,
                                 const schedule::ScheduleSpec& spec, int stage, bool verify = true);

// A 2bw run of `spec` lowered for the stage, with the passes the spec asks for, verified.
schedule::LoweredRun two_bw_schedule(const ops::Program& program, const schedule::ScheduleSpec& spec,
                                     int stages, int stage, schedule::TwoBwRun run);

}  // namespace oases::plan
