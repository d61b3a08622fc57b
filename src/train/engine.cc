#include "train/engine.h"

#include "core/buffer.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "optim/clip.h"
#include "optim/zero_partition.h"
#include "planner/stage_partition.h"
#include "schedule/pipeline_lowering.h"
#include "plan/rank_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

namespace oases::train {

optim::ParamSlot param_slot(const model::ParamSpec& p) {
  optim::ParamSlot slot{p.name, p.offset, p.shape.to_vector(), p.weight_decay};
  slot.full_shape = p.full_shape.to_vector();
  const int dims = static_cast<int>(slot.shape.size());
  if (p.parts > 1 && p.sharding != model::Sharding::replicated)
    slot.split_dim = p.sharding == model::Sharding::rows ? 0 : dims - 1;
  if (p.sharding == model::Sharding::rows && dims > 0 && slot.shape[0] > 0) {
    // Rows past the whole tensor's (a vocabulary padded to a multiple of the degree) are the
    // shard's last ones.
    const std::int64_t rows = slot.shape[0];
    const std::int64_t valid =
        std::clamp<std::int64_t>(slot.full_shape[0] - p.part * rows, 0, rows);
    slot.padding = (rows - valid) * (p.numel() / rows);
    if (p.parts == 1) slot.full_shape[0] = valid;
  }
  return slot;
}

optim::FlatLayout flat_layout(const model::ParamLayout& layout, DType dtype) {
  optim::FlatLayout flat;
  flat.dtype = dtype;
  flat.total_numel = layout.total_numel();
  for (const model::ParamSpec& p : layout.params()) flat.params.push_back(param_slot(p));
  return flat;
}

namespace {

model::ModelOptions model_options(const plan::RunPlan& plan, comm::Communicator& tp,
                                  const ParallelGroups& groups, const kernels::Gemm16Paths& paths,
                                  OffloadStore* offload) {
  model::ModelOptions o = plan.model_options(plan.mesh.pp_rank());
  o.gemm16 = paths;
  o.tp = &tp;
  o.ep = groups.ep;
  o.tp_subgroup = groups.tp_subgroup;
  if (offload != nullptr && plan.zero.offload == plan::Offload::optimizer_and_params)
    o.allocate_params = [offload](std::size_t bytes) { return offload->allocate(bytes); };
  return o;
}

// The world rank whose plan the engine runs: where the groups place this process, laid out as
// the mesh lays ranks out. UserError when a group's size is not the config's degree.
int rank_of_groups(const plan::RunConfig& config, const ParallelGroups& groups) {
  const auto size_of = [](const comm::Communicator* group) { return group ? group->size() : 1; };
  const auto rank_of = [](const comm::Communicator* group) { return group ? group->rank() : 0; };
  const auto& p = config.parallel;
  OASES_CHECK(size_of(groups.tp) == p.tp && size_of(groups.dp) == p.dp && size_of(groups.pp) == p.pp,
              "the engine's groups (tp {}, dp {}, pp {} ranks) do not match parallel.tp = {}, "
              "dp = {}, pp = {}",
              size_of(groups.tp), size_of(groups.dp), size_of(groups.pp), p.tp, p.dp, p.pp);
  return rank_of(groups.tp) +
         static_cast<int>(p.tp) * (rank_of(groups.dp) + static_cast<int>(p.dp) * rank_of(groups.pp));
}

// train.gemm16_path resolved: pinned by name, or measured where every group's rank is 0 and
// broadcast over the tensor-, data- and pipeline-parallel groups in turn (after the three, every
// rank holds the measuring rank's choice).
Gemm16Resolution resolve_gemm16(const plan::RunPlan& plan, comm::Communicator& tp,
                                comm::Communicator& dp, comm::Communicator& pp) {
  Gemm16Resolution resolved;
  if (!plan.dtypes.mixed()) return resolved;
  const DType half = plan.dtypes.compute;
  if (const std::optional<kernels::Gemm16Path> path = plan.settings.gemm16_path) {
    const std::string& setting = plan.config.train.gemm16_path;
    const kernels::Gemm16Availability available = kernels::gemm16_available(*path, half);
    OASES_CHECK(available.available,
                "train.gemm16_path = \"{}\" cannot multiply {} on this CPU ({}); valid: "
                "\"auto\", or \"convert+sgemm\" (every CPU)",
                setting, dtype_name(half), available.detail);
    resolved.paths.bf16 = resolved.paths.f16 = *path;
    resolved.description = fmt::format("{} (train.gemm16_path)", kernels::gemm16_path_name(*path));
    return resolved;
  }
  std::int32_t chosen = 0;
  std::string reason;
  if (tp.rank() == 0 && dp.rank() == 0 && pp.rank() == 0) {
    const kernels::Gemm16Choice choice = kernels::choose_gemm16_path(half);
    chosen = static_cast<std::int32_t>(choice.path);
    reason = choice.reason;
  }
  const Tensor word = Tensor::of(&chosen, {1});
  tp.broadcast(word, 0);
  dp.broadcast(word, 0);
  pp.broadcast(word, 0);
  const auto path = static_cast<kernels::Gemm16Path>(chosen);
  resolved.paths.bf16 = resolved.paths.f16 = path;
  // The reason names the path it chose.
  resolved.description = reason.empty() ? std::string(kernels::gemm16_path_name(path)) : reason;
  return resolved;
}

// A gradient reduction that travels in bf16: the bucket rounded into `staging`, reduced there
// by `start` (a sum over the group, or ZeRO's sum of each rank's block), and widened back into
// the bucket when waited for.
class Bf16Reduction final : public comm::Work {
 public:
  Bf16Reduction(const Tensor& grads,
                const std::function<std::unique_ptr<comm::Work>(const Tensor&)>& start)
      : grads_(grads), staging_(static_cast<std::size_t>(grads.numel()) * 2) {
    const Tensor half = staging_.tensor(DType::bf16, {grads.numel()});
    kernels::convert(grads, half);
    work_ = start(half);
  }
  void wait() override {
    if (done_) return;
    work_->wait();
    kernels::convert(staging_.tensor(DType::bf16, {grads_.numel()}), grads_);
    done_ = true;
  }
  bool test() override { return work_->test(); }
  std::optional<comm::WorkTiming> timing() const override { return work_->timing(); }

