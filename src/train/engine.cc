#include "train/engine.h"

#include "core/error.h"
#include "core/timer.h"
#include "optim/clip.h"
#include "optim/zero_partition.h"
#include "plan/rank_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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
  o.cp = groups.cp;
  o.tp_subgroup = groups.tp_subgroup;
  if (offload != nullptr && plan.zero.offload == plan::Offload::optimizer_and_params)
    o.allocate_params = [offload](std::size_t bytes) { return offload->allocate(bytes); };
  return o;
}

std::int64_t size_of(const comm::Communicator* group) { return group ? group->size() : 1; }

// UserError unless the groups hold tp, dp and pp ranks (a null group: one).
void check_group_sizes(const ParallelGroups& groups, std::int64_t tp, std::int64_t dp,
                       std::int64_t pp) {
  OASES_CHECK(size_of(groups.tp) == tp && size_of(groups.dp) == dp && size_of(groups.pp) == pp,
              "the engine's groups (tp {}, replicas {}, pp {} ranks) do not match parallel.tp = "
              "{}, cp x dp = {}, pp = {}",
              size_of(groups.tp), size_of(groups.dp), size_of(groups.pp), tp, dp, pp);
}

// The world rank whose plan the engine runs: where the groups place this process, laid out as
// the mesh lays ranks out. UserError when a group's size is not the config's degree.
int rank_of_groups(const plan::RunConfig& config, const ParallelGroups& groups) {
  const auto rank_of = [](const comm::Communicator* group) { return group ? group->rank() : 0; };
  const auto& p = config.parallel;
  check_group_sizes(groups, p.tp, p.cp * p.dp, p.pp);
  return rank_of(groups.tp) +
         static_cast<int>(p.tp) *
             (rank_of(groups.dp) + static_cast<int>(p.cp * p.dp) * rank_of(groups.pp));
}

// `plan`, once the groups are checked against its mesh: before anything is built over them.
const plan::RunPlan& checked_against_groups(const plan::RunPlan& plan,
                                            const ParallelGroups& groups) {
  check_group_sizes(groups, plan.mesh.tp, plan.mesh.replicas(), plan.mesh.pp);
  return plan;
}

// The groups gradients are summed over: tp, dp and pp resolved (groups of one where the
// caller gave none), experts split only over more than one rank.
GradientGroups gradient_groups(comm::Communicator& tp, comm::Communicator& dp,
                               comm::Communicator& pp, const ParallelGroups& groups) {
  GradientGroups g;
  g.tp = &tp;
  g.dp = &dp;
  g.pp = &pp;
  g.ep = groups.ep && groups.ep->size() > 1 ? groups.ep : nullptr;
  g.tp_replica_group = groups.tp_replica_group;
  g.expert_replicas = g.ep ? groups.expert_replicas : nullptr;
  return g;
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

// Targets of `count` tokens that enter the loss.
std::int64_t counted_targets(const std::int32_t* targets, std::int64_t count) {
  return std::count_if(targets, targets + count, [](std::int32_t t) { return t >= 0; });
}

// Adds one executor run's measures to a step's.
void add_stats(const runtime::ExecutionStats& stats, StepResult& result) {
  result.compute_seconds += stats.compute_seconds;
  result.exposed_comm_seconds += stats.exposed_comm_seconds;
  result.bubble_seconds += stats.bubble_seconds;
  result.comm_seconds += stats.comm_seconds;
  result.exposed_all_to_all_seconds += stats.exposed_all_to_all_seconds;
  result.all_to_all_seconds += stats.all_to_all_seconds;
  result.exposed_cp_seconds += stats.exposed_cp_seconds;
  result.cp_seconds += stats.cp_seconds;
  result.peak_activation_bytes = std::max(result.peak_activation_bytes, stats.peak_activation_bytes);
}

}  // namespace

TrainingEngine::TrainingEngine(const plan::RunConfig& config, ParallelGroups groups)
    : TrainingEngine(plan::make_run_plan(config, rank_of_groups(config, groups)), groups) {}

