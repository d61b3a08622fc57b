// Mixture-of-experts layers under every layout and schedule against the one-process run, in
// fp64: routing, router noise, random routing and expert dropout are keyed by global token
// indices, so losses (cross-entropy plus the auxiliary terms), gradient norms, the MoE figures
// and (where the layout keeps whole tensors) parameters agree to relative 1e-10 for each gate,
// recomputation policy, sub-batch schedule, data parallelism, ZeRO, pipelines, tensor
// parallelism with the experts split over it (parallel.expert_tp = tp) or whole (expert_tp = 1,
// the MoE layers at degree 1), and expert parallelism. Run at 2 and 4 ranks.
#include "comm/mesh.h"
#include "core/philox.h"
#include "mpi_test_support.h"
#include "runtime/executor.h"
#include "schedule/schedule.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::relative_difference;
using oases::testing::values;

namespace mpitest = comm::mpitest;

constexpr std::int64_t kSeq = 16, kSteps = 3, kGlobalBatch = 8;

struct Layout {
  std::string gate = "switch";
  std::string arch = "gpt";
  int tp = 1, dp = 1, pp = 1, ep = 1;
  int expert_tp = 0;
  bool sequence_parallel = false;
  std::string schedule = "megatron";
  std::string recompute = "none";
  std::string pipeline = "1f1b";
  int virtual_stages = 1;
  std::string plan = "uniform";
  std::int64_t zero = 0;
  std::int64_t micro_batch = 4;
  int sub_batches = 1;
  std::int64_t group_size = 0;
  double capacity_factor = 1.0;  // overflows at these sizes
  int top_k = 0;                  // the gate's default
  std::string precision = "fp64";
};

std::string describe(const Layout& l) {
  return fmt::format(
      "{} {} {} tp{}{} dp{} pp{} ep{} expert_tp{} {} recompute {} {} plan {} zero {} mb {} sb {} "
      "group {}",
      l.precision, l.gate, l.arch, l.tp, l.sequence_parallel ? " sp" : "", l.dp, l.pp, l.ep,
      l.expert_tp, l.schedule, l.recompute, l.pipeline, l.plan, l.zero, l.micro_batch,
      l.sub_batches, l.group_size);
}

plan::RunConfig config(const Layout& layout) {
  plan::RunConfig c = oases::testing::tiny_run(oases::testing::tiny_moe_model(4, layout.arch));
  c.model.heads = 4;
  c.model.ffn_hidden = 48;
  c.model.vocab_size = 64;
  c.model.seq_len = kSeq;
  c.model.dropout = 0.1;
  c.model.moe_gate = ops::parse_moe_gate(layout.gate);
  c.model.moe_top_k = layout.top_k;
  c.model.capacity_factor = layout.capacity_factor;
  c.model.moe_group_size = layout.group_size;
  c.model.moe_aux_loss_coef = 0.1;
  c.model.moe_z_loss_coef = 0.01;
  c.model.expert_dropout = 0.2;
  c.train.micro_batch = layout.micro_batch;
  c.train.global_batch = kGlobalBatch;
  c.train.steps = kSteps;
  c.train.lr = 1e-2;
  c.train.warmup_steps = 1;
  c.train.precision = layout.precision;
  c.train.optimizer = "adamw";
  c.parallel.tp = layout.tp;
  c.parallel.dp = layout.dp;
  c.parallel.pp = layout.pp;
  c.parallel.ep = layout.ep;
  c.parallel.expert_tp = layout.expert_tp;
  c.parallel.sequence_parallel = layout.sequence_parallel;
  c.parallel.schedule = layout.schedule;
  c.parallel.recompute = layout.recompute;
  c.parallel.pipeline = layout.pipeline;
  c.parallel.virtual_stages = layout.virtual_stages;
  c.parallel.plan = layout.plan;
  c.parallel.zero = layout.zero;
  c.parallel.sub_batches = layout.sub_batches;
  c.validate();
  return c;
}

std::vector<std::int32_t> tokens(std::int64_t step, std::uint32_t stream, std::int64_t count) {
  return oases::testing::philox_tokens(step, stream, count, 64, {5, 23});
}

struct RunRecord {
  std::vector<double> losses, norms, moe_losses, dropped;
  std::vector<double> params;  // this rank's, in its layout
};

