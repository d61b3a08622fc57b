// Small cluster descriptions for tests of the cluster simulator and what prices on it.
#pragma once

#include "plan/run_config.h"
#include "sim/cluster.h"

namespace oases::testing {

// `nodes` x `per_node` devices: a switch inside a node (`switch_bytes_per_second` per link), a
// network between nodes whose uplink (`uplink_bytes_per_second`) the node's devices share;
// peaks for fp32, fp64 and bf16, with GEMM and memory efficiency curves.
inline sim::ClusterSpec switched_cluster(int nodes, int per_node, double switch_bytes_per_second,
                                         double network_bytes_per_second,
                                         double uplink_bytes_per_second) {
  sim::ClusterSpec c;
  c.name = "test-cluster";
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.device.name = "test device";
  c.device.memory_bytes = 16.0 * (1 << 30);
  c.device.memory_bytes_per_second = 5e11;
  c.device.kernel_launch_seconds = 4e-6;
  c.device.overlap_slowdown = 0.1;
  c.device.peak_flops = {{"fp32", 20e12}, {"fp64", 10e12}, {"bf16", 300e12}};
  c.device.gemm_efficiency = {{1e6, 1e9, 1e11}, {0.05, 0.4, 0.8}};
  c.device.memory_efficiency = {{1e4, 1e8}, {0.2, 0.85}};
  c.tiers = {{"switch", per_node, switch_bytes_per_second, 0, 3e-6, {}},
             {"network", nodes * per_node, network_bytes_per_second, uplink_bytes_per_second,
              10e-6, {}}};
  return c;
}

// Two nodes of four devices (PCIe inside a node, a network between them), fp32 peak 20
// TFLOP/s, with GEMM and memory efficiency curves: every price is finite and positive.
inline sim::ClusterSpec four_by_two_cluster() {
  sim::ClusterSpec c;
  c.name = "test-cluster";
  c.nodes = 2;
  c.devices_per_node = 4;
  c.device.name = "test device";
  c.device.memory_bytes = 16.0 * (1 << 30);
  c.device.memory_bytes_per_second = 5e11;
  c.device.kernel_launch_seconds = 4e-6;
  c.device.overlap_slowdown = 0.1;
  c.device.peak_flops = {{"fp32", 20e12}};
  c.device.gemm_efficiency = {{1e6, 1e9, 1e11}, {0.05, 0.4, 0.8}};
  c.device.memory_efficiency = {{1e4, 1e8}, {0.2, 0.85}};
  c.tiers = {{"pcie", 4, 10e9, 0, 10e-6, {}}, {"network", 8, 5e9, 5e9, 20e-6, {}}};
  return c;
}

// A GPT of 4 layers x 128 (seq 64, vocabulary 512) in fp32 under the oases schedule over tp x
// dp ranks: micro-batch 8, two micro-batches per data-parallel rank.
inline plan::RunConfig cluster_test_run(int tp, int dp) {
  plan::RunConfig config = plan::parse_run_config("", "test");
  config.model.layers = 4;
  config.model.hidden = 128;
  config.model.heads = 4;
  config.model.ffn_hidden = 512;
  config.model.vocab_size = 512;
  config.model.seq_len = 64;
  config.train.micro_batch = 8;
  config.train.global_batch = 8 * dp * 2;
  config.parallel.tp = tp;
  config.parallel.dp = dp;
  config.parallel.schedule = "oases";
  return config;
}

}  // namespace oases::testing
