// Small cluster descriptions for tests of the cluster simulator and what prices on it.
#pragma once

#include "sim/cluster.h"

namespace oases::testing {

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

}  // namespace oases::testing
