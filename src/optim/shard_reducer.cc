#include "optim/shard_reducer.h"

#include "core/error.h"

#include <utility>

namespace oases::optim {

GroupShardReducer::GroupShardReducer(std::vector<comm::Communicator*> groups)
    : groups_(std::move(groups)) {}

void GroupShardReducer::reduce(std::size_t param, Tensor values, comm::ReduceOp op) {
  OASES_ASSERT(param < groups_.size(), "shard reducer has no group for parameter {} of {}", param,
               groups_.size());
  OASES_ASSERT(values.dtype() == DType::f64, "shard statistics are f64, not {}",
               dtype_name(values.dtype()));
  comm::Communicator* group = groups_[param];
  if (group == nullptr || group->size() == 1) return;
  if (op != comm::ReduceOp::sum) {
    // max and min are exact: any order gives the same bits on every rank.
    group->all_reduce(values, op);
    return;
  }
  const std::int64_t n = values.numel();
  gathered_.resize(static_cast<std::size_t>(n * group->size()));
  group->all_gather(values, Tensor::of(gathered_.data(), {n * group->size()}));
  double* out = values.data<double>();
  for (std::int64_t i = 0; i < n; ++i) {
    double total = 0;
    for (int r = 0; r < group->size(); ++r) total += gathered_[static_cast<std::size_t>(r * n + i)];
    out[i] = total;
  }
}

}  // namespace oases::optim
