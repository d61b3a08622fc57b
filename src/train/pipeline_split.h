// parallel.pipeline_layers = "auto": the transformer layers of each pipeline chunk, balanced by
// planner::balance_stages from costs measured on the run's own ranks at start-up.
#pragma once

#include "comm/mesh.h"
#include "plan/run_config.h"
#include "train/profiler.h"

#include <functional>

namespace oases::train {

// Profiles the model as parallel.plan = "auto" does (run_profile: every segment at each
// power-of-two degree up to parallel.tp, on tensor-parallel groups of the run's ranks), prices
// each layer, the embedding and the head under the run's within-stage schedule
// (planner::pipeline_stage_costs; with parallel.memory_limit as the bound per chunk), splits
// the layers over `chunks` chunks (parallel.pp x virtual stages) with planner::balance_stages
// and returns the config with parallel.pipeline_layers set to the counts. Rank 0 decides and
// tells every rank. make_mesh(k): every rank of the run as tensor-parallel groups of k ranks.
// With options.progress, rank 0 logs the split. Collective over every rank of the run;
// UserError (on every rank) when no split fits the memory limit.
// REQUIRES: parallel.pipeline_layers is "auto".
plan::RunConfig split_pipeline_automatically(const plan::RunConfig& config, const ProfileOptions& options,
                                       const std::function<comm::Mesh(int tp)>& make_mesh,
                                       int chunks);

}  // namespace oases::train
