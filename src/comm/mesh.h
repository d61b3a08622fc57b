// Mesh: this process's place in the grid of ranks and the groups it belongs to.
//
// The world's ranks form a [pp, dp, cp, tp] grid with TP fastest, so that a TP group is a run
// of neighbouring ranks (on one node when a launcher fills nodes in rank order):
//   world rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
// Each rank is in one group of each kind: the tp ranks that share (cp_rank, dp_rank, pp_rank),
// the cp ranks that share (tp_rank, dp_rank, pp_rank) (context parallelism: they split every
// sequence of the same samples), the pp ranks that share (tp_rank, cp_rank, dp_rank), and the
// replica group dp_group(): the cp x dp ranks that share (tp_rank, pp_rank), ordered by
// replica rank cp_rank + cp * dp_rank. They hold the same parameters, so gradients are summed
// and ZeRO partitions over it; it is the data-parallel group itself when cp = 1. Within a
// group, ranks are ordered by the coordinate the group spans, so tp_group().rank() ==
// tp_rank() and so on.
//
// Invariant: tp * cp * dp * pp == world size, each degree >= 1 (checked, UserError otherwise).
// A Mesh owns its communicators; with MPI it must be destroyed before the MpiRuntime.
//
// Per-layer tensor-parallel degrees (a layer at degree k < tp runs as tp/k replicas) use
// sub-groups of the tensor-parallel group: tp_subgroup(span, stride) is the group of ranks
// whose tp rank r has the same r / span and the same r % stride, ordered by r (size
// span / stride; span divides tp, stride divides span):
//   (k, 1)      the k ranks that together hold one copy of a layer at degree k
//   (tp, k)     the tp / k replicas of one shard of a layer at degree k
//   (b, a)      a < b: within one group of b, the ranks that hold the same shard at degree a;
//               gathering over it turns the rows of a layer at degree a into those at degree b
// Mesh::create makes every such group once (collectively), so any plan can use them.
// tp_replica_group(k) holds every rank with the same shard of a layer at degree k: the tp / k
// ranks of (tp, k) in each data-parallel replica, over all dp replicas of one pipeline stage
// (the dp group itself when k == tp). A layer's gradients are summed there in one all-reduce; it is
// a communicator of its own, so those reductions do not queue (in issue order, one FIFO per
// communicator) in front of the activation collectives the next layers wait for.
//
// Expert parallelism (MoE layers, parallel.ep = e dividing dp; cp = 1): add_expert_groups(e) makes,
// after create, the expert-parallel group ep_group() (the e data-parallel ranks that share dp_rank
// / e, tp_rank and pp_rank, ordered by dp_rank % e; they split the experts and exchange tokens) and
// expert_replica_group(k) for each degree k dividing tp (every rank of the pipeline stage with
// the same dp_rank % e and the same tp_rank % k: the ranks that hold the same shard of the same
// experts in a layer at degree k, over which their gradients are summed; tp_replica_group(k)
// when e = 1).
//
// The rest of the engine always talks to a Mesh: a process started without a launcher uses
// Mesh::single_process(), whose groups are SelfCommunicators.
#pragma once

#include "comm/communicator.h"
#include "comm/mpi_runtime.h"

#include <map>
#include <memory>
#include <utility>

namespace oases::comm {

// The degrees of a mesh: parallel.tp, cp, dp and pp.
struct MeshDegrees {
  int tp = 1, cp = 1, dp = 1, pp = 1;
};

class Mesh {
 public:
  // Collective over the world: every rank calls it with the same degrees. Groups are
  // MpiCommunicators named "world", "tp", "dp" and "pp", each with `options`.
  static Mesh create(const MpiRuntime& runtime, MeshDegrees degrees,
                     MpiCommunicatorOptions options = {});
  // Without context parallelism (cp = 1).
  static Mesh create(const MpiRuntime& runtime, int tp, int dp, int pp,
                     MpiCommunicatorOptions options = {}) {
    return create(runtime, MeshDegrees{tp, 1, dp, pp}, options);
  }
  // One process without MPI. The degrees are the requested ones, so that a config asking for
  // more than one rank gets the same error as under a launcher of the wrong size.
  static Mesh single_process(int tp = 1, int dp = 1, int pp = 1, int cp = 1);

  Mesh(Mesh&&) noexcept;
  Mesh& operator=(Mesh&&) noexcept;
  ~Mesh();

  int tp_size() const { return tp_; }
  int cp_size() const { return cp_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }
  int world_size() const { return tp_ * cp_ * dp_ * pp_; }

  int tp_rank() const { return tp_rank_; }
  int cp_rank() const { return cp_rank_; }
  int dp_rank() const { return dp_rank_; }
  int pp_rank() const { return pp_rank_; }
  int replica_rank() const { return cp_rank_ + cp_ * dp_rank_; }
  int world_rank() const { return world_rank_of(tp_rank_, cp_rank_, dp_rank_, pp_rank_); }

  // The world rank at the given coordinates of this mesh.
  int world_rank_of(int tp_rank, int cp_rank, int dp_rank, int pp_rank) const {
    return tp_rank + tp_ * (cp_rank + cp_ * (dp_rank + dp_ * pp_rank));
  }

  Communicator& world() { return *world_; }
  Communicator& tp_group() { return *tp_group_; }
  Communicator& cp_group() { return *cp_group_; }
  // The cp x dp replicas (see above).
  Communicator& dp_group() { return *dp_group_; }
  Communicator& pp_group() { return *pp_group_; }
  // See above; InternalError when span or stride does not divide as required.
  Communicator& tp_subgroup(int span, int stride);
  Communicator& tp_replica_group(int degree);
  // Collective over the world when ep > 1 (every rank calls it with the same ep); ep must divide
  // dp (InternalError otherwise: configs are checked before).
  void add_expert_groups(int ep, MpiCommunicatorOptions options = {});
  int ep_size() const { return ep_; }
  Communicator& ep_group() { return ep_ > 1 ? *ep_group_ : *self_; }
  Communicator& expert_replica_group(int degree);

 private:
  Mesh(MeshDegrees degrees, int world_rank);

  int tp_ = 1, cp_ = 1, dp_ = 1, pp_ = 1, ep_ = 1;
  std::unique_ptr<Communicator> ep_group_;
  std::map<int, std::unique_ptr<Communicator>> expert_replica_groups_;  // by degree
  int tp_rank_ = 0, cp_rank_ = 0, dp_rank_ = 0, pp_rank_ = 0;
  std::unique_ptr<Communicator> world_, tp_group_, cp_group_, dp_group_, pp_group_;
  std::unique_ptr<Communicator> self_;  // groups of one (span == stride)
  std::map<std::pair<int, int>, std::unique_ptr<Communicator>> tp_subgroups_;  // (span, stride)
  std::map<int, std::unique_ptr<Communicator>> tp_replica_groups_;             // by degree
};

}  // namespace oases::comm