void train_steps(TrainingEngine& engine, std::int64_t first, std::int64_t count, RunRecord& run) {
  const plan::RunConfig& c = engine.config();
  const std::int64_t global = c.train.global_batch * kSeq;
  for (std::int64_t step = first; step < first + count; ++step) {
    const auto in = tokens(step, 1, global), out = tokens(step, 2, global);
    const std::int64_t at = engine.first_local_sample() * kSeq;
    const StepResult r = engine.train_step(step, in.data() + at, out.data() + at);
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
    run.moe_losses.push_back(r.moe.loss);
    run.dropped.push_back(r.moe.dropped_fraction);
  }
  engine.save_whole_optimizer_state([&](optim::Optimizer&) {
    run.params = values(engine.model().params());
  });
}

RunRecord train_run(const plan::RunConfig& c, ParallelGroups groups) {
  TrainingEngine engine(c, groups);
  RunRecord run;
  train_steps(engine, 0, kSteps, run);
  return run;
}

// The one-process run of `layout`'s gate and architecture (every rank runs its own).
RunRecord reference(const Layout& layout) {
  Layout single;
  single.gate = layout.gate;
  single.arch = layout.arch;
  single.group_size = layout.group_size;
  single.capacity_factor = layout.capacity_factor;
  single.top_k = layout.top_k;
  single.precision = layout.precision;
  single.micro_batch = kGlobalBatch;
  return train_run(config(single), {});
}

void expect_same(const RunRecord& got, const RunRecord& want, const std::string& what,
                 bool same_param_layout) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (std::size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-10 * std::abs(want.losses[i])) << what << " step " << i;
    EXPECT_NEAR(got.norms[i], want.norms[i], 1e-10 * want.norms[i]) << what << " step " << i;
    EXPECT_NEAR(got.moe_losses[i], want.moe_losses[i], 1e-10 * std::abs(want.moe_losses[i]))
        << what << " step " << i;
    EXPECT_EQ(got.dropped[i], want.dropped[i]) << what << " step " << i;
  }
  if (same_param_layout) {
    EXPECT_LT(relative_difference(got.params, want.params), 1e-10) << what;
  }
}

void compare_single_process(const Layout& layout) {
  const RunRecord want = reference(layout);
  ASSERT_GT(want.moe_losses.front(), 0) << describe(layout);
  expect_same(train_run(config(layout), {}), want, describe(layout), true);
}

void compare_on_mesh(const Layout& layout) {
  const RunRecord want = reference(layout);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), layout.tp, layout.dp, layout.pp,
                                       mpitest::test_options());
  mesh.add_expert_groups(layout.ep, mpitest::test_options());
  const bool whole = layout.tp == 1 && layout.pp == 1 && layout.ep == 1;
  expect_same(train_run(config(layout), parallel_groups(mesh)), want, describe(layout), whole);
}

TEST(Moe, EveryGateOverflowsAndReportsWhatItDropped) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "one-process runs: at 2 ranks only";
  for (const char* gate : {"switch", "gshard", "noisy-topk", "expert-choice"}) {
    // A token loses all of its choices only when every one overflows: top-2 needs less room.
    const bool two_choices = std::string(gate) == "noisy-topk" || std::string(gate) == "gshard";
    const RunRecord run = reference({.gate = gate, .capacity_factor = two_choices ? 0.5 : 1.0});
    double dropped = 0;
    for (double d : run.dropped) dropped = std::max(dropped, d);
    EXPECT_GT(dropped, 0) << gate << ": the capacity drops tokens at random initialisation";
    EXPECT_LT(dropped, 1) << gate;
    for (double l : run.moe_losses) EXPECT_GT(l, 0) << gate;
  }
}

TEST(Moe, SchedulesAndRecomputationEqualTheOneProcessRun) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "one-process runs: at 2 ranks only";
  for (const char* gate : {"switch", "gshard", "noisy-topk", "expert-choice"}) {
    compare_single_process({.gate = gate, .recompute = "full"});
    compare_single_process({.gate = gate, .schedule = "oases", .recompute = "fine-grained",
                            .sub_batches = 2});
  }
  compare_single_process({.gate = "gshard", .recompute = "selective", .micro_batch = 2});
  compare_single_process({.gate = "noisy-topk", .schedule = "cross-pass", .recompute = "full",
                          .sub_batches = 2, .group_size = 8});
  compare_single_process({.gate = "expert-choice", .recompute = "sqrt", .micro_batch = 2,
                          .group_size = 32});
  compare_single_process({.gate = "switch", .arch = "llama", .schedule = "oases",
                          .recompute = "fine-grained", .sub_batches = 2});
  compare_single_process({.gate = "noisy-topk", .arch = "llama", .recompute = "full"});
}

