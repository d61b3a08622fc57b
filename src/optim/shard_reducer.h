// ShardReducer: combines the statistics a rank computed over its part of a parameter with
// those of the ranks that hold the parameter's other parts.
//
// Adafactor's row and column means, the RMS of its update and of the parameter, and SM3's
// row and column maxima are statistics of a whole parameter. When a rank holds only a part of
// it (a tensor-parallel shard: ParamSlot::split_dim >= 0), the optimizer computes the partial
// statistic over its part and asks the reducer to combine it over the parameter's shard group:
// the ranks that together hold one copy of each part. Replicas of a part (the tp / k replicas
// of a layer at degree k, data-parallel replicas) are in different shard groups, so each part
// counts once and every replica computes the same result.
//
// The engine builds the reducer from the model's parameter layout: for a parameter split k
// ways, the group of the k ranks holding its parts (the tensor-parallel group when k = tp,
// comm::Mesh::tp_subgroup(k, 1) when k < tp). ZeRO will plug in here: a rank stepping some rows
// of a matrix whose other rows other data-parallel ranks step holds a part split along the
// matrix's rows, and its reducer's group for that parameter is those ranks.
//
// Sums are formed in rank order (all_gather, then added in order), so every rank of a group
// gets the same bits, run after run: the statistics a shard group shares stay identical on
// all its ranks, which is what lets a checkpoint store them once.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"

#include <cstddef>
#include <vector>

namespace oases::optim {

class ShardReducer {
 public:
  virtual ~ShardReducer() = default;

  // values := `op` over the shard group of parameter `param` (an index into the optimizer's
  // FlatLayout::params) of every rank's `values`. Collective over that group: each of its
  // ranks calls it for the same parameter, op and size, in the same order.
  // REQUIRES: values is a contiguous f64 tensor; op is sum or max.
  virtual void reduce(std::size_t param, Tensor values, comm::ReduceOp op) = 0;
};

// A reducer over one communicator per parameter (null: the parameter needs no reduction).
// The communicators must outlive it.
class GroupShardReducer final : public ShardReducer {
 public:
  explicit GroupShardReducer(std::vector<comm::Communicator*> groups);
  void reduce(std::size_t param, Tensor values, comm::ReduceOp op) override;

 private:
  std::vector<comm::Communicator*> groups_;
  std::vector<double> gathered_;  // scratch of all_gather for sums
};

}  // namespace oases::optim
