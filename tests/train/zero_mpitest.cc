// ZeRO stages 1, 2 and 3 (parallel.zero) against the same layout without them, in fp64: every
// rank keeps the optimizer state of its own block of each gradient bucket, receives only that
// block's gradient sum and gathers the others' updated blocks; stage 2 also gives back the
// gradient pages outside its blocks, stage 3 the parameter pages too, gathering each bucket
// where the schedule reads it. Losses, gradient norms, parameters and the whole optimizer
// state (as checkpoints gather it) agree with zero = 0 to relative 1e-10 over steps with
// gradient accumulation and clipping, for every optimizer, with tensor and pipeline parallelism
// and per-layer plans; checkpoints resume across zero stages; the bytes each rank holds follow
// the stage's formula. Run at 2 ranks (data parallel) and at 4 (dp 4, tp 2 x dp 2, pp 2 x dp 2).
#include "comm/mesh.h"
#include "core/philox.h"
#include "kernels/kernels.h"
#include "mpi_test_support.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::relative_difference;
using oases::testing::values;

namespace mpitest = comm::mpitest;

constexpr std::int64_t kSeq = 16, kSteps = 4;

struct Layout {
  int tp = 1, dp = 1, pp = 1;
  std::string schedule = "megatron";
  std::string pipeline = "1f1b";
  std::string plan = "uniform";
  std::int64_t micro_batch = 2;
  std::string grad_reduce = "fp32";  // train.grad_reduce_dtype
  std::string arch = "gpt";
  std::int64_t micro_batches = 2;  // per rank and step
};

plan::RunConfig config(const std::string& optimizer, const Layout& layout, int zero) {
  // The tiny model's vocabulary of 50 is padded to a multiple of tp: the head's padding rows
  // are cut too.
  plan::RunConfig c = oases::testing::tiny_run(oases::testing::tiny_model(2, layout.arch));
  c.model.seq_len = kSeq;
  c.train.micro_batch = layout.micro_batch;
  c.train.global_batch = layout.micro_batch * layout.micro_batches * layout.dp;
  c.train.steps = kSteps;
  c.train.lr = 1e-2;
  c.train.min_lr = 1e-3;
  c.train.warmup_steps = 1;
  c.train.grad_clip = 0.05;  // below the gradient norm: every step clips
  c.train.precision = "fp64";
  c.train.optimizer = optimizer;
  if (optimizer == "sgd" || optimizer == "sm3") c.train.momentum = 0.9;
  c.parallel.tp = layout.tp;
  c.parallel.dp = layout.dp;
  c.parallel.pp = layout.pp;
  c.parallel.schedule = layout.schedule;
  c.parallel.pipeline = layout.pipeline;
  c.parallel.plan = layout.plan;
  c.parallel.zero = zero;
  c.train.grad_reduce_dtype = layout.grad_reduce;
  return c;
}

std::vector<std::int32_t> tokens(std::int64_t step, std::uint32_t stream, std::int64_t count) {
  return oases::testing::philox_tokens(step, stream, count, 50, {7, 11});
}

struct RunRecord {
  std::vector<double> losses, norms;
  std::vector<double> params;                         // this rank's flat array
  std::map<std::string, std::vector<double>> state;   // whole optimizer state by name
  std::size_t state_bytes = 0;                        // this rank's optimizer
  std::size_t resident_grad_bytes = 0;                // after the last step
  std::size_t resident_param_bytes = 0;               // after the last step
  std::vector<double> stashed;                        // 2bw: W(n - 1), whole
};

// The whole optimizer state and parameters, as a checkpoint sees them (ZeRO-3 gathers the
// parameters for it).
void record_whole(TrainingEngine& engine, RunRecord& run) {
  run.state.clear();
  engine.save_whole_optimizer_state([&](optim::Optimizer& whole) {
    for (const optim::StateTensor& s : whole.state_tensors()) run.state[s.name] = values(s.view);
    run.params = values(engine.model().params());
    if (const Tensor* stashed = engine.stashed_weights()) run.stashed = values(*stashed);
  });
}

