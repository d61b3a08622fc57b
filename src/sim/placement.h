// A run's ranks on a cluster's devices, and the groups each rank's collectives run over: world
// rank r sits on device r (ranks fill nodes in order, as launchers place them), in the mesh's
// grid [pp, dp, tp] with tp fastest, world rank = tp_rank + tp x (dp_rank + dp x pp_rank)
// (comm/mesh.h, whose groups these mirror rank for rank):
//   tp_group            the tp ranks that share (dp_rank, pp_rank)
//   tp_subgroup(s, t)   of those, the ranks r with this rank's r / s and r % t (per-layer
//                       degrees: (k, 1) holds one copy of a layer at degree k; (b, a) gathers
//                       the rows of degree a into degree b)
//   tp_replica_group(k) every rank of the pipeline stage with this rank's tp_rank % k (the
//                       replicas of one shard of a layer at degree k, data-parallel ones
//                       included)
//   dp_group, pp_group  the dp (pp) ranks that share the other two coordinates
//   cp_group            context parallelism: dp counts the cp x dp replicas (cp_rank fastest,
//                       as comm::Mesh orders them), and the cp ranks of one data-parallel
//                       replica (this rank's dp_rank / cp) split its sequences
//   ep_group            the ep data-parallel ranks that share dp_rank / ep, tp_rank, pp_rank
//   expert_replica_group(k)  every rank of the stage with this rank's dp_rank % ep and
//                       tp_rank % k (the holders of the same shard of the same experts)
// Groups list devices in their order within the group.
#pragma once

#include "sim/collective_costs.h"

#include <functional>
#include <vector>

namespace oases::sim {

struct RankLayout {
  int tp = 1, dp = 1, pp = 1, ep = 1;
  int cp = 1;  // dividing dp, which counts every replica

  int world() const { return tp * dp * pp; }
  int rank_of(int tp_rank, int dp_rank, int pp_rank) const {
    return tp_rank + tp * (dp_rank + dp * pp_rank);
  }
  int tp_rank(int rank) const { return rank % tp; }
  int dp_rank(int rank) const { return rank / tp % dp; }
  int pp_rank(int rank) const { return rank / (tp * dp); }

  DeviceGroup tp_group(int rank) const;
  DeviceGroup tp_subgroup(int rank, int span, int stride) const;
  DeviceGroup tp_replica_group(int rank, int degree) const;
  DeviceGroup dp_group(int rank) const;
  DeviceGroup cp_group(int rank) const;
  DeviceGroup pp_group(int rank) const;
  DeviceGroup ep_group(int rank) const;
  DeviceGroup expert_replica_group(int rank, int degree) const;

  // The distinct groups `group_of` gives over every rank of the world: those that run the same
  // collective at the same moment when every rank runs the same schedule.
  std::vector<DeviceGroup> every(const std::function<DeviceGroup(int rank)>& group_of) const;
};

}  // namespace oases::sim
