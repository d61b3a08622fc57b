// Per-layer tensor-parallel degrees, end to end: mixed plans (`parallel.plan`) under
// `mpirun -np tp oases train` give the losses, parameters and AdamW moments of the
// single-process run, under the blocking (megatron) and the overlapped (oases) schedules; the
// reshards between layers of different degrees are all-gathers on the communication lane; a
// plan file written like `oases plan --degrees-only` writes it is accepted, and bad plans are
// rejected with the setting, the value and what would be valid.
//
// The runs are in fp64 and agree to relative 1e-10 per tensor and per loss, as in
// schedules_test.cc (they start from random weights with nonzero biases and LayerNorm
// parameters).
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;
using oases::testing::run_command;

constexpr int kSteps = 2;

using oases::testing::quoted;

class Plans : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("plans_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  // A tiny model of `layers` layers whose micro-batch of `micro_batch` sequences splits into
  // two sub-batches that every degree's replicas can share.
  void write_config(int layers, int micro_batch) {
    std::ofstream(dir_ / "tiny.toml") << "[model]\nlayers = " << layers << R"(
hidden = 64
heads = 4
ffn_hidden = 128
vocab_size = 257
seq_len = 24
dropout = 0.1
attention_dropout = 0.1
[train]
precision = "fp64"  # the verification precision: every layout agrees to 1e-10
micro_batch = )" << micro_batch
                                      << "\nglobal_batch = " << 2 * micro_batch << R"(
steps = 2
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 1
[data]
path = ")" << (dir_ / "data").string()
                                      << "\"\n";
    oases::testing::write_random_init(dir_ / "tiny.toml", dir_ / "init.safetensors", 2024);
  }

  Result run_train(int tp, int dp, const std::string& name, const std::string& extra) const {
    const fs::path out = dir_ / name;
    const std::string command =
        oases::testing::train_command(OASES_BINARY, dir_, tp, dp, out, extra);
    Result r = run_command(command);
    r.output = command + "\n" + r.output;
    return r;
  }

  std::optional<fs::path> train(int tp, int dp, const std::string& name,
                                const std::string& extra) const {
    const Result r = run_train(tp, dp, name, extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return std::nullopt;
    return dir_ / name;
  }

  // The run at (tp, dp) with `settings` against the single-process megatron run.
  void expect_matches(const fs::path& reference, int tp, int dp, const std::string& label,
                      const std::string& settings) const {
    const auto run = train(tp, dp, label, settings);
    if (!run) return;
    const fs::path final_step = fs::path("ckpt") / ("step_" + std::to_string(kSteps));
    const auto want = oases::testing::metric_values(reference / "metrics.jsonl", "loss");
    ASSERT_EQ(want.size(), static_cast<std::size_t>(kSteps));
    expect_same_losses(oases::testing::metric_values(*run / "metrics.jsonl", "loss"), want,
                       label);
    expect_same_tensors(*run / final_step / "model.safetensors",
                        reference / final_step / "model.safetensors", label + " model");
    expect_same_tensors(*run / final_step / "optimizer.safetensors",
                        reference / final_step / "optimizer.safetensors", label + " optimizer");
  }

  std::optional<fs::path> reference() const {
    return train(1, 1, "reference", "parallel.schedule=" + quoted("megatron"));
  }

  fs::path dir_;
};

std::string plan_settings(const std::string& schedule, const std::string& plan) {
  return "parallel.schedule=" + quoted(schedule) + " parallel.plan=" + quoted(plan);
}

TEST_F(Plans, MixedPlansMatchTheSingleProcessRunAtTp2) {
  write_config(4, 4);
  const auto ref = reference();
  ASSERT_TRUE(ref.has_value());
  for (const std::string plan : {"1,1,2,2", "2,1,2,1"})
    for (const std::string schedule : {"megatron", "oases"})
      expect_matches(*ref, 2, 1, schedule + "_" + plan, plan_settings(schedule, plan));
  // Whole-layer recomputation replays collectives inside layers; the reshards sit between them.
  expect_matches(*ref, 2, 1, "full_2,1,2,1",
                 plan_settings("cross-pass", "2,1,2,1") + " parallel.recompute=" + quoted("full"));
}

TEST_F(Plans, MixedPlanMatchesTheSingleProcessRunAtTp4) {
  write_config(3, 8);
  const auto ref = reference();
  ASSERT_TRUE(ref.has_value());
  for (const std::string schedule : {"megatron", "oases"})
    expect_matches(*ref, 4, 1, schedule + "_4,2,1", plan_settings(schedule, "4,2,1"));
}

// Replicas of a layer sum their gradients before the data-parallel replicas do.
TEST_F(Plans, MixedPlanWithDataParallelismMatchesTheSingleProcessRun) {
  write_config(4, 4);
  const auto ref = reference();
  ASSERT_TRUE(ref.has_value());
  // global_batch 8 over dp 2: one micro-batch of 4 per data-parallel rank.
  expect_matches(*ref, 2, 2, "dp2_1,2,2,1", plan_settings("oases", "1,2,2,1"));
}

