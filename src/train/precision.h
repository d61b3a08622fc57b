// Precision: the training engine's part that knows what the run's element types imply for a
// step (plan::DTypes, plan::LossScalingPlan).
//
//   - The 16-bit matrix-product paths (train.gemm16_path): pinned by the setting, or measured
//     once by the rank at place 0 of every group and broadcast, because ranks that split a
//     layer must round alike.
//   - The loss scaler (train/loss_scaler.h): the factor a step's loss gradient is multiplied by,
//     and whether a step's update is applied once its gradient norm is known.
//   - Gradient reductions in bf16 (train.grad_reduce_dtype = "bf16"): the bucket is rounded
//     into a bf16 staging buffer, summed there, and widened back when waited for.
//   - What a non-finite gradient norm means: a skipped step under loss scaling, a UserError
//     that stops the run otherwise (nothing non-finite ever reaches the parameters).
//
// Who calls what: the engine constructs it first (the model is built with gemm16().paths),
// wraps every gradient reduction in start_reduction, reads loss_scaler().scale() before a
// step's backward and calls admit_update once the step's norm (of the unscaled gradient) is
// known. Unscaling itself is one pass with clipping (the engine's clip_gradients).
#pragma once

#include "comm/communicator.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "plan/run_plan.h"
#include "train/loss_scaler.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace oases::train {

// The 16-bit matrix-product paths of a run and why: train.gemm16_path pinned, or measured on
// one rank and broadcast to all (ranks that split a layer must round alike).
struct Gemm16Resolution {
  kernels::Gemm16Paths paths;
  std::string description;  // "convert+sgemm (...reason...)"; empty without mixed precision
};

class Precision {
 public:
  // Starts a gradient reduction of `buffer` (a bucket's gradients, or their bf16 copy) over
  // its group; the returned work completes it.
  using StartReduction = std::function<std::unique_ptr<comm::Work>(const Tensor& buffer)>;

  // Collective over tp, dp and pp (in that order) unless the plan pins the 16-bit path or runs
  // without mixed precision: every rank of the run constructs it alike. `plan` must outlive it.
  // UserError when a pinned path cannot multiply the compute type on this CPU.
  Precision(const plan::RunPlan& plan, comm::Communicator& tp, comm::Communicator& dp,
            comm::Communicator& pp);

  const Gemm16Resolution& gemm16() const { return gemm16_; }
  // Writes the path this run multiplies with into `plan` (settings and config), so that a
  // checkpoint stores it and a resumed run keeps it (the paths round differently in the last
  // bits). Nothing without mixed precision.
  void pin_gemm16_path(plan::RunPlan& plan) const;

  LossScaler& loss_scaler() { return scaler_; }
  double loss_scale() const { return scaler_.scale(); }

  // The reduction of `grads` that `start` performs, travelling in the plan's gradient
  // reduction type: in bf16 a staging copy is reduced and the sum widened back into `grads`
  // when the work is waited for; otherwise `start(grads)` itself.
  std::unique_ptr<comm::Work> start_reduction(const Tensor& grads,
                                              const StartReduction& start) const;

  // Fault injection for tests: optimizer step `step` (0-based) gets an infinity in its first
  // gradient element before the norm is taken, as an fp16 overflow would.
  void inject_gradient_overflow(std::int64_t step) { injected_overflow_step_ = step; }
  // Writes that infinity into `grads` when `step` is the injected one.
  void inject_overflow_if_due(std::int64_t step, const Tensor& grads) const;

  // Whether step `step`'s update is applied, given the global norm of its unscaled gradient
  // (the same on every rank, so every rank decides alike): the loss scaler's verdict, which
  // also moves the scale. Without loss scaling a non-finite norm is a UserError
  // (stop_on_non_finite_gradient).
  bool admit_update(std::int64_t step, double norm, const model::Model& model);
  // UserError: the gradient norm of optimizer step `step` (0-based) is `norm`, NaN or
  // infinite; names the first parameter of `model` whose gradient is, and gives advice that
  // fits the plan's settings.
  [[noreturn]] void stop_on_non_finite_gradient(std::int64_t step, double norm,
                                                const model::Model& model) const;

 private:
  const plan::RunPlan& plan_;
  Gemm16Resolution gemm16_;
  LossScaler scaler_;
  std::optional<std::int64_t> injected_overflow_step_;
};

}  // namespace oases::train
