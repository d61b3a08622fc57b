#include "sim/cluster_costs.h"

#include "core/error.h"
#include "sim/roofline.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

namespace oases::sim {
namespace {

bool is_experts(const ops::SegmentShape& shape) { return shape.name.rfind("experts.", 0) == 0; }

// The segment whose backward finishes `bucket` (ops::SegmentShape::ready_bucket); -1: none.
int finishing_segment(const ops::Program& program, int bucket) {
  for (std::size_t i = 0; i < program.segments.size(); ++i)
    if (program.segments[i].ready_bucket == bucket) return static_cast<int>(i);
  return -1;
}

// Collective prices by (group, bytes), each group's with every group of its kind at once.
class GroupPrices {
 public:
  GroupPrices(const ClusterSpec& cluster, const RankLayout& layout) : cluster_(cluster), layout_(layout) {}

  // `kind` names the collective (a segment's, a bucket's): prices are kept by it and bytes.
  double price(CollectiveOp op, double bytes, const std::function<DeviceGroup(int)>& group_of,
               int rank, const std::string& kind) {
    const auto known = seconds_.find({kind, bytes});
    if (known != seconds_.end()) return known->second;
    auto& concurrent = concurrent_[kind];
    if (concurrent.empty()) concurrent = layout_.every(group_of);
    const double seconds = collective_seconds(cluster_, op, bytes, group_of(rank), concurrent);
    seconds_[{kind, bytes}] = seconds;
    return seconds;
  }

 private:
  const ClusterSpec& cluster_;
  RankLayout layout_;
  std::map<std::string, std::vector<DeviceGroup>> concurrent_;
  std::map<std::pair<std::string, double>, double> seconds_;
};

}  // namespace

DeviceGroup segment_group(const ops::Program& program, int segment, bool forward,
                          const RankLayout& layout, int rank) {
  const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(segment)];
  const ops::CollectiveKind kind = forward ? shape.forward_kind : shape.backward_kind;
  switch (kind) {
    case ops::CollectiveKind::all_to_all:
      return layout.ep_group(rank);
    case ops::CollectiveKind::all_gather: {
      // A reshard runs at the degree of the layer before it; the gather joins collective_ranks
      // groups of the smaller degree into one of the larger.
      const bool rises = shape.has_forward_collective;
      const int larger = rises ? shape.degree * shape.collective_ranks : shape.degree;
      const int smaller = rises ? shape.degree : shape.degree / shape.collective_ranks;
      return layout.tp_subgroup(rank, larger, smaller);
    }
    case ops::CollectiveKind::all_reduce:
      break;
  }
  return layout.tp_subgroup(rank, shape.degree, 1);
}

