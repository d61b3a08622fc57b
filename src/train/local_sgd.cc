#include "train/local_sgd.h"

#include "core/buffer.h"
#include "kernels/kernels.h"
#include "optim/clip.h"
#include "train/gradient_reduction.h"

#include <cmath>

namespace oases::train {

double LocalSgd::average(const Tensor& params, const std::vector<optim::StateTensor>& state,
                         comm::Communicator& replicas, const SumOfSquares& sum_of_squares) const {
  const double count = static_cast<double>(replicas.size());
  Buffer mean_storage(params.nbytes()), difference_storage(params.nbytes());
  const Tensor mean = mean_storage.tensor(params.dtype(), params.shape());
  const Tensor difference = difference_storage.tensor(params.dtype(), params.shape());
  kernels::copy(params, mean);
  replicas.all_reduce(mean, comm::ReduceOp::sum);
  optim::scale(mean, 1.0 / count);
  kernels::copy(mean, difference);
  optim::scale(difference, -1.0);
  kernels::add(params, difference, difference);
  const double distance = sum_over(replicas, sum_of_squares(difference)) / count;
  const double norm = sum_of_squares(mean);
  kernels::copy(mean, params);
  // The optimizer state follows the parameters: each replica's moments (or accumulators) are
  // averaged too, so that the replicas leave the synchronisation identical.
  for (const optim::StateTensor& s : state) {
    replicas.all_reduce(s.view, comm::ReduceOp::sum);
    optim::scale(s.view, 1.0 / count);
  }
  return norm > 0 ? std::sqrt(distance / norm) : 0.0;
}

}  // namespace oases::train