TEST(Moe, DataPipelineAndTensorParallelLayoutsEqualTheOneProcessRun) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  for (const char* gate : {"switch", "gshard", "noisy-topk", "expert-choice"})
    compare_on_mesh({.gate = gate, .dp = 2, .micro_batch = 2});
  compare_on_mesh({.gate = "gshard", .dp = 2, .zero = 1, .micro_batch = 2});
  compare_on_mesh({.gate = "switch", .arch = "llama", .dp = 2, .schedule = "oases",
                   .recompute = "fine-grained", .micro_batch = 4, .sub_batches = 2});
  compare_on_mesh({.gate = "gshard", .pp = 2, .micro_batch = 2});
  compare_on_mesh({.gate = "noisy-topk", .pp = 2, .pipeline = "zero-bubble", .micro_batch = 2});
  compare_on_mesh({.gate = "expert-choice", .pp = 2, .pipeline = "interleaved",
                   .virtual_stages = 2, .micro_batch = 2});
  // tp 2 with the MoE layers (1 and 3) at degree 1: each replica routes its own rows.
  compare_on_mesh({.gate = "expert-choice", .tp = 2, .schedule = "oases",
                   .recompute = "fine-grained", .plan = "2,1,2,1", .micro_batch = 4,
                   .sub_batches = 2});
  // The same by parallel.expert_tp = 1 under a uniform plan.
  compare_on_mesh({.gate = "gshard", .tp = 2, .expert_tp = 1, .micro_batch = 4});
}

// Experts split column/row-parallel over the tensor-parallel group (parallel.expert_tp = tp, the
// default): every rank routes the same rows, each computes its shard of every expert, the
// combine's partial sums and the slot weights' gradients are summed over the group.
TEST(Moe, ExpertsSplitOverTheTensorParallelGroupEqualTheOneProcessRun) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  for (const char* gate : {"switch", "gshard", "noisy-topk", "expert-choice"})
    compare_on_mesh({.gate = gate, .tp = 2, .expert_tp = 2, .micro_batch = 4});
  compare_on_mesh({.gate = "noisy-topk", .arch = "llama", .tp = 2, .schedule = "oases",
                   .recompute = "fine-grained", .micro_batch = 4, .sub_batches = 2});
  compare_on_mesh({.gate = "gshard", .tp = 2, .schedule = "cross-pass", .recompute = "full",
                   .micro_batch = 4, .sub_batches = 2});
  // A plan that splits only the MoE layers.
  compare_on_mesh({.gate = "switch", .tp = 2, .plan = "1,2,1,2", .micro_batch = 4});
}

TEST(Moe, ExpertParallelRunsEqualTheOneProcessRun) {
  const int ranks = mpitest::runtime().world_size();
  if (ranks == 2) {
    for (const char* gate : {"switch", "gshard", "noisy-topk", "expert-choice"})
      compare_on_mesh({.gate = gate, .dp = 2, .ep = 2, .micro_batch = 2});
    compare_on_mesh({.gate = "gshard", .dp = 2, .ep = 2, .schedule = "oases",
                     .recompute = "fine-grained", .micro_batch = 4, .sub_batches = 2});
    compare_on_mesh({.gate = "switch", .arch = "llama", .dp = 2, .ep = 2, .recompute = "full",
                     .zero = 1, .micro_batch = 2});
    compare_on_mesh({.gate = "noisy-topk", .dp = 2, .ep = 2, .zero = 3, .micro_batch = 4});
  } else if (ranks == 4) {
    compare_on_mesh({.gate = "gshard", .dp = 4, .ep = 4, .micro_batch = 2});
    // Expert replicas: dp 4 with ep 2 sums each expert's gradient over two ranks.
    compare_on_mesh({.gate = "switch", .dp = 4, .ep = 2, .zero = 1, .micro_batch = 2});
    // ep 2 x tp 2: the MoE layers at degree 1, each tensor-parallel rank routing its rows.
    compare_on_mesh({.gate = "expert-choice", .tp = 2, .dp = 2, .ep = 2, .schedule = "oases",
                     .recompute = "fine-grained", .plan = "2,1,2,1", .micro_batch = 4,
                     .sub_batches = 2});
    compare_on_mesh({.gate = "noisy-topk", .dp = 2, .pp = 2, .ep = 2, .micro_batch = 2});
    // ep 2 x tp 2 with each expert split over the tensor-parallel pair.
    compare_on_mesh({.gate = "gshard", .tp = 2, .dp = 2, .ep = 2, .expert_tp = 2,
                     .schedule = "oases", .recompute = "fine-grained", .micro_batch = 4,
                     .sub_batches = 2});
    compare_on_mesh({.gate = "switch", .arch = "llama", .tp = 2, .dp = 2, .ep = 2,
                     .expert_tp = 2, .zero = 1, .micro_batch = 2});
    compare_on_mesh({.gate = "noisy-topk", .tp = 2, .dp = 2, .ep = 2, .expert_tp = 1,
                     .zero = 3, .micro_batch = 2});
  } else {
    GTEST_SKIP() << "runs at 2 and 4 ranks";
  }
}