 private:
  Tensor grads_;
  Buffer staging_;
  std::unique_ptr<comm::Work> work_;
  bool done_ = false;
};

LossScaler loss_scaler_for(const plan::LossScalingPlan& scaling) {
  switch (scaling.kind) {
    case plan::LossScalingPlan::Kind::none: return LossScaler::identity();
    case plan::LossScalingPlan::Kind::constant: return LossScaler::constant(scaling.constant);
    case plan::LossScalingPlan::Kind::dynamic: break;
  }
  DynamicLossScale settings;
  settings.initial_scale = scaling.initial_scale;
  settings.window = scaling.window;
  settings.min_scale = scaling.min_scale;
  settings.hysteresis = scaling.hysteresis;
  return LossScaler::dynamic(settings);
}

// Combines the optimizer's statistics of each split parameter of `flat` (the optimizer's
// layout: the whole layout, or ZeRO's owned parts) over the ranks that hold its parts: the
// tensor-parallel group for a parameter split tp ways, the k neighbouring ranks of a layer at
// degree k < tp (each replica group of them on its own).
std::unique_ptr<optim::ShardReducer> shard_reducer(const optim::FlatLayout& flat,
                                                   const model::ParamLayout& layout,
                                                   comm::Communicator& tp,
                                                   const ops::TpSubgroups& tp_subgroup) {
  std::vector<comm::Communicator*> groups;
  for (const optim::ParamSlot& slot : flat.params) {
    const model::ParamSpec& p = layout.find(slot.name);
    comm::Communicator* group = nullptr;
    if (slot.split_dim >= 0) {
      OASES_ASSERT(p.parts == tp.size() || tp_subgroup,
                   "parameter {} in {} parts needs the "
                   "tensor-parallel sub-groups",
                   p.name, p.parts);
      group = p.parts == tp.size() ? &tp : &tp_subgroup(p.parts, 1);
    }
    groups.push_back(group);
  }
  return std::make_unique<optim::GroupShardReducer>(std::move(groups));
}

// Sum of a double over a group (loss sums are reduced in double to keep their digits).
double sum_over(comm::Communicator& group, double value) {
  group.all_reduce(Tensor::of(&value, {1}), comm::ReduceOp::sum);
  return value;
}

// Targets of `count` tokens that enter the loss.
std::int64_t counted_targets(const std::int32_t* targets, std::int64_t count) {
  return std::count_if(targets, targets + count, [](std::int32_t t) { return t >= 0; });
}

}  // namespace

TrainingEngine::TrainingEngine(const plan::RunConfig& config, ParallelGroups groups)
    : TrainingEngine(plan::make_run_plan(config, rank_of_groups(config, groups)), groups) {}

TrainingEngine::TrainingEngine(const plan::RunPlan& plan, ParallelGroups groups)
    : plan_(plan),
      tp_(groups.tp ? groups.tp : &self_tp_),
      dp_(groups.dp ? groups.dp : &self_dp_),
      pp_(groups.pp ? groups.pp : &self_pp_),
      tp_replica_group_(groups.tp_replica_group),
      ep_(groups.ep && groups.ep->size() > 1 ? groups.ep : nullptr),
      expert_replicas_(ep_ ? groups.expert_replicas : nullptr),
      gemm16_(resolve_gemm16(plan, *tp_, *dp_, *pp_)),
      scaler_(loss_scaler_for(plan.loss_scaling)),
      tp_subgroup_(groups.tp_subgroup),
      offload_(plan.zero.offload == plan::Offload::none
                   ? nullptr
                   : std::make_unique<OffloadStore>(plan.zero.offload_dir,
                                                    "parallel.offload_dir")),
      model_(plan.config.model, model_options(plan, *tp_, groups, gemm16_.paths, offload_.get())),
      optimizer_(make_engine_optimizer()),
      // With train.lr = 0 (Adafactor's relative step) every rate is 0, min_lr included.
      lr_schedule_{plan.config.train.lr, plan.config.train.lr == 0 ? 0.0 : plan.config.train.min_lr,
                   plan.config.train.warmup_steps, plan.config.train.lr_decay_steps,
                   plan.config.train.steps},
      executor_(model_.segments(), model_.program(), model_.activations(),
                model_.static_activation_bytes(), runtime::ExecutorOptions{plan.stream_mode}) {
  OASES_CHECK(tp_->size() == plan.mesh.tp && dp_->size() == plan.mesh.dp &&
                  pp_->size() == plan.mesh.pp,
              "the engine's groups (tp {}, dp {}, pp {} ranks) do not match parallel.tp = {}, "
              "dp = {}, pp = {}",
              tp_->size(), dp_->size(), pp_->size(), plan.mesh.tp, plan.mesh.dp, plan.mesh.pp);
  // Checkpoints store the 16-bit product path this run measured, which a resumed run keeps
  // (the paths round differently in the last bits).
  if (plan.dtypes.mixed()) {
    plan_.settings.gemm16_path = gemm16_.paths.for_dtype(plan.dtypes.compute);
    plan_.config.train.gemm16_path = std::string(kernels::gemm16_path_name(*plan_.settings.gemm16_path));
  }
  OASES_CHECK(plan.settings.plan != plan::LayerPlanSource::automatic,
              "parallel.plan = \"auto\" must be planned before an engine runs (`oases train` "
              "profiles and plans at start-up)");
  // The plan says which buckets ZeRO partitions from the degrees alone; the engine found them
  // from its groups.
  OASES_ASSERT(plan.zero.stage == 0 || plan.zero.partitions == !!zero_.partitions(),
               "the plan says ZeRO {} buckets, the engine partitioned {}",
               plan.zero.partitions ? "partitions" : "partitions no", zero_.cut_buckets().size());
  if (pp_->size() > 1) {
    executor_.set_point_to_point(pp_);
    const auto layout_of_stage = [&](int stage) {
      return model::model_param_layout(plan.config.model, tp_->rank(), tp_->size(),
                                       plan.layer_degrees, plan.pipeline.stage_ranges(stage));
    };
    const model::ParamLayout first_stage = layout_of_stage(0);
    const model::ParamLayout last_stage = layout_of_stage(pp_->size() - 1);
    for (const auto& p : first_stage.params()) {
      for (const auto& q : last_stage.params())
        if (p.name == q.name) tied_params_.push_back(p.name);
    }
  }
  shard_params();
}

void TrainingEngine::for_each_foreign_range(
    int bucket, const std::function<void(std::int64_t, std::int64_t)>& visit) const {
  zero_.for_each_foreign_range(model_.bucket(bucket), visit);
}

comm::Communicator& TrainingEngine::zero_group(int bucket) const { return *zero_groups_.at(bucket); }

TrainingEngine::~TrainingEngine() {
  // The communicators outlive the engine, but not the parameters the gathers write into.
  for (auto& [bucket, gather] : param_gathers_) gather->wait();
}

void TrainingEngine::finish_param_gathers() {
  for (auto& [bucket, gather] : param_gathers_) {
    gather->wait();
    stale_buckets_.erase(bucket);
  }
  param_gathers_.clear();
}

void TrainingEngine::start_param_gather(int bucket) {
  if (!stale_buckets_.contains(bucket) || param_gathers_.contains(bucket)) return;
  const model::Model::Bucket& b = model_.bucket(bucket);
  param_gathers_[bucket] = zero_group(bucket).all_gather_blocks_async(
      model_.compute_params().view(b.begin, {b.end - b.begin}), zero_.counts(bucket));
}

void TrainingEngine::shard_params() {
  finish_param_gathers();
  stale_buckets_.clear();  // whole parameters were written
  if (!plan_.schedule.sharded_params) return;
  for_each_owned_range([&](std::int64_t begin, std::int64_t end) {
    model_.refresh_compute_params(begin, end);
  });
  for (const int id : zero_.cut_buckets()) {
    for_each_foreign_range(id, [&](std::int64_t begin, std::int64_t end) {
      model_.release_compute_params(begin, end);
      if (model_.mixed_precision()) model_.release_master_params(begin, end);
    });
  }
  if (versions_) versions_->release_others();
}

void TrainingEngine::gather_whole_params() {
  finish_param_gathers();
  if (!plan_.schedule.sharded_params && stale_buckets_.empty() && !model_.mixed_precision()) return;
  if (!plan_.schedule.sharded_params && !plan_.schedule.deferred_param_gather) return;
  std::vector<std::unique_ptr<comm::Work>> gathers;
  for (const int id : zero_.cut_buckets()) {
    // Deferred gathers: the master copy's other blocks are stale in every bucket (only the
    // 16-bit copy is gathered ahead of use); without mixed precision only in stale buckets.
    if (plan_.schedule.deferred_param_gather && !model_.mixed_precision() && !stale_buckets_.contains(id))
      continue;
    const model::Model::Bucket& b = model_.bucket(id);
    gathers.push_back(zero_group(id).all_gather_blocks_async(
        model_.params().view(b.begin, {b.end - b.begin}), zero_.counts(id)));
  }
  // 2bw under ZeRO-3: the stashed version, which a checkpoint saves too.
  if (plan_.schedule.sharded_params && versions_) {
    for (const int id : zero_.cut_buckets()) {
      const model::Model::Bucket& b = model_.bucket(id);
      gathers.push_back(zero_group(id).all_gather_blocks_async(
          versions_->older().view(b.begin, {b.end - b.begin}), zero_.counts(id)));
    }
  }
  for (auto& work : gathers) work->wait();
  if (plan_.schedule.deferred_param_gather) {
    model_.refresh_compute_params();
    stale_buckets_.clear();
  }
}

runtime::StepHooks TrainingEngine::with_param_hooks(runtime::StepHooks hooks) {
  if (plan_.schedule.deferred_param_gather) {
    // Only buckets updated since their last gather travel (most are on their way since the
    // update); the others are whole already.
    hooks.gather_params = [this](int bucket) { start_param_gather(bucket); };
    hooks.wait_params = [this](int bucket) {
      const auto gather = param_gathers_.find(bucket);
      if (gather == param_gathers_.end()) return;
      gather->second->wait();
      param_gathers_.erase(gather);
      stale_buckets_.erase(bucket);
    };
    return hooks;
  }
  if (!plan_.schedule.sharded_params) return hooks;
  // Buckets nobody else holds (not partitioned) stay whole: their instructions do nothing.
  hooks.gather_params = [this](int bucket) {
    if (!zero_.is_cut(bucket)) return;
    OASES_ASSERT(!param_gathers_.contains(bucket), "bucket {} gathered twice", bucket);
    const model::Model::Bucket& b = model_.bucket(bucket);
    param_gathers_[bucket] = zero_group(bucket).all_gather_blocks_async(
        model_.compute_params().view(b.begin, {b.end - b.begin}), zero_.counts(bucket));
  };
  hooks.wait_params = [this](int bucket) {
    const auto gather = param_gathers_.find(bucket);
    if (gather == param_gathers_.end()) return;
    gather->second->wait();
    param_gathers_.erase(gather);
  };
  hooks.release_params = [this](int bucket) {
    for_each_foreign_range(bucket, [&](std::int64_t begin, std::int64_t end) {
      model_.release_compute_params(begin, end);
    });
  };
  return hooks;
}

std::unique_ptr<optim::Optimizer> TrainingEngine::make_whole_optimizer() const {
  const optim::FlatLayout whole = flat_layout(model_.layout(), model_.dtype());
  return optim::make_optimizer(plan_.optimizer, whole,
                               shard_reducer(whole, model_.layout(), *tp_, tp_subgroup_));
}

std::unique_ptr<optim::Optimizer> TrainingEngine::make_engine_optimizer() {
  const optim::FlatLayout whole = flat_layout(model_.layout(), model_.dtype());
  const optim::OptimizerConfig settings = plan_.optimizer;
  optim::FlatLayout mine = whole;
  if (plan_.zero.stage > 0) {
    zero_ = ZeroPartition(model_.grad_buckets(), whole, settings,
                          [&](const model::Model::Bucket& b) {
                            comm::Communicator* group = reduction_group(b);
                            if (group != nullptr && group->size() > 1) zero_groups_[b.id] = group;
                            return group ? GroupPlace{group->size(), group->rank()} : GroupPlace{};
                          });
    mine = optim::owned_layout(whole, zero_.owned_ranges(model_.grad_buckets()));
  }
  optim::StateAllocator allocate;
  if (offload_) allocate = [this](std::size_t bytes) { return offload_->allocate(bytes); };
  std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(
      settings, mine, shard_reducer(mine, model_.layout(), *tp_, tp_subgroup_), allocate);
  if (offload_) {
    // What each bucket's update reads from the store: its parameters' state, and with
    // "optimizer+params" its master weights.
    for (const optim::StateTensor& s : optimizer->state_tensors())
      offloaded_ranges_[model_.layout().find(s.param).group].emplace_back(s.view.raw(),
                                                                          s.view.nbytes());
    if (plan_.zero.offload == plan::Offload::optimizer_and_params) {
      for (const model::Model::Bucket& b : model_.grad_buckets()) {
        const Tensor master = model_.params().view(b.begin, {b.end - b.begin});
        offloaded_ranges_[b.id].emplace_back(master.raw(), master.nbytes());
      }
    }
  }
  return optimizer;
}

std::int64_t TrainingEngine::owned_start(const optim::StateTensor& state) const {
  const auto& parts = optimizer_->layout().params;
  const auto part = std::ranges::find(parts, state.param, &optim::ParamSlot::name);
  OASES_ASSERT(part != parts.end() && state.elementwise,
               "optimizer state {} of a part of {} that is not element-wise", state.name,
               state.param);
  return part->offset - model_.layout().find(state.param).offset;
}

void TrainingEngine::save_whole_optimizer_state(
    const std::function<void(optim::Optimizer&)>& save) {
  gather_whole_params();  // ZeRO-3: the checkpoint holds whole parameters
  if (!zero_.partitions()) {
    save(*optimizer_);
    if (offload_) offload_->evict_all();  // what the save read goes back to the store
    return;
  }
  const std::unique_ptr<optim::Optimizer> whole = make_whole_optimizer();
  std::map<std::string, Tensor> whole_views;
  for (const optim::StateTensor& s : whole->state_tensors()) whole_views.emplace(s.name, s.view);
  // Each element of the state is this rank's or zero here; a sum over the owners then leaves
  // every value exactly as its owner holds it.
  for (const optim::StateTensor& s : optimizer_->state_tensors()) {
    const Tensor& target = whole_views.at(s.name);
    kernels::copy(s.view, target.numel() == s.view.numel()
                              ? target.reshaped(s.view.shape())
                              : target.view(owned_start(s), {s.view.numel()}));
  }
  for (const optim::StateTensor& s : whole->state_tensors()) {
    const int bucket = model_.layout().find(s.param).group;
    if (zero_.is_cut(bucket)) zero_group(bucket).all_reduce(s.view, comm::ReduceOp::sum);
  }
  if (offload_) offload_->evict_all();
  save(*whole);
  shard_params();
}

void TrainingEngine::load_whole_optimizer_state(
    const std::function<void(optim::Optimizer&)>& load) {
  finish_param_gathers();
  if (!zero_.partitions()) {
    load(*optimizer_);
    if (offload_) offload_->evict_all();
    return;
  }
  const std::unique_ptr<optim::Optimizer> whole = make_whole_optimizer();
  load(*whole);
  std::map<std::string, Tensor> whole_views;
  for (const optim::StateTensor& s : whole->state_tensors()) whole_views.emplace(s.name, s.view);
  for (const optim::StateTensor& s : optimizer_->state_tensors()) {
    const Tensor& source = whole_views.at(s.name);
    kernels::copy(source.numel() == s.view.numel() ? source.reshaped(s.view.shape())
                                                   : source.view(owned_start(s), {s.view.numel()}),
                  s.view);
  }
  if (offload_) offload_->evict_all();
}

const schedule::Schedule& TrainingEngine::schedule_for(std::int64_t sequences, bool training) {
  const auto key = std::pair{sequences, training};
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  const schedule::ScheduleSpec spec =
      plan_.pass_spec(static_cast<int>(sequences / model_.micro_batch()), training);
  return schedules_.emplace(key, plan::rank_schedule(plan_, model_.program(), spec, pp_->rank()))
      .first->second;
}

double TrainingEngine::run_batches(std::int64_t step, const std::int32_t* inputs,
                                   const std::int32_t* targets, std::int64_t sequences,
                                   std::int64_t first_sample, double loss_scale,
                                   ops::HeadMode mode, const runtime::StepHooks& hooks,
                                   StepResult* result) {
  const std::int64_t mb = model_.micro_batch(), seq = config().model.seq_len;
  OASES_ASSERT(first_sample >= 0, "negative sample index");
  OASES_ASSERT(sequences > 0 && sequences % mb == 0, "{} sequences is not a multiple of the "
               "micro-batch {}", sequences, mb);
  const bool training = mode == ops::HeadMode::train;
  ops::StepContext ctx;
  ctx.step = step;
  ctx.head_mode = mode;
  ctx.dropout_enabled = training;
  ctx.loss_gradient_scale = loss_scale;
  for (std::int64_t row = 0; row < sequences; row += mb) {
    ctx.micro_batches.push_back(
        {inputs + row * seq, targets ? targets + row * seq : nullptr, first_sample + row});
  }
  const schedule::Schedule& schedule = schedule_for(sequences, training);
  model_.loss().reset();
  if (training) model_.reset_moe_stats();
  if (training) model_.zero_grads();
  const runtime::ExecutionStats stats =
      executor_.run(schedule, ctx, with_param_hooks(hooks), listener_);
  // (Deferred gathers started by the run's update travel on into the next run.)
  OASES_ASSERT(!plan_.schedule.sharded_params || param_gathers_.empty(),
               "{} parameter gathers left in flight", param_gathers_.size());
  if (result) {
    result->compute_seconds += stats.compute_seconds;
    result->exposed_comm_seconds += stats.exposed_comm_seconds;
    result->bubble_seconds += stats.bubble_seconds;
    result->comm_seconds += stats.comm_seconds;
    result->exposed_all_to_all_seconds += stats.exposed_all_to_all_seconds;
    result->all_to_all_seconds += stats.all_to_all_seconds;
    result->peak_activation_bytes = std::max(result->peak_activation_bytes, stats.peak_activation_bytes);
  }
  const auto& loss = model_.loss();
  // Only the last pipeline stage holds the head and so the loss.
  OASES_ASSERT(!model_.has_head() || loss.count == counted_targets(targets, sequences * seq),
               "loss counted {} targets, expected {}", loss.count,
               counted_targets(targets, sequences * seq));
  return loss.sum;
}

double TrainingEngine::compute_gradients(std::int64_t step, const std::int32_t* inputs,
                                         const std::int32_t* targets, std::int64_t sequences) {
  const std::int64_t counted = counted_targets(targets, sequences * config().model.seq_len);
  const double scale = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
  return run_batches(step, inputs, targets, sequences, 0, scale, ops::HeadMode::train, {},
                     nullptr) * scale;
}

double TrainingEngine::evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                                std::int64_t sequences) {
  const double local = run_batches(0, inputs, targets, sequences, dp_->rank() * sequences, 1.0,
                                   ops::HeadMode::eval, {}, nullptr);
  const double count = sum_over(*dp_, static_cast<double>(model_.loss().count));
  double loss = count > 0 ? sum_over(*dp_, local) / count : 0.0;
  // Only the last pipeline stage computes the loss.
  if (pp_->size() > 1) pp_->broadcast(Tensor::of(&loss, {1}), pp_->size() - 1);
  return loss;
}