// `steps` optimizer steps from `first` on, every rank handing its engine its share of the
// global batch as the trainer does.
void train(TrainingEngine& engine, std::int64_t first, std::int64_t steps, RunRecord& run) {
  const plan::RunConfig& c = engine.config();
  const std::int64_t global = c.train.global_batch * kSeq;
  for (std::int64_t step = first; step < first + steps; ++step) {
    const auto in = tokens(step, 1, global), out = tokens(step, 2, global);
    const std::int64_t at = engine.first_local_sample() * kSeq;
    const StepResult r = engine.train_step(step, in.data() + at, out.data() + at);
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  run.resident_param_bytes = engine.model().resident_param_bytes();
  record_whole(engine, run);
  run.state_bytes = engine.optimizer().state_bytes();
  run.resident_grad_bytes = engine.model().resident_grad_bytes();
}

RunRecord train_fresh(const plan::RunConfig& c, comm::Mesh& mesh) {
  TrainingEngine engine(c, parallel_groups(mesh));
  RunRecord run;
  train(engine, 0, kSteps, run);
  return run;
}

void expect_same(const RunRecord& zero, const RunRecord& reference, const std::string& what) {
  ASSERT_EQ(zero.losses.size(), reference.losses.size()) << what;
  for (std::size_t i = 0; i < zero.losses.size(); ++i) {
    EXPECT_NEAR(zero.losses[i], reference.losses[i], 1e-10 * std::abs(reference.losses[i]))
        << what << " step " << i;
    EXPECT_NEAR(zero.norms[i], reference.norms[i], 1e-10 * reference.norms[i])
        << what << " step " << i;
  }
  EXPECT_LT(relative_difference(zero.params, reference.params), 1e-10) << what;
  ASSERT_EQ(zero.stashed.size(), reference.stashed.size()) << what;
  if (!reference.stashed.empty()) {
    EXPECT_LT(relative_difference(zero.stashed, reference.stashed), 1e-10) << what << " stashed";
  }
  ASSERT_EQ(zero.state.size(), reference.state.size()) << what;
  for (const auto& [name, want] : reference.state) {
    ASSERT_TRUE(zero.state.contains(name)) << what << ": " << name;
    EXPECT_LT(relative_difference(zero.state.at(name), want), 1e-10) << what << ": " << name;
  }
}

// Runs `layout` with zero 0, 1 and 2 on a mesh of it and compares; also checks that the state
// is split: the ranks of a data-parallel group hold between them exactly the state of one
// replica, and none much more than its share; and that stage 2 keeps less of the gradients.
void compare(const std::string& optimizer, const Layout& layout,
             const std::vector<int>& stages = {1, 2, 3}) {
  const std::string what = fmt::format("{} {} tp{} dp{} pp{} {} {} plan {} reduce {}",
                                       layout.arch, optimizer, layout.tp, layout.dp, layout.pp,
                                       layout.schedule, layout.pipeline, layout.plan,
                                       layout.grad_reduce);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), layout.tp, layout.dp, layout.pp,
                                       mpitest::test_options());
  const RunRecord reference = train_fresh(config(optimizer, layout, 0), mesh);
  for (const int stage : stages) {
    const std::string with = fmt::format("{} zero {}", what, stage);
    const RunRecord zero = train_fresh(config(optimizer, layout, stage), mesh);
    expect_same(zero, reference, with);
    if (stage == 3) {
      EXPECT_LT(zero.resident_param_bytes, reference.resident_param_bytes) << with;
      // Keeping gathered parameters from forward to backward changes no result.
      plan::RunConfig kept = config(optimizer, layout, 3);
      kept.parallel.zero3_reshard_after_forward = false;
      expect_same(train_fresh(kept, mesh), reference, with + " kept from forward to backward");
    } else {
      EXPECT_EQ(zero.resident_param_bytes, reference.resident_param_bytes) << with;
    }
    double bytes = static_cast<double>(zero.state_bytes);
    mesh.dp_group().all_reduce(Tensor::of(&bytes, {1}));
    if (layout.plan == "uniform") {
      EXPECT_EQ(bytes, static_cast<double>(reference.state_bytes)) << with;
    }
    if (optimizer == "adamw") {
      // Element-wise: blocks of ceil(bucket / dp) elements.
      EXPECT_LE(static_cast<double>(zero.state_bytes),
                static_cast<double>(reference.state_bytes) / layout.dp + 16.0 * 8 * 16)
          << with;
    }
    EXPECT_LT(zero.state_bytes, reference.state_bytes) << with;
    if (stage >= 2) {
      EXPECT_LT(zero.resident_grad_bytes, reference.resident_grad_bytes) << with;
    } else {
      EXPECT_EQ(zero.resident_grad_bytes, reference.resident_grad_bytes) << with;
    }
  }
}

TEST(Zero, DataParallelEqualsZeroZeroForEveryOptimizer) {
  if (mpitest::runtime().world_size() == 2) {
    for (const std::string optimizer : {"adamw", "adafactor", "sm3", "sgd"})
      compare(optimizer, {.dp = 2});
    // Gradients reduced in bf16: each owner sums the same two rounded values the all-reduce
    // sums, so the stages still agree (at 2 ranks; more would sum in another order).
    compare("adamw", {.dp = 2, .grad_reduce = "bf16"});
  } else {
    ASSERT_EQ(mpitest::runtime().world_size(), 4);
    for (const std::string optimizer : {"adamw", "adafactor"}) compare(optimizer, {.dp = 4});
  }
}

