#include "optim/optimizer.h"

#include "core/error.h"
#include "optim/adafactor.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "optim/sm3.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace oases::optim {

Optimizer::Optimizer(FlatLayout layout, std::unique_ptr<ShardReducer> reducer,
                     StateAllocator allocate)
    : layout_(std::move(layout)), reducer_(std::move(reducer)), allocate_(std::move(allocate)) {
  validate_layout(layout_);
}

Buffer Optimizer::allocate_state(std::size_t bytes) const {
  return allocate_ ? allocate_(bytes) : Buffer(bytes);
}

void Optimizer::step(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                     const StepInfo& info) {
  for (const auto& [what, tensor] :
       {std::pair{"parameters", params}, std::pair{"gradients", grads}}) {
    OASES_ASSERT(tensor.dtype() == layout_.dtype, "{} step: {} are {}, the layout is {}", name(),
                 what, dtype_name(tensor.dtype()), dtype_name(layout_.dtype));
    OASES_ASSERT(tensor.numel() == layout_.total_numel,
                 "{} step: {} have {} elements, the layout {}", name(), what, tensor.numel(),
                 layout_.total_numel);
    OASES_ASSERT(!tensor.empty() || layout_.total_numel == 0, "{} step: {} are null", name(), what);
  }
  OASES_ASSERT(params.raw() != grads.raw() || layout_.total_numel == 0,
               "{} step: parameters and gradients are the same array", name());
  OASES_ASSERT(0 <= begin && begin <= end && end <= layout_.total_numel,
               "{} step: range [{}, {}) is not inside [0, {})", name(), begin, end,
               layout_.total_numel);
  OASES_ASSERT(info.lr >= 0 && info.step >= 1, "{} step: lr = {} must be >= 0 and step = {} >= 1",
               name(), info.lr, info.step);
  for (const std::int64_t cut : {begin, end}) {
    if (begin == end) break;  // an empty range updates nothing, wherever it sits
    for_each_param_slice(layout_, cut, std::min(cut + 1, layout_.total_numel),
                         [&](std::size_t i, std::int64_t, std::int64_t) {
                           const ParamSlot& p = layout_.params[i];
                           OASES_ASSERT(cut == p.offset || accepts_cut(p),
                                        "{} step: the range [{}, {}) cuts parameter {} [{}, {}), "
                                        "which {} updates only whole",
                                        name(), begin, end, p.name, p.offset, p.end(), name());
                         });
  }
  update(params, grads, begin, end, info);
}

void Optimizer::step(Tensor params, Tensor grads, const StepInfo& info) {
  step(params, grads, 0, layout_.total_numel, info);
}

double Optimizer::state_bytes_per_parameter() const {
  const std::int64_t n = layout_.param_numel();
  return n == 0 ? 0.0 : static_cast<double>(state_bytes()) / static_cast<double>(n);
}

void Optimizer::reduce_over_shards(std::size_t param, std::vector<double>& values,
                                   comm::ReduceOp op) {
  const ParamSlot& p = layout_.params[param];
  if (p.split_dim < 0) return;
  OASES_ASSERT(reducer_ != nullptr,
               "{}: parameter {} is split along dimension {} but no shard reducer combines its "
               "statistics",
               name(), p.name, p.split_dim);
  reducer_->reduce(param, Tensor::of(values.data(), {static_cast<std::int64_t>(values.size())}),
                   op);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const FlatLayout& layout,
                                          std::unique_ptr<ShardReducer> reducer,
                                          const StateAllocator& allocate) {
  validate_optimizer_config(config);
  if (config.kind == OptimizerKind::adafactor) {
    AdafactorHyperParams hyper;
    hyper.beta1 = config.adafactor_beta1;
    hyper.weight_decay = config.weight_decay;
    hyper.relative_step = config.relative_step;
    return std::make_unique<Adafactor>(layout, hyper, std::move(reducer), allocate);
  }
  if (config.kind == OptimizerKind::sm3)
    return std::make_unique<Sm3>(layout, Sm3HyperParams{config.momentum, config.weight_decay},
                                 std::move(reducer), allocate);
  if (config.kind == OptimizerKind::sgd)
    return std::make_unique<Sgd>(
        layout, SgdHyperParams{config.momentum, config.nesterov, config.weight_decay}, allocate);
  return std::make_unique<AdamW>(
      layout, AdamWHyperParams{config.beta1, config.beta2, config.eps, config.weight_decay},
      allocate);
}

}  // namespace oases::optim
