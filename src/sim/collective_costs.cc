#include "sim/collective_costs.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

namespace oases::sim {
namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

DeviceGroup sorted(DeviceGroup group) {
  std::sort(group.begin(), group.end());
  return group;
}

void check_group(const ClusterSpec& cluster, const DeviceGroup& group) {
  OASES_ASSERT(!group.empty(), "a collective over no devices");
  std::set<int> seen;
  for (int d : group) {
    OASES_ASSERT(d >= 0 && d < cluster.devices(), "device {} outside the {} devices of {}", d,
                 cluster.devices(), cluster.name);
    OASES_ASSERT(seen.insert(d).second, "device {} twice in one group", d);
  }
}

const LinkTier& tier_at(const ClusterSpec& cluster, int tier) {
  return cluster.tiers[static_cast<std::size_t>(tier)];
}

// Hops of concurrent rings (or messages) that leave and enter each domain below a tier.
struct UplinkLoad {
  std::map<std::pair<int, int>, int> out, in;  // (tier, lower domain) -> hops
  void add(const ClusterSpec& cluster, int from, int to) {
    const int tier = cluster.tier_between(from, to);
    const int lower = cluster.lower_span(tier);
    ++out[{tier, from / lower}];
    ++in[{tier, to / lower}];
  }
  // The uplink bandwidth one hop from -> to gets.
  double share(const ClusterSpec& cluster, int from, int to) const {
    const int tier = cluster.tier_between(from, to);
    const double uplink = tier_at(cluster, tier).uplink_bytes_per_second;
    if (uplink <= 0) return kUnlimited;
    const int lower = cluster.lower_span(tier);
    const int leaving = std::max(1, out.count({tier, from / lower}) ? out.at({tier, from / lower}) : 0);
    const int entering = std::max(1, in.count({tier, to / lower}) ? in.at({tier, to / lower}) : 0);
    return uplink / std::max(leaving, entering);
  }
};

UplinkLoad ring_loads(const ClusterSpec& cluster, const std::vector<DeviceGroup>& rings) {
  UplinkLoad load;
  for (const DeviceGroup& ring : rings) {
    const DeviceGroup r = sorted(ring);
    if (r.size() < 2) continue;
    for (std::size_t i = 0; i < r.size(); ++i) {
      load.add(cluster, r[i], r[(i + 1) % r.size()]);
    }
  }
  return load;
}

double ring_all_reduce(const RingPath& path, double bytes, std::size_t n) {
  if (n < 2) return 0;
  const double steps = 2.0 * static_cast<double>(n - 1);
  return steps / static_cast<double>(n) * bytes / path.bytes_per_second + steps * path.latency_seconds;
}

// Groups split by node: each group's devices on one node, for every node it has devices on.
std::vector<DeviceGroup> per_node(const ClusterSpec& cluster, const DeviceGroup& group) {
  std::map<int, DeviceGroup> by_node;
  for (int d : group) by_node[d / cluster.devices_per_node].push_back(d);
  std::vector<DeviceGroup> out;
  for (auto& [node, devices] : by_node) out.push_back(std::move(devices));
  return out;
}

// NCCL's tree all-reduce of a group spanning several nodes: a ring inside each node, then
// double binary trees over the nodes.
double tree_all_reduce(const ClusterSpec& cluster, double bytes, const DeviceGroup& group,
                       const std::vector<DeviceGroup>& concurrent) {
  const std::vector<DeviceGroup> local = per_node(cluster, group);
  const std::size_t nodes = local.size();
  double inside = 0;
  std::vector<DeviceGroup> all_local;
  for (const DeviceGroup& g : concurrent)
    for (DeviceGroup& part : per_node(cluster, g)) all_local.push_back(std::move(part));
  for (const DeviceGroup& part : local)
    inside = std::max(inside, ring_all_reduce(ring_path(cluster, part, all_local, bytes), bytes, part.size()));
  // Across nodes: the node's devices of the group send through their links, sharing the node's
  // uplink with the other groups that cross it.
  const int network = static_cast<int>(cluster.tiers.size()) - 1;
  const LinkTier& net = tier_at(cluster, network);
  double bandwidth = kUnlimited;
  for (const DeviceGroup& part : local) {
    const int node = part.front() / cluster.devices_per_node;
    int crossing = 0;
    for (const DeviceGroup& g : concurrent) {
      const auto parts = per_node(cluster, g);
      if (parts.size() > 1 && std::any_of(g.begin(), g.end(), [&](int d) {
            return d / cluster.devices_per_node == node;
          }))
        ++crossing;
    }
    double b = net.link_bytes_per_second * static_cast<double>(part.size());
    if (net.uplink_bytes_per_second > 0)
      b = std::min(b, net.uplink_bytes_per_second / std::max(1, crossing));
    bandwidth = std::min(bandwidth, b * net.efficiency_at(bytes));
  }
  const double depth = std::ceil(std::log2(static_cast<double>(nodes)));
  return inside + 2 * bytes / bandwidth + 2 * depth * net.latency_seconds;
}

double all_to_all(const ClusterSpec& cluster, double bytes, const DeviceGroup& group,
                  const std::vector<DeviceGroup>& concurrent) {
  const std::size_t n = group.size();
  if (n < 2) return 0;
  std::map<std::pair<int, int>, double> link_load;                  // (device, tier)
  std::map<std::pair<int, int>, double> out_load, in_load;          // (tier, lower domain)
  for (const DeviceGroup& g : concurrent) {
    const double block = bytes / static_cast<double>(g.size());
    for (int a : g)
      for (int b : g) {
        if (a == b) continue;
        const int tier = cluster.tier_between(a, b);
        const int lower = cluster.lower_span(tier);
        link_load[{a, tier}] += block;
        out_load[{tier, a / lower}] += block;
        in_load[{tier, b / lower}] += block;
      }
  }
  double seconds = 0, latency = 0;
  for (int a : group)
    for (int b : group) {
      if (a == b) continue;
      const int tier = cluster.tier_between(a, b);
      const LinkTier& t = tier_at(cluster, tier);
      const int lower = cluster.lower_span(tier);
      const double efficiency = t.efficiency_at(bytes);
      latency = std::max(latency, t.latency_seconds);
      seconds = std::max(seconds, link_load[{a, tier}] / (t.link_bytes_per_second * efficiency));
      if (t.uplink_bytes_per_second > 0)
        seconds = std::max({seconds, out_load[{tier, a / lower}] / (t.uplink_bytes_per_second * efficiency),
                            in_load[{tier, b / lower}] / (t.uplink_bytes_per_second * efficiency)});
    }
  return seconds + static_cast<double>(n - 1) * latency;
}

}  // namespace

