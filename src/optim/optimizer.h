// Optimizer: updates parameters from gradients over a FlatLayout, and owns whatever state
// that update keeps between steps. Four kinds (train.optimizer):
//   adamw      two moments per element (optim/adamw.h)
//   adafactor  factored second moments: a row and a column statistic per matrix, one value per
//              element of a vector; optional first moment (optim/adafactor.h)
//   sm3        SM3-II: row and column accumulators per matrix, one per element of a vector;
//              optional momentum (optim/sm3.h)
//   sgd        torch.optim.SGD: a momentum buffer per element, or no state (optim/sgd.h)
//
// Callers see the state only as named tensors (state_tensors()): a checkpoint writer iterates
// them and gathers each like the parameter it belongs to; a reader scatters into the same
// views. Nothing outside optim/ knows which kinds of state an optimizer keeps: adding an
// optimizer adds its files and a case in make_optimizer, and its callers do not change.
//
// Statistics over a whole parameter. Adafactor's and SM3's updates of a matrix element read
// statistics of its whole row and column (and Adafactor's the RMS of the whole parameter and
// of its update). A rank holding a part of a parameter (ParamSlot::split_dim >= 0, a
// tensor-parallel shard) computes them over its part and combines them over the parameter's
// shard group with the ShardReducer given to make_optimizer (optim/shard_reducer.h), so that
// every layout computes the single-process update (up to summation order).
//
// Ranges. step() updates the elements [begin, end) of the flat arrays. Which cuts a range
// may make through a parameter depends on the optimizer (accepts_cut):
//   adamw, sgd  any cut: each element's update reads only that element's state, so stepping
//               disjoint ranges that cover [0, total_numel) is bitwise one whole-layout step
//               (ZeRO gives each data-parallel rank its own range);
//   sm3         any cut through a vector (its accumulator is per element); a matrix (>= 2
//               dimensions) must lie wholly inside or outside the range;
//   adafactor   no cut: every parameter wholly inside or outside (its update clipping and
//               relative step read the RMS of the whole parameter).
// A range that cuts where the optimizer does not accept it is an InternalError. ZeRO for the
// factored optimizers will cut matrices at row boundaries and treat the rows a rank steps as a
// part split along the rows, combined over the data-parallel ranks stepping the other rows
// through the same ShardReducer.
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

#include "core/buffer.h"
#include "core/named_values.h"
#include "core/tensor.h"
#include "optim/flat_layout.h"
#include "optim/shard_reducer.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
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
  // elementwise == false: the parameter dimension this state has reduced away (a mean or a
  // maximum over it). The view's shape is the parameter's shard shape without that dimension,
  // and state element (i_0, ..., i_{d-1}, i_{d+1}, ...) belongs to the parameter's elements
  // (i_0, ..., *, ...). Names follow one rule, which checkpoint checks rely on: a state that
  // reduces the last dimension is named "<kind>_row.<param>", one that reduces the dimension
  // before it "<kind>_col.<param>" (Hugging Face's exp_avg_sq_row / exp_avg_sq_col).
  int reduced_dim = -1;
};