// Offloading composes: ZeRO-2 whose state lives in a scratch file between steps.
TEST(Zero, OffloadedStateEqualsZeroZero) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  const RunRecord reference = train_fresh(config("adamw", {.dp = 2}, 0), mesh);
  plan::RunConfig c = config("adamw", {.dp = 2}, 2);
  c.parallel.offload = "optimizer";
  c.parallel.offload_dir = std::filesystem::temp_directory_path().string();
  expect_same(train_fresh(c, mesh), reference, "zero 2 with the optimizer state offloaded");
}

TEST(Zero, TensorParallelSchedulesAndPlansEqualZeroZero) {
  if (mpitest::runtime().world_size() != 4) GTEST_SKIP() << "needs 4 ranks (tp 2 x dp 2)";
  for (const std::string schedule : {"oases", "megatron"})
    compare("adamw", {.tp = 2, .dp = 2, .schedule = schedule});
  compare("sm3", {.tp = 2, .dp = 2, .schedule = "oases"});
  // Every segment that computes on a parameter gathers it first (LLaMA's and BERT's heads and
  // norms included).
  for (const std::string arch : {"llama", "bert"})
    compare("adamw", {.tp = 2, .dp = 2, .schedule = "oases", .arch = arch}, {3});
  // A layer at degree 1 sums its gradient over tensor- and data-parallel replicas at once:
  // its buckets are partitioned over that replica group.
  // (Its two replicas split each sub-batch of micro_batch / 2 sequences.)
  compare("adamw", {.tp = 2, .dp = 2, .schedule = "oases", .plan = "1,2", .micro_batch = 4});
}

TEST(Zero, PipelinesEqualZeroZero) {
  if (mpitest::runtime().world_size() != 4) GTEST_SKIP() << "needs 4 ranks (pp 2 x dp 2)";
  // GPT's tied word embedding sits in different buckets on the two stages.
  for (const std::string pipeline : {"1f1b", "zero-bubble"})
    compare("adamw", {.dp = 2, .pp = 2, .pipeline = pipeline});
  // 2bw's two weight versions: under ZeRO-3 each rank keeps its blocks of both, the schedule's
  // windows end where the version changes, and a checkpoint gathers the stashed one whole.
  compare("adamw", {.dp = 2, .pp = 2, .pipeline = "2bw", .micro_batches = 4});
  compare("adafactor", {.dp = 2, .pp = 2, .pipeline = "1f1b"});
}

// The bytes a rank holds, measured (buffer sizes; resident gradient pages from mincore),
// against each stage's formula per parameter: AdamW keeps 8 bytes of state per parameter in
// fp32, mixed precision adds a 2-byte working copy to the 4-byte master; gradients are 4 bytes.
//   zero 0: 4 (+2) + 4 + 8      zero 1: 4 (+2) + 4 + 8/dp      zero 2: 4 (+2) + 4/dp + 8/dp
//   zero 3: 4/dp (+2/dp) + 4/dp + 8/dp, plus the other ranks' blocks of the buckets gathered at
//   once during a step (none between steps)
// within the blocks' rounding (a block holds ceil(bucket / dp) elements; pages of 4 KiB cut
// the gradient and parameter blocks).
TEST(Zero, PerRankBytesFollowTheFormulas) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  for (const std::string precision : {"fp32", "bf16"}) {
    std::vector<double> unpartitioned;  // zero 0's whole master weights after the steps
    for (const int stage : {0, 1, 2, 3}) {
      plan::RunConfig c = config("adamw", {.dp = 2}, stage);
      c.model.hidden = 64;
      c.model.ffn_hidden = 256;
      c.model.vocab_size = 512;
      c.train.precision = precision;
      c.train.gemm16_path = "auto";  // measured at start-up, as `oases train` does by default
      TrainingEngine engine(c, parallel_groups(mesh));
      RunRecord run;
      train(engine, 0, 2, run);
      const auto total = static_cast<double>(engine.model().param_count());
      const double parameters = static_cast<double>(engine.optimizer().layout().param_numel());
      const double dp = stage >= 1 ? 2.0 : 1.0;
      const double buckets = static_cast<double>(engine.model().grad_buckets().size());
      const std::string what = fmt::format("{} zero {}", precision, stage);
      // At 2 ranks every stage sums the same two gradients: the master weights a checkpoint
      // sees (gathered whole from the blocks and, under mixed precision, not from the 16-bit
      // copy) are the same.
      if (stage == 0) unpartitioned = run.params;
      EXPECT_LT(relative_difference(run.params, unpartitioned), 1e-12) << what;
      const planner::MemoryFigures figures = engine.memory_figures();
      const double param_bytes = precision == "bf16" ? 6 : 4;
      const double page = 4096;
      if (stage < 3) {
        EXPECT_EQ(static_cast<double>(figures.params), total * param_bytes) << what;
        EXPECT_EQ(static_cast<double>(run.resident_param_bytes), total * param_bytes) << what;
      } else {
        // Between steps only this rank's blocks are resident; the figure adds what a step
        // holds gathered at most, which is more than nothing and less than the whole model.
        const double gathered = static_cast<double>(engine.peak_gathered_param_bytes());
        EXPECT_GT(gathered, 0) << what;
        EXPECT_LT(gathered, total * (param_bytes == 6 ? 2 : 4)) << what;
        EXPECT_NEAR(static_cast<double>(figures.params) - gathered, total * param_bytes / dp,
                    param_bytes * buckets) << what;
        EXPECT_NEAR(static_cast<double>(run.resident_param_bytes), total * param_bytes / dp,
                    (param_bytes == 6 ? 4 : 2) * (buckets + 1) * page) << what;
      }
      // The state of this rank's parameters' blocks: 8 bytes each, 1/dp of the buckets.
      double whole_parameters = parameters;
      mesh.dp_group().all_reduce(Tensor::of(&whole_parameters, {1}));
      if (stage == 0) whole_parameters /= 2;
      // (Blocks cut the flat range, alignment gaps between parameters included: up to 16
      // elements of each parameter's gap may fall on either side.)
      const double gaps = 16.0 * static_cast<double>(engine.model().layout().params().size());
      EXPECT_NEAR(static_cast<double>(run.state_bytes), 8 * whole_parameters / dp, 8 * gaps)
          << what;
      EXPECT_EQ(figures.optimizer, run.state_bytes) << what;
      const double grads = static_cast<double>(run.resident_grad_bytes);
      if (stage < 2) {
        EXPECT_EQ(grads, 4 * total) << what;
      } else {
        EXPECT_NEAR(grads, 4 * total / dp, (2 * buckets + 2) * page) << what;
        EXPECT_NEAR(static_cast<double>(figures.grads), 4 * total / dp, 4 * buckets) << what;
      }
    }
  }
}

