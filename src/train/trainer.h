// The training run behind `oases train`: data, the step loop, evaluation, progress output,
// metrics (JSON Lines) and checkpoints, on one process or on a mesh of MPI ranks.
#pragma once

#include "comm/mesh.h"
#include "comm/mpi_runtime.h"
#include "plan/run_config.h"
#include "train/engine.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {

// What a resumed run does when the learning-rate schedule of its config (train.steps, lr,
// min_lr, warmup_steps, lr_decay_steps) would give any remaining step another learning rate
// than the schedule the checkpoint was trained with (stored in the checkpoint):
//   refuse:     stop with a UserError that names the changed settings and the learning rates
//               of the next step under both schedules (the default: a changed schedule is
//               more often a mistake than a plan, and the run would not continue the curve
//               it started);
//   config:     recompute the schedule from the config (a warning says what changes);
//   checkpoint: keep the checkpoint's lr, min_lr, warmup and decay end (its lr_decay_steps,
//               else its train.steps), running to the config's train.steps; steps past the
//               decay end train at min_lr.
// A schedule that gives every remaining step the same rate is no change, whatever settings
// differ.
enum class LrScheduleOnResume { refuse, config, checkpoint };

struct TrainOptions {
  std::string init_from;   // safetensors file with HF GPT-2 names to start from
  bool progress = true;    // print the progress line to stderr
  LrScheduleOnResume lr_schedule = LrScheduleOnResume::refuse;
  // Where this rank runs (comm::MpiRuntime::placement() and most_crowded_placement()), for
  // its thread count (train/threads.h); unset: one process on this host.
  std::optional<comm::HostPlacement> placement, most_crowded_placement;
};

struct StepRecord {
  std::int64_t step = 0;   // completed steps after this one (1-based)
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  double loss_scale = 1;           // fp16: the scale the step's loss was multiplied by
  bool skipped = false;            // fp16: overflowed gradients, no update applied
  std::int64_t skipped_steps = 0;  // fp16: skipped steps of the run so far (resumes included)
  std::optional<double> val_loss;
};

struct TrainSummary {
  std::int64_t start_step = 0;        // > 0 when resumed
  std::vector<StepRecord> steps;
  std::optional<double> initial_val_loss;  // before the first step (when evaluation is on)
  std::optional<double> final_val_loss;
  std::string last_checkpoint;        // empty when none was written
  // A stop signal (train.save_signals) ended the run before train.steps: its number; the
  // checkpoint of the last step it finished is last_checkpoint (when checkpoint.dir is set),
  // and the process is expected to exit with status 128 + stopped_by_signal. 0 otherwise.
  int stopped_by_signal = 0;
};

// Trains on the ranks of `mesh` (every rank calls this with the same config). Rank 0 of the
// world prints progress, writes metrics, traces and checkpoint files; the returned summary is
// the same on every rank.
//
// Metrics (log.metrics, JSON Lines): a fresh run first writes {"step": 0, "tokens": 0,
// "time": t} (with "val_loss" when validation is on: the loss before training), then one
// record per step with "step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s",
// "model_tflops", "mfu", "compute_s", "exposed_comm_s", "comm_s", "peak_activation_bytes",
// "peak_mem_bytes", "time" (Unix seconds when the step ended) and "tokens" (training tokens
// consumed up to and including the step: step x global_batch x seq_len), plus "val_loss" on
// evaluation steps; under train.precision = "fp16" also "loss_scale" (the step's) and
// "skipped_steps" (steps skipped for overflowed gradients so far); under
// parallel.dp_sync_every > 1, on the steps that average the replicas, "replica_divergence"
// (their RMS distance from the mean before averaging, relative to the mean's norm); on the first
// step after a checkpoint was saved, "checkpoint_s": how long the save held the step loop up
// before that step (the whole write; with checkpoint.async the copy into host memory, plus any
// wait for the previous asynchronous save, which "checkpoint_wait_s" gives apart); with more than
// one rank, every log.every steps and on the last, the straggler figures of the window
// (train/stragglers.h): "slowest_rank", "straggler_ratio", "rank_compute_s" and
// "rank_exposed_comm_s" (per world rank, per step). Beside it, `run.json` (written atomically at
// the start of every run, fresh or resumed) describes the run: {"format": 1, "config": the resolved
// config as TOML, "layer_degrees", "world_size", "tp", "dp", "pp", "threads", "started" (ISO-8601
// UTC), "host", "cpu", "parameters", "start_step", "schedule": {"kind", "recompute" (one policy, or
// per layer the policies joined by commas; with "recompute_every", its layers per group, under
// "sqrt"), "sub_batches", "micro_batches"} (auto
// settings resolved), "memory_bytes": {"parameters", "gradients", "optimizer", "activations",
// and under mixed precision "working_copy": the 16-bit parameters} (per rank), and under mixed
// precision "gemm16_path": the 16-bit product path and why, and where parallel.plan names a
// plan file that carries settings "plan": {"file", "settings": {key: value as --set takes it},
// "predicted_step_s" (when the file gives one)}}. run.json is not written when
// log.metrics names a device or pipe (such as /dev/stdout).
//
// Before anything is written, world rank 0 claims the run's outputs (train/run_outputs.h:
// checked paths, and locks on checkpoint.dir and log.metrics held until this returns).
//
// Stop signals (train.save_on_signal, train.save_signals): while this runs, the first such
// signal on any rank makes every rank finish its step (the ranks agree at each step's end,
// with one small all-reduce), save a checkpoint of it by the usual protocol (when
// checkpoint.dir is set and that step is not saved already) and return with
// stopped_by_signal set; rank 0 says where it saved. A second signal ends the process at once
// (core/stop_signals.h). Under 2bw or local SGD, whose steps do not all end in a state a
// checkpoint can hold, the next such step is run first.
TrainSummary run_training(const plan::RunConfig& config, const TrainOptions& options, comm::Mesh& mesh);

// Single process.
TrainSummary run_training(const plan::RunConfig& config, const TrainOptions& options);

// The groups of `mesh` a TrainingEngine on this rank trains in; `mesh` must outlive them.
ParallelGroups parallel_groups(comm::Mesh& mesh);

}  // namespace oases::train