// Where an optimizer's state lives: a zeroed buffer of the given size. Empty: the heap
// (Buffer). parallel.offload passes an OffloadStore's (core/offload_store.h).
using StateAllocator = std::function<Buffer(std::size_t bytes)>;

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

  // Bytes of state this optimizer holds. Padding holds no state (AdamW: two values of the
  // layout's dtype per element of layout().param_numel()).
  virtual std::size_t state_bytes() const = 0;
  // state_bytes() / layout().param_numel() (0 for an empty layout): AdamW 8 at fp32;
  // Adafactor about 4 x (1/rows + 1/cols) per matrix element and 4 per vector element.
  double state_bytes_per_parameter() const;

  // Views of the whole state, one per (kind of state, parameter), in a fixed order (by
  // parameter, then kind). The views stay valid and keep pointing at the live state for the
  // optimizer's lifetime; step() updates what they show. A fresh optimizer's state is what
  // its first step expects (zeros for all four kinds), so loading a checkpoint means writing
  // every view.
  virtual std::vector<StateTensor> state_tensors() = 0;
  // The state tensors this optimizer keeps for a parameter laid out like `slot` (on any rank:
  // a checkpoint writer asks for the parameters of other pipeline stages), with null views of
  // their shapes: the same names, shapes and order state_tensors() gives for such a slot.
  virtual std::vector<StateTensor> state_layout(const ParamSlot& slot) const = 0;

  // Whether a step range may begin or end strictly inside `slot` (see "Ranges" above).
  virtual bool accepts_cut(const ParamSlot& slot) const = 0;

 protected:
  // Validates the layout (validate_layout). `reducer` combines statistics of split parameters
  // (null: no parameter is split, or the optimizer needs no statistics over parameters);
  // `allocate` gives the state's storage (empty: the heap).
  explicit Optimizer(FlatLayout layout, std::unique_ptr<ShardReducer> reducer = nullptr,
                     StateAllocator allocate = {});
  // Zeroed storage for `bytes` of state, from the allocator given.
  Buffer allocate_state(std::size_t bytes) const;

  // step()'s work, called with arguments already checked, once per call to step().
  virtual void update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                      const StepInfo& info) = 0;

  // values := `op` over the shard group of layout().params[param] (a no-op when the slot is not
  // split). Collective over that group. InternalError when the slot is split and no reducer
  // was given.
  void reduce_over_shards(std::size_t param, std::vector<double>& values, comm::ReduceOp op);

 private:
  FlatLayout layout_;
  std::unique_ptr<ShardReducer> reducer_;
  StateAllocator allocate_;
};

enum class OptimizerKind : std::uint8_t { adamw, adafactor, sm3, sgd };
// train.optimizer's words.
inline constexpr std::array<NamedValue<OptimizerKind>, 4> kOptimizerNames{{
    {OptimizerKind::adamw, "adamw"},
    {OptimizerKind::adafactor, "adafactor"},
    {OptimizerKind::sm3, "sm3"},
    {OptimizerKind::sgd, "sgd"}}};
std::string_view name(OptimizerKind kind);
// The kind kOptimizerNames names; UserError naming train.optimizer and the valid names.
OptimizerKind parse_optimizer_kind(std::string_view text);

// The optimizer settings of a run ([train] section; names as there).
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;  // train.optimizer
  double beta1 = 0.9;          // adamw
  double beta2 = 0.95;         // adamw
  double eps = 1e-8;           // adamw
  double weight_decay = 0.1;   // all four; for parameters whose ParamSlot::weight_decay is true
  double momentum = 0;         // sgd (torch's momentum) and sm3 (its beta1); 0: no state for it
  bool nesterov = false;       // sgd; needs momentum > 0
  double adafactor_beta1 = 0;  // adafactor's first moment; 0: none (Hugging Face's beta1=None)
  // adafactor: train.lr = 0, Adafactor's relative step size min(1e-2, 1/sqrt(t)) x
  // max(1e-3, RMS(param)) instead of StepInfo::lr.
  bool relative_step = false;
};

// The kinds' names in kOptimizerNames order: {"adamw", "adafactor", "sm3", "sgd"}.
std::vector<std::string_view> optimizer_names();

// UserError when a hyper-parameter is out of range (beta1,
// beta2, momentum and adafactor_beta1 in [0, 1), eps >= 0, weight_decay >= 0; nesterov with
// momentum > 0; momentum only for sgd and sm3, adafactor_beta1 only for adafactor, nesterov
// only for sgd, relative_step only for adafactor; the message names the setting).
void validate_optimizer_config(const OptimizerConfig& config);

// A new optimizer of kind config.kind over `layout`, its state as before a first step.
// `reducer` combines statistics over the parts of split parameters (ParamSlot::split_dim >= 0);
// it may be null when no slot is split.
// UserError: as validate_optimizer_config.
// InternalError: the layout breaks an invariant of FlatLayout; (at the first step that needs
//                it) a factored optimizer's split slot has no reducer.
// `allocate` gives the state's storage (empty: the heap).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const FlatLayout& layout,
                                          std::unique_ptr<ShardReducer> reducer = nullptr,
                                          const StateAllocator& allocate = {});

}  // namespace oases::optim