void TrainingEngine::logits(const std::int32_t* inputs, const Tensor& out) {
  ops::StepContext ctx;
  ctx.head_mode = ops::HeadMode::logits;
  ctx.dropout_enabled = false;
  ctx.logits_out = out;
  ctx.micro_batches.push_back({inputs, nullptr, 0});
  executor_.run(schedule_for(model_.micro_batch(), false), ctx, with_param_hooks({}), nullptr);
}

StepResult TrainingEngine::train_step(std::int64_t step, const std::int32_t* inputs,
                                      const std::int32_t* targets, bool drain) {
  if (plan_.pipeline.two_bw()) return train_step_2bw(step, inputs, targets, drain);
  StepResult result;
  runtime::StepHooks hooks;
  // Gradients are scaled by 1 / (counted targets of the global batch), so the sum over
  // replicas is the gradient of the global mean loss (times fp16's loss scale).
  const double loss_scale = scaler_.scale();
  std::vector<std::unique_ptr<comm::Work>> reductions;
  hooks.reduce_grads = [&](int bucket) {
    if (auto work = reduce_bucket(bucket)) reductions.push_back(std::move(work));
    // The bucket's gradients are final: its update's state can start coming back now.
    if (offload_) prefetch_offloaded(bucket);
  };
  hooks.optimizer_step = [&] {
    finish_reductions(reductions, result);
    apply_update(step, loss_scale, result);
  };
  // A causal language model counts every target; a masked one only the masked positions, which
  // differ between data-parallel ranks.
  const std::int64_t local_tokens = local_batch() * config().model.seq_len;
  const double local_counted = static_cast<double>(
      config().model.masked_lm() ? counted_targets(targets, local_tokens) : local_tokens);
  const double counted =
      config().model.masked_lm()
          ? sum_over(*dp_, local_counted)
          : static_cast<double>(config().train.global_batch * config().model.seq_len);
  // Local SGD: each replica's gradient is the mean over its own batch.
  const double gradient_count = plan_.local_sgd ? local_counted : counted;
  const double scale = gradient_count > 0 ? 1.0 / gradient_count : 0.0;
  const double local = run_batches(step, inputs, targets, local_batch(), first_local_sample(),
                                   scale * loss_scale, ops::HeadMode::train, hooks, &result);
  if (plan_.local_sgd && ((step + 1) % plan_.sync_every == 0 || drain))
    result.replica_divergence = average_replicas();
  const std::size_t expected = reduced_bucket_count();
  OASES_ASSERT(reductions.size() == expected, "{} gradient buckets reduced of {}",
               reductions.size(), expected);
  result.loss = counted > 0 ? sum_over(*dp_, local) / counted : 0.0;
  if (pp_->size() > 1) pp_->broadcast(Tensor::of(&result.loss, {1}), pp_->size() - 1);
  result.moe = moe_summary();
  return result;
}

