// GradientReduction: the training engine's part that knows which ranks hold which copy of each
// parameter, and so how gradients are summed and how a gradient-shaped array is measured.
//
//   - group_of: the group that sums a gradient bucket every step: the ranks that hold the same
//     experts (an MoE layer's experts under expert parallelism), a layer's replicas (tensor-
//     and data-parallel ranks at once, for a layer below parallel.tp), else the data-parallel
//     group; null when nobody else holds the bucket (one replica, or local SGD, whose replicas
//     sum nothing between their averages).
//   - Tied parameters: GPT's word embedding is held by the first and the last pipeline stage;
//     after the step's reductions both add the other's gradient, so both copies take the same
//     update.
//   - sum_of_squares: the global sum of squares of an array laid out like the parameters, each
//     parameter counted once over the tensor-, data-, expert- and pipeline-parallel groups
//     (clipping's norm, local SGD's divergence).
//
// How a bucket is summed (all-reduce, or ZeRO's reduce-scatter of blocks; fp32 or bf16 on the
// wire) is ZeroSharding's and Precision's; the engine composes the three.
#pragma once

#include "comm/communicator.h"
#include "core/buffer.h"
#include "model/model.h"
#include "plan/run_plan.h"
#include "train/zero_sharding.h"

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace oases::train {

// The groups gradients are summed and measured over, as the engine resolved them.
struct GradientGroups {
  comm::Communicator* tp = nullptr;  // never null (a group of one at least); so dp and pp
  comm::Communicator* dp = nullptr;
  comm::Communicator* pp = nullptr;
  comm::Communicator* ep = nullptr;  // null: every expert on this rank (parallel.ep = 1)
  // The ranks holding the same shard of a layer at `degree` (comm::Mesh::tp_replica_group);
  // needed when a layer runs below parallel.tp.
  std::function<comm::Communicator&(int degree)> tp_replica_group;
  // With ep: the ranks holding the same shard of the same experts at `degree`
  // (comm::Mesh::expert_replica_group).
  std::function<comm::Communicator&(int degree)> expert_replicas;
};

// Sum of a double over a group (loss sums and squares are reduced in double to keep their
// digits). Collective over `group`.
double sum_over(comm::Communicator& group, double value);

class GradientReduction {
 public:
  // `plan`, `model` and the groups must outlive the part.
  GradientReduction(const plan::RunPlan& plan, model::Model& model, GradientGroups groups);

  const GradientGroups& groups() const { return groups_; }
  // The group that sums bucket `bucket`'s gradients (null: none). May create the replica
  // groups it names on first use (comm::Mesh), so every rank asks alike.
  comm::Communicator* group_of(const model::Model::Bucket& bucket) const;
  // The buckets group_of gives a group: the reductions a step waits for.
  std::size_t reduced_bucket_count() const;
  // Sequence parallelism: sums, over each layer's group, the gradients of bucket `bucket` that
  // its ranks formed from their own tokens (model::Model::token_shard_gradients), so that they
  // are whole before group_of's reduction; a no-op for other buckets. Collective (blocking)
  // over those groups, called by every rank in the same bucket order.
  void sum_token_shard_gradients(int bucket);

  // Names of the parameters both the first and the last pipeline stage hold, in layout order,
  // where this rank is one of those stages (empty otherwise, and when pp = 1).
  std::vector<std::string> tied_params_here() const;
  // Sums the tied parameters' whole gradients between the first and the last stage (a no-op
  // elsewhere): both add the other's copy to their own. Point to point over pp.
  void sum_tied_gradients();

  // Sum of squares of `flat` (laid out like the parameters) over the whole model: a
  // replicated parameter counted once, a split one by the first replica of each part, a tied
  // one by the first stage, ZeRO's blocks (of `zero`'s cut buckets) by their owners. Collective
  // over the tensor-, data-, expert- and pipeline-parallel groups; the same on every rank.
  double sum_of_squares(const Tensor& flat, const ZeroSharding& zero) const;

 private:
  // This rank's squares of `flat`, sorted by the groups that still have to sum them.
  struct LocalSquares {
    double sharded = 0, replicated = 0;               // whole parameters
    double replicated_blocks = 0, sharded_blocks = 0;  // ZeRO's blocks of them
    double experts = 0, expert_shards = 0;             // experts (ep > 1)
    std::map<int, std::array<double, 2>> expert_blocks;  // ZeRO's blocks of experts by degree
  };
  LocalSquares local_squares(const Tensor& flat, const ZeroSharding& zero) const;
  bool is_tied(const std::string& name) const;

  const plan::RunPlan& plan_;
  model::Model& model_;
  GradientGroups groups_;
  // Names of the parameters both the first and the last pipeline stage hold, in layout order
  // (empty when pp = 1).
  std::vector<std::string> tied_params_;
  // Packs the shard gradients of one bucket and group for their sum (sized for the largest).
  Buffer shard_staging_;
};

}  // namespace oases::train
