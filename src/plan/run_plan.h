// RunPlan: what one rank of a run does, resolved once from the RunConfig.
//
// The RunConfig (plan/run_config.h) is what the user wrote: words and numbers, validated, and
// stored with checkpoints. Everything that runs reads the RunPlan instead: every enum-like
// setting parsed into its enum, every "auto" resolved, every flag that follows from several
// settings derived here and nowhere else. The engine, the trainer, the profiler, the cluster
// simulation, the CLI and the report all take their decisions from it, so two of them cannot
// disagree about what a run is.
//
// A plan is built per process and rank (make_run_plan); it is cheap (no model is built, no
// file but a plan file named by parallel.plan is read) and holds no references.
//
// What is not resolved here: settings measured at start-up. parallel.plan = "auto" and
// parallel.pipeline_layers = "auto" are measured by `oases train` and replaced in the config
// by the degrees and counts found (train/profiler.h, train/pipeline_split.h) before the plan
// is made; train.gemm16_path = "auto" is measured by the engine, which then reads the pinned
// path it chose.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/named_values.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "ops/program.h"
#include "optim/optimizer.h"
#include "plan/run_config.h"
#include "plan/settings.h"
#include "planner/memory.h"
#include "planner/profile.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace oases::plan {

// The mesh of ranks (parallel.tp, cp, dp, pp, ep) and where this rank sits in it, laid out as
// comm::Mesh lays it out: world rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).
// The cp x dp ranks of one (tp_rank, pp_rank) hold the same parameters (replicas): gradients
// are summed and ZeRO partitions over them; the cp ranks of one replica read the same samples.
struct MeshPlan {
  int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1;
  int rank = 0;  // world rank
  int world() const { return tp * cp * dp * pp; }
  int replicas() const { return cp * dp; }
  int tp_rank() const { return rank % tp; }
  int cp_rank() const { return rank / tp % cp; }
  int dp_rank() const { return rank / (tp * cp) % dp; }
  int replica_rank() const { return rank / tp % replicas(); }
  int pp_rank() const { return rank / (tp * cp * dp); }
  int ep_rank() const { return dp_rank() % ep; }
};

// The element types of a run.
struct DTypes {
  DType compute = DType::f32;        // activations, the working copy of the weights
  DType master = DType::f32;         // parameters, gradients, optimizer state
  DType gradient_reduce = DType::f32;  // data-parallel gradient sums on the wire
  bool mixed() const { return compute != master; }
};

// How the pipeline cuts the model (one stage and one chunk when parallel.pp = 1).
struct PipelinePlan {
  schedule::PipelineKind kind = schedule::PipelineKind::one_f_one_b;
  int stages = 1;          // parallel.pp
  int virtual_stages = 1;  // chunks per stage
  int layers = 0;          // model.layers
  // Transformer layers of each chunk, in model order: stages x virtual_stages counts. Empty
  // while parallel.pipeline_layers = "auto" waits to be measured (more than one chunk).
  std::vector<int> chunk_layers;

  bool enabled() const { return stages > 1; }
  // The no-flush 2bw pipeline: batch t computes on the weights one update older than those its
  // update goes to, two weight versions kept. One stage runs it too (weight stashing alone).
  bool two_bw() const { return kind == schedule::PipelineKind::two_bw; }
  // The layers [begin, end) of each chunk `stage` holds, in model order: chunks stage,
  // stage + stages, ... ({{0, layers}} without a pipeline). UserError while the counts are
  // still to be measured.
  std::vector<model::LayerRange> stage_ranges(int stage) const;
  // chunk_layers, or that UserError.
  const std::vector<int>& counts() const;
};

// ZeRO and offloading as they apply to this run.
struct ZeroPlan {
  int stage = 0;  // parallel.zero as configured
  // Some gradient bucket is summed over more than one rank (data-parallel replicas summing
  // every step, or layers below parallel.tp summing over their replicas): ZeRO partitions
  // only such buckets, so without one a stage changes nothing.
  bool partitions = false;
  int effective_stage() const { return partitions ? stage : 0; }
  Offload offload = Offload::none;
  std::string offload_dir;
};

// fp16's loss scaling; the other precisions scale nothing.
struct LossScalingPlan {
  enum class Kind : std::uint8_t { none, constant, dynamic };
  Kind kind = Kind::none;
  double constant = 1;  // Kind::constant
  // Kind::dynamic: Megatron-LM's rule (train/loss_scaler.h).
  double initial_scale = 65536, min_scale = 1;
  std::int64_t window = 1000, hysteresis = 2;
};

