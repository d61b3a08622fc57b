// Compute prices from a segment's work on a cluster's device (sim/roofline.h), against values
// computed by hand: launch + FLOPs / (peak x GEMM efficiency at the product's size), launch +
// bytes / (bandwidth x memory efficiency at the size); instructions take their part of the
// segment's work.
#include "sim/roofline.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>

namespace oases::sim {
namespace {

DeviceSpec device() {
  DeviceSpec d;
  d.name = "test device";
  d.memory_bytes_per_second = 1e11;
  d.kernel_launch_seconds = 5e-6;
  d.peak_flops = {{"fp32", 1e12}, {"bf16", 4e12}};
  d.gemm_efficiency = {{1e6, 1e8}, {0.1, 0.5}};
  d.gemm_efficiency_of["fp32"] = {{1e6, 1e8}, {0.2, 0.4}};
  d.memory_efficiency = {{1e4, 1e8}, {0.2, 0.8}};
  return d;
}

TEST(Roofline, ProductsAndMemoryKernelsTakeTheirEfficiencyAtTheirSize) {
  const DeviceSpec d = device();
  ops::Work w;
  w.matmuls = {{100, 100, 100}};  // 2e6 FLOPs: log10(2) / 2 of the way from 1e6 to 1e8
  const double at = std::log10(2.0) / 2;
  EXPECT_NEAR(work_seconds(d, w, "bf16"), 5e-6 + 2e6 / (4e12 * (0.1 + at * 0.4)), 1e-15);
  EXPECT_NEAR(work_seconds(d, w, "fp32"), 5e-6 + 2e6 / (1e12 * (0.2 + at * 0.2)), 1e-15);
  // A batched product is one kernel whose size is all its instances.
  ops::Work batched;
  batched.matmuls = {{10, 10, 10, 500}};  // 500 x 2000 = 1e6 FLOPs
  EXPECT_NEAR(work_seconds(d, batched, "bf16"), 5e-6 + 1e6 / (4e12 * 0.1), 1e-15);
  ops::Work memory;
  memory.bytes = 1e6;  // halfway in log10 between 1e4 and 1e8
  EXPECT_NEAR(work_seconds(d, memory, "bf16"), 5e-6 + 1e6 / (1e11 * 0.5), 1e-15);
  EXPECT_EQ(work_seconds(d, ops::Work{}, "bf16"), 0.0);
  EXPECT_THROW(work_seconds(d, w, "fp16"), UserError);
  // A step efficiency of 0.5 halves every kernel's rate; launches stay as they are.
  DeviceSpec derated = d;
  derated.step_efficiency = 0.5;
  EXPECT_NEAR(work_seconds(derated, w, "bf16"), 5e-6 + 2 * 2e6 / (4e12 * (0.1 + at * 0.4)), 1e-15);
  EXPECT_NEAR(work_seconds(derated, memory, "bf16"), 5e-6 + 2 * 1e6 / (1e11 * 0.5), 1e-15);
}

TEST(Roofline, InstructionsTakeTheirPartOfTheSegmentsWork) {
  ops::Program program;
  ops::SegmentShape s;
  s.name = "mlp.0";
  s.backward_stages = 2;
  s.work.known = true;
  s.work.checkpoint.bytes = 1;
  s.work.internals.matmuls = {{1, 1, 1}};
  s.work.output.matmuls = {{2, 1, 1}};
  s.work.backward_input = {ops::Work{{{3, 1, 1}}, 0}, ops::Work{{}, 7}};
  s.work.backward_weight.matmuls = {{4, 1, 1}};
  program.segments = {s};
  using schedule::Op;
  const auto flops = [&](Op op, int stage = 0, ops::TensorSets sets = 0, bool input_only = false) {
    schedule::Instruction ins{op};
    ins.segment = 0;
    ins.stage = stage;
    ins.sets = sets;
    ins.input_only = input_only;
    return instruction_work(program, ins).flops();
  };
  EXPECT_EQ(flops(Op::forward), 2.0 * (1 + 2));
  EXPECT_EQ(flops(Op::recompute, 0, ops::kInternals), 2.0);
  EXPECT_EQ(flops(Op::recompute, 0, ops::kInternals | ops::kOutput), 6.0);
  EXPECT_EQ(flops(Op::backward, 0), 2.0 * (3 + 4));
  EXPECT_EQ(flops(Op::backward, 0, 0, true), 6.0);
  EXPECT_EQ(flops(Op::backward_weight), 8.0);
  EXPECT_EQ(flops(Op::backward, 1), 0.0);
  program.segments[0].work.known = false;
  EXPECT_THROW(flops(Op::forward), InternalError);
}

// An Encode reads the set's values and writes them encoded, a Decode the reverse: one
// memory-bound pass over (set element + encoded element) bytes per value, the statistics left
// out; a device without a memory bandwidth gives no codec.
TEST(Roofline, ACodecPassMovesTheValuesBothWays) {
  ops::Program program;
  program.set_element_bytes = 4;
  ops::SegmentShape s;
  s.name = "mlp.0";
  s.checkpoint_bytes = 4000;
  s.internals_bytes = 40000 + 64;
  s.internals_statistics_bytes = 64;
  program.segments = {s};
  const DeviceSpec d = device();
  const auto codec = roofline_codec(d, program);
  ASSERT_TRUE(codec);
  schedule::Instruction ins{schedule::Op::encode};
  ins.segment = 0;
  ins.sets = ops::kCheckpoint | ops::kInternals;
  ins.encoding = ops::ActivationEncoding::fp8_e4m3;
  ops::Work pass;
  pass.bytes = (1000 + 10000) * (4 + 1);
  EXPECT_DOUBLE_EQ(codec(ins), work_seconds(d, pass, "fp32"));
  EXPECT_GT(codec(ins), d.kernel_launch_seconds);
  ins.op = schedule::Op::decode;
  ins.sets = ops::kInternals;
  ins.encoding = ops::ActivationEncoding::bf16;
  pass.bytes = 10000 * (4 + 2);
  EXPECT_DOUBLE_EQ(codec(ins), work_seconds(d, pass, "fp32"));
  DeviceSpec unknown = d;
  unknown.memory_bytes_per_second = 0;
  EXPECT_FALSE(roofline_codec(unknown, program));
}

}  // namespace
}  // namespace oases::sim