// Sequence parallelism with MoE layers: a shard segment runs the epilogue and the pre-norm on
// this rank's block of the tokens and all-gathers them; the dispatch routes the gathered tokens
// of its group as it routes the replicated ones without sequence parallelism (every rank of a
// split layer the same rows); the combine reduce-scatters the experts' outputs back to the
// blocks. Under every gate, with the experts split over the pair or whole (the MoE layers at
// degree 1), under the overlapped and recomputing schedules, mixed plans, pipelines, ZeRO and
// expert parallelism over ep 2.
TEST(Moe, SequenceParallelRunsEqualTheOneProcessRun) {
  const int ranks = mpitest::runtime().world_size();
  if (ranks == 2) {
    for (const char* gate : {"switch", "gshard", "noisy-topk", "expert-choice"})
      compare_on_mesh(
          {.gate = gate, .tp = 2, .expert_tp = 2, .sequence_parallel = true, .micro_batch = 4});
    compare_on_mesh(
        {.gate = "gshard", .tp = 2, .expert_tp = 1, .sequence_parallel = true, .micro_batch = 4});
    compare_on_mesh({.gate = "noisy-topk",
                     .arch = "llama",
                     .tp = 2,
                     .sequence_parallel = true,
                     .schedule = "oases",
                     .recompute = "fine-grained",
                     .micro_batch = 4,
                     .sub_batches = 2});
    compare_on_mesh({.gate = "switch",
                     .tp = 2,
                     .sequence_parallel = true,
                     .schedule = "cross-pass",
                     .recompute = "full",
                     .micro_batch = 4,
                     .sub_batches = 2});
    compare_on_mesh({.gate = "expert-choice",
                     .tp = 2,
                     .sequence_parallel = true,
                     .recompute = "selective",
                     .plan = "2,1,2,2",
                     .micro_batch = 4});
  } else if (ranks == 4) {
    // ep 2 x tp 2: the experts split over the pair and over two expert-parallel ranks.
    compare_on_mesh({.gate = "gshard",
                     .tp = 2,
                     .dp = 2,
                     .ep = 2,
                     .expert_tp = 2,
                     .sequence_parallel = true,
                     .schedule = "oases",
                     .recompute = "fine-grained",
                     .micro_batch = 4,
                     .sub_batches = 2});
    compare_on_mesh({.gate = "switch",
                     .arch = "llama",
                     .tp = 2,
                     .dp = 2,
                     .ep = 2,
                     .expert_tp = 1,
                     .sequence_parallel = true,
                     .zero = 1,
                     .micro_batch = 2});
    compare_on_mesh({.gate = "noisy-topk",
                     .tp = 2,
                     .pp = 2,
                     .sequence_parallel = true,
                     .pipeline = "zero-bubble",
                     .micro_batch = 2});
  } else {
    GTEST_SKIP() << "runs at 2 and 4 ranks";
  }
}

