#include "sim/cluster_costs.h"

#include "core/error.h"
#include "sim/roofline.h"


#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace oases::sim {
namespace {

// The segment whose backward finishes `bucket` (ops::SegmentShape::ready_bucket); -1: none.
int finishing_segment(const ops::Program& program, int bucket) {
  for (std::size_t i = 0; i < program.segments.size(); ++i)
    if (program.segments[i].ready_bucket == bucket) return static_cast<int>(i);
  return -1;
}

// Which group of a rank a collective runs over: every rank's group of one kind runs it at once.
struct GroupKind {
  enum Type { ep, cp, tp_subgroup, tp_replicas, expert_replicas } type = tp_subgroup;
  int a = 1, b = 1;  // tp_subgroup: (span, stride); replicas: (degree, unused)
  auto operator<=>(const GroupKind&) const = default;

  DeviceGroup group(const RankLayout& layout, int rank) const {
    switch (type) {
      case ep: return layout.ep_group(rank);
      case cp:
        return layout.cp_group(rank);
      case tp_subgroup: return layout.tp_subgroup(rank, a, b);
      case tp_replicas: return layout.tp_replica_group(rank, a);
      case expert_replicas: return layout.expert_replica_group(rank, a);
    }
    return {};
  }
};

}  // namespace

class CollectivePriceCache {
 public:
  using Layout = std::tuple<int, int, int, int, int>;  // tp, dp, pp, ep, cp
  static Layout key_of(const RankLayout& l) { return {l.tp, l.dp, l.pp, l.ep, l.cp}; }

  double price(const ClusterSpec& cluster, const RankLayout& layout, CollectiveOp op, double bytes,
               const GroupKind& kind, const DeviceGroup& group) {
    const auto key = std::make_tuple(key_of(layout), op, bytes, kind, group);
    {
      std::lock_guard lock(mutex_);
      if (const auto known = seconds_.find(key); known != seconds_.end()) return known->second;
    }
    const std::vector<DeviceGroup> concurrent = concurrent_of(layout, kind);
    const double seconds = collective_seconds(cluster, op, bytes, group, concurrent);
    std::lock_guard lock(mutex_);
    seconds_.emplace(key, seconds);
    return seconds;
  }

 private:
  std::vector<DeviceGroup> concurrent_of(const RankLayout& layout, const GroupKind& kind) {
    const auto key = std::make_pair(key_of(layout), kind);
    {
      std::lock_guard lock(mutex_);
      if (const auto known = concurrent_.find(key); known != concurrent_.end())
        return known->second;
    }
    std::vector<DeviceGroup> groups = layout.every([&](int r) { return kind.group(layout, r); });
    std::lock_guard lock(mutex_);
    return concurrent_.emplace(key, std::move(groups)).first->second;
  }

  std::mutex mutex_;
  std::map<std::pair<Layout, GroupKind>, std::vector<DeviceGroup>> concurrent_;
  std::map<std::tuple<Layout, CollectiveOp, double, GroupKind, DeviceGroup>, double> seconds_;
};

std::shared_ptr<CollectivePriceCache> make_collective_price_cache() {
  return std::make_shared<CollectivePriceCache>();
}

namespace {

// Collective prices by (operation, bytes, group kind), each with every group of its kind at
// once; the concurrent groups of a kind are found once (once per layout with a shared cache).
class GroupPrices {
 public:
  GroupPrices(const ClusterSpec& cluster, const RankLayout& layout, int rank,
              std::shared_ptr<CollectivePriceCache> shared)
      : cluster_(cluster), layout_(layout), rank_(rank), shared_(std::move(shared)) {}

  double price(CollectiveOp op, double bytes, const GroupKind& kind) {
    const auto key = std::make_tuple(op, bytes, kind);
    const auto known = seconds_.find(key);
    if (known != seconds_.end()) return known->second;
    double seconds = 0;
    if (shared_) {
      seconds = shared_->price(cluster_, layout_, op, bytes, kind, kind.group(layout_, rank_));
    } else {
      auto& concurrent = concurrent_[kind];
      if (concurrent.empty())
        concurrent = layout_.every([&](int r) { return kind.group(layout_, r); });
      seconds = collective_seconds(cluster_, op, bytes, kind.group(layout_, rank_), concurrent);
    }
    seconds_[key] = seconds;
    return seconds;
  }