MoeSummary TrainingEngine::moe_summary() {
  MoeSummary summary;
  const model::ModelConfig& c = config().model;
  if (!c.has_moe()) return summary;
  // Per MoE layer: experts' counts, tokens, dropped, groups, aux sum, z sum. Each rank adds
  // the layers it holds; MoE layers run at degree 1, so tensor-parallel ranks route distinct
  // rows and every group sums.
  const auto E = static_cast<std::size_t>(c.experts);
  const std::size_t width = E + 5;
  std::vector<std::int64_t> layers;
  for (std::int64_t l = 0; l < c.layers; ++l)
    if (c.is_moe_layer(l)) layers.push_back(l);
  std::vector<double> packed(layers.size() * width, 0.0);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const ops::MoeLayerStats& s = model_.moe_stats()[static_cast<std::size_t>(layers[i])];
    if (s.tokens_per_expert.size() != E) continue;
    double* row = &packed[i * width];
    std::copy(s.tokens_per_expert.begin(), s.tokens_per_expert.end(), row);
    row[E] = s.tokens;
    row[E + 1] = s.dropped_tokens;
    row[E + 2] = s.groups;
    row[E + 3] = s.aux_sum;
    row[E + 4] = s.z_sum;
  }
  const Tensor all = Tensor::of(packed.data(), {static_cast<std::int64_t>(packed.size())});
  for (comm::Communicator* group : {tp_, dp_, pp_})
    if (group->size() > 1) group->all_reduce(all, comm::ReduceOp::sum);
  double tokens = 0, dropped = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const double* row = &packed[i * width];
    if (row[E + 2] == 0) continue;  // no training forward since the reset
    MoeLayerReport report;
    report.layer = layers[i];
    report.tokens_per_expert_min = *std::min_element(row, row + E);
    report.tokens_per_expert_max = *std::max_element(row, row + E);
    report.dropped_fraction = row[E] > 0 ? row[E + 1] / row[E] : 0;
    report.aux_loss = row[E + 3] / row[E + 2];
    report.z_loss = row[E + 4] / row[E + 2];
    summary.loss += c.moe_aux_loss_coef * report.aux_loss + c.moe_z_loss_coef * report.z_loss;
    tokens += row[E];
    dropped += row[E + 1];
    summary.layers.push_back(report);
  }
  summary.dropped_fraction = tokens > 0 ? dropped / tokens : 0;
  return summary;
}