// 16-bit activations (bf16, fp16) under expert parallelism and with experts split over the
// tensor-parallel group: the rows' headers cross the all-to-alls as raw bits, the router runs in
// f32 and the slot weights' gradients are summed over the group in 16 bits. The gate is noisy
// top-k keeping all four experts, so no routing decision can flip between layouts, and each
// layout's losses, MoE losses and gradient norms stay within the format's rounding bound of
// the one-process run at the same precision (tests/train/mixed_precision_test.cc: sqrt of the
// roundings, 12 L + 4 + 8 per MoE layer, times the unit roundoff).
TEST(Moe, SixteenBitLayoutsStayWithinRoundingOfTheOneProcessRun) {
  const int ranks = mpitest::runtime().world_size();
  if (ranks != 2 && ranks != 4) GTEST_SKIP() << "runs at 2 and 4 ranks";
  const double roundings = 12 * 4 + 4 + 8 * 2;
  for (const auto& [precision, unit] : std::vector<std::pair<std::string, double>>{
           {"bf16", std::ldexp(1.0, -8)}, {"fp16", std::ldexp(1.0, -11)}}) {
    const Layout base{.gate = "noisy-topk", .top_k = 4, .precision = precision};
    const RunRecord want = reference(base);
    std::vector<Layout> layouts;
    if (ranks == 2) {
      Layout ep = base, split = base;
      ep.dp = ep.ep = 2;
      ep.micro_batch = 2;
      split.tp = split.expert_tp = 2;
      split.schedule = "oases";
      split.recompute = "fine-grained";
      split.sub_batches = 2;
      layouts = {ep, split};
    } else {
      Layout both = base;
      both.tp = both.expert_tp = both.dp = both.ep = 2;
      both.micro_batch = 2;
      layouts = {both};
    }
    const double tolerance = std::sqrt(roundings) * unit;
    for (const Layout& layout : layouts) {
      comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), layout.tp, layout.dp, layout.pp,
                                           mpitest::test_options());
      mesh.add_expert_groups(layout.ep, mpitest::test_options());
      const RunRecord got = train_run(config(layout), parallel_groups(mesh));
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (std::size_t i = 0; i < want.losses.size(); ++i) {
        EXPECT_NEAR(got.losses[i], want.losses[i], tolerance * want.losses[i]) << describe(layout) << " step " << i;
        EXPECT_NEAR(got.moe_losses[i], want.moe_losses[i], tolerance * want.moe_losses[i])
            << describe(layout) << " step " << i;
        EXPECT_NEAR(got.norms[i], want.norms[i], tolerance * want.norms[i]) << describe(layout) << " step " << i;
        EXPECT_EQ(got.dropped[i], 0.0) << describe(layout);
      }
    }
  }
}

