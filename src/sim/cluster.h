// Cluster descriptions: the hardware a whole-cluster simulation runs a config's schedules on,
// read from TOML files (clusters/*.toml). Devices are numbered 0 .. nodes x devices_per_node
// - 1, node-major; every rank of a run is one device (rank r on device r).
//
//   name = "dgx-a100"
//   description = """where every figure comes from, and every assumption"""
//
//   [topology]
//   nodes = 4
//   devices_per_node = 8
//
//   [device]
//   name = "A100-SXM4-80GB"
//   memory_gib = 80                 # what one device holds
//   memory_bandwidth_gbs = 2039     # GB/s (1e9 bytes/s)
//   kernel_launch_us = 4            # fixed cost of every kernel
//   overlap_slowdown = 0.1          # compute runs 1 / (1 + this) as fast while a collective
//                                   # shares the device (communication kernels take SMs)
//   collective_slowdown = 0         # communication runs 1 / (1 + this) as fast under compute
//   step_efficiency = 0.86          # what a training step reaches of the kernel curves below
//                                   # (launch gaps, shapes, kernels the work leaves out);
//                                   # calibrated on a stated measurement; 1 when absent
//   [device.peak_tflops]            # dense peak per element type of the matrix products
//   fp32 = 19.5
//   bf16 = 312
//   fp16 = 312
//   [device.gemm_efficiency]        # achieved fraction of the peak against a matrix product's
//   flops = [1e6, 1e9, 1e12]        # FLOPs (2 m n k), interpolated linearly in log10(flops)
//   fraction = [0.02, 0.45, 0.8]    # and held constant beyond the first and last points
//   [device.gemm_efficiency.fp32]   # optional, per element type: its own curve
//   flops = [1e9, 1e12]
//   fraction = [0.5, 0.7]
//   [device.memory_efficiency]      # achieved fraction of the memory bandwidth against the
//   bytes = [1e4, 1e6, 1e8]         # bytes an elementwise kernel moves, likewise
//   fraction = [0.05, 0.5, 0.9]
//
//   [[tier]]                        # links, innermost first
//   name = "nvswitch"
//   span = 8                        # devices in one domain of the tier: consecutive blocks
//   link_gbs = 300                  # one device's bandwidth into the tier, each direction
//   uplink_gbs = 0                  # what one domain of the tier below (a device for the
//                                   # first tier) can move through this tier in all, each
//                                   # direction, shared by its devices' transfers (0: only
//                                   # the devices' links limit it)
//   latency_us = 3                  # per message (per step of a ring)
//   sharing = "fair"                # how a device's concurrent transfers (its tensor-parallel
//                                   # collectives beside its gradient reductions) share a link:
//                                   # "fair" (each gets an equal part, as NCCL's channels and
//                                   # a tc queue give; the default) or "issue-order" (a
//                                   # transport that sends one pair of processes' messages in
//                                   # the order they were issued, whatever their communicator,
//                                   # as Open MPI's TCP transport does: a later transfer waits
//                                   # for the earlier ones)
//   [tier.efficiency]               # optional: the fraction of the bandwidth a transfer
//   bytes = [4e6, 5e7]              # reaches against its size (a collective's buffer, a
//   fraction = [1.0, 0.85]          # message), as the device curves; absent: 1
//   [[tier]]
//   name = "infiniband"
//   span = 32                       # the last tier spans every device
//   link_gbs = 25
//   uplink_gbs = 200                # a node's 8 NICs of 200 Gb/s
//   latency_us = 6
//
// Two devices talk over the innermost tier whose domain holds both. A tier's span is a multiple
// of the one before it (the first's, of 1) and a divisor of the next; devices_per_node is one of
// the spans, and the last span is every device. Tiers inside a node describe NVLink bridges
// (span 2), PCIe or NVSwitch (span devices_per_node); the last describes the network. A device
// with no [device.peak_tflops] computes from an `oases profile` of this machine (compute =
// "profile", the clusters that describe this machine's CPU ranks).
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <map>
#include <string_view>
#include <string>
#include <vector>

