// The training run behind `oases train`: data, the step loop, evaluation, progress output,
// metrics (JSON Lines) and checkpoints, on one process or on a mesh of MPI ranks.
#pragma once

#include "comm/mesh.h"
#include "train/config.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {

struct TrainOptions {
  std::string init_from;   // safetensors file with HF GPT-2 names to start from
  bool progress = true;    // print the progress line to stderr
};

struct StepRecord {
  std::int64_t step = 0;   // completed steps after this one (1-based)
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  std::optional<double> val_loss;
};

struct TrainSummary {
  std::int64_t start_step = 0;        // > 0 when resumed
  std::vector<StepRecord> steps;
  std::optional<double> initial_val_loss;  // before the first step (when evaluation is on)
  std::optional<double> final_val_loss;
  std::string last_checkpoint;        // empty when none was written
};

// Trains on the ranks of `mesh` (every rank calls this with the same config). Rank 0 of the
// world prints progress, writes metrics, traces and checkpoint files; the returned summary is
// the same on every rank.
TrainSummary run_training(const RunConfig& config, const TrainOptions& options, comm::Mesh& mesh);

// Single process.
TrainSummary run_training(const RunConfig& config, const TrainOptions& options);

}  // namespace oases::train
