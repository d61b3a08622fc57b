// Mixture-of-experts layers under every layout and schedule against the one-process run, in
// fp64: routing, router noise, random routing and expert dropout are keyed by global token
// indices, so losses (cross-entropy plus the auxiliary terms), gradient norms, the MoE figures
// and (where the layout keeps whole tensors) parameters agree to relative 1e-10 for each gate,
// recomputation policy, sub-batch schedule, data parallelism, ZeRO-1, pipelines and a per-layer
// plan that runs the MoE layers at degree 1 under tp 2. Run at 2 ranks.
#include "comm/mesh.h"
#include "core/philox.h"
#include "mpi_test_support.h"
#include "support/numbers.h"
#include "runtime/executor.h"
#include "schedule/schedule.h"
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
};

std::string describe(const Layout& l) {
  return fmt::format("{} {} tp{} dp{} pp{} ep{} {} recompute {} {} plan {} zero {} mb {} sb {} group {}",
                     l.gate, l.arch, l.tp, l.dp, l.pp, l.ep, l.schedule, l.recompute, l.pipeline,
                     l.plan, l.zero, l.micro_batch, l.sub_batches, l.group_size);
}

RunConfig config(const Layout& layout) {
  RunConfig c;
  c.model.arch = layout.arch;
  c.model.layers = 4;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.model.ffn_hidden = 48;
  c.model.vocab_size = 64;
  c.model.seq_len = kSeq;
  c.model.dropout = 0.1;
  c.model.moe_every = 2;
  c.model.experts = 4;
  c.model.moe_gate = layout.gate;
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
  c.train.precision = "fp64";
  c.train.optimizer = "adamw";
  c.parallel.tp = layout.tp;
  c.parallel.dp = layout.dp;
  c.parallel.pp = layout.pp;
  c.parallel.ep = layout.ep;
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
  const RunConfig& c = engine.config();
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

RunRecord train_run(const RunConfig& c, ParallelGroups groups) {
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
  } else {
    GTEST_SKIP() << "runs at 2 and 4 ranks";
  }
}

// A checkpoint written under ep 2 (each rank holding half the experts) holds whole tensors:
// a one-process run resumes from it and ends where the one-process run straight through does.
TEST(Moe, ACheckpointSavedAtEpTwoResumesAtEpOne) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  const Layout layout{.gate = "gshard", .dp = 2, .ep = 2, .micro_batch = 2};
  const RunRecord straight = reference(layout);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  mesh.add_expert_groups(2, mpitest::test_options());
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
      save_checkpoint(dir.string(), engine.config(), engine.model(), whole, state, "", 0,
                      engine.tp(), engine.pp(), mesh.world().rank() == 0, {}, nullptr,
                      &mesh.ep_group());
    });
    mesh.world().barrier();
  }
  const std::string step_dir = *latest_checkpoint(dir.string());
  Layout single;
  single.gate = layout.gate;
  single.micro_batch = kGlobalBatch;
  TrainingEngine engine(config(single), {});
  load_model_weights((std::filesystem::path(step_dir) / "model.safetensors").string(),
                     engine.model().layout(), engine.model().params());
  engine.model().refresh_compute_params();
  TrainingState state;
  engine.load_whole_optimizer_state([&](optim::Optimizer& whole) {
    state = load_optimizer_state(step_dir, engine.model().layout(), whole);
  });
  ASSERT_EQ(state.step, kFirst);
  RunRecord rest;
  train_steps(engine, kFirst, kSteps - kFirst, rest);
  for (std::size_t i = 0; i < rest.losses.size(); ++i)
    EXPECT_NEAR(rest.losses[i], straight.losses[kFirst + i], 1e-10 * straight.losses[kFirst + i])
        << "step " << kFirst + i;
  EXPECT_LT(relative_difference(rest.params, straight.params), 1e-10);
  mesh.world().barrier();
  if (mesh.world().rank() == 0) std::filesystem::remove_all(dir);
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

TEST(Moe, AnMoeLayerAtTensorParallelDegreeAboveOneIsAClearError) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 2, 1, 1, mpitest::test_options());
  try {
    TrainingEngine engine(config({.tp = 2}), parallel_groups(mesh));
    FAIL() << "an MoE layer at degree 2 was built";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("mixture-of-experts layer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace oases::train