namespace oases::sim {

// A piecewise-linear curve in log10(x): the achieved fraction of a peak against a kernel's
// size. Clamped to the first and last points outside them.
struct EfficiencyCurve {
  std::vector<double> x;         // ascending, > 0
  std::vector<double> fraction;  // in (0, 1], one per x
  double at(double value) const;
};

// The name a cluster file gives an element type among device.peak_tflops and
// gemm_efficiency's curves: "fp32", "bf16", "fp16", "fp64".
std::string_view precision_key(DType dtype);

struct DeviceSpec {
  std::string name;
  double memory_bytes = 0;
  double memory_bytes_per_second = 0;
  double kernel_launch_seconds = 0;
  double overlap_slowdown = 0;
  double collective_slowdown = 0;
  // Every kernel runs at this fraction of what its curve gives (device.step_efficiency).
  double step_efficiency = 1;
  // Dense peak FLOP/s of matrix products by element type ("fp32", "bf16", "fp16", "fp64");
  // empty: compute comes from a profile (the device is this machine's).
  std::map<std::string, double> peak_flops;
  EfficiencyCurve gemm_efficiency;                            // any element type
  std::map<std::string, EfficiencyCurve> gemm_efficiency_of;  // by element type, where given
  EfficiencyCurve memory_efficiency;
  bool computes_from_profile() const { return peak_flops.empty(); }
  const EfficiencyCurve& gemm_curve(const std::string& dtype) const {
    const auto it = gemm_efficiency_of.find(dtype);
    return it == gemm_efficiency_of.end() ? gemm_efficiency : it->second;
  }
};

struct LinkTier {
  std::string name;
  int span = 1;                   // devices per domain
  double link_bytes_per_second = 0;
  double uplink_bytes_per_second = 0;  // 0: unlimited beyond the links
  double latency_seconds = 0;
  // Fraction of the bandwidth a transfer of a given size reaches (empty: the whole of it).
  EfficiencyCurve efficiency;
  double efficiency_at(double bytes) const { return efficiency.x.empty() ? 1.0 : efficiency.at(bytes); }
  // Concurrent transfers of a device on this tier move one at a time, in issue order
  // (sharing = "issue-order"), instead of splitting the bandwidth ("fair").
  bool in_issue_order = false;
};

struct ClusterSpec {
  std::string name, description;
  int nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device;
  std::vector<LinkTier> tiers;  // innermost first

  int devices() const { return nodes * devices_per_node; }
  // The innermost tier whose domain holds both devices (a device with itself: -1).
  int tier_between(int a, int b) const;
  // The innermost tier whose domain holds every device of `group` (one device: -1).
  int tier_of(const std::vector<int>& group) const;
  // The domain of tier `tier` that device `device_index` is in (device_index / span).
  int domain_of(int tier, int device_index) const;
  // The span of the domain below tier `tier` (1 for the first tier).
  int lower_span(int tier) const { return tier == 0 ? 1 : tiers[static_cast<std::size_t>(tier) - 1].span; }
};

// Parses a cluster description; `source` names it in errors. Every error names the key, the
// value found and what would be valid (UserError).
ClusterSpec parse_cluster(const std::string& toml_text, const std::string& source);
// Reads clusters/NAME.toml-style files; `overrides` are "section.key=value" assignments
// applied before parsing (tier keys as "tier.NAME.key", e.g. tier.network.link_gbs=0.125).
ClusterSpec load_cluster(const std::string& path, const std::vector<std::string>& overrides = {});

// The cluster has a device for each of `ranks` ranks; UserError naming its devices and the
// config's ranks otherwise.
void check_cluster_holds(const ClusterSpec& cluster, std::int64_t ranks, const std::string& source);

}  // namespace oases::sim
