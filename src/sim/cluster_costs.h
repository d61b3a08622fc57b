// The prices of one rank's instructions on a cluster (a CostModel for sim/schedule_sim.h):
//   - compute by roofline from each segment's work (sim/roofline.h);
//   - a segment's collective over the devices of the group it runs on (sim/placement.h): its
//     all-reduce over the layer's copy (tp_subgroup(degree, 1)), a reshard's all-gather over
//     tp_subgroup(larger degree, smaller degree), an MoE all-to-all over the ep group, with
//     every group of that kind running the same collective at once (the ranks of a kind run
//     the same schedule together, so their transfers share the links they cross);
//   - a gradient bucket's data-parallel reduction (ZeRO stages 0-1: all-reduce; 2-3:
//     reduce-scatter) and the parameter gathers of ZeRO-1 to 3 (all-gather; the schedule holds
//     them where the engine shards parameters) over the bucket's replica
//     group: tp_replica_group of the degree of the segment that finishes it, or the expert
//     replica group for an MoE layer's experts;
//   - a pipeline message of the segment's activation (or gradient) bytes to the peer stage,
//     while every rank of this stage sends to its own peer;
//   - the optimizer step as a pass over the rank's parameters, gradients and AdamW moments
//     (28 bytes read and written per fp32 parameter, divided over dp under ZeRO);
//   - the device's overlap and collective slowdowns; the data-parallel lane shares the
//     tensor-parallel lane's link when both groups cross the same tier.
#pragma once

#include <memory>

#include "core/dtype.h"
#include "ops/program.h"
#include "sim/cluster.h"
#include "sim/placement.h"
#include "sim/schedule_sim.h"

#include <string>

namespace oases::sim {

struct ClusterRank {
  RankLayout layout;
  int rank = 0;
  DType products = DType::f32;     // the element type of the products (and of the parameters compute reads)
  std::size_t grad_element_bytes = 4;
  int zero = 0;                    // ZeRO stage
};

// Collective prices shared by the cost models of many simulations on one cluster (the joint
// planner's): each (layout, group of the rank, operation, bytes) is priced once, with the
// concurrent groups of its kind found once per layout. Thread-safe. Every cost model that uses
// one must be built for the same cluster, and the cache must outlive them.
class CollectivePriceCache;
std::shared_ptr<CollectivePriceCache> make_collective_price_cache();

// `cluster` and `program` must outlive the returned model. UserError when the cluster has too
// few devices for the layout. A device that computes from a profile (this machine's) leaves
// compute and optimizer_step for the caller to fill from the profile. `shared`: a cache of
// collective prices on this cluster (the same prices, found once).
CostModel cluster_costs(const ClusterSpec& cluster, const ops::Program& program,
                        const ClusterRank& rank,
                        const std::shared_ptr<CollectivePriceCache>& shared = nullptr);

// The devices a collective of `program`'s segment `segment` runs over (its forward collective
// when `forward`), for `rank` of `layout`.
DeviceGroup segment_group(const ops::Program& program, int segment, bool forward,
                          const RankLayout& layout, int rank);

}  // namespace oases::sim
