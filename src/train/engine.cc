#include "train/engine.h"

#include "core/error.h"
#include "kernels/cpu/optimizer.h"

#include <cmath>
#include <cstring>
#include <numbers>

namespace oases::train {
namespace k = oases::kernels::cpu;

TrainingEngine::TrainingEngine(const RunConfig& config)
    : config_(config),
      model_(config.model, config.train.micro_batch, static_cast<std::uint64_t>(config.train.seed)),
      exp_avg_(static_cast<std::size_t>(model_.param_count()) * sizeof(float)),
      exp_avg_sq_(static_cast<std::size_t>(model_.param_count()) * sizeof(float)),
      tp_("tp"),
      executor_(model_.segments(), tp_),
      shape_(model_.program_shape()) {}

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

double TrainingEngine::run_batches(std::int64_t step, const std::int32_t* inputs,
                                   const std::int32_t* targets, std::int64_t sequences,
                                   ops::HeadMode mode, const runtime::StepHooks& hooks,
                                   StepResult* result) {
  const std::int64_t mb = model_.micro_batch(), seq = config_.model.seq_len;
  OASES_ASSERT(sequences > 0 && sequences % mb == 0, "{} sequences is not a multiple of the "
               "micro-batch {}", sequences, mb);
  const bool training = mode == ops::HeadMode::train;
  ops::StepContext ctx;
  ctx.step = step;
  ctx.head_mode = mode;
  ctx.dropout_enabled = training;
  ctx.loss_gradient_scale = 1.0f / static_cast<float>(sequences * seq);
  const int micro_batches = static_cast<int>(sequences / mb);
  for (int i = 0; i < micro_batches; ++i) {
    const std::int64_t row = i * mb;
    ctx.micro_batches.push_back({inputs + row * seq, targets + row * seq, row});
  }
  // Reused across steps: the schedule depends only on the program and the micro-batch count.
  const schedule::Schedule schedule =
      schedule::megatron_schedule(shape_, micro_batches, training);
  model_.loss().reset();
  if (training) model_.zero_grads();
  const runtime::ExecutionStats stats = executor_.run(schedule, ctx, hooks, trace_);
  if (result) result->exposed_comm_seconds = stats.exposed_comm_seconds;
  const auto& loss = model_.loss();
  OASES_ASSERT(loss.count == sequences * seq, "loss counted {} tokens, expected {}", loss.count,
               sequences * seq);
  return loss.sum / static_cast<double>(loss.count);
}

double TrainingEngine::compute_gradients(std::int64_t step, const std::int32_t* inputs,
                                         const std::int32_t* targets, std::int64_t sequences) {
  return run_batches(step, inputs, targets, sequences, ops::HeadMode::train, {}, nullptr);
}

double TrainingEngine::evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                                std::int64_t sequences) {
  return run_batches(0, inputs, targets, sequences, ops::HeadMode::eval, {}, nullptr);
}

void TrainingEngine::logits(const std::int32_t* inputs, float* out) {
  ops::StepContext ctx;
  ctx.head_mode = ops::HeadMode::logits;
  ctx.dropout_enabled = false;
  ctx.logits_out = out;
  ctx.micro_batches.push_back({inputs, nullptr, 0});
  executor_.run(schedule::megatron_schedule(shape_, 1, false), ctx, {}, nullptr);
}

StepResult TrainingEngine::train_step(std::int64_t step, const std::int32_t* inputs,
                                      const std::int32_t* targets) {
  StepResult result;
  runtime::StepHooks hooks;
  // Data-parallel reduction: a group of one rank has nothing to reduce.
  hooks.reduce_grads = [] {};
  hooks.optimizer_step = [&] {
    result.grad_norm = clip_gradients();
    apply_adamw(step, learning_rate(step));
  };
  result.loss = run_batches(step, inputs, targets, config_.train.global_batch,
                            ops::HeadMode::train, hooks, &result);
  return result;
}

double TrainingEngine::clip_gradients() {
  const float* grads = model_.grads();
  double sum_sq = 0;
  for (const auto& p : model_.layout().params()) sum_sq += k::sum_of_squares(grads + p.offset, p.numel());
  const double norm = std::sqrt(sum_sq);
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

std::size_t TrainingEngine::memory_bytes() const {
  // Parameters, gradients and the two AdamW moments, all fp32, plus the activation arena.
  return 4 * static_cast<std::size_t>(model_.param_count()) * sizeof(float) +
         model_.activation_bytes();
}

}  // namespace oases::train