RingPath ring_path(const ClusterSpec& cluster, const DeviceGroup& group,
                   const std::vector<DeviceGroup>& concurrent, double bytes) {
  check_group(cluster, group);
  const DeviceGroup ring = sorted(group);
  if (ring.size() < 2) return {kUnlimited, 0};
  const UplinkLoad load = ring_loads(cluster, concurrent.empty() ? std::vector<DeviceGroup>{group} : concurrent);
  RingPath path{kUnlimited, 0};
  for (std::size_t i = 0; i < ring.size(); ++i) {
    const int a = ring[i], b = ring[(i + 1) % ring.size()];
    const int tier = cluster.tier_between(a, b);
    const LinkTier& t = tier_at(cluster, tier);
    const int lower = cluster.lower_span(tier);
    const auto members = std::count_if(ring.begin(), ring.end(), [&](int d) { return d / lower == a / lower; });
    const double channels = t.link_bytes_per_second * static_cast<double>(members);
    const double efficiency = bytes > 0 ? t.efficiency_at(bytes) : 1.0;
    path.bytes_per_second = std::min(
        {path.bytes_per_second, channels * efficiency, load.share(cluster, a, b) * efficiency});
    path.latency_seconds = std::max(path.latency_seconds, t.latency_seconds);
  }
  return path;
}

double collective_seconds(const ClusterSpec& cluster, CollectiveOp op, double bytes,
                          const DeviceGroup& group, const std::vector<DeviceGroup>& concurrent) {
  check_group(cluster, group);
  const std::vector<DeviceGroup> all = concurrent.empty() ? std::vector<DeviceGroup>{group} : concurrent;
  const std::size_t n = group.size();
  if (n < 2 || bytes <= 0) return 0;
  switch (op) {
    case CollectiveOp::all_reduce: {
      const double ring = ring_all_reduce(ring_path(cluster, group, all, bytes), bytes, n);
      if (per_node(cluster, group).size() < 2) return ring;
      return std::min(ring, tree_all_reduce(cluster, bytes, group, all));
    }
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter: {
      const RingPath path = ring_path(cluster, group, all, bytes);
      const double steps = static_cast<double>(n - 1);
      return steps / static_cast<double>(n) * bytes / path.bytes_per_second + steps * path.latency_seconds;
    }
    case CollectiveOp::all_to_all:
      return all_to_all(cluster, bytes, group, all);
    case CollectiveOp::shift: {
      const RingPath path = ring_path(cluster, group, all, bytes);
      return bytes / path.bytes_per_second + path.latency_seconds;
    }
  }
  return 0;
}

double message_seconds(const ClusterSpec& cluster, double bytes, int from, int to,
                       const std::vector<std::pair<int, int>>& concurrent) {
  check_group(cluster, {from, to});
  const std::vector<std::pair<int, int>> all =
      concurrent.empty() ? std::vector<std::pair<int, int>>{{from, to}} : concurrent;
  const int tier = cluster.tier_between(from, to);
  const LinkTier& t = tier_at(cluster, tier);
  UplinkLoad load;
  int from_link = 0;
  for (const auto& [a, b] : all) {
    load.add(cluster, a, b);
    if (a == from && cluster.tier_between(a, b) == tier) ++from_link;
  }
  const double bandwidth = std::min(t.link_bytes_per_second / std::max(1, from_link),
                                    load.share(cluster, from, to)) *
                           t.efficiency_at(bytes);
  return bytes / bandwidth + t.latency_seconds;
}

}  // namespace oases::sim
