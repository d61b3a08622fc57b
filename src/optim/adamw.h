// AdamW as torch.optim.AdamW (docs/models.md, "Reference semantics"): decoupled weight decay,
// bias-corrected moments, eps added outside the square root. The arithmetic is
// kernels::adamw_update, in PyTorch's order of operations.
//
// State: exp_avg (first moment m) and exp_avg_sq (second moment v), one value of the layout's
// dtype each per parameter element, zero before the first step. They are stored packed: the
// parameters' elements in layout order without the padding between them, so padding costs no
// memory. Checkpoint names are "exp_avg.<param>" and "exp_avg_sq.<param>", each shaped like
// the parameter's shard.
//
// For each parameter p and every element in the stepped range:
//   kernels::adamw_update(..., AdamWStep{lr, beta1, beta2, eps,
//                                        p.weight_decay ? weight_decay : 0, step})
// Each element's update depends on that element alone, so a step over several ranges gives
// the same bits as one step over their union.
#pragma once

#include "core/buffer.h"
#include "optim/optimizer.h"

#include <cstdint>
#include <vector>

namespace oases::optim {

struct AdamWHyperParams {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // for parameters with ParamSlot::weight_decay; others take none
};

class AdamW final : public Optimizer {
 public:
  // REQUIRES: beta1, beta2 in [0, 1); eps, weight_decay >= 0 (InternalError otherwise;
  // make_optimizer reports user settings as UserErrors first); layout valid.
  AdamW(FlatLayout layout, const AdamWHyperParams& hyper, StateAllocator allocate = {});

  std::string_view name() const override { return "adamw"; }
  const AdamWHyperParams& hyper_params() const { return hyper_; }

  std::size_t state_bytes() const override;
  // exp_avg.<p> then exp_avg_sq.<p> for each parameter p in layout order.
  std::vector<StateTensor> state_tensors() override;
  std::vector<StateTensor> state_layout(const ParamSlot& slot) const override;
  bool accepts_cut(const ParamSlot&) const override { return true; }

 private:
  void update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
              const StepInfo& info) override;

  AdamWHyperParams hyper_;
  // state_offsets_[i]: element offset of parameter i's state in exp_avg_ and exp_avg_sq_.
  std::vector<std::int64_t> state_offsets_;
  Buffer exp_avg_;     // [param_numel] of the layout's dtype
  Buffer exp_avg_sq_;  // [param_numel] of the layout's dtype
};

}  // namespace oases::optim