CostModel cluster_costs(const ClusterSpec& cluster, const ops::Program& program,
                        const ClusterRank& at) {
  check_cluster_holds(cluster, at.layout.world(), cluster.name);
  const RankLayout layout = at.layout;
  const int rank = at.rank;
  auto prices = std::make_shared<GroupPrices>(cluster, layout);
  const double element = static_cast<double>(program.set_element_bytes);
  CostModel costs;
  // A device that computes from a profile leaves compute and the optimizer to the caller.
  const bool roofline = !cluster.device.computes_from_profile();
  if (roofline) costs.compute = roofline_compute(cluster.device, program, at.dtype);
  costs.collective = [&program, layout, rank, prices, element](const schedule::Instruction& ins) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const bool forward = ins.direction == schedule::Direction::forward;
    const ops::CollectiveKind kind = forward ? shape.forward_kind : shape.backward_kind;
    const double bytes = element * static_cast<double>(forward ? shape.forward_collective_elements
                                                               : shape.backward_collective_elements);
    const auto group_of = [&program, segment = ins.segment, forward, layout](int r) {
      return segment_group(program, segment, forward, layout, r);
    };
    const CollectiveOp op = kind == ops::CollectiveKind::all_to_all   ? CollectiveOp::all_to_all
                            : kind == ops::CollectiveKind::all_gather ? CollectiveOp::all_gather
                                                                      : CollectiveOp::all_reduce;
    return prices->price(op, bytes, group_of, rank,
                         fmt::format("{}.{}", shape.name, forward ? "fwd" : "bwd"));
  };
  // A bucket's replicas: the ranks holding the same shard of its parameters.
  const auto replicas = [&program, layout](int bucket) {
    const int segment = finishing_segment(program, bucket);
    const ops::SegmentShape* shape =
        segment >= 0 ? &program.segments[static_cast<std::size_t>(segment)] : nullptr;
    const int degree = shape ? shape->degree : layout.tp;
    const bool experts = shape && is_experts(*shape) && layout.ep > 1;
    return std::function<DeviceGroup(int)>([layout, degree, experts](int r) {
      return experts ? layout.expert_replica_group(r, degree) : layout.tp_replica_group(r, degree);
    });
  };
  const auto bucket_bytes = [&program](int bucket, double element_bytes, double param_element) {
    const auto& bytes = program.bucket_param_bytes;
    if (bucket < 0 || static_cast<std::size_t>(bucket) >= bytes.size()) return 0.0;
    return static_cast<double>(bytes[static_cast<std::size_t>(bucket)]) / param_element * element_bytes;
  };
  const double param_element = at.dtype == "bf16" || at.dtype == "fp16" ? 2.0
                               : at.dtype == "fp64"                     ? 8.0
                                                                        : 4.0;
  const double grad_element = static_cast<double>(at.grad_element_bytes);
  const int zero = at.zero;
  costs.reduce_grads = [prices, replicas, bucket_bytes, rank, zero, param_element,
                        grad_element](int bucket) {
    return prices->price(zero >= 2 ? CollectiveOp::reduce_scatter : CollectiveOp::all_reduce,
                         bucket_bytes(bucket, grad_element, param_element), replicas(bucket), rank,
                         fmt::format("bucket.{}", bucket));
  };
  if (zero >= 3)
    costs.gather_params = [prices, replicas, bucket_bytes, rank, param_element](int bucket) {
      return prices->price(CollectiveOp::all_gather, bucket_bytes(bucket, param_element, param_element),
                           replicas(bucket), rank, fmt::format("gather.{}", bucket));
    };
  costs.p2p = [&cluster, &program, layout, rank](const schedule::Instruction& ins) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const DeviceGroup stages = layout.pp_group(rank);
    const int to = stages[static_cast<std::size_t>(ins.peer)];
    std::vector<std::pair<int, int>> concurrent;
    for (int r = 0; r < layout.world(); ++r)
      if (layout.pp_rank(r) == layout.pp_rank(rank))
        concurrent.push_back({r, layout.pp_group(r)[static_cast<std::size_t>(ins.peer)]});
    return message_seconds(cluster, static_cast<double>(shape.received_bytes), rank, to, concurrent);
  };
  // AdamW over this rank's share: the fp32 parameter, gradient and two moments read, the
  // parameter and moments written (and the 16-bit copy under mixed precision).
  double parameters = 0;
  for (std::size_t bytes : program.bucket_param_bytes) parameters += static_cast<double>(bytes) / param_element;
  if (zero >= 1) parameters /= layout.dp;
  ops::Work step;
  step.bytes = parameters * (28 + (param_element == 2 ? 2 : 0));
  if (roofline) costs.optimizer_step = work_seconds(cluster.device, step, at.dtype);
  costs.overlap_slowdown = cluster.device.overlap_slowdown;
  costs.collective_slowdown = cluster.device.collective_slowdown;
  costs.shared_link = layout.dp > 1 && layout.tp > 1 &&
                      cluster.tier_of(layout.tp_group(rank)) == cluster.tier_of(layout.dp_group(rank));
  return costs;
}

}  // namespace oases::sim
