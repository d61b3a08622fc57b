// One rank's instruction prices on a cluster (sim/cluster_costs.h): a GPT rank of tp 2 x dp 2
// on two nodes of two devices (tensor parallelism inside a node, data parallelism across),
// each price against the collective, message and roofline functions it is made of.
#include "sim/cluster_costs.h"

#include "comm/communicator.h"
#include "model/model.h"
#include "sim/roofline.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <utility>

namespace oases::sim {
namespace {

ClusterSpec two_by_two() {
  ClusterSpec c;
  c.name = "2x2";
  c.nodes = 2;
  c.devices_per_node = 2;
  c.device.name = "test device";
  c.device.memory_bytes_per_second = 1e11;
  c.device.kernel_launch_seconds = 5e-6;
  c.device.overlap_slowdown = 0.1;
  c.device.peak_flops = {{"fp32", 1e12}};
  c.device.gemm_efficiency = {{1e6, 1e9}, {0.2, 0.6}};
  c.device.memory_efficiency = {{1e4, 1e8}, {0.3, 0.9}};
  c.tiers = {{"pcie", 2, 10e9, 0, 5e-6, {}}, {"network", 4, 5e9, 5e9, 10e-6, {}}};
  return c;
}

// The tiny GPT of two layers with 4 heads of 8, a vocabulary of 256 and sequences of 8.
model::ModelConfig two_layers() {
  model::ModelConfig config = testing::tiny_model(2);
  config.heads = 4;
  config.vocab_size = 256;
  config.seq_len = 8;
  return config;
}

TEST(ClusterCosts, EachPriceIsItsCollectiveOnTheGroupsDevices) {
  const ClusterSpec cluster = two_by_two();
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  const model::ModelConfig config = two_layers();
  model::ModelOptions options;
  options.tp = &tp;
  options.micro_batch = 4;
  const model::Model model(config, options);
  const ops::Program& program = model.program();
  const ClusterRank at{.layout = {.tp = 2, .dp = 2}, .rank = 1};
  const CostModel costs = cluster_costs(cluster, program, at);

  int attention = -1;
  for (std::size_t i = 0; i < program.segments.size(); ++i)
    if (program.segments[i].name == "attention.0") attention = static_cast<int>(i);
  ASSERT_GE(attention, 0);
  const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(attention)];
  schedule::Instruction start{schedule::Op::start};
  start.segment = attention;
  // Rank 1's tensor-parallel pair is devices {0, 1}, while {2, 3} reduces at the same time.
  EXPECT_EQ(segment_group(program, attention, true, at.layout, 1), (DeviceGroup{0, 1}));
  EXPECT_DOUBLE_EQ(costs.collective(start),
                   collective_seconds(cluster, CollectiveOp::all_reduce,
                                      4.0 * static_cast<double>(shape.forward_collective_elements),
                                      {0, 1}, {{0, 1}, {2, 3}}));
  schedule::Instruction forward{schedule::Op::forward};
  forward.segment = attention;
  EXPECT_DOUBLE_EQ(costs.compute(forward), work_seconds(cluster.device, shape.work.forward(), "fp32"));
  // Layer 0's gradients over its data-parallel replicas {1, 3}, across the nodes, beside {0, 2}.
  const int bucket = 1;
  ASSERT_GT(program.bucket_param_bytes.at(bucket), 0u);
  EXPECT_DOUBLE_EQ(costs.reduce_grads(bucket),
                   collective_seconds(cluster, CollectiveOp::all_reduce,
                                      static_cast<double>(program.bucket_param_bytes[bucket]), {1, 3},
                                      {{0, 2}, {1, 3}}));
  EXPECT_FALSE(costs.gather_params);
  EXPECT_FALSE(costs.shared_link);  // tensor parallelism on PCIe, data parallelism on the network
  EXPECT_DOUBLE_EQ(costs.overlap_slowdown, 0.1);
  EXPECT_GT(costs.optimizer_step, 0.0);
  // ZeRO-3: buckets reduce-scattered and gathered over the same replicas.
  const CostModel zero3 = cluster_costs(cluster, program, {.layout = {.tp = 2, .dp = 2}, .rank = 1, .zero = 3});
  EXPECT_DOUBLE_EQ(zero3.gather_params(bucket),
                   collective_seconds(cluster, CollectiveOp::all_gather,
                                      static_cast<double>(program.bucket_param_bytes[bucket]), {1, 3},
                                      {{0, 2}, {1, 3}}));
  EXPECT_LT(zero3.optimizer_step, costs.optimizer_step);
  // A layer below the tensor-parallel degree reduces over the tensor-parallel pair's own link
  // (layer 0 at degree 1 on tp 2, dp 1): shared, in issue order where the tier keeps it.
  {
    comm::ShapeOnlyCommunicator pair(1, 2, "tp");
    model::ModelOptions mixed_options = options;
    mixed_options.tp = &pair;
    mixed_options.layer_degrees = {1, 2};
    std::map<std::pair<int, int>, std::unique_ptr<comm::ShapeOnlyCommunicator>> subgroups;
    mixed_options.tp_subgroup = [&](int span, int stride) -> comm::Communicator& {
      if (span == 2 && stride == 1) return pair;
      auto& group = subgroups[{span, stride}];
      if (!group) group = std::make_unique<comm::ShapeOnlyCommunicator>(1 % span / stride, span / stride, "sub");
      return *group;
    };
    const model::Model mixed(config, mixed_options);
    ClusterSpec in_order = cluster;
    EXPECT_TRUE(cluster_costs(cluster, mixed.program(), {.layout = {.tp = 2}, .rank = 1}).shared_link);
    EXPECT_FALSE(cluster_costs(cluster, mixed.program(), {.layout = {.tp = 2}, .rank = 1})
                     .shared_link_in_issue_order);
    in_order.tiers[0].in_issue_order = true;
    EXPECT_TRUE(cluster_costs(in_order, mixed.program(), {.layout = {.tp = 2}, .rank = 1})
                    .shared_link_in_issue_order);
    EXPECT_FALSE(cluster_costs(in_order, program, {.layout = {.tp = 2}, .rank = 1}).shared_link);
  }
  // Eight ranks do not fit on four devices.
  EXPECT_THROW(cluster_costs(cluster, program, {.layout = {.tp = 2, .dp = 4}, .rank = 1}), UserError);
}

// A mixture-of-experts layer's experts are reduced over the ranks holding the same experts
// (dp 4 = 2 expert groups of ep 2: rank 1 shares its experts with rank 3), the rest of the
// model over every data-parallel rank; with dp = ep no rank shares its experts.
TEST(ClusterCosts, ExpertBucketsReduceOverTheirExpertReplicas) {
  const ClusterSpec cluster = two_by_two();
  comm::ShapeOnlyCommunicator tp(0, 1, "tp");
  comm::ShapeOnlyCommunicator ep(1, 2, "ep");
  model::ModelConfig config = two_layers();
  config.moe_every = 2;
  config.experts = 4;
  model::ModelOptions options;
  options.tp = &tp;
  options.ep = &ep;
  options.micro_batch = 4;
  const model::Model model(config, options);
  const ops::Program& program = model.program();
  ASSERT_EQ(program.bucket_holds_experts.size(), program.bucket_param_bytes.size());
  int experts = -1, dense = -1;
  for (const model::Model::Bucket& b : model.grad_buckets()) {
    EXPECT_EQ(program.bucket_holds_experts.at(static_cast<std::size_t>(b.id)), b.experts);
    (b.experts ? experts : dense) = b.id;
  }
  ASSERT_GE(experts, 0);
  ASSERT_GE(dense, 0);
  const auto bytes = [&](int bucket) { return static_cast<double>(program.bucket_param_bytes.at(bucket)); };

  const CostModel four = cluster_costs(cluster, program, {.layout = {.tp = 1, .dp = 4, .ep = 2}, .rank = 1});
  EXPECT_DOUBLE_EQ(four.reduce_grads(experts),
                   collective_seconds(cluster, CollectiveOp::all_reduce, bytes(experts), {1, 3},
                                      {{0, 2}, {1, 3}}));
  EXPECT_DOUBLE_EQ(four.reduce_grads(dense),
                   collective_seconds(cluster, CollectiveOp::all_reduce, bytes(dense), {0, 1, 2, 3},
                                      {{0, 1, 2, 3}}));
  const CostModel two = cluster_costs(cluster, program, {.layout = {.tp = 1, .dp = 2, .ep = 2}, .rank = 1});
  EXPECT_EQ(two.reduce_grads(experts), 0.0);
  EXPECT_GT(two.reduce_grads(dense), 0.0);
  // The experts' all-to-alls (the collectives' lane) and the dense layers' reductions cross the
  // same pair of devices: they share its link.
  EXPECT_TRUE(two.shared_link);
  EXPECT_FALSE(two.shared_link_in_issue_order);
  ClusterSpec in_order = cluster;
  for (LinkTier& tier : in_order.tiers) tier.in_issue_order = true;
  EXPECT_TRUE(cluster_costs(in_order, program, {.layout = {.tp = 1, .dp = 2, .ep = 2}, .rank = 1})
                  .shared_link_in_issue_order);
  // Without experts the collectives' lane is idle at tp 1: nothing to share.
  EXPECT_FALSE(cluster_costs(cluster, program, {.layout = {.tp = 1, .dp = 2}, .rank = 1}).shared_link);
}

// Sequence parallelism: a layer's gathers and reduce-scatters run over its tensor-parallel
// pair, each priced as the collective it is; a ring's all-gather and reduce-scatter together
// cost what its all-reduce costs, so the layers' collectives cost what they cost without it.
TEST(ClusterCosts, SequenceParallelGathersAndScattersCostTheirAllReduces) {
  const ClusterSpec cluster = two_by_two();
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  model::ModelOptions options;
  options.tp = &tp;
  options.micro_batch = 4;
  options.shape_only = true;
  const model::Model plain(two_layers(), options);
  options.sequence_parallel = true;
  const model::Model sharded(two_layers(), options);
  const ClusterRank at{.layout = {.tp = 2, .dp = 2}, .rank = 1};
  // Every collective of the layers, forward and backward, summed.
  const auto layer_collectives = [&](const ops::Program& program) {
    const CostModel costs = cluster_costs(cluster, program, at);
    double total = 0;
    for (std::size_t i = 0; i < program.segments.size(); ++i) {
      const ops::SegmentShape& s = program.segments[i];
      if (s.layer < 0) continue;
      schedule::Instruction start{schedule::Op::start};
      start.segment = static_cast<int>(i);
      for (const auto direction : {schedule::Direction::forward, schedule::Direction::backward}) {
        start.direction = direction;
        const bool has = direction == schedule::Direction::forward ? s.has_forward_collective
                                                                   : s.has_backward_collective;
        if (!has) continue;
        EXPECT_EQ(segment_group(program, static_cast<int>(i),
                                direction == schedule::Direction::forward, at.layout, 1),
                  (DeviceGroup{0, 1}))
            << s.name;
        total += costs.collective(start);
      }
    }
    return total;
  };
  const double without = layer_collectives(plain.program());
  EXPECT_GT(without, 0.0);
  EXPECT_NEAR(layer_collectives(sharded.program()), without, 1e-12 * without);
  // One gather, against the function it is made of.
  const ops::Program& program = sharded.program();
  int shard = -1;
  for (std::size_t i = 0; i < program.segments.size(); ++i)
    if (program.segments[i].name == "mlp_in.1") shard = static_cast<int>(i);
  ASSERT_GE(shard, 0);
  schedule::Instruction gather{schedule::Op::start};
  gather.segment = shard;
  EXPECT_DOUBLE_EQ(
      cluster_costs(cluster, program, at).collective(gather),
      collective_seconds(
          cluster, CollectiveOp::all_gather,
          4.0 * static_cast<double>(
                    program.segments[static_cast<std::size_t>(shard)].forward_collective_elements),
          {0, 1}, {{0, 1}, {2, 3}}));
}

// Context parallelism (all-to-all): at tp 1 x cp 2 x dp 2 on two nodes of two devices, the cp
// pairs are {0, 1} and {2, 3} (cp inside a node) and the gradients' replicas all four; each of
// the attention's all-to-alls is priced over this rank's cp pair by its volume, the out
// projection's all-reduce over its group of one costs nothing.
TEST(ClusterCosts, ContextParallelAllToAllsRunOverTheCpGroup) {
  const ClusterSpec cluster = two_by_two();
  comm::ShapeOnlyCommunicator tp(0, 1, "tp"), cp(1, 2, "cp");
  model::ModelOptions options;
  options.tp = &tp;
  options.cp = &cp;
  options.micro_batch = 4;
  options.shape_only = true;
  const model::Model model(two_layers(), options);
  const ops::Program& program = model.program();
  const ClusterRank at{.layout = {.tp = 1, .dp = 4, .cp = 2}, .rank = 1};
  EXPECT_EQ(at.layout.cp_group(3), (DeviceGroup{2, 3}));
  EXPECT_EQ(at.layout.dp_group(1), (DeviceGroup{0, 1, 2, 3}));
  const CostModel costs = cluster_costs(cluster, program, at);
  const auto index = [&](const std::string& name) {
    for (std::size_t i = 0; i < program.segments.size(); ++i)
      if (program.segments[i].name == name) return static_cast<int>(i);
    ADD_FAILURE() << "no segment " << name;
    return 0;
  };
  // 4 sequences of 8 tokens, 4 per rank each: 16 tokens of q|k|v (3 x 32 columns) leave each
  // rank, then 16 of the output (32 columns); backward moves them back.
  const std::vector<std::tuple<std::string, bool, std::int64_t>> all_to_alls{
      {"attention.1", true, 16 * 96},
      {"attention_core.1", true, 16 * 32},
      {"attention_core.1", false, 16 * 96},
      {"attention_out.1", false, 16 * 32}};
  for (const auto& [name, forward, elements] : all_to_alls) {
    const int segment = index(name);
    const ops::SegmentShape& s = program.segments[static_cast<std::size_t>(segment)];
    EXPECT_EQ(s.context_parallel_ranks, 2) << name;
    EXPECT_EQ(forward ? s.forward_collective_elements : s.backward_collective_elements, elements)
        << name;
    EXPECT_EQ(segment_group(program, segment, forward, at.layout, 1), (DeviceGroup{0, 1})) << name;
    schedule::Instruction start{schedule::Op::start};
    start.segment = segment;
    start.direction = forward ? schedule::Direction::forward : schedule::Direction::backward;
    EXPECT_DOUBLE_EQ(
        costs.collective(start),
        collective_seconds(cluster, CollectiveOp::all_to_all, 4.0 * static_cast<double>(elements),
                           {0, 1}, {{0, 1}, {2, 3}}))
        << name;
  }
  schedule::Instruction reduce{schedule::Op::start};
  reduce.segment = index("attention_out.1");
  reduce.direction = schedule::Direction::forward;
  EXPECT_EQ(costs.collective(reduce), 0.0);
}

// Context parallelism (ring): the projections' shift and the output segment's backward shift
// carry this rank's k|v block (its 16 tokens x 2 x 32 columns) to its neighbour in the cp
// pair: one step of a ring over {0, 1}, dearer than an all-to-all of the same bytes over the
// pair (which sends half of them).
TEST(ClusterCosts, RingShiftsCarryABlockOverTheCpGroup) {
  const ClusterSpec cluster = two_by_two();
  comm::ShapeOnlyCommunicator tp(0, 1, "tp"), cp(1, 2, "cp");
  model::ModelOptions options;
  options.tp = &tp;
  options.cp = &cp;
  options.cp_kind = ops::ContextParallelKind::ring;
  options.micro_batch = 4;
  options.shape_only = true;
  const model::Model model(two_layers(), options);
  const ops::Program& program = model.program();
  const ClusterRank at{.layout = {.tp = 1, .dp = 4, .cp = 2}, .rank = 1};
  const CostModel costs = cluster_costs(cluster, program, at);
  int shifts = 0;
  for (std::size_t i = 0; i < program.segments.size(); ++i) {
    const ops::SegmentShape& s = program.segments[i];
    for (const bool forward : {true, false}) {
      const bool has = forward ? s.has_forward_collective : s.has_backward_collective;
      if (!has || (forward ? s.forward_kind : s.backward_kind) != ops::CollectiveKind::shift)
        continue;
      ++shifts;
      const std::int64_t elements =
          forward ? s.forward_collective_elements : s.backward_collective_elements;
      EXPECT_EQ(elements, 16 * 64) << s.name;
      const int segment = static_cast<int>(i);
      EXPECT_EQ(segment_group(program, segment, forward, at.layout, 1), (DeviceGroup{0, 1}))
          << s.name;
      schedule::Instruction start{schedule::Op::start};
      start.segment = segment;
      start.direction = forward ? schedule::Direction::forward : schedule::Direction::backward;
      const double bytes = 4.0 * static_cast<double>(elements);
      const double seconds = costs.collective(start);
      EXPECT_DOUBLE_EQ(seconds, collective_seconds(cluster, CollectiveOp::shift, bytes, {0, 1},
                                                   {{0, 1}, {2, 3}}))
          << s.name;
      EXPECT_GT(seconds, collective_seconds(cluster, CollectiveOp::all_to_all, bytes, {0, 1},
                                            {{0, 1}, {2, 3}}))
          << s.name;
    }
  }
  // Two layers, one shift each way.
  EXPECT_EQ(shifts, 4);
}

}  // namespace
}  // namespace oases::sim