TEST(Zero, CheckpointsResumeAcrossZeroStages) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "oases_zero_mpitest_checkpoints";
  if (mesh.world().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  mesh.world().barrier();
  for (const std::string optimizer : {"adamw", "adafactor"}) {
    const Layout layout{.dp = 2};
    // Straight through at zero 0: the reference.
    RunRecord reference;
    {
      TrainingEngine engine(config(optimizer, layout, 0), parallel_groups(mesh));
      train(engine, 0, kSteps, reference);
    }
    for (const int saved_at : {0, 1, 3}) {
      const std::string folder = (dir / fmt::format("{}_zero{}", optimizer, saved_at)).string();
      {
        TrainingEngine engine(config(optimizer, layout, saved_at), parallel_groups(mesh));
        RunRecord first;
        train(engine, 0, kSteps / 2, first);
        TrainingState state;
        state.step = state.data_position = kSteps / 2;
        state.seed = static_cast<std::uint64_t>(engine.config().train.seed);
        engine.save_whole_optimizer_state([&](optim::Optimizer& whole) {
          save_checkpoint(folder, engine.plan(), engine.model(), whole, state, {}, 0, engine.tp(),
                          engine.pp(), mesh.world().rank() == 0);
        });
        mesh.world().barrier();
      }
      const std::string step_dir = *latest_checkpoint(folder);
      for (const int resumed_at : {0, 2, 3}) {
        TrainingEngine engine(config(optimizer, layout, resumed_at), parallel_groups(mesh));
        load_model_weights((std::filesystem::path(step_dir) / "model.safetensors").string(),
                           engine.model().layout(), engine.model().params());
        engine.model().refresh_compute_params();
        engine.shard_params();
        TrainingState state;
        engine.load_whole_optimizer_state([&](optim::Optimizer& whole) {
          state = load_optimizer_state(step_dir, engine.model().layout(), whole);
        });
        ASSERT_EQ(state.step, kSteps / 2);
        RunRecord rest;
        train(engine, kSteps / 2, kSteps - kSteps / 2, rest);
        const std::string what =
            fmt::format("{} saved at zero {} resumed at zero {}", optimizer, saved_at, resumed_at);
        for (std::size_t i = 0; i < rest.losses.size(); ++i) {
          EXPECT_NEAR(rest.losses[i], reference.losses[kSteps / 2 + i],
                      1e-10 * reference.losses[kSteps / 2 + i])
              << what << " step " << kSteps / 2 + i;
        }
        EXPECT_LT(relative_difference(rest.params, reference.params), 1e-10) << what;
        for (const auto& [name, want] : reference.state)
          EXPECT_LT(relative_difference(rest.state.at(name), want), 1e-10) << what << ": " << name;
      }
    }
  }
}

}  // namespace
}  // namespace oases::train
