// The optimizer settings' names and checks (optim/optimizer.h), apart from the optimizers
// themselves, so that reading a configuration needs none of the optimizers' code.
#include "optim/optimizer.h"

#include "core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <vector>

namespace oases::optim {

std::string_view name(OptimizerKind kind) { return value_name<OptimizerKind>(kOptimizerNames, kind); }

OptimizerKind parse_optimizer_kind(std::string_view text) {
  return parse_named_value<OptimizerKind>(kOptimizerNames, text, "train.optimizer");
}

std::vector<std::string_view> optimizer_names() {
  std::vector<std::string_view> names;
  for (const NamedValue<OptimizerKind>& entry : kOptimizerNames) names.push_back(entry.name);
  return names;
}

void validate_optimizer_config(const OptimizerConfig& config) {
  OASES_CHECK(config.beta1 >= 0 && config.beta1 < 1, "train.beta1 = {} must be in [0, 1)",
              config.beta1);
  OASES_CHECK(config.beta2 >= 0 && config.beta2 < 1, "train.beta2 = {} must be in [0, 1)",
              config.beta2);
  OASES_CHECK(config.eps >= 0, "train.eps = {} must be >= 0", config.eps);
  OASES_CHECK(config.weight_decay >= 0, "train.weight_decay = {} must be >= 0",
              config.weight_decay);
  OASES_CHECK(config.momentum >= 0 && config.momentum < 1,
              "train.momentum = {} must be in [0, 1) (0: no momentum)", config.momentum);
  OASES_CHECK(config.adafactor_beta1 >= 0 && config.adafactor_beta1 < 1,
              "train.adafactor_beta1 = {} must be in [0, 1) (0: no first moment)",
              config.adafactor_beta1);
  OASES_CHECK(config.momentum == 0 || config.kind == OptimizerKind::sgd || config.kind == OptimizerKind::sm3,
              "train.momentum = {} applies to train.optimizer = \"sgd\" and \"sm3\", not \"{}\"{}",
              config.momentum, name(config.kind),
              config.kind == OptimizerKind::adafactor ? "; Adafactor's first moment is train.adafactor_beta1"
                                         : "; AdamW's is train.beta1");
  OASES_CHECK(config.adafactor_beta1 == 0 || config.kind == OptimizerKind::adafactor,
              "train.adafactor_beta1 = {} applies to train.optimizer = \"adafactor\", not \"{}\"",
              config.adafactor_beta1, name(config.kind));
  OASES_CHECK(!config.nesterov || config.kind == OptimizerKind::sgd,
              "train.nesterov = true applies to train.optimizer = \"sgd\", not \"{}\"",
              name(config.kind));
  OASES_CHECK(!config.nesterov || config.momentum > 0,
              "train.nesterov = true needs train.momentum > 0 (it is {}), as torch.optim.SGD does",
              config.momentum);
  OASES_CHECK(!config.relative_step || config.kind == OptimizerKind::adafactor,
              "train.lr = 0 (a relative step size) is Adafactor's; train.optimizer = \"{}\" needs "
              "train.lr > 0",
              name(config.kind));
}

}  // namespace oases::optim