void TrainingEngine::apply_update(std::int64_t step, double loss_scale, StepResult& result) {
  result.loss_scale = loss_scale;
  if (injected_overflow_step_ == step) {
    const double infinity = std::numeric_limits<double>::infinity();
    kernels::convert(Tensor::of(&infinity, {1}), model_.grads().view(0, {1}));
  }
  result.grad_norm = clip_gradients(loss_scale);
  const bool finite = std::isfinite(result.grad_norm);
  // Every rank holds the same reduced norm, so every rank skips or stops here alike, before
  // any parameter takes a non-finite value.
  if (!finite && plan_.loss_scaling.kind == plan::LossScalingPlan::Kind::none) stop_on_non_finite_gradient(step, result.grad_norm);
  if (!scaler_.update(finite)) {
    result.skipped = true;
    return;
  }
  step_optimizer(step);
}

void TrainingEngine::stop_on_non_finite_gradient(std::int64_t step, double norm) const {
  std::string first = "(none on this rank)";
  for (const auto& p : model_.layout().params()) {
    if (std::isfinite(kernels::sum_of_squares(model_.layout().view(model_.grads(), p)))) continue;
    first = p.name;
    break;
  }
  const auto& t = config().train;
  std::string advice = fmt::format("lower train.lr (now {})", t.lr);
  if (t.warmup_steps == 0) advice += " or warm up to it with train.warmup_steps";
  advice += t.grad_clip > 0
                ? fmt::format("; clipping (train.grad_clip = {}) cannot repair a gradient that is "
                              "already NaN or infinite", t.grad_clip)
                : "; train.grad_clip (e.g. 1.0) keeps large but finite gradients in check";
  OASES_FAIL("training diverged at step {}: the gradient norm is {} (the first parameter with a "
             "non-finite gradient: {}); the update was not applied, so the parameters and every "
             "checkpoint stay finite; {}",
             step + 1, norm, first, advice);
}

std::size_t TrainingEngine::reduced_bucket_count() {
  std::size_t count = 0;
  for (const model::Model::Bucket& b : model_.grad_buckets()) count += reduction_group(b) != nullptr;
  return count;
}

comm::Communicator* TrainingEngine::reduction_group(const model::Model::Bucket& b) {
  // An MoE layer's experts split over expert-parallel ranks: the ranks with the same experts.
  if (b.experts && ep_) {
    comm::Communicator& replicas = expert_replicas_(model_.layer_degree(b.layer));
    return replicas.size() > 1 ? &replicas : nullptr;
  }
  if (b.layer >= 0 && model_.layer_degree(b.layer) < tp_->size()) {
    OASES_ASSERT(tp_replica_group_, "layer {} at degree {} needs the replica groups", b.layer,
                 model_.layer_degree(b.layer));
    return &tp_replica_group_(model_.layer_degree(b.layer));
  }
  return dp_->size() == 1 || plan_.local_sgd ? nullptr : dp_;
}

