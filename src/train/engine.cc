#include "train/engine.h"

#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/optimizer.h"

#include <cmath>
#include <cstring>
#include <numbers>

namespace oases::train {
namespace k = oases::kernels::cpu;

TrainingEngine::TrainingEngine(const RunConfig& config, ParallelGroups groups)
    : config_(config),
      tp_(groups.tp ? groups.tp : &self_tp_),
      dp_(groups.dp ? groups.dp : &self_dp_),
      tp_subgroup_(groups.tp_subgroup),
      tp_replica_group_(groups.tp_replica_group),
      model_(config.model, config.train.micro_batch, static_cast<std::uint64_t>(config.train.seed),
             *tp_, train::schedule_spec(config).sub_batches, layer_degrees(config), tp_subgroup_),
      exp_avg_(static_cast<std::size_t>(model_.param_count()) * sizeof(float)),
      exp_avg_sq_(static_cast<std::size_t>(model_.param_count()) * sizeof(float)),
      spec_(train::schedule_spec(config)),
      executor_(model_.segments(), *tp_, model_.activations(), model_.static_activation_bytes()) {
  OASES_CHECK(config.train.global_batch % (config.train.micro_batch * dp_->size()) == 0,
              "train.global_batch = {} must be a multiple of train.micro_batch x dp = {} x {}",
              config.train.global_batch, config.train.micro_batch, dp_->size());
}

double TrainingEngine::learning_rate(std::int64_t step) const {
  const auto& t = config_.train;
  if (step < t.warmup_steps)
    return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  const std::int64_t decay_steps = (t.lr_decay_steps > 0 ? t.lr_decay_steps : t.steps) - t.warmup_steps;
  if (decay_steps <= 0) return t.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - t.warmup_steps) / static_cast<double>(decay_steps));
  return t.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (t.lr - t.min_lr);
}

const schedule::Schedule& TrainingEngine::schedule_for(std::int64_t sequences, bool training) {
  const auto key = std::pair{sequences, training};
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  schedule::ScheduleSpec spec = spec_;
  spec.micro_batches = static_cast<int>(sequences / model_.micro_batch());
  spec.training = training;
  schedule::Schedule schedule = schedule::generate(model_.program(), spec);
  schedule::verify_schedule(model_.program(), spec, schedule);
  return schedules_.emplace(key, std::move(schedule)).first->second;
}

double TrainingEngine::run_batches(std::int64_t step, const std::int32_t* inputs,
                                   const std::int32_t* targets, std::int64_t sequences,
                                   std::int64_t first_sample, float loss_scale,
                                   ops::HeadMode mode, const runtime::StepHooks& hooks,
                                   StepResult* result) {
  const std::int64_t mb = model_.micro_batch(), seq = config_.model.seq_len;
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
  if (training) model_.zero_grads();
  const runtime::ExecutionStats stats = executor_.run(schedule, ctx, hooks, trace_);
  if (result) {
    result->compute_seconds += stats.compute_seconds;
    result->exposed_comm_seconds += stats.exposed_comm_seconds;
    result->comm_seconds += stats.comm_seconds;
    result->peak_activation_bytes = std::max(result->peak_activation_bytes, stats.peak_activation_bytes);
  }
  const auto& loss = model_.loss();
  OASES_ASSERT(loss.count == sequences * seq, "loss counted {} tokens, expected {}", loss.count,
               sequences * seq);
  return loss.sum;
}

namespace {
// Sum of a double over a group (loss sums are reduced in double to keep their digits).
double sum_over(comm::Communicator& group, double value) {
  group.all_reduce(Tensor::of(&value, {1}), comm::ReduceOp::sum);
  return value;
}
}  // namespace

double TrainingEngine::compute_gradients(std::int64_t step, const std::int32_t* inputs,
                                         const std::int32_t* targets, std::int64_t sequences) {
  const std::int64_t tokens = sequences * config_.model.seq_len;
  return run_batches(step, inputs, targets, sequences, 0, 1.0f / static_cast<float>(tokens),
                     ops::HeadMode::train, {}, nullptr) /
         static_cast<double>(tokens);
}

double TrainingEngine::evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                                std::int64_t sequences) {
  const double local = run_batches(0, inputs, targets, sequences, dp_->rank() * sequences, 1.0f,
                                   ops::HeadMode::eval, {}, nullptr);
  return sum_over(*dp_, local) /
         static_cast<double>(sequences * dp_->size() * config_.model.seq_len);
}

void TrainingEngine::logits(const std::int32_t* inputs, float* out) {
  ops::StepContext ctx;
  ctx.head_mode = ops::HeadMode::logits;
  ctx.dropout_enabled = false;
  ctx.logits_out = out;
  ctx.micro_batches.push_back({inputs, nullptr, 0});
  executor_.run(schedule_for(model_.micro_batch(), false), ctx, {}, nullptr);
}

