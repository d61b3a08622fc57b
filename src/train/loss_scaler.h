// LossScaler: the factor an fp16 run multiplies its loss by before backward, so that small
// gradients stay above fp16's smallest normal number, and the rule that moves it.
//
// The rule is Megatron-LM's dynamic scaler (and torch.cuda.amp.GradScaler's, plus hysteresis):
//   - a step whose gradients hold an inf or a NaN is skipped (no optimizer update) and counted;
//     it resets the run of clean steps and uses up one unit of hysteresis; once hysteresis is
//     used up (<= 0) the scale backs off: scale = max(scale x backoff_factor, min_scale), and
//     every further overflow backs off again until the scale grows;
//   - after `window` consecutive clean steps the scale grows: scale x growth_factor, and the
//     hysteresis is refilled.
// A constant scaler (Megatron's --loss-scale) never moves, but still skips and counts steps
// with non-finite gradients. bf16, fp32 and fp64 runs use the identity scaler (scale 1, every
// step applied unless its gradients are non-finite).
//
// The state (scale, clean-step count, hysteresis left, skipped steps) is what a checkpoint
// stores; restoring it resumes the same sequence of scales bit for bit.
//
// Example:
//   LossScaler scaler = LossScaler::dynamic({});
//   loss_gradient_seed = scaler.scale() / tokens;        ... backward ...
//   const bool apply = scaler.update(std::isfinite(global_grad_norm_of_scaled_grads));
//   if (apply) { unscale grads by 1 / scale_used; clip; optimizer step; }
#pragma once

#include <cstdint>
#include <string>

namespace oases::train {

// Settings of the dynamic rule; names as their [train] keys.
struct DynamicLossScale {
  double initial_scale = 65536;   // train.initial_loss_scale: 2^16
  std::int64_t window = 1000;     // train.loss_scale_window: clean steps before the scale grows
  double min_scale = 1;           // train.min_loss_scale
  std::int64_t hysteresis = 2;    // train.hysteresis: overflows tolerated before backing off
  double growth_factor = 2;
  double backoff_factor = 0.5;
};

// What a checkpoint keeps of a scaler.
struct LossScaleState {
  double scale = 1;
  std::int64_t clean_steps = 0;     // consecutive steps with finite gradients since the last
                                    // growth or overflow
  std::int64_t hysteresis_left = 0;
  std::int64_t skipped_steps = 0;   // steps skipped for non-finite gradients, in all
};

class LossScaler {
 public:
  // REQUIRES (InternalError otherwise; the config reports user settings first): min_scale >= 1,
  // initial_scale >= min_scale, window >= 1, hysteresis >= 1, growth_factor > 1,
  // backoff_factor in (0, 1).
  static LossScaler dynamic(const DynamicLossScale& settings);
  // REQUIRES: scale >= 1.
  static LossScaler constant(double scale);
  // Scale 1: for precisions that need no scaling.
  static LossScaler identity() { return constant(1); }

  bool is_dynamic() const { return dynamic_; }
  // The factor for the coming step's loss.
  double scale() const { return state_.scale; }
  std::int64_t skipped_steps() const { return state_.skipped_steps; }

  // Records the outcome of the step that ran at scale(): `gradients_finite` is false when any
  // gradient element (on any rank) is an inf or a NaN. Returns whether the step's update is to
  // be applied (exactly when the gradients are finite), and moves the scale by the rule above.
  bool update(bool gradients_finite);

  LossScaleState state() const { return state_; }
  // REQUIRES: state.scale >= 1; counts >= 0 (a checkpoint's values; UserError otherwise, naming
  // `source`).
  void restore(const LossScaleState& state, const std::string& source);

 private:
  LossScaler(bool dynamic, const DynamicLossScale& settings, LossScaleState state)
      : dynamic_(dynamic), settings_(settings), state_(state) {}

  bool dynamic_;
  DynamicLossScale settings_;
  LossScaleState state_;
};

}  // namespace oases::train
