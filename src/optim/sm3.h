// SM3-II (Anil, Gupta, Koren & Singer 2019, "Memory-Efficient Adaptive Optimization"), with
// the covers of a matrix being its rows and its columns, as the paper's implementation keeps
// them (google-research/sm3).
//
// For a parameter W with gradient G at step t, learning rate lr = StepInfo::lr:
//   W of two or more dimensions, as a stack of [rows, cols] matrices, with row accumulators
//   A_i (accumulator_row) and column accumulators B_j (accumulator_col), zero at first:
//     nu_ij = min(A_i, B_j) + G_ij^2
//     A_i = max_j nu_ij;  B_j = max_i nu_ij       (over the whole parameter: on a shard,
//                                                  combined over its shard group)
//   W a vector (or scalar), accumulator V (accumulator), diagonal AdaGrad:
//     nu_i = V_i = V_i + G_i^2
//   U = G / sqrt(nu + 1e-30)    (the paper's implementation's guard: nu = 0 only where every
//                                gradient so far was 0, and there U = 0)
//   with train.momentum = mu > 0:  M = mu M + (1 - mu) U;  U = M            (momentum)
//   W = W - lr x weight_decay x W   (decoupled, parameters with ParamSlot::weight_decay only)
//   W = W - lr U
// nu and U are formed in the layout's dtype. Padding elements (ParamSlot::padding) enter no
// maximum and stay as they are.
//
// State bytes: (rows + cols) values per matrix of a stack, one per vector element, and one
// per element with momentum. Ranges may cut vectors (their accumulators are per element) but
// not parameters of two or more dimensions.
#pragma once

#include "core/buffer.h"
#include "optim/optimizer.h"

#include <cstdint>
#include <vector>

namespace oases::optim {

struct Sm3HyperParams {
  double momentum = 0;      // [0, 1); 0: no momentum state
  double weight_decay = 0;  // for parameters with ParamSlot::weight_decay; others take none
  double eps = 1e-30;       // added to nu under the square root
};

class Sm3 final : public Optimizer {
 public:
  // REQUIRES: momentum in [0, 1); weight_decay >= 0; a reducer when some slot is split
  // (InternalError otherwise).
  Sm3(FlatLayout layout, const Sm3HyperParams& hyper,
      std::unique_ptr<ShardReducer> reducer = nullptr, StateAllocator allocate = {});

  std::string_view name() const override { return "sm3"; }
  std::size_t state_bytes() const override { return accumulators_.bytes() + momentum_.bytes(); }
  // Per parameter: accumulator_row.<p> and accumulator_col.<p> (two or more dimensions) or
  // accumulator.<p>, then momentum.<p> when momentum > 0.
  std::vector<StateTensor> state_tensors() override;
  std::vector<StateTensor> state_layout(const ParamSlot& slot) const override;
  bool accepts_cut(const ParamSlot& slot) const override;

 private:
  void update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
              const StepInfo& info) override;
  template <class T>
  void update_matrix(std::size_t index, T* param, const T* grad, const StepInfo& info);
  template <class T>
  void update_vector(std::size_t index, std::int64_t first, T* param, const T* grad, std::int64_t n,
                     const StepInfo& info);

  Sm3HyperParams hyper_;
  std::vector<std::int64_t> accumulator_offsets_;  // per parameter, into accumulators_
  std::vector<std::int64_t> momentum_offsets_;     // per parameter, into momentum_
  Buffer accumulators_;                            // packed accumulators of the layout's dtype
  Buffer momentum_;                                // [param_numel] when momentum > 0, else empty
  std::vector<double> new_rows_, new_cols_;        // scratch of one matrix's update
};

}  // namespace oases::optim
