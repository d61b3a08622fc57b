#include "plan/run_plan.h"

#include "core/error.h"
#include "planner/planner.h"
#include "planner/stage_partition.h"
#include "plan/resolve.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace oases::plan {

const std::vector<int>& PipelinePlan::counts() const {
  const int chunks = stages * virtual_stages;
  OASES_CHECK(!chunk_layers.empty(),
              "parallel.pipeline_layers = \"auto\" is resolved by `oases train` and `oases "
              "plan` (from measured layer costs); here it needs explicit counts: \"uniform\" or "
              "one layer count per chunk, parallel.pp x parallel.virtual_stages = {} of them "
              "(e.g. \"{}\")",
              chunks,
              planner::format_pipeline_layers(planner::uniform_pipeline_layers(layers, chunks)));
  return chunk_layers;
}

std::vector<model::LayerRange> PipelinePlan::stage_ranges(int stage) const {
  OASES_ASSERT(stage >= 0 && stage < stages, "stage {} of {}", stage, stages);
  std::vector<model::LayerRange> out;
  std::int64_t first = 0;
  for (std::size_t chunk = 0; chunk < counts().size(); ++chunk) {
    const int count = chunk_layers[chunk];
    if (static_cast<int>(chunk) % stages == stage) out.push_back({first, first + count});
    first += count;
  }
  return out;
}

model::ModelOptions RunPlan::model_options(int stage) const {
  model::ModelOptions o;
  o.dtype = dtypes.master;
  if (dtypes.mixed()) o.mixed_precision = dtypes.compute;
  o.micro_batch = config.train.micro_batch;
  o.sub_batches = schedule.sub_batches;
  o.slot_lanes = schedule::slot_lanes(schedule);
  o.seed = static_cast<std::uint64_t>(config.train.seed);
  o.layer_degrees = layer_degrees;
  o.sequence_parallel = sequence_parallel;
  o.cp_kind = settings.context_parallel;
  o.layer_ranges = pipeline.stage_ranges(stage);
  o.pageable_grads = zero.stage >= 2;
  o.pageable_params = zero.stage >= 3;
  return o;
}

planner::ProfiledLayout RunPlan::profiled_layout() const {
  planner::ProfiledLayout layout;
  layout.sequence_parallel = sequence_parallel;
  layout.cp = mesh.cp;
  layout.cp_kind = settings.context_parallel;
  return layout;
}

void RunPlan::check_profile(const planner::Profile& profile, const std::string& source) const {
  std::vector<int> degrees;
  for (int k = 1; k <= mesh.tp; k *= 2) degrees.push_back(k);
  planner::check_profile_matches(profile, config.model, config.train.micro_batch,
                                 schedule.sub_batches, degrees, source,
                                 static_cast<int>(config.parallel.ep));
  planner::check_profile_layout(profile, profiled_layout(), source);
}

planner::MemoryPolicy RunPlan::memory_policy() const {
  planner::MemoryPolicy policy;
  policy.master_element = dtype_size(dtypes.master);
  policy.working_element = dtypes.mixed() ? dtype_size(dtypes.compute) : 0;
  policy.weight_versions = pipeline.two_bw() ? 2 : 1;
  policy.zero_stage = zero.effective_stage();
  policy.offload_params = zero.offload == Offload::optimizer_and_params;
  return policy;
}

schedule::ScheduleSpec RunPlan::pass_spec(int micro_batches, bool training) const {
  schedule::ScheduleSpec spec = schedule;
  spec.micro_batches = micro_batches;
  spec.training = training;
  return spec;
}

RunPlan RunPlan::for_rank(int rank) const {
  OASES_ASSERT(rank >= 0 && rank < mesh.world(), "rank {} of a world of {}", rank, mesh.world());
  RunPlan plan = *this;
  plan.mesh.rank = rank;
  return plan;
}

