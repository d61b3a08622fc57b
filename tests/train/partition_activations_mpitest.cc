// Partitioned activation checkpoints (parallel.partition_activations; ZeRO-R) against the same
// run without them, in fp64: each rank of a tensor-parallel group keeps its slice of every
// layer's residual-stream checkpoint between the passes and the schedule all-gathers it before
// the backward pass reads it, so losses, gradient norms and parameters agree to relative 1e-10
// under every schedule and recomputation policy, per-layer plans (a layer at degree 1 has
// nothing to partition), LLaMA and BERT, pipelines (1F1B, zero-bubble and 2BW) and ZeRO-3; the measured peak of kept activations falls and equals the schedule's prediction.
// Run at 2 ranks (tp 2) and at 4 (tp 2 x pp 2, tp 2 x dp 2, tp 4).
#include "comm/mesh.h"
#include "core/philox.h"
#include "mpi_test_support.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/engine.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::relative_difference;
using oases::testing::values;

namespace mpitest = comm::mpitest;

constexpr std::int64_t kSeq = 16, kSteps = 3;

struct Layout {
  int tp = 2, dp = 1, pp = 1;
  std::string schedule = "megatron";
  std::string recompute = "full";
  std::string pipeline = "1f1b";
  std::string plan = "uniform";
  std::string arch = "gpt";
  // Whether the peak falls (else it does not rise): under sqrt recomputation it lies in the
  // last group's backward, where the other groups' checkpoints are freed already; a pipeline's
  // last stage runs each micro-batch's backward right after its forward.
  bool peak_falls = true;
  std::int64_t zero = 0;
  std::int64_t micro_batch = 4;
  std::int64_t micro_batches = 2;  // per rank and step
};

std::string describe(const Layout& l) {
  return fmt::format("{} tp{} dp{} pp{} {} recompute {} {} plan {} zero {}", l.arch, l.tp, l.dp,
                     l.pp, l.schedule, l.recompute, l.pipeline, l.plan, l.zero);
}

plan::RunConfig config(const Layout& layout, bool partition) {
  plan::RunConfig c = oases::testing::tiny_run(oases::testing::tiny_model(3, layout.arch));
  c.model.heads = 4;
  c.model.vocab_size = 64;
  c.model.seq_len = kSeq;
  c.model.dropout = 0.1;  // keyed masks: recomputed and partitioned runs draw the same
  c.model.attention_dropout = 0.1;
  c.train.micro_batch = layout.micro_batch;
  c.train.global_batch = layout.micro_batch * layout.micro_batches * layout.dp;
  c.train.steps = kSteps;
  c.train.lr = 1e-2;
  c.train.warmup_steps = 1;
  c.train.precision = "fp64";
  c.train.optimizer = "adamw";
  c.parallel.tp = layout.tp;
  c.parallel.dp = layout.dp;
  c.parallel.pp = layout.pp;
  c.parallel.schedule = layout.schedule;
  c.parallel.recompute = layout.recompute;
  c.parallel.pipeline = layout.pipeline;
  c.parallel.plan = layout.plan;
  c.parallel.zero = layout.zero;
  c.parallel.partition_activations = partition;
  c.validate();
  return c;
}

std::vector<std::int32_t> tokens(std::int64_t step, std::uint32_t stream, std::int64_t count) {
  return oases::testing::philox_tokens(step, stream, count, 64, {3, 17});
}

struct RunRecord {
  std::vector<double> losses, norms, params;
  std::size_t measured_peak = 0, predicted_peak = 0;
  std::size_t partitions = 0;  // Partition instructions in the training schedule
};

RunRecord train_run(const plan::RunConfig& c, comm::Mesh& mesh) {
  TrainingEngine engine(c, parallel_groups(mesh));
  RunRecord run;
  run.predicted_peak = engine.activation_bytes();
  const std::int64_t global = c.train.global_batch * kSeq;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    const auto in = tokens(step, 1, global), out = tokens(step, 2, global);
    const std::int64_t at = engine.first_local_sample() * kSeq;
    const StepResult r = engine.train_step(step, in.data() + at, out.data() + at);
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
    run.measured_peak = std::max(run.measured_peak, r.peak_activation_bytes);
  }
  engine.save_whole_optimizer_state([&](optim::Optimizer&) {
    run.params = values(engine.model().params());
  });
  if (c.parallel.pipeline != "2bw")
    for (const schedule::Instruction& ins : engine.schedule_for(engine.local_batch(), true))
      run.partitions += ins.op == schedule::Op::partition;
  return run;
}