std::unique_ptr<comm::Work> TrainingEngine::reduce_bucket(int bucket) {
  const model::Model::Bucket& b = model_.bucket(bucket);
  const Tensor grads = model_.grads().view(b.begin, {b.end - b.begin});
  comm::Communicator* group = reduction_group(b);
  if (group == nullptr) return nullptr;
  const bool cut = zero_.is_cut(b.id);
  // ZeRO: each rank receives the sum of its own block only (in place).
  const auto start = [&](const Tensor& buffer) {
    return cut ? group->reduce_scatter_blocks_async(buffer, zero_.counts(b.id), comm::ReduceOp::sum)
               : group->all_reduce_async(buffer, comm::ReduceOp::sum);
  };
  std::unique_ptr<comm::Work> work = plan_.dtypes.gradient_reduce == DType::bf16
                                         ? std::make_unique<Bf16Reduction>(grads, start)
                                         : start(grads);
  if (plan_.zero.stage >= 2 && cut) {
    // ZeRO-2: the other ranks' blocks of a bucket go back to the operating system as soon as
    // its reduction is seen complete (here, as later buckets start, and at the latest when the
    // optimizer step waits for them all).
    release_reduced_blocks(false);
    unreleased_.push_back({work.get(), b.id});
  }
  return work;
}

void TrainingEngine::prefetch_offloaded(int bucket) {
  const auto ranges = offloaded_ranges_.find(bucket);
  if (ranges == offloaded_ranges_.end()) return;
  for (const auto& [data, bytes] : ranges->second) offload_->prefetch(data, bytes);
}

void TrainingEngine::release_reduced_blocks(bool wait) {
  std::erase_if(unreleased_, [&](const UnreleasedBucket& pending) {
    if (!wait && !pending.reduction->test()) return false;
    pending.reduction->wait();  // a bf16 reduction widens its result here
    zero_.for_each_foreign_range(model_.bucket(pending.bucket),
                                 [&](std::int64_t begin, std::int64_t end) {
                                   model_.release_grads(begin, end);
                                 });
    return true;
  });
}

void TrainingEngine::for_each_owned_range(
    const std::function<void(std::int64_t, std::int64_t)>& visit) const {
  zero_.for_each_owned_range(model_.grad_buckets(), visit);
}

void TrainingEngine::finish_reductions(std::vector<std::unique_ptr<comm::Work>>& reductions,
                                       StepResult& result) {
  const Stopwatch waited;
  for (auto& work : reductions) work->wait();
  release_reduced_blocks(true);
  // ZeRO: the two stages holding a tied parameter cut it differently (it sits in different
  // buckets there), so each first gathers its reduced gradient whole over its own group.
  std::vector<std::unique_ptr<comm::Work>> gathers;
  const bool holds_tied = pp_->rank() == 0 || pp_->rank() == pp_->size() - 1;
  for (const std::string& name : holds_tied ? tied_params_ : std::vector<std::string>{}) {
    const model::ParamSpec& p = model_.layout().find(name);
    if (!zero_.is_cut(p.group)) continue;
    std::vector<std::int64_t> counts;
    const std::vector<std::int64_t>& cuts = zero_.cuts(p.group);
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
      counts.push_back(std::max<std::int64_t>(0, std::min(cuts[i + 1], p.offset + p.numel()) -
                                                     std::max(cuts[i], p.offset)));
    gathers.push_back(zero_group(p.group).all_gather_blocks_async(
        model_.layout().view(model_.grads(), p), std::move(counts)));
  }
  for (auto& work : gathers) work->wait();
  sum_tied_gradients();
  result.exposed_comm_seconds += waited.seconds();
}

void TrainingEngine::step_optimizer(std::int64_t step) {
  const optim::StepInfo info{learning_rate(step), step + 1};
  if (plan_.schedule.sharded_params) {
    // ZeRO-3: each rank updates its own blocks; the next forward gathers them where needed.
    for (const model::Model::Bucket& b : model_.grad_buckets())
      optimizer_->step(model_.params(), model_.grads(), b.begin, b.end, info);
    for_each_owned_range([&](std::int64_t begin, std::int64_t end) {
      model_.refresh_compute_params(begin, end);
    });
    if (offload_) offload_->evict_all();
    return;
  }
  if (!zero_.partitions()) {
    optimizer_->step(model_.params(), model_.grads(), info);
    model_.refresh_compute_params();
    if (offload_) offload_->evict_all();
    return;
  }
  if (plan_.schedule.deferred_param_gather) {
    // ZeRO-1 and 2: each bucket's gather starts once its blocks are updated (with mixed
    // precision, those of the 16-bit copy; the master's only for a checkpoint) and is waited
    // for by the next run's schedule.
    for (const model::Model::Bucket& b : model_.grad_buckets()) {
      optimizer_->step(model_.params(), model_.grads(), b.begin, b.end, info);
      if (!zero_.is_cut(b.id)) {
        model_.refresh_compute_params(b.begin, b.end);
        continue;
      }
      const auto block = static_cast<std::size_t>(zero_.block(b.id));
      model_.refresh_compute_params(zero_.cuts(b.id)[block], zero_.cuts(b.id)[block + 1]);
      stale_buckets_.insert(b.id);
      start_param_gather(b.id);
    }
    if (offload_) offload_->evict_all();
    return;
  }
  // ZeRO: bucket by bucket, in the order the next forward reads them, so that the gather of
  // one bucket's updated blocks travels while the next bucket's blocks are updated.
  std::vector<std::unique_ptr<comm::Work>> gathers;
  for (const model::Model::Bucket& b : model_.grad_buckets()) {
    optimizer_->step(model_.params(), model_.grads(), b.begin, b.end, info);
    if (!zero_.is_cut(b.id)) continue;
    gathers.push_back(zero_group(b.id).all_gather_blocks_async(
        model_.params().view(b.begin, {b.end - b.begin}), zero_.counts(b.id)));
  }
  for (auto& work : gathers) work->wait();
  model_.refresh_compute_params();
  // What the step read back from the store goes back to it until the next step.
  if (offload_) offload_->evict_all();
}

void TrainingEngine::sum_tied_gradients() {
  const int last = pp_->size() - 1;
  if (tied_params_.empty() || (pp_->rank() != 0 && pp_->rank() != last)) return;
  const int peer = pp_->rank() == 0 ? last : 0;
  // Both stages add the other's copy to their own: a + b and b + a are the same number, so the
  // copies stay identical.
  for (std::size_t i = 0; i < tied_params_.size(); ++i) {
    const Tensor mine = model_.layout().view(model_.grads(), model_.layout().find(tied_params_[i]));
    Buffer storage(mine.nbytes());
    const Tensor theirs(storage.data(), mine.dtype(), mine.shape());
    // Tags above the pipeline's message slots: under 2bw activations and gradients between
    // these two stages may still be in flight, and must not match these receives.
    const int first_tag = static_cast<int>(local_batch() / model_.micro_batch()) * plan_.schedule.sub_batches;
    const int tag = first_tag + static_cast<int>(i);
    auto sent = pp_->send_async(mine, peer, tag);
    auto received = pp_->recv_async(theirs, peer, tag);
    received->wait();
    sent->wait();
    kernels::add(mine, theirs, mine);
  }
}

