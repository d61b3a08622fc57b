// Cluster descriptions (sim/cluster.h): every shipped file parses and holds what it says; a
// malformed description, or one whose topology cannot hold a config's ranks, is a clear error
// naming the key, the value and what would be valid.
#include "sim/cluster.h"

#include "core/error.h"
#include "support/errors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace oases::sim {
namespace {

using oases::testing::user_error_of;

const std::string kTwoNodes = R"(
name = "two-nodes"
description = "a test cluster"
[topology]
nodes = 2
devices_per_node = 4
[device]
name = "test device"
memory_gib = 16
memory_bandwidth_gbs = 1000
kernel_launch_us = 5
overlap_slowdown = 0.1
[device.peak_tflops]
fp32 = 20
bf16 = 100
[device.gemm_efficiency]
flops = [1e6, 1e8]
fraction = [0.1, 0.5]
[device.memory_efficiency]
bytes = [1e4, 1e8]
fraction = [0.2, 0.8]
[[tier]]
name = "pair"
span = 2
link_gbs = 50
latency_us = 2
[[tier]]
name = "pcie"
span = 4
link_gbs = 10
latency_us = 5
[[tier]]
name = "network"
span = 8
link_gbs = 5
uplink_gbs = 5
latency_us = 10
)";

std::string with(const std::string& from, const std::string& to) {
  std::string text = kTwoNodes;
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

std::string error_of(const std::string& text) {
  return user_error_of([&] { parse_cluster(text, "c.toml"); });
}

TEST(Cluster, ParsesTopologyDeviceAndTiers) {
  const ClusterSpec c = parse_cluster(kTwoNodes, "c.toml");
  EXPECT_EQ(c.name, "two-nodes");
  EXPECT_EQ(c.devices(), 8);
  EXPECT_DOUBLE_EQ(c.device.memory_bytes, 16.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(c.device.peak_flops.at("bf16"), 100e12);
  EXPECT_DOUBLE_EQ(c.device.kernel_launch_seconds, 5e-6);
  ASSERT_EQ(c.tiers.size(), 3u);
  EXPECT_DOUBLE_EQ(c.tiers[2].uplink_bytes_per_second, 5e9);
  EXPECT_DOUBLE_EQ(c.tiers[1].uplink_bytes_per_second, 0);
  EXPECT_FALSE(c.tiers[1].in_issue_order);  // "fair" unless said
  EXPECT_TRUE(parse_cluster(with("link_gbs = 10", "link_gbs = 10\nsharing = \"issue-order\""), "c.toml")
                  .tiers[1]
                  .in_issue_order);
  // Devices talk over the innermost tier that holds both.
  EXPECT_EQ(c.tier_between(0, 1), 0);
  EXPECT_EQ(c.tier_between(1, 2), 1);
  EXPECT_EQ(c.tier_between(3, 4), 2);
  EXPECT_EQ(c.tier_of({4, 5, 6}), 1);
  EXPECT_EQ(c.tier_of({2}), -1);
  // Interpolated in log10 between points, held beyond them.
  EXPECT_NEAR(c.device.gemm_efficiency.at(1e7), 0.3, 1e-12);
  EXPECT_DOUBLE_EQ(c.device.gemm_efficiency.at(1e3), 0.1);
  EXPECT_DOUBLE_EQ(c.device.gemm_efficiency.at(1e12), 0.5);
}

TEST(Cluster, MalformedDescriptionsNameTheKeyTheValueAndWhatIsValid) {
  EXPECT_NE(error_of("name = \"x\"\n[topology\n").find("is not valid TOML"), std::string::npos);
  EXPECT_NE(error_of(with("nodes = 2\n", "")).find("topology.nodes is missing"), std::string::npos);
  EXPECT_NE(error_of(with("nodes = 2", "nodes = 0")).find("topology.nodes = 0; it must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of(with("nodes = 2", "nodes = \"two\"")).find("topology.nodes is a string; expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of(with("kernel_launch_us", "kernel_lanch_us")).find("unknown key device.kernel_lanch_us; valid keys here:"),
            std::string::npos);
  EXPECT_NE(error_of(with("link_gbs = 10", "link_gbs = -1")).find("tier[1].link_gbs = -1; it must be a finite number > 0"),
            std::string::npos);
  EXPECT_NE(error_of(with("span = 4", "span = 3")).find("tier[1].span = 3 (\"pcie\"); each tier's span must be a multiple of the one before it (2)"),
            std::string::npos);
  EXPECT_NE(error_of(with("span = 8", "span = 16")).find("the last tier (\"network\") spans 16 devices; it must span every device"),
            std::string::npos);
  // Nodes of 4 with links of pairs and of every device: no tier links exactly a node.
  EXPECT_NE(error_of(with("[[tier]]\nname = \"pcie\"\nspan = 4\nlink_gbs = 10\nlatency_us = 5\n", ""))
                .find("topology.devices_per_node = 4 is not the span of any tier (2, 8)"),
            std::string::npos);
  EXPECT_NE(error_of(with("fraction = [0.1, 0.5]", "fraction = [0.1, 1.5]")).find("device.gemm_efficiency.fraction[1] = 1.5; a fraction of the peak is in (0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of(with("flops = [1e6, 1e8]", "flops = [1e8, 1e6]")).find("device.gemm_efficiency.flops must be positive and ascending"),
            std::string::npos);
  EXPECT_NE(error_of(with("flops = [1e6, 1e8]", "flops = [1e6]")).find("has 1 points and device.gemm_efficiency.fraction 2"),
            std::string::npos);
  EXPECT_NE(error_of(with("name = \"network\"", "name = \"pcie\"")).find("two tiers are named \"pcie\""),
            std::string::npos);
  EXPECT_NE(error_of(with("link_gbs = 10", "link_gbs = 10\nsharing = \"round-robin\""))
                .find("tier[1].sharing = \"round-robin\" (\"pcie\"); valid: \"fair\""),
            std::string::npos);
  EXPECT_NE(error_of(with("[device.peak_tflops]\nfp32 = 20\n", "[device.peak_tflops]\n")).find("device.peak_tflops.fp32 is missing"),
            std::string::npos);
  EXPECT_NE(error_of(with("kernel_launch_us = 5", "kernel_launch_us = 5\nstep_efficiency = 1.5"))
                .find("device.step_efficiency = 1.5; a fraction of the kernels' figures is in (0, 1]"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(parse_cluster(with("kernel_launch_us = 5", "kernel_launch_us = 5\nstep_efficiency = 0.8"), "c.toml")
                       .device.step_efficiency,
                   0.8);
  EXPECT_DOUBLE_EQ(parse_cluster(kTwoNodes, "c.toml").device.step_efficiency, 1.0);
  // A tier's transfer-size efficiency, and its errors named under the tier.
  const std::string curve = "latency_us = 5\n[tier.efficiency]\nbytes = [1e6, 1e8]\nfraction = [1.0, 0.5]\n";
  const ClusterSpec sized = parse_cluster(with("latency_us = 5\n", curve), "c.toml");
  EXPECT_DOUBLE_EQ(sized.tiers[1].efficiency_at(1e8), 0.5);
  EXPECT_DOUBLE_EQ(sized.tiers[1].efficiency_at(1e5), 1.0);
  EXPECT_DOUBLE_EQ(sized.tiers[0].efficiency_at(1e8), 1.0);  // none given
  EXPECT_NE(error_of(with("latency_us = 5\n", "latency_us = 5\n[tier.efficiency]\nbytes = [1e6]\nfraction = [1.0, 0.5]\n"))
                .find("tier[1].efficiency.bytes has 1 points"),
            std::string::npos);
}

TEST(Cluster, OverridesSetKeysAndTiersByName) {
  const std::string path = ::testing::TempDir() + "/cluster_override.toml";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(kTwoNodes.c_str(), f);
    std::fclose(f);
  }
  const ClusterSpec c = load_cluster(path, {"tier.network.link_gbs=0.125", "topology.nodes=4",
                                            "tier.network.span=16", "device.peak_tflops.fp32=40"});
  EXPECT_DOUBLE_EQ(c.tiers[2].link_bytes_per_second, 0.125e9);
  EXPECT_EQ(c.devices(), 16);
  EXPECT_DOUBLE_EQ(c.device.peak_flops.at("fp32"), 40e12);
  EXPECT_NE(user_error_of([&] { load_cluster(path, {"tier.nvlink.link_gbs=1"}); })
                .find("has no tier named \"nvlink\""),
            std::string::npos);
}

TEST(Cluster, ATopologyThatCannotHoldTheRanksIsAnError) {
  const ClusterSpec c = parse_cluster(kTwoNodes, "c.toml");
  check_cluster_holds(c, 8, "c.toml");
  EXPECT_NE(user_error_of([&] { check_cluster_holds(c, 16, "c.toml"); })
                .find("the config runs 16 ranks (tp x dp x pp) but the cluster c.toml (two-nodes) has 8 devices (2 nodes x 4)"),
            std::string::npos);
}

// Every description shipped in clusters/ parses, names its sources and holds a whole number
// of nodes.
TEST(Cluster, EveryShippedDescriptionParses) {
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(OASES_SOURCE_DIR) + "/clusters")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    const ClusterSpec c = load_cluster(entry.path().string());
    EXPECT_FALSE(c.description.empty());
    EXPECT_EQ(c.devices() % c.devices_per_node, 0);
    EXPECT_GT(c.device.memory_bytes, 0);
    ++parsed;
  }
  EXPECT_GE(parsed, 6);
}

}  // namespace
}  // namespace oases::sim
