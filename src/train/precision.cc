#include "train/precision.h"

#include "core/buffer.h"
#include "core/error.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace oases::train {
namespace {

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

// A gradient reduction that travels in bf16: the bucket rounded into `staging`, reduced there
// by `start` (a sum over the group, or ZeRO's sum of each rank's block), and widened back into
// the bucket when waited for.
class Bf16Reduction final : public comm::Work {
 public:
  Bf16Reduction(const Tensor& grads, const Precision::StartReduction& start)
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

}  // namespace

Precision::Precision(const plan::RunPlan& plan, comm::Communicator& tp, comm::Communicator& dp,
                     comm::Communicator& pp)
    : plan_(plan),
      gemm16_(resolve_gemm16(plan, tp, dp, pp)),
      scaler_(loss_scaler_for(plan.loss_scaling)) {}

void Precision::pin_gemm16_path(plan::RunPlan& plan) const {
  if (!plan.dtypes.mixed()) return;
  plan.settings.gemm16_path = gemm16_.paths.for_dtype(plan.dtypes.compute);
  plan.config.train.gemm16_path = std::string(kernels::gemm16_path_name(*plan.settings.gemm16_path));
}

std::unique_ptr<comm::Work> Precision::start_reduction(const Tensor& grads,
                                                       const StartReduction& start) const {
  if (plan_.dtypes.gradient_reduce == DType::bf16) return std::make_unique<Bf16Reduction>(grads, start);
  return start(grads);
}

void Precision::inject_overflow_if_due(std::int64_t step, const Tensor& grads) const {
  if (injected_overflow_step_ != step) return;
  const double infinity = std::numeric_limits<double>::infinity();
  kernels::convert(Tensor::of(&infinity, {1}), grads.view(0, {1}));
}

bool Precision::admit_update(std::int64_t step, double norm, const model::Model& model) {
  const bool finite = std::isfinite(norm);
  if (!finite && plan_.loss_scaling.kind == plan::LossScalingPlan::Kind::none)
    stop_on_non_finite_gradient(step, norm, model);
  return scaler_.update(finite);
}

void Precision::stop_on_non_finite_gradient(std::int64_t step, double norm,
                                            const model::Model& model) const {
  std::string first = "(none on this rank)";
  for (const auto& p : model.layout().params()) {
    if (std::isfinite(kernels::sum_of_squares(model.layout().view(model.grads(), p)))) continue;
    first = p.name;
    break;
  }
  const auto& t = plan_.config.train;
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

}  // namespace oases::train
