#include "sim/placement.h"

#include "core/error.h"

#include <algorithm>
#include <set>

namespace oases::sim {

DeviceGroup RankLayout::tp_group(int rank) const {
  return tp_subgroup(rank, tp, 1);
}

DeviceGroup RankLayout::tp_subgroup(int rank, int span, int stride) const {
  OASES_ASSERT(span >= 1 && tp % span == 0 && stride >= 1 && span % stride == 0,
               "tensor-parallel subgroup ({}, {}) of a group of {}", span, stride, tp);
  const int r = tp_rank(rank), first = r / span * span;
  DeviceGroup group;
  for (int t = first; t < first + span; ++t)
    if (t % stride == r % stride) group.push_back(rank_of(t, dp_rank(rank), pp_rank(rank)));
  return group;
}

DeviceGroup RankLayout::tp_replica_group(int rank, int degree) const {
  OASES_ASSERT(degree >= 1 && tp % degree == 0, "degree {} of a group of {}", degree, tp);
  DeviceGroup group;
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t)
      if (t % degree == tp_rank(rank) % degree) group.push_back(rank_of(t, d, pp_rank(rank)));
  return group;
}

DeviceGroup RankLayout::dp_group(int rank) const {
  DeviceGroup group;
  for (int d = 0; d < dp; ++d) group.push_back(rank_of(tp_rank(rank), d, pp_rank(rank)));
  return group;
}

DeviceGroup RankLayout::cp_group(int rank) const {
  OASES_ASSERT(cp >= 1 && dp % cp == 0, "cp {} does not divide the replicas {}", cp, dp);
  const int first = dp_rank(rank) / cp * cp;
  DeviceGroup group;
  for (int d = first; d < first + cp; ++d)
    group.push_back(rank_of(tp_rank(rank), d, pp_rank(rank)));
  return group;
}

DeviceGroup RankLayout::pp_group(int rank) const {
  DeviceGroup group;
  for (int p = 0; p < pp; ++p) group.push_back(rank_of(tp_rank(rank), dp_rank(rank), p));
  return group;
}

DeviceGroup RankLayout::ep_group(int rank) const {
  OASES_ASSERT(ep >= 1 && dp % ep == 0, "ep {} does not divide dp {}", ep, dp);
  const int first = dp_rank(rank) / ep * ep;
  DeviceGroup group;
  for (int d = first; d < first + ep; ++d) group.push_back(rank_of(tp_rank(rank), d, pp_rank(rank)));
  return group;
}

DeviceGroup RankLayout::expert_replica_group(int rank, int degree) const {
  OASES_ASSERT(degree >= 1 && tp % degree == 0, "degree {} of a group of {}", degree, tp);
  DeviceGroup group;
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t)
      if (d % ep == dp_rank(rank) % ep && t % degree == tp_rank(rank) % degree)
        group.push_back(rank_of(t, d, pp_rank(rank)));
  return group;
}

std::vector<DeviceGroup> RankLayout::every(const std::function<DeviceGroup(int)>& group_of) const {
  std::set<DeviceGroup> seen;
  std::vector<DeviceGroup> groups;
  for (int r = 0; r < world(); ++r) {
    DeviceGroup g = group_of(r);
    DeviceGroup key = g;
    std::sort(key.begin(), key.end());
    if (seen.insert(key).second) groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace oases::sim
