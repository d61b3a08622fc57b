// Collective and message prices on a cluster's tiers (sim/collective_costs.h), against values
// computed by hand from the alpha-beta formulas: a ring all-reduce on each tier, a ring that
// crosses tiers (its slowest hop sets the pace), rings and messages that share an uplink, the
// tree NCCL takes when it is faster, and an all-to-all across nodes.
#include "sim/collective_costs.h"

#include <gtest/gtest.h>

namespace oases::sim {
namespace {

// 2 nodes x 4 devices: NVLink-bridged pairs (50 GB/s, 2 us), PCIe inside a node (10 GB/s per
// device, 5 us), one 5 GB/s NIC per node (10 us).
ClusterSpec two_nodes() {
  ClusterSpec c;
  c.name = "test";
  c.nodes = 2;
  c.devices_per_node = 4;
  c.tiers = {{"pair", 2, 50e9, 0, 2e-6, {}}, {"pcie", 4, 10e9, 0, 5e-6, {}}, {"network", 8, 5e9, 5e9, 10e-6, {}}};
  return c;
}

constexpr double kBytes = 1e9;

TEST(CollectiveCosts, RingAllReduceOnEachTier) {
  const ClusterSpec c = two_nodes();
  // A bridged pair: 2 (n - 1) / n x S / B + 2 (n - 1) alpha with n = 2, B = 50 GB/s.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, kBytes, {0, 1}), 1e9 / 50e9 + 2 * 2e-6, 1e-12);
  // Two devices of a node in different pairs: over PCIe.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, kBytes, {1, 2}), 1e9 / 10e9 + 2 * 5e-6, 1e-12);
  // One device per node: over the network, one ring through each NIC.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, kBytes, {0, 4}), 1e9 / 5e9 + 2 * 10e-6, 1e-12);
}

TEST(CollectiveCosts, ARingAcrossTiersMovesAtItsSlowestHop) {
  const ClusterSpec c = two_nodes();
  // 0-1 and 2-3 over bridges, 1-2 and 3-0 over PCIe: a channel through each device of a pair
  // (2 x 10 GB/s) is slower than the bridges; each step waits for the PCIe latency.
  const RingPath node = ring_path(c, {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(node.bytes_per_second, 20e9);
  EXPECT_DOUBLE_EQ(node.latency_seconds, 5e-6);
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, kBytes, {0, 1, 2, 3}),
              2.0 * 3 / 4 * 1e9 / 20e9 + 6 * 5e-6, 1e-12);
  // All eight: the NIC (5 GB/s, shared by the node's four channels) sets the pace.
  const double ring = 2.0 * 7 / 8 * 1e9 / 5e9 + 14 * 10e-6;
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, kBytes, {0, 1, 2, 3, 4, 5, 6, 7}), ring, 1e-12);
  // All-gather and reduce-scatter: half the steps of an all-reduce.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_gather, kBytes, {0, 1, 2, 3}),
              3.0 / 4 * 1e9 / 20e9 + 3 * 5e-6, 1e-12);
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::reduce_scatter, kBytes, {0, 4}), 0.5 * 1e9 / 5e9 + 10e-6, 1e-12);
}

TEST(CollectiveCosts, ConcurrentRingsShareTheUplinkTheyCross) {
  const ClusterSpec c = two_nodes();
  // Four data-parallel rings, one per device position, all leave node 0 through its NIC at
  // once: each gets a quarter of it.
  const std::vector<DeviceGroup> rings = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, kBytes, {1, 5}, rings),
              1e9 / (5e9 / 4) + 2 * 10e-6, 1e-12);
  // Rings inside the nodes do not touch the NIC.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, kBytes, {0, 1}, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}),
              1e9 / 50e9 + 2 * 2e-6, 1e-12);
}