void compare(const Layout& layout, bool expect_partitions = true) {
  const std::string what = describe(layout);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), layout.tp, layout.dp, layout.pp,
                                       mpitest::test_options());
  const RunRecord whole = train_run(config(layout, false), mesh);
  const RunRecord sliced = train_run(config(layout, true), mesh);
  ASSERT_EQ(sliced.losses.size(), whole.losses.size()) << what;
  for (std::size_t i = 0; i < whole.losses.size(); ++i) {
    EXPECT_NEAR(sliced.losses[i], whole.losses[i], 1e-10 * std::abs(whole.losses[i]))
        << what << " step " << i;
    EXPECT_NEAR(sliced.norms[i], whole.norms[i], 1e-10 * whole.norms[i]) << what << " step " << i;
  }
  EXPECT_LT(relative_difference(sliced.params, whole.params), 1e-10) << what;
  if (layout.pipeline == "2bw") return;  // its runs are lowered per step, not one schedule
  EXPECT_EQ(whole.partitions, 0u) << what;
  if (!expect_partitions) {
    EXPECT_EQ(sliced.partitions, 0u) << what;
    return;
  }
  EXPECT_GT(sliced.partitions, 0u) << what;
  if (layout.peak_falls) {
    EXPECT_LT(sliced.measured_peak, whole.measured_peak) << what;
  } else {
    EXPECT_LE(sliced.measured_peak, whole.measured_peak) << what;
  }
  EXPECT_EQ(sliced.measured_peak, sliced.predicted_peak) << what;
  EXPECT_EQ(whole.measured_peak, whole.predicted_peak) << what;
}

TEST(PartitionActivations, EveryScheduleEqualsTheUnpartitionedRun) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks (tp 2)";
  compare({.schedule = "megatron", .recompute = "full"});
  compare({.schedule = "megatron", .recompute = "none"});
  compare({.schedule = "megatron", .recompute = "selective"});
  compare({.schedule = "megatron", .recompute = "sqrt", .peak_falls = false});
  compare({.schedule = "fine-grained", .recompute = "fine-grained"});
  compare({.schedule = "cross-pass", .recompute = "full"});
  compare({.schedule = "oases", .recompute = "fine-grained"});
  // Layer 0 at degree 1 keeps its checkpoint whole: the others are still partitioned.
  compare({.schedule = "oases", .recompute = "fine-grained", .plan = "1,2,2"});
  compare({.schedule = "oases", .recompute = "fine-grained", .arch = "llama"});
  compare({.schedule = "megatron", .recompute = "full", .arch = "bert"});
}

TEST(PartitionActivations, DegreeOneHasNothingToPartition) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  compare({.tp = 1, .dp = 2, .schedule = "megatron", .recompute = "full"}, false);
}

TEST(PartitionActivations, PipelinesZeroAndWiderGroupsEqualTheUnpartitionedRun) {
  if (mpitest::runtime().world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  compare({.tp = 4, .schedule = "oases", .recompute = "fine-grained"});
  compare({.pp = 2, .schedule = "oases", .recompute = "fine-grained", .pipeline = "1f1b",
           .peak_falls = false, .micro_batches = 4});
  compare({.pp = 2, .schedule = "megatron", .recompute = "full", .pipeline = "zero-bubble",
           .peak_falls = false, .micro_batches = 4});
  compare({.pp = 2, .schedule = "megatron", .recompute = "full", .pipeline = "2bw",
           .micro_batches = 4});
  compare({.dp = 2, .schedule = "oases", .recompute = "fine-grained", .zero = 3});
}

}  // namespace
}  // namespace oases::train
