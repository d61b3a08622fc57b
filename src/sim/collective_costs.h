// Seconds of collectives and point-to-point messages on a cluster's links (sim/cluster.h),
// by the alpha-beta model on the tiers they cross, with the bandwidth of a shared uplink split
// between the transfers that cross it at once.
//
// Rings. A group's ring visits its devices in ascending order (as NCCL orders a node's devices
// together) and wraps around. Each hop a -> b crosses tier u = tier_between(a, b). Its
// bandwidth is the least of
//   - what the devices of the group in a's domain below u can put into tier u: link(u) times
//     their number (NCCL runs a channel through each device's link, e.g. each GPU's NIC), and
//   - uplink(u) of a's and of b's domain below u divided by the hops of every concurrent ring
//     that leave (enter) that domain through tier u.
// The ring moves at its slowest hop's bandwidth B; each step costs the largest latency among its
// hops, alpha. For n devices and a buffer of S bytes (all-reduce: each rank's buffer; all-gather
// and reduce-scatter: the whole gathered buffer):
//   all-reduce      2 (n - 1) / n x S / B + 2 (n - 1) alpha      (reduce-scatter + all-gather)
//   all-gather,
//   reduce-scatter  (n - 1) / n x S / B + (n - 1) alpha
// A group that spans several nodes may instead reduce by trees (NCCL's double binary tree over
// the nodes, after a ring inside each node): 2 S / B_net + 2 ceil(log2 nodes) alpha_net plus
// the ring all-reduce inside a node; the faster of ring and tree is taken, as NCCL's tuner does.
//
// All-to-all. Each device sends S / n to every other device of its group. A device's link at
// tier u carries what it sends to peers across tier u; a domain's uplink at tier u carries what
// all its devices send across u, for every concurrent group. The exchange takes the longest of
// those loads over their bandwidths, plus (n - 1) times the largest latency it meets.
//
// Point-to-point. S bytes from a to b cross tier u = tier_between(a, b): S / bandwidth + latency,
// the bandwidth being link(u) shared with the concurrent messages leaving a's domain, and the
// uplinks of both domains shared likewise.
//
// Transfer size. Every bandwidth above is taken times its tier's efficiency at the transfer's
// size S (LinkTier::efficiency; 1 where the tier gives none).
#pragma once

#include "sim/cluster.h"

#include <vector>

namespace oases::sim {

// shift: every device of the group sends `bytes` to its neighbour in the ring at once (a step
// of ring attention).
enum class CollectiveOp { all_reduce, all_gather, reduce_scatter, all_to_all, shift };

// Devices of one group, any order (rings use ascending order).
using DeviceGroup = std::vector<int>;

// Seconds of `op` over `group` with `bytes` as above, while every group of `concurrent` (which
// holds `group` itself, or is empty: `group` alone) runs the same collective at once.
double collective_seconds(const ClusterSpec& cluster, CollectiveOp op, double bytes,
                          const DeviceGroup& group,
                          const std::vector<DeviceGroup>& concurrent = {});

// Seconds of one message of `bytes` from device `from` to `to` while every (from, to) pair of
// `concurrent` (which holds this one, or is empty) sends at once.
double message_seconds(const ClusterSpec& cluster, double bytes, int from, int to,
                       const std::vector<std::pair<int, int>>& concurrent = {});

// The ring of a group: its bandwidth (bytes/s) and per-step latency, as above.
struct RingPath {
  double bytes_per_second = 0;
  double latency_seconds = 0;
};
// `bytes` > 0: each hop's bandwidth times its tier's efficiency at that transfer size.
RingPath ring_path(const ClusterSpec& cluster, const DeviceGroup& group,
                   const std::vector<DeviceGroup>& concurrent = {}, double bytes = 0);

}  // namespace oases::sim