 private:
  const ClusterSpec& cluster_;
  RankLayout layout_;
  int rank_;
  std::shared_ptr<CollectivePriceCache> shared_;
  std::map<GroupKind, std::vector<DeviceGroup>> concurrent_;
  std::map<std::tuple<CollectiveOp, double, GroupKind>, double> seconds_;
};

GroupKind segment_group_kind(const ops::Program& program, int segment, bool forward) {
  const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(segment)];
  const ops::CollectiveKind kind = forward ? shape.forward_kind : shape.backward_kind;
  switch (kind) {
    case ops::CollectiveKind::all_to_all:
      return {shape.context_parallel_ranks > 0 ? GroupKind::cp : GroupKind::ep};
    case ops::CollectiveKind::shift:
      return {GroupKind::cp};
    case ops::CollectiveKind::reduce_scatter:
      break;
    case ops::CollectiveKind::all_gather: {
      if (shape.sequence_sharded && !forward && shape.backward_degree > 0)
        return {GroupKind::tp_subgroup, shape.backward_degree, 1};
      if (shape.sequence_sharded) break;
      // A reshard runs at the degree of the layer before it; the gather joins collective_ranks
      // groups of the smaller degree into one of the larger.
      const bool rises = shape.has_forward_collective;
      const int larger = rises ? shape.degree * shape.collective_ranks : shape.degree;
      const int smaller = rises ? shape.degree : shape.degree / shape.collective_ranks;
      return {GroupKind::tp_subgroup, larger, smaller};
    }
    case ops::CollectiveKind::all_reduce:
      break;
  }
  return {GroupKind::tp_subgroup, shape.degree, 1};
}

}  // namespace

DeviceGroup segment_group(const ops::Program& program, int segment, bool forward,
                          const RankLayout& layout, int rank) {
  return segment_group_kind(program, segment, forward).group(layout, rank);
}

