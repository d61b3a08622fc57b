// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
// Cost"), computed as Hugging Face transformers' Adafactor computes it.
//
// For a parameter W with gradient G at step t (1-based), all statistics over the whole
// parameter (on a shard: combined over its shard group, optim/shard_reducer.h):
//   beta2_t = 1 - t^-0.8
//   lr_t    = train.lr > 0: StepInfo::lr (the run's LR schedule)
//             train.lr = 0: min(1e-2, 1 / sqrt(t)) x max(1e-3, RMS(W))     (relative step)
//   W of two or more dimensions, as a stack of [rows, cols] matrices (factored):
//     R_i = beta2_t R_i + (1 - beta2_t) mean_j (G_ij^2 + 1e-30)           exp_avg_sq_row
//     C_j = beta2_t C_j + (1 - beta2_t) mean_i (G_ij^2 + 1e-30)           exp_avg_sq_col
//     U_ij = G_ij / sqrt(R_i / mean(R) x C_j)
//   W a vector (or scalar):
//     V_i = beta2_t V_i + (1 - beta2_t) (G_i^2 + 1e-30)                   exp_avg_sq
//     U_i = G_i / sqrt(V_i)
//   U = U / max(1, RMS(U) / 1.0)                                           update clipping
//   U = lr_t U
//   with train.adafactor_beta1 = b1 > 0:  M = b1 M + (1 - b1) U;  U = M     exp_avg
//   W = W - lr_t x weight_decay x W      (parameters with ParamSlot::weight_decay only)
//   W = W - U
// RMS(X) = sqrt(mean of X^2). Statistics are summed in double; the elements of U are formed
// in double and rounded to the layout's dtype. Padding elements (ParamSlot::padding) enter no
// statistic and stay as they are. State starts at zero (beta2_1 = 0 makes the first step's
// statistics those of the first gradient).
//
// Hugging Face equivalents (transformers.optimization.Adafactor):
//   train.lr = 0:  Adafactor(lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
//                  beta1=None or b1, weight_decay=wd, scale_parameter=True,
//                  relative_step=True, warmup_init=False)
//   train.lr > 0:  the same with lr=train.lr, scale_parameter=False, relative_step=False
// (weight decay on the parameters oases decays, as a parameter group would do).
//
// State bytes: (rows + cols) values per matrix of a stack, one per vector element, and one
// per element with a first moment. Ranges may not cut a parameter (the RMS is per parameter).
#pragma once

#include "core/buffer.h"
#include "optim/optimizer.h"

#include <cstdint>
#include <vector>

namespace oases::optim {

struct AdafactorHyperParams {
  double beta1 = 0;         // 0: no first moment
  double weight_decay = 0;  // for parameters with ParamSlot::weight_decay; others take none
  bool relative_step = false;
  // Fixed by the paper (and Hugging Face's defaults); named for the formulas above.
  double eps1 = 1e-30;  // added to squared gradients
  double eps2 = 1e-3;   // floor of RMS(W) in the relative step
  double clip_threshold = 1.0;
  double decay_rate = -0.8;  // beta2_t = 1 - t^decay_rate
  double max_relative_step = 1e-2;
};

class Adafactor final : public Optimizer {
 public:
  // REQUIRES: beta1 in [0, 1); weight_decay >= 0; a reducer when some slot is split
  // (InternalError otherwise).
  Adafactor(FlatLayout layout, const AdafactorHyperParams& hyper,
            std::unique_ptr<ShardReducer> reducer = nullptr, StateAllocator allocate = {});

  std::string_view name() const override { return "adafactor"; }
  std::size_t state_bytes() const override { return second_.bytes() + exp_avg_.bytes(); }
  // Per parameter: exp_avg_sq_row.<p> and exp_avg_sq_col.<p> (two or more dimensions) or
  // exp_avg_sq.<p>, then exp_avg.<p> when beta1 > 0.
  std::vector<StateTensor> state_tensors() override;
  std::vector<StateTensor> state_layout(const ParamSlot& slot) const override;
  bool accepts_cut(const ParamSlot&) const override { return false; }

 private:
  void update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
              const StepInfo& info) override;
  template <class T>
  void update_param(std::size_t index, T* param, const T* grad, const StepInfo& info);
  // Updates the factored statistics of parameter `index` from its gradient and fills
  // row_factor_ and col_factor_ with 1 / sqrt(R_i / mean(R)) and 1 / sqrt(C_j); returns the
  // sum of the squares of the parameter's valid elements (over the shard group).
  template <class T>
  double update_factored_statistics(std::size_t index, const T* param, const T* grad,
                                    double beta2t);

  AdafactorHyperParams hyper_;
  std::vector<std::int64_t> second_offsets_;   // per parameter, into second_
  std::vector<std::int64_t> exp_avg_offsets_;  // per parameter, into exp_avg_
  Buffer second_;   // packed second-moment state (factored or full) of the layout's dtype
  Buffer exp_avg_;  // [param_numel] when beta1 > 0, else empty
  // Scratch of one parameter's update, sized at the first step that needs it.
  std::vector<double> row_factor_, col_factor_, statistics_, row_squares_, row_means_;
};

}  // namespace oases::optim