TrainingEngine::TrainingEngine(const plan::RunPlan& plan, ParallelGroups groups)
    : plan_(checked_against_groups(plan, groups)),
      tp_(groups.tp ? groups.tp : &self_tp_),
      dp_(groups.dp ? groups.dp : &self_dp_),
      pp_(groups.pp ? groups.pp : &self_pp_),
      precision_(plan_, *tp_, *dp_, *pp_),
      tp_subgroup_(groups.tp_subgroup),
      offload_(plan.zero.offload == plan::Offload::none
                   ? nullptr
                   : std::make_unique<OffloadStore>(plan.zero.offload_dir,
                                                    "parallel.offload_dir")),
      model_(plan.config.model,
             model_options(plan, *tp_, groups, precision_.gemm16().paths, offload_.get())),
      reduction_(plan_, model_, gradient_groups(*tp_, *dp_, *pp_, groups)),
      zero_(plan_, model_, flat_layout(model_.layout(), model_.dtype()),
            [this](const model::Model::Bucket& b) { return reduction_.group_of(b); }),
      optimizer_(make_engine_optimizer()),
      // With train.lr = 0 (Adafactor's relative step) every rate is 0, min_lr included.
      lr_schedule_{plan.config.train.lr, plan.config.train.lr == 0 ? 0.0 : plan.config.train.min_lr,
                   plan.config.train.warmup_steps, plan.config.train.lr_decay_steps,
                   plan.config.train.steps},
      executor_(model_.segments(), model_.program(), model_.activations(),
                model_.static_activation_bytes(), runtime::ExecutorOptions{plan.stream_mode, plan.compute_delay_s}),
      local_sgd_(plan_),
      two_bw_(plan_, model_, zero_, pp_->rank(), pp_->size()) {
  precision_.pin_gemm16_path(plan_);
  OASES_CHECK(plan.settings.plan != plan::LayerPlanSource::automatic,
              "parallel.plan = \"auto\" must be planned before an engine runs (`oases train` "
              "profiles and plans at start-up)");
  // The plan says which buckets ZeRO partitions from the degrees alone; the engine found them
  // from its groups.
  OASES_ASSERT(plan.zero.stage == 0 || plan.zero.partitions == zero_.partitions(),
               "the plan says ZeRO {} buckets, the engine partitioned {}",
               plan.zero.partitions ? "partitions" : "partitions no",
               zero_.partition().cut_buckets().size());
  if (pp_->size() > 1) executor_.set_point_to_point(pp_);
  shard_params();
}

TrainingEngine::~TrainingEngine() = default;

std::unique_ptr<optim::Optimizer> TrainingEngine::make_whole_optimizer() const {
  const optim::FlatLayout whole = flat_layout(model_.layout(), model_.dtype());
  return optim::make_optimizer(plan_.optimizer, whole,
                               shard_reducer(whole, model_.layout(), *tp_, tp_subgroup_));
}

