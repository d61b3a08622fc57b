// One rank's instruction prices on a cluster (sim/cluster_costs.h): a GPT rank of tp 2 x dp 2
// on two nodes of two devices (tensor parallelism inside a node, data parallelism across),
// each price against the collective, message and roofline functions it is made of.
#include "sim/cluster_costs.h"

#include "comm/communicator.h"
#include "model/model.h"
#include "sim/roofline.h"

#include <gtest/gtest.h>

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

TEST(ClusterCosts, EachPriceIsItsCollectiveOnTheGroupsDevices) {
  const ClusterSpec cluster = two_by_two();
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  model::ModelConfig config;
  config.layers = 2;
  config.hidden = 32;
  config.heads = 4;
  config.ffn_hidden = 64;
  config.vocab_size = 256;
  config.seq_len = 8;
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
  // Eight ranks do not fit on four devices.
  EXPECT_THROW(cluster_costs(cluster, program, {.layout = {.tp = 2, .dp = 4}, .rank = 1}), UserError);
}

}  // namespace
}  // namespace oases::sim
