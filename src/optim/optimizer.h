// Optimizer: updates parameters from gradients over a FlatLayout, and owns whatever state
// that update keeps between steps (AdamW: two moments per element).
//
// Callers see the state only as named tensors (state_tensors()): a checkpoint writer iterates
// them and gathers each like the parameter it belongs to; a reader scatters into the same
// views. Nothing outside optim/ knows which kinds of state an optimizer keeps: adding an
// optimizer adds its files and a case in make_optimizer, and its callers do not change.
//
// Ranges. step() updates the elements [begin, end) of the flat arrays. A range may cut
// through parameters: each parameter's part inside the range is updated with that parameter's
// hyper-parameters (its weight decay), exactly as a step over the whole layout would update
// those elements. Stepping disjoint ranges that cover [0, total_numel) is therefore bitwise
// the same as one whole-layout step; ZeRO gives each data-parallel rank its own range. (That
// holds for optimizers whose update of an element reads only that element's state, as
// AdamW's does. One with factored state would have to say which cuts it accepts.)
//
// Thread safety: an Optimizer is used by one thread at a time. Its kernels may use OpenMP
// inside a call.
//
// Example:
//   auto optimizer = optim::make_optimizer(config, layout);
//   for (std::int64_t s = 0; s < steps; ++s) {
//     ... fill grads ...
//     optimizer->step(params, grads, {.lr = schedule.at(s), .step = s + 1});
//   }
#pragma once

#include "core/tensor.h"
#include "optim/flat_layout.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace oases::optim {

// What changes from one update to the next.
struct StepInfo {
  double lr = 0;          // learning rate of this update (>= 0)
  std::int64_t step = 1;  // 1-based count of updates including this one (bias correction)
};

// A named view of part of an optimizer's state.
struct StateTensor {
  std::string name;   // checkpoint name, e.g. "exp_avg.h.0.attn.c_attn.weight"
  std::string param;  // the ParamSlot it belongs to, e.g. "h.0.attn.c_attn.weight"
  Tensor view;        // the state itself (the layout's dtype); writing into it sets the state
  // True when the state holds one value per element of the parameter: view has the
  // parameter's (shard) shape, element i belongs to parameter element i, and a checkpoint
  // gathers and scatters it exactly as it does the parameter. False for factored state
  // (shapes of their own, e.g. Adafactor's row and column statistics).
  bool elementwise = true;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // The name train.optimizer selects it by, e.g. "adamw".
  virtual std::string_view name() const = 0;
  const FlatLayout& layout() const { return layout_; }

  // Updates params[i] for every parameter element i in [begin, end), from grads[i] and the
  // optimizer's state for i, and advances that state. Padding elements are not touched.
  // REQUIRES: params and grads are views of the whole flat arrays: layout().total_numel
  //           elements of layout().dtype (any shape), not overlapping each other;
  //           0 <= begin <= end <= total_numel; info.lr >= 0; info.step >= 1.
  // Violations are bugs (InternalError).
  void step(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
            const StepInfo& info);
  // The whole layout: step(params, grads, 0, layout().total_numel, info).
  void step(Tensor params, Tensor grads, const StepInfo& info);

  // Bytes of state per parameter element (AdamW: two values of the layout's dtype). For an
  // optimizer with factored state, the bytes of its element-wise part only.
  virtual std::size_t state_bytes_per_element() const = 0;
  // Bytes of state this optimizer holds. Padding holds no state: for AdamW this is
  // state_bytes_per_element() x layout().param_numel().
  virtual std::size_t state_bytes() const = 0;

  // Views of the whole state, one per (kind of state, parameter), in a fixed order (by
  // parameter, then kind). The views stay valid and keep pointing at the live state for the
  // optimizer's lifetime; step() updates what they show. A fresh optimizer's state is what
  // its first step expects (AdamW: zeros), so loading a checkpoint means writing every view.
  virtual std::vector<StateTensor> state_tensors() = 0;

 protected:
  // Validates the layout (validate_layout).
  explicit Optimizer(FlatLayout layout);

  // step()'s work, called with arguments already checked, once per call to step().
  virtual void update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                      const StepInfo& info) = 0;

 private:
  FlatLayout layout_;
};

// The optimizer settings of a run ([train] section; names as there).
struct OptimizerConfig {
  std::string name = "adamw";  // train.optimizer
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied to parameters whose ParamSlot::weight_decay is true
};

// Names make_optimizer accepts: {"adamw"}.
std::vector<std::string_view> optimizer_names();

// A new optimizer of kind config.name over `layout`, its state as before a first step.
// UserError: config.name is not one of optimizer_names() (the message names train.optimizer,
//            the value and the valid names), or a hyper-parameter is out of range (beta1 and
//            beta2 in [0, 1), eps >= 0, weight_decay >= 0; the message names the setting).
// InternalError: the layout breaks an invariant of FlatLayout.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const FlatLayout& layout);

}  // namespace oases::optim
