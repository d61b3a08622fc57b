// Pipeline plans from a Profile: the stage costs that parallel.pipeline_layers = "auto" balances,
// and the predicted step time and bubble of each pipeline schedule that `oases plan
// --degrees-only` reports.
//
// Pipeline stages run every layer at the profile's full tensor-parallel degree T (per-layer
// degrees do not combine with pipelines), so every segment instance processes one sub-batch of
// micro_batch / sub_batches sequences and takes the time profiled at degree T, scaled to those
// rows (planner/cost_model.h).
//
// The prediction lowers each rank's schedule with the very pass the engine runs
// (schedule::lower_pipeline) over that rank's part of the model, and runs all ranks together
// in sim::simulate_ranks: so a prediction exists exactly for the schedules the runtime can run.
// Kinds the lowering does not handle yet are reported as such, with its message.
#pragma once

#include "planner/profile.h"
#include "planner/stage_partition.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oases::planner {

// The cost of each transformer layer, of the embedding and of the head for balance_stages:
// seconds of one micro-batch's forward, recomputation and backward instructions under
// `within_stage` (its kind, recompute policy and sub-batches), from the profile at degree
// profile.tp. With memory_limit > 0, also the memory bound: a chunk's bytes are the parameters,
// gradients and optimizer state of its layers plus `in_flight` micro-batches of their kept
// activations (in_flight: the most micro-batches any chunk of the pipeline schedule keeps,
// schedule::max_in_flight), and the first and the last chunk each add the rest of the model's
// state (the tied word embedding lives on both) and the boundary buffers; the limit is
// memory_limit. UserError when the profile lacks degree profile.tp.
StageCosts pipeline_stage_costs(const Profile& profile, const schedule::ScheduleSpec& within_stage,
                                std::int64_t micro_batch, int in_flight,
                                std::int64_t memory_limit);

// parallel.pipeline_layers = "auto": balance_stages over `chunks` chunks (P x v) of the costs
// above, with in_flight the most micro-batches any rank of `pipeline` keeps.
std::vector<int> auto_pipeline_layers(const Profile& profile,
                                      const schedule::ScheduleSpec& within_stage,
                                      const schedule::PipelineSpec& pipeline,
                                      std::int64_t micro_batch, std::int64_t memory_limit);

struct PipelineOption {
  schedule::PipelineKind kind = schedule::PipelineKind::one_f_one_b;
  int virtual_stages = 1;
  std::vector<int> layers_per_chunk;  // the split it was predicted with
  // Empty when predicted; else why there is no prediction (the lowering's or the spec
  // check's message, e.g. "... not lowered yet ...").
  std::string unavailable;
  double step_seconds = 0;             // the slowest rank's
  std::vector<double> bubble_seconds;  // per rank: compute lane waiting on a Recv
  std::vector<double> compute_seconds;  // per rank
  double mean_bubble_seconds() const;
};

struct PipelinePredictionOptions {
  int stages = 2;         // P
  int micro_batches = 1;  // m per step
  // Transformer layers per stage (v = 1); each kind with v = 1 runs this split.
  std::vector<int> layers_per_stage;
  // Bytes per second of a point-to-point link between stages; 0: messages cost nothing (the
  // profile does not measure them).
  double link_bytes_per_second = 0;
};

// One option per pipeline kind, in the order gpipe, 1f1b, interleaved (v = 2, the layers split
// evenly over 2P chunks), zero-bubble, 2bw. UserError when the options or within_stage are
// not a valid setting (layers_per_stage not P counts summing to the model's layers, ...).
std::vector<PipelineOption> predict_pipelines(const Profile& profile,
                                              const schedule::ScheduleSpec& within_stage,
                                              std::int64_t micro_batch,
                                              const PipelinePredictionOptions& options);

// What `oases plan --degrees-only` prints for a pipeline: a heading, then per kind the
// predicted step, the mean bubble per stage and its share of the step, and each stage's bubble;
// or why there is no prediction.
std::string format_pipeline_options(const std::vector<PipelineOption>& options,
                                    const PipelinePredictionOptions& settings);

}  // namespace oases::planner