StepResult TrainingEngine::train_step(std::int64_t step, const std::int32_t* inputs,
                                      const std::int32_t* targets) {
  StepResult result;
  runtime::StepHooks hooks;
  // Gradients are scaled by 1 / (tokens of the global batch), so the sum over replicas is the
  // gradient of the global mean loss. A layer below the full degree sums over its replicas in
  // this tensor-parallel group and in every data-parallel one at once (one group); the other
  // buckets over the data-parallel group.
  std::vector<std::unique_ptr<comm::Work>> reductions;
  hooks.reduce_grads = [&](int bucket) {
    if (auto work = reduce_over_replicas(bucket)) {
      reductions.push_back(std::move(work));
      return;
    }
    if (dp_->size() == 1) return;
    const auto [begin, end] = model_.grad_buckets()[static_cast<std::size_t>(bucket)];
    reductions.push_back(dp_->all_reduce_async(Tensor::of(model_.grads() + begin, {end - begin}),
                                               comm::ReduceOp::sum));
  };
  hooks.optimizer_step = [&] {
    const Stopwatch waited;
    for (auto& work : reductions) work->wait();
    result.exposed_comm_seconds += waited.seconds();
    result.grad_norm = clip_gradients();
    apply_adamw(step, learning_rate(step));
  };
  const std::int64_t global_tokens = config_.train.global_batch * config_.model.seq_len;
  const double local = run_batches(step, inputs, targets, local_batch(), first_local_sample(),
                                   1.0f / static_cast<float>(global_tokens), ops::HeadMode::train,
                                   hooks, &result);
  std::size_t expected = 0;
  for (std::size_t b = 0; b < model_.grad_buckets().size(); ++b) {
    const auto layer = static_cast<std::int64_t>(b) - 1;
    const bool replicated = layer >= 0 && layer < config_.model.layers &&
                            model_.layer_degree(layer) < tp_->size();
    expected += replicated || dp_->size() > 1;
  }
  OASES_ASSERT(reductions.size() == expected, "{} gradient buckets reduced of {}",
               reductions.size(), expected);
  result.loss = sum_over(*dp_, local) / static_cast<double>(global_tokens);
  return result;
}

std::unique_ptr<comm::Work> TrainingEngine::reduce_over_replicas(int bucket) {
  const std::int64_t layer = bucket - 1;
  const int degree = model_.layer_degree(layer);
  if (layer < 0 || layer >= config_.model.layers || degree == tp_->size()) return nullptr;
  const auto [begin, end] = model_.grad_buckets()[static_cast<std::size_t>(bucket)];
  OASES_ASSERT(tp_replica_group_, "layer {} at degree {} needs the replica groups", layer, degree);
  return tp_replica_group_(degree).all_reduce_async(Tensor::of(model_.grads() + begin, {end - begin}), comm::ReduceOp::sum);
}

double TrainingEngine::clip_gradients() {
  const float* grads = model_.grads();
  // Every rank of the tensor-parallel group holds the same gradient for a parameter with one
  // part (replicated, or a layer at degree 1): it counts once. A parameter in k parts is held
  // by tp / k replicas of each part: the first replica (ranks below k) counts it, and the group
  // sums.
  double sharded = 0, replicated = 0;
  for (const auto& p : model_.layout().params()) {
    if (p.parts == 1) replicated += k::sum_of_squares(grads + p.offset, p.numel());
    else if (tp_->rank() < p.parts) sharded += k::sum_of_squares(grads + p.offset, p.numel());
  }
  const double norm = std::sqrt(sum_over(*tp_, sharded) + replicated);
  if (config_.train.grad_clip > 0) {
    const auto factor = static_cast<float>(k::clip_coefficient(norm, config_.train.grad_clip));
    k::scale_in_place(model_.grads(), model_.param_count(), factor);
  }
  return norm;
}

void TrainingEngine::apply_adamw(std::int64_t step, double lr) {
  const auto& t = config_.train;
  float* params = model_.params();
  const float* grads = model_.grads();
  for (const auto& p : model_.layout().params()) {
    k::AdamWStep hp{lr, t.beta1, t.beta2, t.eps, p.weight_decay ? t.weight_decay : 0.0, step + 1};
    k::adamw_update(params + p.offset, grads + p.offset, exp_avg() + p.offset,
                    exp_avg_sq() + p.offset, p.numel(), hp);
  }
}

}  // namespace oases::train

namespace oases::train {

std::size_t TrainingEngine::activation_bytes() {
  return model_.static_activation_bytes() +
         schedule::peak_activation_bytes(model_.program(), schedule_for(local_batch(), true));
}

std::size_t TrainingEngine::memory_bytes() {
  // Parameters, gradients and the two AdamW moments, all fp32, plus activations.
  return 4 * static_cast<std::size_t>(model_.param_count()) * sizeof(float) + activation_bytes();
}

}  // namespace oases::train
