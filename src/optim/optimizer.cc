#include "optim/optimizer.h"

#include "core/error.h"
#include "optim/adamw.h"

#include <fmt/format.h>

#include <utility>

namespace oases::optim {

Optimizer::Optimizer(FlatLayout layout) : layout_(std::move(layout)) {
  validate_layout(layout_);
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
  update(params, grads, begin, end, info);
}

void Optimizer::step(Tensor params, Tensor grads, const StepInfo& info) {
  step(params, grads, 0, layout_.total_numel, info);
}

std::vector<std::string_view> optimizer_names() {
  return {"adamw"};
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const FlatLayout& layout) {
  OASES_CHECK(config.beta1 >= 0 && config.beta1 < 1, "train.beta1 = {} must be in [0, 1)",
              config.beta1);
  OASES_CHECK(config.beta2 >= 0 && config.beta2 < 1, "train.beta2 = {} must be in [0, 1)",
              config.beta2);
  OASES_CHECK(config.eps >= 0, "train.eps = {} must be >= 0", config.eps);
  OASES_CHECK(config.weight_decay >= 0, "train.weight_decay = {} must be >= 0",
              config.weight_decay);
  if (config.name == "adamw") {
    return std::make_unique<AdamW>(
        layout, AdamWHyperParams{config.beta1, config.beta2, config.eps, config.weight_decay});
  }
  OASES_FAIL("train.optimizer = \"{}\" is not an optimizer oases has; valid: \"{}\"", config.name,
             fmt::join(optimizer_names(), "\", \""));
}

}  // namespace oases::optim
