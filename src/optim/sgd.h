// SGD as torch.optim.SGD with dampening 0: weight decay as an L2 term added to the gradient,
// optional momentum (heavy ball, or Nesterov's). The arithmetic is kernels::sgd_update, in
// PyTorch's order of operations.
//
// State: with momentum > 0, "momentum_buffer.<param>" (torch's name), one value per parameter
// element, packed without padding and zero before the first step; with momentum = 0, none.
// Each element's update reads only its own state, so any range cut is accepted.
#pragma once

#include "core/buffer.h"
#include "optim/optimizer.h"

#include <cstdint>
#include <vector>

namespace oases::optim {

struct SgdHyperParams {
  double momentum = 0;      // [0, 1)
  bool nesterov = false;    // needs momentum > 0
  double weight_decay = 0;  // for parameters with ParamSlot::weight_decay; others take none
};

class Sgd final : public Optimizer {
 public:
  // REQUIRES: momentum in [0, 1); weight_decay >= 0; nesterov only with momentum > 0
  // (InternalError otherwise; make_optimizer reports user settings as UserErrors first).
  Sgd(FlatLayout layout, const SgdHyperParams& hyper, StateAllocator allocate = {});

  std::string_view name() const override { return "sgd"; }
  std::size_t state_bytes() const override { return momentum_buffer_.bytes(); }
  std::vector<StateTensor> state_tensors() override;
  std::vector<StateTensor> state_layout(const ParamSlot& slot) const override;
  bool accepts_cut(const ParamSlot&) const override { return true; }

 private:
  void update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
              const StepInfo& info) override;

  SgdHyperParams hyper_;
  std::vector<std::int64_t> state_offsets_;  // per parameter, into momentum_buffer_
  Buffer momentum_buffer_;                   // [param_numel] when momentum > 0, else empty
};

}  // namespace oases::optim