std::unique_ptr<optim::Optimizer> TrainingEngine::make_engine_optimizer() {
  const optim::FlatLayout whole = flat_layout(model_.layout(), model_.dtype());
  const optim::FlatLayout mine =
      plan_.zero.stage > 0 ? optim::owned_layout(whole, zero_.owned_ranges()) : whole;
  optim::StateAllocator allocate;
  if (offload_) allocate = [this](std::size_t bytes) { return offload_->allocate(bytes); };
  std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(
      plan_.optimizer, mine, shard_reducer(mine, model_.layout(), *tp_, tp_subgroup_), allocate);
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

void TrainingEngine::shard_params() {
  zero_.shard_params();
  if (zero_.params_sharded()) two_bw_.release_others();
}

void TrainingEngine::gather_whole_params() {
  zero_.gather_whole_params(two_bw_.stashed_weights());
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
  zero_.gather_whole_state(*optimizer_, *whole);
  if (offload_) offload_->evict_all();
  save(*whole);
  shard_params();
}

void TrainingEngine::load_whole_optimizer_state(
    const std::function<void(optim::Optimizer&)>& load) {
  zero_.finish_param_gathers();
  if (!zero_.partitions()) {
    load(*optimizer_);
    if (offload_) offload_->evict_all();
    return;
  }
  const std::unique_ptr<optim::Optimizer> whole = make_whole_optimizer();
  load(*whole);
  zero_.keep_owned_state(*whole, *optimizer_);
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
  const std::int64_t mb = model_.micro_batch(), seq = model_.context().seq_len;
  inputs = own_tokens(inputs, sequences, own_inputs_);
  targets = own_tokens(targets, sequences, own_targets_);
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
      executor_.run(schedule, ctx, zero_.with_param_hooks(hooks), listener_);
  // (Deferred gathers started by the run's update travel on into the next run.)
  OASES_ASSERT(!plan_.schedule.sharded_params || zero_.gathers_in_flight() == 0,
               "{} parameter gathers left in flight", zero_.gathers_in_flight());
  if (result) add_stats(stats, *result);
  check_loss_count(targets, sequences);
  return model_.loss().sum;
}

const std::int32_t* TrainingEngine::own_tokens(const std::int32_t* tokens, std::int64_t sequences,
                                               std::vector<std::int32_t>& own) const {
  const ops::ModelContext& m = model_.context();
  if (tokens == nullptr || m.cp_size() == 1) return tokens;
  own.resize(static_cast<std::size_t>(sequences * m.seq_len));
  for (std::int64_t row = 0; row < sequences; ++row)
    for (std::int64_t local = 0; local < m.seq_len; ++local)
      own[static_cast<std::size_t>(row * m.seq_len + local)] =
          tokens[row * m.full_seq_len + m.position(local)];
  return own.data();
}

void TrainingEngine::check_loss_count(const std::int32_t* targets, std::int64_t sequences) {
  const std::int64_t tokens = sequences * model_.context().seq_len;
  // Only the last pipeline stage holds the head and so the loss.
  OASES_ASSERT(!model_.has_head() || model_.loss().count == counted_targets(targets, tokens),
               "loss counted {} targets, expected {}", model_.loss().count,
               counted_targets(targets, tokens));
}

TrainingEngine::TargetCounts TrainingEngine::count_targets(const std::int32_t* targets) {
  // Under context parallelism a rank counts the targets of its own chunks. Any model may be
  // given targets that do not count (masked-language modelling; a shard's loss mask), and
  // their number differs between data-parallel ranks, so the global count is their sum.
  const std::int64_t local_tokens = local_batch() * model_.context().seq_len;
  TargetCounts counts;
  counts.local = static_cast<double>(
      counted_targets(own_tokens(targets, local_batch(), own_targets_), local_tokens));
  counts.global = sum_over(*dp_, counts.local);
  return counts;
}

void TrainingEngine::report_loss(double local_sum, double counted, StepResult& result) {
  result.loss = counted > 0 ? sum_over(*dp_, local_sum) / counted : 0.0;
  if (pp_->size() > 1) pp_->broadcast(Tensor::of(&result.loss, {1}), pp_->size() - 1);
  result.moe = moe_summary();
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
  executor_.run(schedule_for(model_.micro_batch(), false), ctx, zero_.with_param_hooks({}),
                nullptr);
}

StepResult TrainingEngine::train_step(std::int64_t step, const std::int32_t* inputs,
                                      const std::int32_t* targets, bool drain) {
  if (plan_.pipeline.two_bw()) return train_step_2bw(step, inputs, targets, drain);
  StepResult result;
  runtime::StepHooks hooks;
  // Gradients are scaled by 1 / (counted targets of the global batch), so the sum over
  // replicas is the gradient of the global mean loss (times fp16's loss scale).
  const double loss_scale = precision_.loss_scale();
  std::vector<std::unique_ptr<comm::Work>> reductions;
  hooks.reduce_grads = [&](int bucket) { reduce_grads(bucket, reductions); };
  hooks.optimizer_step = [&] {
    finish_reductions(reductions, result);
    apply_update(step, loss_scale, result);
  };
  const TargetCounts counted = count_targets(targets);
  // Local SGD: each replica's gradient is the mean over its own batch.
  const double gradient_count = local_sgd_.gradient_count(counted.local, counted.global);
  const double scale = gradient_count > 0 ? 1.0 / gradient_count : 0.0;
  const double local = run_batches(step, inputs, targets, local_batch(), first_local_sample(),
                                   scale * loss_scale, ops::HeadMode::train, hooks, &result);
  if (local_sgd_.averages_after(step, drain)) result.replica_divergence = average_replicas();
  const std::size_t expected = reduction_.reduced_bucket_count();
  OASES_ASSERT(reductions.size() == expected, "{} gradient buckets reduced of {}",
               reductions.size(), expected);
  report_loss(local, counted.global, result);
  return result;
}

StepResult TrainingEngine::train_step_2bw(std::int64_t step, const std::int32_t* inputs,
                                          const std::int32_t* targets, bool drain) {
  const bool carries_in = two_bw_.begin(step);
  model_.reset_moe_stats();
  const TargetCounts counted = count_targets(targets);
  const double scale = counted.global > 0 ? 1.0 / counted.global : 0.0;
  const TwoBwSteps::Batches batches =
      two_bw_.stage_batch(step, inputs, targets, first_local_sample(), scale, carries_in);

  StepResult result;
  std::vector<std::unique_ptr<comm::Work>> reductions;
  std::size_t reduced = 0, updates = 0;
  runtime::StepHooks hooks;
  hooks.reduce_grads = [&](int bucket) { reduced += reduce_grads(bucket, reductions) ? 1 : 0; };
  hooks.optimizer_step = [&] {
    step_2bw_batch(reductions, result);
    ++updates;
  };
  // Batch b of this call is step + b, which computes on W(step + b - 1).
  hooks.use_weights = [&](int batch) { two_bw_.use_weights(step + batch - 1); };

  const schedule::LoweredRun& run = two_bw_.run({carries_in, drain});
  model_.loss().reset();
  if (!carries_in) model_.zero_grads();
  add_stats(executor_.run(run.schedule, *batches.own, *batches.previous,
                          zero_.with_param_hooks(hooks), listener_),
            result);
  two_bw_.end(step, drain);

  const std::size_t expected = reduction_.reduced_bucket_count();
  OASES_ASSERT(reduced == expected * updates, "{} gradient buckets reduced in {} updates of {}",
               reduced, updates, expected);
  check_loss_count(targets, local_batch());
  report_loss(model_.loss().sum, counted.global, result);
  return result;
}

void TrainingEngine::step_2bw_batch(std::vector<std::unique_ptr<comm::Work>>& reductions,
                                    StepResult& result) {
  finish_reductions(reductions, result);
  reductions.clear();
  // W(b + 1) = W(b) - update(gradient of batch b at W(b - 1)): the batch stepped is the newest
  // version's number.
  const std::int64_t batch = two_bw_.newest();
  result.grad_norm = clip_gradients();
  if (!std::isfinite(result.grad_norm))
    precision_.stop_on_non_finite_gradient(batch, result.grad_norm, model_);
  two_bw_.begin_update();
  step_optimizer(batch);
  model_.zero_grads();  // the next batch's backwards accumulate from zero
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

bool TrainingEngine::reduce_grads(int bucket, std::vector<std::unique_ptr<comm::Work>>& reductions) {
  reduction_.sum_token_shard_gradients(bucket);
  std::unique_ptr<comm::Work> work = reduce_bucket(bucket);
  const bool started = work != nullptr;
  if (started) reductions.push_back(std::move(work));
  // The bucket's gradients are final: its update's state can start coming back now.
  if (offload_) prefetch_offloaded(bucket);
  return started;
}

std::unique_ptr<comm::Work> TrainingEngine::reduce_bucket(int bucket) {
  const model::Model::Bucket& b = model_.bucket(bucket);
  comm::Communicator* group = reduction_.group_of(b);
  if (group == nullptr) return nullptr;
  const Tensor grads = model_.grads().view(b.begin, {b.end - b.begin});
  const comm::IssuerLabel label(*group, fmt::format("ReduceGrads(bucket={})", bucket));
  std::unique_ptr<comm::Work> work = precision_.start_reduction(grads, [&](const Tensor& buffer) {
    return zero_.start_reduction(b.id, *group, buffer);
  });
  zero_.track_reduction(work.get(), b.id);
  return work;
}

void TrainingEngine::prefetch_offloaded(int bucket) {
  const auto ranges = offloaded_ranges_.find(bucket);
  if (ranges == offloaded_ranges_.end()) return;
  for (const auto& [data, bytes] : ranges->second) offload_->prefetch(data, bytes);
}

void TrainingEngine::finish_reductions(std::vector<std::unique_ptr<comm::Work>>& reductions,
                                       StepResult& result) {
  const Stopwatch waited;
  for (auto& work : reductions) work->wait();
  zero_.release_reduced_blocks(true);
  // ZeRO: the two stages holding a tied parameter cut it differently (it sits in different
  // buckets there), so each first gathers its reduced gradient whole over its own group.
  zero_.gather_whole_gradients(reduction_.tied_params_here());
  reduction_.sum_tied_gradients();
  result.exposed_comm_seconds += waited.seconds();
}

void TrainingEngine::apply_update(std::int64_t step, double loss_scale, StepResult& result) {
  result.loss_scale = loss_scale;
  precision_.inject_overflow_if_due(step, model_.grads());
  result.grad_norm = clip_gradients(loss_scale);
  // Every rank holds the same reduced norm, so every rank skips or stops here alike, before
  // any parameter takes a non-finite value.
  if (!precision_.admit_update(step, result.grad_norm, model_)) {
    result.skipped = true;
    return;
  }
  step_optimizer(step);
}

double TrainingEngine::clip_gradients(double loss_scale) {
  const Tensor grads = model_.grads();
  const double squares = reduction_.sum_of_squares(grads, zero_);
  // The norm of the unscaled gradient; unscaling and clipping are one pass over it.
  const double norm = std::sqrt(squares) / loss_scale;
  if (!std::isfinite(norm)) return norm;
  const double clip =
      config().train.grad_clip > 0 ? optim::clip_coefficient(norm, config().train.grad_clip) : 1.0;
  if (config().train.grad_clip > 0 || loss_scale != 1) {
    // Only the blocks this rank updates (all of them without ZeRO): under ZeRO-2 the rest of
    // the array is not even resident.
    zero_.for_each_owned_range([&](std::int64_t begin, std::int64_t end) {
      optim::scale(grads.view(begin, {end - begin}), clip / loss_scale);
    });
  }
  return norm;
}

void TrainingEngine::step_optimizer(std::int64_t step) {
  zero_.step(*optimizer_, optim::StepInfo{learning_rate(step), step + 1});
  // What the step read back from the store goes back to it until the next step.
  if (offload_) offload_->evict_all();
}

double TrainingEngine::average_replicas() {
  const double divergence = local_sgd_.average(
      model_.params(), optimizer_->state_tensors(), *dp_,
      [this](const Tensor& flat) { return reduction_.sum_of_squares(flat, zero_); });
  model_.refresh_compute_params();
  return divergence;
}

std::size_t TrainingEngine::peak_gathered_param_bytes() {
  if (!zero_.params_sharded()) return 0;
  return zero_.peak_gathered_bytes(schedule_for(local_batch(), true));
}

std::size_t TrainingEngine::activation_bytes() {
  return model_.static_activation_bytes() +
         schedule::peak_activation_bytes(model_.program(), schedule_for(local_batch(), true));
}

planner::MemoryFigures TrainingEngine::memory_figures() {
  planner::MemorySizes sizes;
  sizes.params = model_.param_count();
  zero_.for_each_owned_range(
      [&](std::int64_t begin, std::int64_t end) { sizes.owned_params += end - begin; });
  sizes.gathered_bytes = peak_gathered_param_bytes();
  sizes.optimizer_state = optimizer_->state_bytes();
  sizes.activations = activation_bytes();
  sizes.offload_store = offload_ ? offload_->allocated_bytes() : 0;
  return planner::memory_figures(plan_.memory_policy(), sizes);
}

void TrainingEngine::set_stashed_weights(const Tensor& values, std::int64_t steps_done) {
  two_bw_.set_stashed_weights(values, steps_done);
}

}  // namespace oases::train