TEST_F(Plans, PlanFileFromThePlannerIsUsed) {
  write_config(4, 4);
  const auto ref = reference();
  ASSERT_TRUE(ref.has_value());
  const fs::path plan = dir_ / "plan.json";
  std::ofstream(plan) << nlohmann::json{{"format", "oases-plan"},
                                        {"version", 1},
                                        {"tp", 2},
                                        {"degrees", {2, 2, 1, 1}},
                                        {"predicted_step_s", 0.1},
                                        {"predicted_memory_bytes", 1}}
                             .dump();
  expect_matches(*ref, 2, 1, "file", plan_settings("oases", plan.string()));

  // The trace shows the reshard of the fall (2 -> 1, gradient gathered in backward) and of the
  // rise before the head (1 -> 2, rows gathered in forward), and no other all-gather.
  const fs::path trace_file = dir_ / "traced" / "trace.json";
  const auto run = train(2, 1, "traced",
                         plan_settings("oases", plan.string()) +
                             " train.steps=1 log.trace=" + quoted(trace_file.string()));
  ASSERT_TRUE(run.has_value());
  std::ifstream in(trace_file);
  ASSERT_TRUE(in.good()) << trace_file;
  const nlohmann::json trace = nlohmann::json::parse(in);
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, int> gathers;
    for (const auto& e : trace.at("traceEvents")) {
      if (e.value("ph", "") != "X" || e.value("pid", -1) != rank || e.value("tid", -1) != 1)
        continue;
      const std::string name = e.at("name").get<std::string>();
      if (name.rfind("AG ", 0) == 0) ++gathers[name];
    }
    std::map<std::string, int> expected;
    for (const std::string at : {"mb0 sb0", "mb0 sb1", "mb1 sb0", "mb1 sb1"}) {
      expected["AG bwd reshard.2 " + at] = 1;
      expected["AG fwd reshard.4 " + at] = 1;
    }
    EXPECT_EQ(gathers, expected) << "rank " << rank;
  }
}

// Checkpoints hold whole tensors: a run saved under one plan resumes under another (and under
// the uniform layout) with the same next losses.
TEST_F(Plans, CheckpointResumesUnderAnotherPlan) {
  write_config(4, 4);
  const auto source = train(2, 1, "source",
                            plan_settings("oases", "1,1,2,2") +
                                " train.steps=4 checkpoint.every=2 checkpoint.keep=0");
  ASSERT_TRUE(source.has_value());
  const auto losses = oases::testing::metric_values(*source / "metrics.jsonl", "loss");
  ASSERT_EQ(losses.size(), 4u);
  for (const std::string plan : {"2,1,2,1", "uniform"}) {
    const std::string name = "resume_" + plan;
    fs::create_directories(dir_ / name / "ckpt");
    fs::copy(*source / "ckpt" / "step_2", dir_ / name / "ckpt" / "step_2",
             fs::copy_options::recursive);
    const auto run = train(2, 1, name,
                           plan_settings("megatron", plan) +
                               " train.steps=4 checkpoint.resume=true");
    if (!run) continue;
    expect_same_losses(oases::testing::metric_values(*run / "metrics.jsonl", "loss"),
                       {losses.begin() + 2, losses.end()}, name);
  }
}

// parallel.plan = "auto" profiles, plans and trains in one job; whatever it chooses trains the
// same model. A limit below every plan's need is an error that says by how much.
TEST_F(Plans, AutoPlanProfilesPlansAndTrainsWithinTheMemoryLimit) {
  write_config(4, 4);
  const auto ref = reference();
  ASSERT_TRUE(ref.has_value());
  // Between the two uniform plans' needs in fp64 (about 3.1 and 5.0 MiB for this model), so
  // that the limit binds: every layer at degree 1 does not fit.
  const std::string limit = " parallel.memory_limit=4000000";
  expect_matches(*ref, 2, 1, "auto", plan_settings("oases", "auto") + limit);
  std::ifstream in(dir_ / "auto" / "ckpt" / "plan.json");
  ASSERT_TRUE(in.good()) << "no plan.json next to the checkpoints";
  const nlohmann::json plan = nlohmann::json::parse(in);
  const auto degrees = plan.at("degrees").get<std::vector<int>>();
  ASSERT_EQ(degrees.size(), 4u);
  EXPECT_NE(degrees, (std::vector<int>{1, 1, 1, 1})) << "exceeds the limit";
  EXPECT_LE(plan.at("predicted_memory_bytes").get<std::int64_t>(), 4000000);
  // The joint search chose the run's settings first (compression kept as configured: the run
  // above computes what the reference does).
  ASSERT_TRUE(plan.contains("settings")) << plan.dump();
  EXPECT_EQ(plan.at("settings").at("parallel.activation_compression"), "none");
  EXPECT_TRUE(plan.contains("report"));

  const Result r = run_train(2, 1, "too_small",
                             plan_settings("oases", "auto") + " parallel.memory_limit=1000000");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("parallel.memory_limit = 1000000 bytes is too small for any plan"),
            std::string::npos)
      << r.output;
}

TEST_F(Plans, BadPlansNameTheSettingAndWhatIsValid) {
  write_config(4, 4);
  struct Case {
    std::string plan, expected;
  };
  const std::vector<Case> cases{
      {"1,2,2", "parallel.plan = \"1,2,2\" gives 3 layer degrees; the model has model.layers = 4"},
      {"1,3,2,2", "layer 1 has degree 3; valid degrees divide parallel.tp = 2"},
      {"no-such-plan.json", "parallel.plan = \"no-such-plan.json\" is neither \"uniform\""},
  };
  for (const Case& c : cases) {
    const Result r = run_train(2, 1, "bad", plan_settings("oases", c.plan));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
  }
  // Four replicas of one row each cannot share sub-batches of two rows.
  write_config(3, 4);
  const Result r = run_train(4, 1, "rows", plan_settings("oases", "4,2,1"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("its 4 replicas split every sub-batch of 2 sequences"),
            std::string::npos)
      << r.output;
}

}  // namespace
