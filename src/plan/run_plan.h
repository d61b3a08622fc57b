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

#include "core/dtype.h"
#include "core/named_values.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "ops/program.h"
#include "optim/optimizer.h"
#include "plan/run_config.h"
#include "planner/memory.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace oases::plan {

// train.precision: the element type of the compute.
enum class Precision : std::uint8_t {
  fp32,  // everything in f32
  fp64,  // everything in f64: the verification precision
  bf16,  // mixed: bf16 activations, working weights and tensor-parallel collectives over f32
  fp16,  //        master weights, gradients and optimizer state; fp16 with loss scaling
};
inline constexpr std::array<NamedValue<Precision>, 4> kPrecisionNames{{
    {Precision::fp32, "fp32"}, {Precision::fp64, "fp64"},
    {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"}}};

// train.grad_reduce_dtype: the type data-parallel gradient sums travel in.
enum class GradReduceType : std::uint8_t { fp32, bf16 };
inline constexpr std::array<NamedValue<GradReduceType>, 2> kGradReduceTypeNames{{
    {GradReduceType::fp32, "fp32"}, {GradReduceType::bf16, "bf16"}}};

// parallel.offload: what lives in a scratch file between optimizer steps.
enum class Offload : std::uint8_t { none, optimizer, optimizer_and_params };
inline constexpr std::array<NamedValue<Offload>, 3> kOffloadNames{{
    {Offload::none, "none"}, {Offload::optimizer, "optimizer"},
    {Offload::optimizer_and_params, "optimizer+params"}}};

// parallel.plan: where each layer's tensor-parallel degree comes from.
enum class LayerPlanSource : std::uint8_t {
  uniform,    // "uniform": every layer at parallel.tp (MoE layers at 1 with expert_tp = 1)
  automatic,  // "auto": measured and planned at start-up (resolved before a plan is made)
  listed,     // "1,1,2,2": one degree per layer
  file,       // a plan file written by `oases plan`
};

// parallel.pipeline_layers: how the layers are cut into pipeline chunks.
enum class PipelineLayersSource : std::uint8_t {
  uniform,    // "uniform": as evenly as possible (schedule::uniform_pipeline_layers)
  automatic,  // "auto": balanced from measured layer costs at start-up
  listed,     // "3,4,4,5": one count per chunk
};

// Where parallel.plan's and parallel.pipeline_layers's words point. Never throws on the words
// themselves: a text that is neither keyword nor list is a plan file's path.
LayerPlanSource layer_plan_source(const std::string& plan);
PipelineLayersSource pipeline_layers_source(const std::string& pipeline_layers);

// The settings whose values are words, parsed: each field's enum lists its valid words beside
// its declaration. "auto" settings resolved here are resolved in RunPlan instead.
struct Settings {
  model::Architecture arch = model::Architecture::gpt;           // model.arch
  ops::MoeGate moe_gate = ops::MoeGate::switch_top1;             // model.moe_gate
  std::optional<schedule::ScheduleKind> schedule;                // parallel.schedule; "auto": none
  std::optional<schedule::Recompute> recompute;                  // parallel.recompute; "auto": none
  schedule::PipelineKind pipeline = schedule::PipelineKind::one_f_one_b;  // parallel.pipeline
  PipelineLayersSource pipeline_layers = PipelineLayersSource::uniform;  // parallel.pipeline_layers
  LayerPlanSource plan = LayerPlanSource::uniform;               // parallel.plan
  std::optional<ops::ActivationEncoding> activation_compression;  // "none": none
  Offload offload = Offload::none;                               // parallel.offload
  optim::OptimizerKind optimizer = optim::OptimizerKind::adamw;  // train.optimizer
  Precision precision = Precision::fp32;                         // train.precision
  GradReduceType grad_reduce = GradReduceType::fp32;             // train.grad_reduce_dtype
  std::optional<kernels::Gemm16Path> gemm16_path;                // train.gemm16_path; "auto": none
  data::TokenizerKind tokenizer = data::TokenizerKind::byte;     // data.tokenizer
};
// UserError naming the key, the word found and the valid words for the first word that is not
// known.
Settings parse_settings(const RunConfig& config);

// The mesh of ranks (parallel.tp, dp, pp, ep) and where this rank sits in it, laid out as
// comm::Mesh lays it out: world rank = tp_rank + tp * (dp_rank + dp * pp_rank).
struct MeshPlan {
  int tp = 1, dp = 1, pp = 1, ep = 1;
  int rank = 0;  // world rank
  int world() const { return tp * dp * pp; }
  int tp_rank() const { return rank % tp; }
  int dp_rank() const { return rank / tp % dp; }
  int pp_rank() const { return rank / (tp * dp); }
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
  // Transformer layers of each chunk, in model order: stages x virtual_stages counts.
  std::vector<int> chunk_layers;

  bool enabled() const { return stages > 1; }
  // The no-flush 2bw pipeline is in effect (2bw over more than one stage).
  bool two_bw() const { return kind == schedule::PipelineKind::two_bw && stages > 1; }
  // The layers [begin, end) of each chunk `stage` holds, in model order: chunks stage,
  // stage + stages, ... ({{0, layers}} without a pipeline).
  std::vector<model::LayerRange> stage_ranges(int stage) const;
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
  ZeroPlan zero;
  // parallel.dp_sync_every > 1 over more than one data-parallel rank (local SGD): replicas step
  // alone and average every sync_every steps; no gradient sums over the data-parallel group.
  std::int64_t sync_every = 1;
  bool local_sgd = false;
  LossScalingPlan loss_scaling;
  optim::OptimizerConfig optimizer;

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
  // The schedule spec of a pass over `micro_batches` micro-batches (training or forward only).
  schedule::ScheduleSpec pass_spec(int micro_batches, bool training) const;
};

// The plan of world rank `rank` (checked against the mesh). Validates the config first
// (RunConfig::validate) and reads the plan file parallel.plan names, if it names one.
// UserError for settings that cannot run together, naming them and what would be valid.
// REQUIRES: parallel.plan and parallel.pipeline_layers are not "auto" (resolved by measuring;
// with one chunk, pipeline_layers = "auto" has nothing to balance and is taken as uniform).
RunPlan make_run_plan(const RunConfig& config, int rank = 0);

}  // namespace oases::plan