namespace {

MeshPlan mesh_plan(const RunConfig& config, int rank) {
  MeshPlan mesh;
  mesh.tp = static_cast<int>(config.parallel.tp);
  mesh.cp = static_cast<int>(config.parallel.cp);
  mesh.dp = static_cast<int>(config.parallel.dp);
  mesh.pp = static_cast<int>(config.parallel.pp);
  mesh.ep = static_cast<int>(config.parallel.ep);
  OASES_ASSERT(rank >= 0 && rank < mesh.world(), "rank {} of a world of {}", rank, mesh.world());
  mesh.rank = rank;
  return mesh;
}

DTypes dtypes_of(const Settings& s) {
  DTypes d;
  switch (s.precision) {
    case Precision::fp32: break;
    case Precision::fp64: d.compute = d.master = d.gradient_reduce = DType::f64; break;
    case Precision::bf16: d.compute = DType::bf16; break;
    case Precision::fp16: d.compute = DType::f16; break;
    case Precision::automatic:
      OASES_ASSERT(false, "train.precision = \"auto\" must be resolved before a plan is made");
  }
  if (s.grad_reduce == GradReduceType::bf16) d.gradient_reduce = DType::bf16;
  return d;
}

LossScalingPlan loss_scaling_of(const OptimConfig& t, Precision precision) {
  LossScalingPlan l;
  if (precision != Precision::fp16) return l;
  if (t.loss_scale > 0) {
    l.kind = LossScalingPlan::Kind::constant;
    l.constant = t.loss_scale;
    return l;
  }
  l.kind = LossScalingPlan::Kind::dynamic;
  l.initial_scale = t.initial_loss_scale;
  l.min_scale = t.min_loss_scale;
  l.window = t.loss_scale_window;
  l.hysteresis = t.hysteresis;
  return l;
}

// Whether some gradient bucket is summed over more than one rank, which is what ZeRO
// partitions: the data-parallel replicas' every step (not under local SGD), or the replicas of
// a layer below the tensor-parallel degree.
bool buckets_summed_over_ranks(const RunPlan& p) {
  if (p.mesh.replicas() > 1 && !p.local_sgd) return true;
  return std::ranges::any_of(p.layer_degrees, [&](int degree) { return degree < p.mesh.tp; });
}

// OASES_TEST_SLOW_RANK = "<world rank>:<milliseconds>": the test seam of RunPlan's
// compute_delay_s, for `rank`.
double compute_delay_from_environment(int rank) {
  constexpr const char* kVariable = "OASES_TEST_SLOW_RANK";
  const char* value = std::getenv(kVariable);
  if (value == nullptr || *value == '\0') return 0;
  int slow_rank = -1;
  double milliseconds = 0;
  char rest = 0;
  OASES_CHECK(std::sscanf(value, "%d:%lf%c", &slow_rank, &milliseconds, &rest) == 2 &&
                  slow_rank >= 0 && milliseconds >= 0,
              "{} = '{}' is not valid: expected <world rank>:<milliseconds>, such as 1:20",
              kVariable, value);
  return slow_rank == rank ? milliseconds / 1e3 : 0;
}

}  // namespace

RunPlan make_run_plan(const RunConfig& config, int rank) {
  RunPlan p;
  p.config = config;
  p.settings = parse_settings(config);
  OASES_CHECK(p.settings.precision != Precision::automatic,
              "train.precision = \"auto\" is chosen by measuring the machine that runs: `oases "
              "train` and `oases profile` resolve it, `oases simulate --cluster` by the "
              "cluster's peaks; here give train.precision as \"fp32\", \"bf16\", \"fp16\" or "
              "\"fp64\"");
  p.mesh = mesh_plan(config, rank);
  p.dtypes = dtypes_of(p.settings);
  p.pipeline = resolve_pipeline(config, p.settings);
  p.layer_degrees = resolve_layer_degrees(config, p.settings, &p.plan_file);
  p.sequence_parallel = config.parallel.sequence_parallel;
  p.schedule = resolve_schedule(config, p.settings);
  p.sync_every = config.parallel.dp_sync_every;
  p.local_sgd = p.sync_every > 1 && p.mesh.dp > 1;
  p.zero.stage = static_cast<int>(config.parallel.zero);
  p.zero.partitions = p.zero.stage >= 1 && buckets_summed_over_ranks(p);
  p.zero.offload = p.settings.offload;
  p.zero.offload_dir = config.parallel.offload_dir;
  // ZeRO-3 holds only this rank's blocks between uses and gathers each bucket for the compute
  // that reads it. ZeRO-1 and 2 gather the blocks an update changed ahead of the next step's
  // first use, so the gathers travel while the update and the next forward compute; 2bw swaps
  // whole weight versions between its batches and waits for them at the update instead.
  p.schedule.sharded_params = p.zero.partitions && p.zero.stage >= 3;
  p.schedule.reshard_after_forward = config.parallel.zero3_reshard_after_forward;
  p.schedule.deferred_param_gather =
      p.zero.partitions && p.zero.stage <= 2 && !p.pipeline.two_bw();
  p.loss_scaling = loss_scaling_of(config.train, p.settings.precision);
  p.optimizer = optimizer_config(config.train, p.settings.optimizer);
  p.stream_mode = stream_mode_from_environment();
  p.compute_delay_s = compute_delay_from_environment(rank);
  return p;
}

}  // namespace oases::plan