CostModel cluster_costs(const ClusterSpec& cluster, const ops::Program& program,
                        const ClusterRank& at,
                        const std::shared_ptr<CollectivePriceCache>& shared) {
  check_cluster_holds(cluster, at.layout.world(), cluster.name);
  const RankLayout layout = at.layout;
  const int rank = at.rank;
  auto prices = std::make_shared<GroupPrices>(cluster, layout, rank, shared);
  const double element = static_cast<double>(program.set_element_bytes);
  CostModel costs;
  // A device that computes from a profile leaves compute and the optimizer to the caller.
  const bool roofline = !cluster.device.computes_from_profile();
  const std::string products(precision_key(at.products));
  if (roofline) costs.compute = roofline_compute(cluster.device, program, products);
  costs.codec = roofline_codec(cluster.device, program);
  costs.collective = [&program, prices, element](const schedule::Instruction& ins) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const bool forward = ins.direction == schedule::Direction::forward;
    const ops::CollectiveKind kind = forward ? shape.forward_kind : shape.backward_kind;
    const double bytes = element * static_cast<double>(forward ? shape.forward_collective_elements
                                                               : shape.backward_collective_elements);
    const CollectiveOp op = kind == ops::CollectiveKind::shift        ? CollectiveOp::shift
                            : kind == ops::CollectiveKind::all_to_all ? CollectiveOp::all_to_all
                            : kind == ops::CollectiveKind::all_gather ? CollectiveOp::all_gather
                            : kind == ops::CollectiveKind::reduce_scatter
                                ? CollectiveOp::reduce_scatter
                                : CollectiveOp::all_reduce;
    return prices->price(op, bytes, segment_group_kind(program, ins.segment, forward));
  };
  // A bucket's replicas: the ranks holding the same shard of its parameters.
  const auto replicas = [&program, layout](int bucket) {
    const int segment = finishing_segment(program, bucket);
    const ops::SegmentShape* shape =
        segment >= 0 ? &program.segments[static_cast<std::size_t>(segment)] : nullptr;
    const int degree = shape ? shape->degree : layout.tp;
    const auto& holds_experts = program.bucket_holds_experts;
    const bool experts = layout.ep > 1 && bucket >= 0 &&
                         static_cast<std::size_t>(bucket) < holds_experts.size() &&
                         holds_experts[static_cast<std::size_t>(bucket)];
    return GroupKind{experts ? GroupKind::expert_replicas : GroupKind::tp_replicas, degree, 1};
  };
  const auto bucket_bytes = [&program](int bucket, double element_bytes, double param_element) {
    const auto& bytes = program.bucket_param_bytes;
    if (bucket < 0 || static_cast<std::size_t>(bucket) >= bytes.size()) return 0.0;
    return static_cast<double>(bytes[static_cast<std::size_t>(bucket)]) / param_element * element_bytes;
  };
  const auto param_element = static_cast<double>(dtype_size(at.products));
  const double grad_element = static_cast<double>(at.grad_element_bytes);
  const int zero = at.zero;
  costs.reduce_grads = [prices, replicas, bucket_bytes, zero, param_element, grad_element](int bucket) {
    return prices->price(zero >= 2 ? CollectiveOp::reduce_scatter : CollectiveOp::all_reduce,
                         bucket_bytes(bucket, grad_element, param_element), replicas(bucket));
  };
  // ZeRO-3 gathers ahead of use; ZeRO-1 and 2 gather the updated blocks ahead of the next use.
  if (zero >= 1)
    costs.gather_params = [prices, replicas, bucket_bytes, param_element](int bucket) {
      return prices->price(CollectiveOp::all_gather, bucket_bytes(bucket, param_element, param_element),
                           replicas(bucket));
    };
  // Every rank of this stage sends to its own peer stage at once; the pairs are found once per
  // peer stage, the prices once per size.
  auto messages = std::make_shared<std::map<std::pair<int, double>, double>>();
  costs.p2p = [&cluster, &program, layout, rank, messages](const schedule::Instruction& ins) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const double bytes = static_cast<double>(shape.received_bytes);
    const auto known = messages->find({ins.peer, bytes});
    if (known != messages->end()) return known->second;
    const DeviceGroup stages = layout.pp_group(rank);
    const int to = stages[static_cast<std::size_t>(ins.peer)];
    std::vector<std::pair<int, int>> concurrent;
    for (int r = 0; r < layout.world(); ++r)
      if (layout.pp_rank(r) == layout.pp_rank(rank))
        concurrent.push_back({r, layout.pp_group(r)[static_cast<std::size_t>(ins.peer)]});
    const double seconds = message_seconds(cluster, bytes, rank, to, concurrent);
    (*messages)[{ins.peer, bytes}] = seconds;
    return seconds;
  };
  // AdamW over this rank's share: the fp32 parameter, gradient and two moments read, the
  // parameter and moments written (and the 16-bit copy under mixed precision).
  double parameters = 0;
  for (std::size_t bytes : program.bucket_param_bytes) parameters += static_cast<double>(bytes) / param_element;
  if (zero >= 1) parameters /= layout.dp;
  ops::Work step;
  step.bytes = parameters * (28 + (param_element == 2 ? 2 : 0));
  if (roofline) costs.optimizer_step = work_seconds(cluster.device, step, products);
  costs.overlap_slowdown = cluster.device.overlap_slowdown;
  costs.collective_slowdown = cluster.device.collective_slowdown;
  // A layer's replicas (over data parallelism, and inside the tensor-parallel group for layers
  // below its degree) reduce on the collectives' link when their groups meet the same tier. The
  // collectives' lane carries the tensor-parallel collectives and, with ep > 1, the MoE layers'
  // all-to-alls over the expert-parallel group.
  int smallest_degree = layout.tp;
  for (const ops::SegmentShape& shape : program.segments)
    smallest_degree = std::min(smallest_degree, std::max(1, shape.degree));
  const DeviceGroup replicas_of_smallest = layout.tp_replica_group(rank, smallest_degree);
  if (replicas_of_smallest.size() > 1) {
    const int replica_tier = cluster.tier_of(replicas_of_smallest);
    const auto meets = [&](const DeviceGroup& group) {
      return group.size() > 1 && cluster.tier_of(group) == replica_tier;
    };
    costs.shared_link = meets(layout.tp_group(rank)) || (layout.ep > 1 && meets(layout.ep_group(rank)));
    costs.shared_link_in_issue_order =
        costs.shared_link && cluster.tiers[static_cast<std::size_t>(replica_tier)].in_issue_order;
  }
  return costs;
}

}  // namespace oases::sim