double TrainingEngine::model_sum_of_squares(const Tensor& flat) {
  // Every rank of the tensor-parallel group holds the same values for a parameter with one
  // part (replicated, or a layer at degree 1): it counts once. A parameter in k parts is held
  // by tp / k replicas of each part: the first replica (ranks below k) counts it, and the group
  // sums. Under ZeRO (a partitioned bucket) each rank counts only its block, whose values only
  // it holds reduced: a replicated parameter's blocks are summed over the data-parallel group
  // (each tensor-parallel rank holds the same ones); a split parameter's, and every block of a
  // bucket partitioned over a layer's replica group (tensor- and data-parallel ranks at once),
  // over both groups.
  // Under expert parallelism each expert-parallel rank holds other experts (identical on the
  // ranks that replicate them): their squares are summed over the expert-parallel group, split
  // ones (experts of a layer at degree k > 1) over the tensor-parallel group too, from its first
  // k ranks. ZeRO's blocks of them are first summed over the replicas of their shard.
  double sharded = 0, replicated = 0, replicated_blocks = 0, sharded_blocks = 0;
  double experts = 0, expert_shards = 0;
  std::map<int, std::array<double, 2>> expert_blocks;  // by degree: whole, split
  const int first_expert_group = model::expert_group_of(model_.config().layers, 0);
  for (const auto& p : model_.layout().params()) {
    // A tied parameter's copies on the first and last stage hold the same values: the first
    // stage counts it.
    if (pp_->rank() > 0 && std::ranges::find(tied_params_, p.name) != tied_params_.end())
      continue;
    const bool expert = ep_ && p.group >= first_expert_group;
    if (zero_.is_cut(p.group)) {
      const auto block = static_cast<std::size_t>(zero_.block(p.group));
      const std::int64_t lo = std::max(p.offset, zero_.cuts(p.group)[block]);
      const std::int64_t hi = std::min(p.offset + p.numel(), zero_.cuts(p.group)[block + 1]);
      const double squares = lo < hi ? optim::sum_of_squares(flat, lo, hi) : 0.0;
      if (expert) {
        const int degree = model_.layer_degree(p.group - first_expert_group);
        expert_blocks[degree][p.parts == 1 ? 0 : 1] += squares;
        continue;
      }
      (p.parts == 1 && &zero_group(p.group) == dp_ ? replicated_blocks : sharded_blocks) += squares;
      continue;
    }
    const double squares = p.parts == 1 || tp_->rank() < p.parts
                               ? optim::sum_of_squares(flat, p.offset, p.offset + p.numel())
                               : 0.0;
    if (expert) (p.parts == 1 ? experts : expert_shards) += squares;
    else (p.parts == 1 ? replicated : sharded) += squares;
  }
  if (!!zero_.partitions()) {
    double blocks[2] = {replicated_blocks, sharded_blocks};
    dp_->all_reduce(Tensor::of(blocks, {2}), comm::ReduceOp::sum);
    replicated += blocks[0];
    sharded += blocks[1];
  }
  if (ep_) {
    for (auto& [degree, blocks] : expert_blocks) {
      comm::Communicator& replicas = expert_replicas_(degree);
      if (replicas.size() > 1) replicas.all_reduce(Tensor::of(blocks.data(), {2}), comm::ReduceOp::sum);
      experts += blocks[0];
      if (tp_->rank() < degree) expert_shards += blocks[1];
    }
    double totals[2] = {experts, expert_shards};
    ep_->all_reduce(Tensor::of(totals, {2}), comm::ReduceOp::sum);
    replicated += totals[0];
    sharded += totals[1];
  }
  double squares = sum_over(*tp_, sharded) + replicated;
  if (pp_->size() > 1) squares = sum_over(*pp_, squares);
  return squares;
}

double TrainingEngine::average_replicas() {
  const Tensor params = model_.params();
  const double replicas = static_cast<double>(dp_->size());
  Buffer mean_storage(params.nbytes()), difference_storage(params.nbytes());
  const Tensor mean = mean_storage.tensor(params.dtype(), params.shape());
  const Tensor difference = difference_storage.tensor(params.dtype(), params.shape());
  kernels::copy(params, mean);
  dp_->all_reduce(mean, comm::ReduceOp::sum);
  optim::scale(mean, 1.0 / replicas);
  kernels::copy(mean, difference);
  optim::scale(difference, -1.0);
  kernels::add(params, difference, difference);
  const double distance = sum_over(*dp_, model_sum_of_squares(difference)) / replicas;
  const double norm = model_sum_of_squares(mean);
  kernels::copy(mean, params);
  // The optimizer state follows the parameters: each replica's moments (or accumulators) are
  // averaged too, so that the replicas leave the synchronisation identical.
  for (const optim::StateTensor& state : optimizer_->state_tensors()) {
    dp_->all_reduce(state.view, comm::ReduceOp::sum);
    optim::scale(state.view, 1.0 / replicas);
  }
  model_.refresh_compute_params();
  return norm > 0 ? std::sqrt(distance / norm) : 0.0;
}

double TrainingEngine::clip_gradients(double loss_scale) {
  const Tensor grads = model_.grads();
  const double squares = model_sum_of_squares(grads);
  // The norm of the unscaled gradient; unscaling and clipping are one pass over it.
  const double norm = std::sqrt(squares) / loss_scale;
  if (!std::isfinite(norm)) return norm;
  const double clip =
      config().train.grad_clip > 0 ? optim::clip_coefficient(norm, config().train.grad_clip) : 1.0;
  if (config().train.grad_clip > 0 || loss_scale != 1) {
    // Only the blocks this rank updates (all of them without ZeRO): under ZeRO-2 the rest of
    // the array is not even resident.
    for_each_owned_range([&](std::int64_t begin, std::int64_t end) {
      optim::scale(grads.view(begin, {end - begin}), clip / loss_scale);
    });
  }
  return norm;
}

std::size_t TrainingEngine::peak_gathered_param_bytes() {
  if (!plan_.schedule.sharded_params) return 0;
  return zero_.peak_gathered_bytes(schedule_for(local_batch(), true), model_,
                                   dtype_size(model_.compute_params().dtype()));
}

std::size_t TrainingEngine::activation_bytes() {
  return model_.static_activation_bytes() +
         schedule::peak_activation_bytes(model_.program(), schedule_for(local_batch(), true));
}

planner::MemoryFigures TrainingEngine::memory_figures() {
  planner::MemorySizes sizes;
  sizes.params = model_.param_count();
  for_each_owned_range(
      [&](std::int64_t begin, std::int64_t end) { sizes.owned_params += end - begin; });
  sizes.gathered_bytes = peak_gathered_param_bytes();
  sizes.optimizer_state = optimizer_->state_bytes();
  sizes.activations = activation_bytes();
  sizes.offload_store = offload_ ? offload_->allocated_bytes() : 0;
  return planner::memory_figures(plan_.memory_policy(), sizes);
}

