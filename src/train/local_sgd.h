// LocalSgd: the training engine's part for parallel.dp_sync_every = x > 1 over more than one
// data-parallel replica (plan::RunPlan::local_sgd).
//
// Each replica steps on the mean gradient of its own local batch (no gradient is summed over
// the data-parallel group), and after steps x, 2x, ... and after every step the caller drains
// (evaluations, checkpoints, the last step) the replicas average their parameters and their
// optimizer state, so that they leave the synchronisation identical. The divergence reported
// then is the root mean square distance of the replicas' parameters from their mean, relative
// to the mean's norm, before averaging:
//   divergence = sqrt( (sum over replicas r of |p_r - mean|^2) / R  /  |mean|^2 )
// with R replicas and |.|^2 the whole model's sum of squares (each parameter counted once).
//
// Who calls what: the engine divides the loss gradient by gradient_count(), asks
// averages_after() once a step's update is applied, and then calls average().
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "plan/run_plan.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace oases::train {

class LocalSgd {
 public:
  // The global sum of squares of an array laid out like `params` (collective where the model
  // is split; GradientReduction::sum_of_squares in the engine).
  using SumOfSquares = std::function<double(const Tensor& flat)>;

  explicit LocalSgd(const plan::RunPlan& plan)
      : enabled_(plan.local_sgd), sync_every_(plan.sync_every) {}

  bool enabled() const { return enabled_; }
  // Whether the replicas average after step `step` (0-based), which the caller drains or not.
  bool averages_after(std::int64_t step, bool drain) const {
    return enabled_ && ((step + 1) % sync_every_ == 0 || drain);
  }
  // What a replica's loss gradient is divided by, given the counted targets of its own batch
  // and of the global batch: its own under local SGD (each replica's gradient is the mean over
  // its batch), the global batch's otherwise.
  double gradient_count(double local_counted, double global_counted) const {
    return enabled_ ? local_counted : global_counted;
  }

  // Replaces `params` and every tensor of `state` by their mean over `replicas` and returns the
  // divergence before it (0 when the mean is zero). Collective over `replicas` (and whatever
  // `sum_of_squares` reduces over). The caller refreshes copies derived from the parameters.
  double average(const Tensor& params, const std::vector<optim::StateTensor>& state,
                 comm::Communicator& replicas, const SumOfSquares& sum_of_squares) const;

 private:
  bool enabled_;
  std::int64_t sync_every_;
};

}  // namespace oases::train
