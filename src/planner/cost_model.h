// Cost model: what a plan costs, predicted from a Profile. A uniform plan runs every layer at
// degree k: tp / k replicas, each on k / tp of every micro-batch, each running the schedule on
// its share. The step time comes from simulating that schedule (sim/schedule_sim.h) with each
// instruction's profiled time, scaled linearly from the profiled rows to the rows it runs on;
// the replicas' gradient reduction and the optimizer step are included. Memory is parameters,
// gradients and both AdamW moments of this rank's shard, plus the schedule's activation peak.
#pragma once

#include "ops/program.h"
#include "planner/profile.h"
#include "schedule/schedule.h"
#include "sim/schedule_sim.h"

#include <cstdint>

namespace oases::planner {

struct Prediction {
  double step_seconds = 0;
  double compute_seconds = 0;
  double exposed_comm_seconds = 0;
  std::int64_t activation_bytes = 0;  // boundary buffers + peak of kept tensors
  std::int64_t state_bytes = 0;       // parameters, gradients, AdamW moments
  std::int64_t memory_bytes() const { return activation_bytes + state_bytes; }
};

// The GPT program of a degree-`degree` replica whose segment instances process `rows`
// sequences, with set sizes scaled from the profile.
ops::Program program_at(const Profile& profile, int degree, double rows);
ops::Program program_at(const Profile& profile, int degree, double rows, int layers);

// Instruction costs of that program for the simulator.
sim::CostModel costs_at(const Profile& profile, int degree, double rows,
                        const ops::Program& program, double overlap_slowdown = 0);

// Every layer at `degree` under `spec` (kind, recompute, sub_batches, micro_batches: the
// schedule each replica runs; micro_batch: sequences per micro-batch of the whole group).
// overlap_slowdown < 0 takes the profile's measured value.
Prediction predict_uniform(const Profile& profile, int degree, const schedule::ScheduleSpec& spec,
                           std::int64_t micro_batch, double overlap_slowdown = -1);
// The same model with `layers` transformer layers (the planner takes differences to price one
// layer).
Prediction predict_uniform(const Profile& profile, int degree, const schedule::ScheduleSpec& spec,
                           std::int64_t micro_batch, int layers, double overlap_slowdown);

}  // namespace oases::planner