const schedule::LoweredRun& TrainingEngine::two_bw_run(schedule::TwoBwRun run) {
  const auto key = std::pair{run.carries_in, run.drains};
  if (auto it = two_bw_runs_.find(key); it != two_bw_runs_.end()) return it->second;
  schedule::ScheduleSpec spec = plan_.schedule;
  spec.micro_batches = static_cast<int>(local_batch() / model_.micro_batch());
  spec.training = true;
  return two_bw_runs_.emplace(key, lower_2bw(spec, run)).first->second;
}

schedule::LoweredRun TrainingEngine::lower_2bw(const schedule::ScheduleSpec& spec,
                                               schedule::TwoBwRun run) const {
  return plan::two_bw_schedule(model_.program(), spec, pp_->size(), pp_->rank(), run);
}

void TrainingEngine::set_stashed_weights(const Tensor& values, std::int64_t steps_done) {
  OASES_ASSERT(plan_.pipeline.two_bw() && !in_flight_step_, "stashed weights set outside a 2bw run or mid-stream");
  versions_ = make_weight_versions(steps_done);
  versions_->set_older(values);
  refresh_held_compute_params();
}

std::unique_ptr<WeightVersions> TrainingEngine::make_weight_versions(std::int64_t newest) const {
  std::vector<WeightVersions::Range> held;
  if (plan_.schedule.sharded_params)
    for_each_owned_range([&](std::int64_t begin, std::int64_t end) { held.emplace_back(begin, end); });
  return std::make_unique<WeightVersions>(model_.params(), newest, std::move(held));
}

void TrainingEngine::refresh_held_compute_params() {
  if (!plan_.schedule.sharded_params) return model_.refresh_compute_params();
  for_each_owned_range([&](std::int64_t begin, std::int64_t end) {
    model_.refresh_compute_params(begin, end);
  });
}

void TrainingEngine::step_2bw_batch(std::vector<std::unique_ptr<comm::Work>>& reductions,
                                    StepResult& result) {
  finish_reductions(reductions, result);
  reductions.clear();
  // W(b + 1) = W(b) - update(gradient of batch b at W(b - 1)): the batch stepped is the newest
  // version's number.
  const std::int64_t batch = versions_->newest();
  result.grad_norm = clip_gradients();
  if (!std::isfinite(result.grad_norm)) stop_on_non_finite_gradient(batch, result.grad_norm);
  versions_->begin_update();
  step_optimizer(batch);
  model_.zero_grads();  // the next batch's backwards accumulate from zero
}

StepResult TrainingEngine::train_step_2bw(std::int64_t step, const std::int32_t* inputs,
                                          const std::int32_t* targets, bool drain) {
  OASES_ASSERT(!in_flight_step_ || *in_flight_step_ + 1 == step,
               "2bw step {} follows step {}, whose last backwards are still in flight", step,
               *in_flight_step_);
  const bool carries_in = in_flight_step_.has_value();
  // Both versions start as the loaded weights (W(-1) = W(0); after a resume without stashed
  // weights, W(step - 1) = W(step)).
  if (!versions_) versions_ = make_weight_versions(step);
  OASES_ASSERT(versions_->newest() == (carries_in ? step - 1 : step),
               "2bw step {} with W({}) the newest weights", step, versions_->newest());
  model_.reset_moe_stats();

  const std::int64_t seq = config().model.seq_len, rows = local_batch();
  const std::int64_t local_tokens = rows * seq;
  const double counted =
      config().model.masked_lm()
          ? sum_over(*dp_, static_cast<double>(counted_targets(targets, local_tokens)))
          : static_cast<double>(config().train.global_batch * seq);
  const double scale = counted > 0 ? 1.0 / counted : 0.0;
  // The batch's tokens stay here until its last backward has run (the next call, at most).
  BatchInFlight& own = batches_[static_cast<std::size_t>(step % 2)];
  own.step = step;
  own.inputs.assign(inputs, inputs + local_tokens);
  own.targets.assign(targets, targets + local_tokens);
  own.context = {};
  own.context.step = step;
  own.context.head_mode = ops::HeadMode::train;
  own.context.dropout_enabled = true;
  own.context.loss_gradient_scale = scale;
  const std::int64_t mb = model_.micro_batch();
  for (std::int64_t row = 0; row < rows; row += mb)
    own.context.micro_batches.push_back(
        {own.inputs.data() + row * seq, own.targets.data() + row * seq, first_local_sample() + row});
  const ops::StepContext& previous =
      carries_in ? batches_[static_cast<std::size_t>((step - 1) % 2)].context : own.context;

  StepResult result;
  std::vector<std::unique_ptr<comm::Work>> reductions;
  std::size_t reduced = 0, updates = 0;
  runtime::StepHooks hooks;
  hooks.reduce_grads = [&](int bucket) {
    if (auto work = reduce_bucket(bucket)) {
      reductions.push_back(std::move(work));
      ++reduced;
    }
    if (offload_) prefetch_offloaded(bucket);
  };
  hooks.optimizer_step = [&] {
    step_2bw_batch(reductions, result);
    ++updates;
  };
  // Batch b of this call is step + b, which computes on W(step + b - 1).
  hooks.use_weights = [&](int batch) {
    versions_->use(step + batch - 1);
    // ZeRO-3: the other ranks' blocks are released here (the schedule's windows end at every
    // UseWeights) and gathered again from the version now in place.
    refresh_held_compute_params();
  };

  const schedule::LoweredRun& run = two_bw_run({carries_in, drain});
  model_.loss().reset();
  if (!carries_in) model_.zero_grads();
  const runtime::ExecutionStats stats =
      executor_.run(run.schedule, own.context, previous, with_param_hooks(hooks), listener_);
  versions_->use(versions_->newest());  // between calls the model holds the newest weights
  refresh_held_compute_params();
  in_flight_step_ = drain ? std::nullopt : std::optional<std::int64_t>(step);

  result.compute_seconds = stats.compute_seconds;
  result.exposed_comm_seconds += stats.exposed_comm_seconds;
  result.bubble_seconds = stats.bubble_seconds;
  result.comm_seconds = stats.comm_seconds;
  result.exposed_all_to_all_seconds = stats.exposed_all_to_all_seconds;
  result.all_to_all_seconds = stats.all_to_all_seconds;
  result.peak_activation_bytes = stats.peak_activation_bytes;
  const std::size_t expected = reduced_bucket_count();
  OASES_ASSERT(reduced == expected * updates, "{} gradient buckets reduced in {} updates of {}",
               reduced, updates, expected);
  const auto& loss = model_.loss();
  OASES_ASSERT(!model_.has_head() || loss.count == counted_targets(targets, local_tokens),
               "loss counted {} targets, expected {}", loss.count,
               counted_targets(targets, local_tokens));
  result.loss = counted > 0 ? sum_over(*dp_, loss.sum) / counted : 0.0;
  if (pp_->size() > 1) pp_->broadcast(Tensor::of(&result.loss, {1}), pp_->size() - 1);
  result.moe = moe_summary();
  return result;
}

}  // namespace oases::train