// The plan file parallel.plan names, as read for the layers' degrees: what it gives besides them.
struct PlanFile {
  std::string path;
  // The settings it carries (planner::Plan::settings), in the file's order; parse_run_config
  // applied them to the config. Empty for a file of degrees alone.
  std::vector<std::pair<std::string, std::string>> settings;
  double predicted_step_seconds = 0;  // 0: the file gives none
};

struct RunPlan {
  RunConfig config;  // the words it was made from (stored with checkpoints)
  Settings settings;
  MeshPlan mesh;
  DTypes dtypes;
  // Training steps' schedule: kind, recompute policy (and sqrt's group), micro-batches per
  // step on one data-parallel rank, sub-batches, and every ZeRO flag (sharded_params,
  // reshard_after_forward, deferred_param_gather) and partitioned checkpoints.
  schedule::ScheduleSpec schedule;
  PipelinePlan pipeline;
  // The tensor-parallel degree of each transformer layer; empty: every layer at parallel.tp.
  std::vector<int> layer_degrees;
  // Where parallel.plan names a plan file (read once, with the degrees).
  std::optional<PlanFile> plan_file;
  // parallel.sequence_parallel: norms, dropout and residuals on 1/tp of the tokens.
  bool sequence_parallel = false;
  ZeroPlan zero;
  // parallel.dp_sync_every > 1 over more than one data-parallel rank (local SGD): replicas step
  // alone and average every sync_every steps; no gradient sums over the data-parallel group.
  std::int64_t sync_every = 1;
  bool local_sgd = false;
  LossScalingPlan loss_scaling;
  optim::OptimizerConfig optimizer;
  // How the executor's streams run: immediately (the default), or asynchronously on threads of
  // their own where the environment asks for it (OASES_ASYNC_CPU_STREAMS=1; the tests' check
  // that every wait is an event).
  StreamMode stream_mode = StreamMode::immediate;
  // A test seam: seconds of sleep added to each compute instruction of this rank, so that tests
  // can make one rank a straggler (OASES_TEST_SLOW_RANK=<world rank>:<milliseconds>; 0 otherwise).
  double compute_delay_s = 0;

  // Sequences per global batch on one data-parallel rank, and per micro-batch.
  std::int64_t local_batch() const { return config.train.global_batch / mesh.dp; }
  std::int64_t micro_batch() const { return config.train.micro_batch; }

  // The options of the model pipeline stage `stage` builds, as far as they follow from the
  // plan: element types, batch split, slot lanes, seed, per-layer degrees, the stage's layers,
  // ZeRO's pageable arrays. The caller adds the communicators, the 16-bit GEMM paths and where
  // the parameters live.
  model::ModelOptions model_options(int stage) const;
  // What decides how much memory a rank holds, for planner::memory_figures.
  planner::MemoryPolicy memory_policy() const;
  // The layout a profile of this run is measured in (oases profile) and must match.
  planner::ProfiledLayout profiled_layout() const;
  // UserError naming `source` unless `profile` was measured for this run's model, batch split,
  // every power-of-two degree up to tp, expert-parallel link and layout
  // (planner::check_profile_matches, planner::check_profile_layout).
  void check_profile(const planner::Profile& profile, const std::string& source) const;
  // The schedule spec of a pass over `micro_batches` micro-batches (training or forward only).
  schedule::ScheduleSpec pass_spec(int micro_batches, bool training) const;
  // The same plan for world rank `rank` of its mesh (the simulators plan every rank of a run
  // from one).
  RunPlan for_rank(int rank) const;
};

// The plan of world rank `rank` (checked against the mesh); reads the plan file parallel.plan
// names, if it names one. UserError for a word that is not known and for what the resolution
// cannot make run (a schedule and a recomputation policy that do not go together, counts that
// do not cut the model, ...), naming the settings and what would be valid. A config read from
// TOML is validated already (parse_run_config runs RunConfig::validate); one built in code is
// taken as it is, for what the engine can run beyond what a user is let ask for (a test's bf16
// gradient sums of fp64 gradients, say).
// REQUIRES: parallel.plan and parallel.pipeline_layers are not "auto" (resolved by measuring;
// with one chunk, pipeline_layers = "auto" has nothing to balance and is taken as uniform).
RunPlan make_run_plan(const RunConfig& config, int rank = 0);

}  // namespace oases::plan