// A checkpoint written under expert parallelism (each rank holding some of the experts, or
// shards of them) holds whole tensors: a one-process run resumes from it and ends where the
// one-process run straight through does.
void resume_in_one_process(const Layout& layout) {
  const RunRecord straight = reference(layout);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), layout.tp, layout.dp, layout.pp,
                                       mpitest::test_options());
  mesh.add_expert_groups(layout.ep, mpitest::test_options());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "oases_moe_mpitest_checkpoint";
  if (mesh.world().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  mesh.world().barrier();
  constexpr std::int64_t kFirst = 2;
  {
    TrainingEngine engine(config(layout), parallel_groups(mesh));
    RunRecord first;
    train_steps(engine, 0, kFirst, first);
    TrainingState state;
    state.step = state.data_position = kFirst;
    state.seed = static_cast<std::uint64_t>(engine.config().train.seed);
    engine.save_whole_optimizer_state([&](optim::Optimizer& whole) {
      save_checkpoint(dir.string(), engine.plan(), engine.model(), whole, state, {}, 0, engine.tp(),
                      engine.pp(), mesh.world().rank() == 0, {}, nullptr, &mesh.ep_group());
    });
    mesh.world().barrier();
  }
  const std::string step_dir = *latest_checkpoint(dir.string());
  Layout single;
  single.gate = layout.gate;
  single.arch = layout.arch;
  single.micro_batch = kGlobalBatch;
  TrainingEngine engine(config(single), {});
  load_model_weights((std::filesystem::path(step_dir) / "model.safetensors").string(),
                     engine.model().layout(), engine.model().params());
  engine.model().refresh_compute_params();
  TrainingState state;
  engine.load_whole_optimizer_state([&](optim::Optimizer& whole) {
    state = load_optimizer_state(step_dir, engine.model().layout(), whole);
  });
  ASSERT_EQ(state.step, kFirst) << describe(layout);
  RunRecord rest;
  train_steps(engine, kFirst, kSteps - kFirst, rest);
  for (std::size_t i = 0; i < rest.losses.size(); ++i)
    EXPECT_NEAR(rest.losses[i], straight.losses[kFirst + i], 1e-10 * straight.losses[kFirst + i])
        << describe(layout) << " step " << kFirst + i;
  EXPECT_LT(relative_difference(rest.params, straight.params), 1e-10) << describe(layout);
  mesh.world().barrier();
  if (mesh.world().rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Moe, ACheckpointSavedUnderExpertParallelismResumesInOneProcess) {
  const int ranks = mpitest::runtime().world_size();
  if (ranks == 2) {
    resume_in_one_process({.gate = "gshard", .dp = 2, .ep = 2, .micro_batch = 2});
    resume_in_one_process({.gate = "switch", .tp = 2, .expert_tp = 2, .micro_batch = 4});
  } else if (ranks == 4) {
    resume_in_one_process({.gate = "noisy-topk", .arch = "llama", .tp = 2, .dp = 2, .ep = 2,
                           .expert_tp = 2, .micro_batch = 2});
  } else {
    GTEST_SKIP() << "runs at 2 and 4 ranks";
  }
}

// Under oases with two sub-batches, each dispatch and combine all-to-all (forward and backward)
// of one sub-batch is in flight while the other sub-batch computes. In the trace (compute
// instructions reported as they end, collectives at their Wait): after the instruction that
// issued the all-to-all (its segment's Forward, or backward stage 0) ends, a compute
// instruction of the other sub-batch starts and ends before the all-to-all is waited for.
TEST(Moe, OasesOverlapsEveryAllToAllWithTheOtherSubBatch) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  struct Recorder final : runtime::InstructionListener {
    std::vector<runtime::InstructionRecord> records;
    void record(const runtime::InstructionRecord& r) override { records.push_back(r); }
  } recorder;
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  mesh.add_expert_groups(2, mpitest::test_options());
  const Layout layout{.gate = "gshard", .dp = 2, .ep = 2, .schedule = "oases",
                      .recompute = "fine-grained", .micro_batch = 4, .sub_batches = 2};
  TrainingEngine engine(config(layout), parallel_groups(mesh));
  engine.set_listener(&recorder);
  RunRecord run;
  train_steps(engine, 0, 1, run);
  engine.set_listener(nullptr);
  int all_to_alls = 0;
  const auto& records = recorder.records;
  using schedule::Op;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const runtime::InstructionRecord& a2a = records[i];
    if (a2a.lane != runtime::Lane::communication || a2a.collective != ops::CollectiveKind::all_to_all)
      continue;
    ++all_to_alls;
    const schedule::Instruction& ins = a2a.instruction;
    const bool forward = ins.direction == schedule::Direction::forward;
    // The instruction that issued it: the last one of its instance that produced its buffer.
    std::optional<std::size_t> issuer;
    for (std::size_t j = i; j-- > 0;) {
      const schedule::Instruction& c = records[j].instruction;
      if (records[j].lane != runtime::Lane::compute || c.segment != ins.segment ||
          c.micro_batch != ins.micro_batch || c.sub_batch != ins.sub_batch)
        continue;
      if (forward ? (c.op == Op::forward || c.op == Op::recompute)
                  : (c.op == Op::backward && c.stage == 0)) {
        issuer = j;
        break;
      }
    }
    ASSERT_TRUE(issuer.has_value()) << schedule::to_string(ins);
    bool overlapped = false;
    for (std::size_t j = *issuer + 1; j < i && !overlapped; ++j) {
      const runtime::InstructionRecord& c = records[j];
      overlapped = c.lane == runtime::Lane::compute && c.segment != nullptr &&
                   c.instruction.micro_batch == ins.micro_batch &&
                   c.instruction.sub_batch != ins.sub_batch &&
                   c.began >= records[*issuer].finished;
    }
    EXPECT_TRUE(overlapped) << schedule::to_string(ins)
                            << ": no compute of the other sub-batch while it was in flight";
  }
  // Per instance and MoE layer: dispatch and combine forward, and both back (fine-grained
  // recomputation replays none): 1 micro-batch per rank x 2 sub-batches x 2 layers x 4.
  EXPECT_EQ(all_to_alls, 1 * 2 * 2 * 4);
}

}  // namespace
}  // namespace oases::train