TEST(CollectiveCosts, TwoMessagesSharingALinkTakeTwiceAsLong) {
  const ClusterSpec c = two_nodes();
  EXPECT_NEAR(message_seconds(c, kBytes, 0, 4), 1e9 / 5e9 + 10e-6, 1e-12);
  // Two devices of node 0 send to node 1 at once: they share its NIC.
  EXPECT_NEAR(message_seconds(c, kBytes, 0, 4, {{0, 4}, {1, 5}}), 1e9 / 2.5e9 + 10e-6, 1e-12);
  // One device sends two messages at once over its own link.
  EXPECT_NEAR(message_seconds(c, kBytes, 1, 2, {{1, 2}, {1, 3}}), 1e9 / 5e9 + 5e-6, 1e-12);
  // Messages on different links do not interfere.
  EXPECT_NEAR(message_seconds(c, kBytes, 1, 2, {{1, 2}, {5, 6}}), 1e9 / 10e9 + 5e-6, 1e-12);
}

TEST(CollectiveCosts, SmallAllReducesOverManyNodesTakeTheTree) {
  ClusterSpec c;
  c.name = "many nodes";
  c.nodes = 64;
  c.devices_per_node = 1;
  c.tiers = {{"network", 64, 10e9, 0, 20e-6, {}}};
  DeviceGroup all;
  for (int d = 0; d < 64; ++d) all.push_back(d);
  // 1 KB: the ring's 126 latencies against the tree's 2 x 6.
  const double tree = 2 * 1e3 / 10e9 + 2 * 6 * 20e-6;
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, 1e3, all), tree, 1e-12);
  // 1 GB: the ring's 2 (n - 1) / n x S / B beats the tree's 2 S / B.
  const double ring = 2.0 * 63 / 64 * 1e9 / 10e9 + 126 * 20e-6;
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, 1e9, all), ring, 1e-12);
}

TEST(CollectiveCosts, AllToAllAcrossNodesIsBoundByTheSharedNic) {
  const ClusterSpec c = two_nodes();
  // Each of 0, 1, 4, 5 sends a quarter of its 4 GB to each peer: device 0 sends 1 GB over
  // PCIe (to 1; 0.1 s), 2 GB over its network link (0.4 s), and node 0's NIC carries 4 GB
  // from both its devices: 0.8 s, plus three steps at the network's latency.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_to_all, 4e9, {0, 1, 4, 5}), 0.8 + 3 * 10e-6, 1e-12);
  EXPECT_EQ(collective_seconds(c, CollectiveOp::all_to_all, 4e9, {3}), 0.0);
}

// A tier's transfer-size efficiency: a 1e8-byte transfer on a tier that reaches half its
// bandwidth at that size takes twice the bandwidth term (latency unchanged); a size the curve
// holds at 1 is priced as without a curve; messages and all-to-alls likewise.
TEST(CollectiveCosts, LargeTransfersTakeTheirTiersEfficiency) {
  ClusterSpec c = two_nodes();
  c.tiers[1].efficiency = {{1e6, 1e8}, {1.0, 0.5}};  // PCIe
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, 1e8, {1, 2}), 1e8 / (0.5 * 10e9) + 2 * 5e-6, 1e-12);
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, 1e6, {1, 2}), 1e6 / 10e9 + 2 * 5e-6, 1e-12);
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_gather, 1e8, {1, 2}), 0.5 * 1e8 / (0.5 * 10e9) + 5e-6, 1e-12);
  EXPECT_NEAR(message_seconds(c, 1e8, 1, 2), 1e8 / (0.5 * 10e9) + 5e-6, 1e-12);
  // The bridged pair's tier has no curve.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_reduce, 1e8, {0, 1}), 1e8 / 50e9 + 2 * 2e-6, 1e-12);
  // An all-to-all over PCIe: each device sends 1e8 / 2 to the other at half the link.
  EXPECT_NEAR(collective_seconds(c, CollectiveOp::all_to_all, 1e8, {1, 2}), 0.5e8 / (0.5 * 10e9) + 5e-6, 1e-12);
}

}  // namespace
}  // namespace oases::sim
