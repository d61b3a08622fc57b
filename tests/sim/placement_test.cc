// The groups of a run's ranks on a cluster's devices (sim/placement.h), worked out by hand for
// tp 2 x dp 4 x pp 2 with ep 2 from the mesh's rules (comm/mesh.h).
#include "sim/placement.h"

#include <gtest/gtest.h>

namespace oases::sim {
namespace {

TEST(Placement, GroupsFollowTheMeshGrid) {
  const RankLayout layout{.tp = 2, .dp = 4, .pp = 2, .ep = 2};
  EXPECT_EQ(layout.world(), 16);
  // Rank 5: tp_rank 1, dp_rank 2, pp_rank 0.
  EXPECT_EQ(layout.tp_rank(5), 1);
  EXPECT_EQ(layout.dp_rank(5), 2);
  EXPECT_EQ(layout.pp_rank(5), 0);
  EXPECT_EQ(layout.tp_group(5), (DeviceGroup{4, 5}));
  EXPECT_EQ(layout.dp_group(5), (DeviceGroup{1, 3, 5, 7}));
  EXPECT_EQ(layout.pp_group(5), (DeviceGroup{5, 13}));
  EXPECT_EQ(layout.ep_group(5), (DeviceGroup{5, 7}));
  EXPECT_EQ(layout.tp_subgroup(5, 1, 1), (DeviceGroup{5}));
  EXPECT_EQ(layout.tp_subgroup(5, 2, 2), (DeviceGroup{5}));
  // A layer at degree 1: every rank of the stage holds the same shard.
  EXPECT_EQ(layout.tp_replica_group(5, 1), (DeviceGroup{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(layout.tp_replica_group(5, 2), layout.dp_group(5));
  // The same experts (dp_rank % 2 == 0) and the same shard of them (tp_rank 1).
  EXPECT_EQ(layout.expert_replica_group(5, 2), (DeviceGroup{1, 5}));
  EXPECT_EQ(layout.expert_replica_group(5, 1), (DeviceGroup{0, 1, 4, 5}));
  // Every group of a kind, once: 8 tensor-parallel pairs, 4 data-parallel groups of 4.
  EXPECT_EQ(layout.every([&](int r) { return layout.tp_group(r); }).size(), 8u);
  const auto dp_groups = layout.every([&](int r) { return layout.dp_group(r); });
  ASSERT_EQ(dp_groups.size(), 4u);
  EXPECT_EQ(dp_groups[3], (DeviceGroup{9, 11, 13, 15}));
}

TEST(Placement, SubgroupsOfAWiderTensorParallelGroup) {
  const RankLayout layout{.tp = 8};
  // Rank 6 at degree 4 (span 4, stride 1): ranks 4..7; gathering degree 2 into 4 (span 4,
  // stride 2): the ranks of 4..7 with the same parity.
  EXPECT_EQ(layout.tp_subgroup(6, 4, 1), (DeviceGroup{4, 5, 6, 7}));
  EXPECT_EQ(layout.tp_subgroup(6, 4, 2), (DeviceGroup{4, 6}));
  EXPECT_EQ(layout.tp_replica_group(6, 4), (DeviceGroup{2, 6}));
}

}  // namespace
}  // namespace oases::sim
